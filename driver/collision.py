"""Collision detection over the external-torque estimate (driver/observer.py), per joint at two levels, as
libfranka has them: over its **contact** threshold a joint is in contact (stream flag CONTACT, nothing else
happens); over its **collision** threshold the driver reacts.

Reactions (`reaction`):
  "quick_stop"     (default) the driver's fault state: the drives get a quick stop, the motion or servo session
                   ends; fault_reset and enable to go on
  "stop_and_hold"  the motion or servo session ends and the drives hold the pose measured at the collision
                   (position control, gravity feed-forward); no fault
  "back_off"       the motion or servo session ends and the arm yields from the pose measured at the collision
                   along the estimated external torque, by back_off_distance (rad) at no more than back_off_speed
                   (rad/s), then holds (driver/back_off.py; planned beside the cycle while the arm holds, and
                   checked against the limits before it starts; when a limit refuses it, the arm holds as with
                   stop_and_hold); no fault

Either way a health event names the joint and its estimated torque, and an ERROR line goes to the log. A
collision stays latched (stream flag COLLISION) until every estimate is back under its contact threshold; only
then can the next one trigger a reaction.

Thresholds (N m per joint) come from the config ([collision] contact, collision) or, where it gives none, from
the rule:
  * with the identified model's residual statistics (result.json beside model.toml: fit.residual_rms_measured,
    the RMS per joint of the measured torque minus the model's over the identification's rows):
        contact = CONTACT_SIGMA * rms,  collision = COLLISION_SIGMA * rms
  * without them (a catalogue model): NOMINAL_CONTACT and NOMINAL_COLLISION times each joint's torque limit.
Both are floored at MIN_THRESHOLD_NM. Why 10 and 20: the observer passes, up to its gains' band, what the model
does not hold (the friction near zero speed that the near-rest fit does not catch; the sensors' noise); over 10
minutes of full-speed excitation of the simulated arm its largest excursion was 2 to 5 times that RMS per joint
with the friction near rest, 3 to 10 times without it (benchmarks/bench_collision.py), so 20 times leaves a margin
of 4, or 2 without it.

At run time (`set_collision`): lowering thresholds is always allowed; raising any, or changing the reaction, is
refused while a motion or servo session runs (the arm would be less protected mid-motion than when it started).
"""
from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

import numpy as np

from driver import observer_kernels as ok
from driver.observer import MomentumObserver
from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError

REACTIONS = ("quick_stop", "stop_and_hold", "back_off")
CONTACT_SIGMA = 10.0
COLLISION_SIGMA = 20.0
NOMINAL_CONTACT = 0.10         # of the torque limit, without residual statistics
NOMINAL_COLLISION = 0.20
MIN_THRESHOLD_NM = 0.05        # no threshold below this (N m): under it, encoder steps alone would cross it
GAP_PERIODS = 10.0             # a sample more than this many periods after the last restarts the observer
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Watch:
    """The driver config's [model] and [collision] (docs/reference/driver-config.md).

    model: the observer's and the feed-forward's model file or shipped name (None: the driver's own model);
    gains: the observer's gains, 1/s (one number or n); friction_smoothing: rad/s; feed_forward: plan the motions'
    torque feed-forward with this model; feed_forward_friction: with its friction (False: the rigid body alone);
    compensate: what torque servo sessions get added to their torque by default (driver.compensation.KINDS:
    "gravity", "friction"). detect: collision detection on ([collision] present); contact, collision: thresholds
    (N m, one number or n; None: the rule); reaction: one of REACTIONS; back_off_distance (rad), back_off_speed
    (rad/s): the back-off reaction's motion (driver/back_off.py)."""

    model: str | None = None
    gains: float | tuple = 100.0
    friction_smoothing: float = 0.01
    feed_forward: bool = True
    compensate: tuple[str, ...] = ()
    detect: bool = False
    contact: float | tuple | None = None
    collision: float | tuple | None = None
    reaction: str = "quick_stop"
    source: str = "<defaults>"
    back_off_distance: float = 0.02
    back_off_speed: float = 0.1
    feed_forward_friction: bool = True


class CollisionError(InputError):
    """Thresholds or a reaction that cannot be used (the message names the field)."""


@dataclass(frozen=True)
class Thresholds:
    """contact, collision (n,) N m; reaction one of REACTIONS; enabled False: the estimate is published but
    nothing is detected; source says where the numbers came from."""

    contact: np.ndarray
    collision: np.ndarray
    reaction: str = "quick_stop"
    enabled: bool = True
    source: str = "config"

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "reaction": self.reaction, "contact": self.contact.tolist(),
                "collision": self.collision.tolist(), "source": self.source}


def rule_thresholds(tau_max: np.ndarray, residual_rms=None) -> tuple[np.ndarray, np.ndarray, str]:
    """(contact, collision, source) by the documented rule (module docstring)."""
    if residual_rms is not None:
        rms = np.asarray(residual_rms, dtype=float)
        contact, collision = CONTACT_SIGMA * rms, COLLISION_SIGMA * rms
        source = f"{CONTACT_SIGMA:g} and {COLLISION_SIGMA:g} times the identification's residual RMS"
    else:
        limit = np.where(np.isfinite(tau_max), tau_max, 100.0)
        contact, collision = NOMINAL_CONTACT * limit, NOMINAL_COLLISION * limit
        source = f"{NOMINAL_CONTACT:g} and {NOMINAL_COLLISION:g} of the torque limits (no residual statistics)"
    return np.maximum(contact, MIN_THRESHOLD_NM), np.maximum(collision, MIN_THRESHOLD_NM), source


def _levels(value, n: int, where: str) -> np.ndarray:
    items = value if isinstance(value, (list, tuple, np.ndarray)) else [value] * n
    if len(items) != n or not all(isinstance(v, (int, float, np.floating)) and not isinstance(v, bool)
                                  and math.isfinite(v) and v >= MIN_THRESHOLD_NM for v in items):
        raise CollisionError(f"{where}: expected one number or {n} numbers of N m, each at least "
                             f"{MIN_THRESHOLD_NM:g}, got {value!r}")
    return np.array(items, dtype=float)


def make_thresholds(n: int, tau_max: np.ndarray, *, contact=None, collision=None, reaction: str = "quick_stop",
                    enabled: bool = True, residual_rms=None, where: str = "collision") -> Thresholds:
    """Thresholds from what is given (one number or n, N m), the rest by the rule; CollisionError naming the field
    when a level is not a positive number, contact exceeds collision, or the reaction is unknown."""
    rule_contact, rule_collision, source = rule_thresholds(tau_max, residual_rms)
    given = [k for k, v in (("contact", contact), ("collision", collision)) if v is not None]
    c = rule_contact if contact is None else _levels(contact, n, f"{where}.contact")
    k = rule_collision if collision is None else _levels(collision, n, f"{where}.collision")
    if given:
        source = "config" if len(given) == 2 else f"{given[0]} from the config, the other by the rule ({source})"
    if np.any(c > k):
        j = int(np.argmax(c > k))
        raise CollisionError(f"{where}: joint {j + 1}: contact threshold {c[j]:.4g} N m is above its collision "
                             f"threshold {k[j]:.4g} N m")
    if reaction not in REACTIONS:
        raise CollisionError(f"{where}.reaction: expected one of {', '.join(REACTIONS)}, got {reaction!r}")
    if not isinstance(enabled, bool):
        raise CollisionError(f"{where}.enabled: expected true or false, got {enabled!r}")
    return Thresholds(c, k, reaction, enabled, source)


def check_change(old: Thresholds, new: Thresholds, moving: bool) -> None:
    """CollisionError when `new` may not replace `old` now: while moving, nothing may make detection less strict
    (a threshold raised, detection disabled, the reaction changed)."""
    if not moving:
        return
    if old.enabled and not new.enabled:
        raise CollisionError("set_collision: disabling detection is refused while the arm moves; stop it first")
    if new.reaction != old.reaction:
        raise CollisionError("set_collision: changing the reaction is refused while the arm moves; stop it first")
    for name in ("contact", "collision"):
        up = getattr(new, name) > getattr(old, name)
        if up.any():
            j = int(np.argmax(up))
            raise CollisionError(f"set_collision: raising joint {j + 1}'s {name} threshold is refused while the arm "
                                 f"moves (lowering is allowed); stop it first")


class CollisionMonitor:
    """The observer and the thresholds, watched once per cycle (driver/cycle.py calls `watch`)."""

    def __init__(self, observer: MomentumObserver, thresholds: Thresholds, torque_per_amp: np.ndarray):
        self.observer = observer
        self.thresholds = thresholds
        self.torque_per_amp = np.asarray(torque_per_amp, dtype=float)
        self._tau_m = np.zeros(observer.n)
        self.flags = 0                # the stream flags: FLAG_CONTACT, FLAG_COLLISION
        self.latched = False
        self.collisions = 0
        self.last: dict | None = None  # the last collision: joint, tau_ext, threshold, time
        self.peak = np.zeros(observer.n)   # |tau_ext| peaks since the last health report (peaks())
        self._peak_lock = threading.Lock()  # the cycle raises the peaks, the health thread reads and clears them
        self._gap_ns = int(GAP_PERIODS * observer.dt * 1e9)
        self._last_ns: int | None = None   # the device time of the last sample the observer took
        self.restarts = 0                  # restarts after a gap in the samples
        self.back_off = None               # (q, tau_ext) -> the back-off motion (PlannedMotion); the daemon sets it
        self.back_off_setting = None       # driver.back_off.BackOff: its distance and speed (shown in status)

    def warm_up(self, q: np.ndarray, qd: np.ndarray, current: np.ndarray, tau_ext: np.ndarray) -> None:
        """Compile (or load from numba's cache) the kernels `watch` calls, for the types of the arrays the cycle
        passes, on a scratch observer and scratch output: this monitor and tau_ext are left as they were."""
        o = self.observer
        scratch = MomentumObserver(o.model, 1.0 / o.dt, o.gains, float(o.friction[0, 3]),
                                   (o.friction[:, 4], o.friction[:, 5]))
        out = np.zeros_like(tau_ext)
        scratch.update(q, qd, np.multiply(current, self.torque_per_amp), out)
        ok.contact_levels(out, self.thresholds.contact, self.thresholds.collision)

    def watch(self, q: np.ndarray, qd: np.ndarray, current: np.ndarray, tau_ext: np.ndarray, fresh: bool,
              active: bool, device_time_ns: int = 0) -> int:
        """One cycle: with a new sample while the drives hold the arm (active), the estimate into tau_ext and the
        levels checked; otherwise the observer restarts and tau_ext is 0. The observer integrates over the device
        time between samples (a late or lost sample's period counts as long as it was); a sample more than
        GAP_PERIODS after the last one restarts it (its integral would guess too much). Returns the joint
        (0-based) whose collision threshold was crossed and needs the reaction now, else -1."""
        if not active:
            if self.observer.started:
                self.observer.reset()
                tau_ext[:] = 0.0
            self.flags = 0
            self.latched = False
            self._last_ns = None
            return -1
        if not fresh:
            return -1
        last, self._last_ns = self._last_ns, device_time_ns
        dt = 0.0
        if last is not None and self.observer.started:
            step = device_time_ns - last
            if step > self._gap_ns:
                self.observer.reset()
                self.restarts += 1
            elif step > 0:
                dt = step * 1e-9
        np.multiply(current, self.torque_per_amp, out=self._tau_m)
        self.observer.update(q, qd, self._tau_m, tau_ext, dt)
        th = self.thresholds
        code = ok.contact_levels(tau_ext, th.contact, th.collision)
        if code < 0:                      # a non-finite estimate: never published, the observer restarts
            tau_ext[:] = 0.0
            self.observer.reset()
            return -1
        with self._peak_lock:          # uncontended but for the health thread's read once a second
            np.maximum(self.peak, np.abs(tau_ext), out=self.peak)
        contact = code & 0xFFFF
        flags = stream.FLAG_CONTACT if contact else 0
        hit = -1
        if self.latched:
            if contact == 0:
                self.latched = False
        elif th.enabled and code >> 16:
            hit = (code >> 16) - 1
            self.latched = True
            self.collisions += 1
        if self.latched:
            flags |= stream.FLAG_COLLISION
        self.flags = flags if th.enabled else 0
        return hit

    def describe(self, joint: int, tau_ext: np.ndarray, now: float) -> tuple[str, dict]:
        """The event text and log fields of a collision on `joint` (0-based)."""
        value, limit = float(tau_ext[joint]), float(self.thresholds.collision[joint])
        self.last = {"joint": joint + 1, "tau_ext": value, "threshold": limit, "time": now,
                     "reaction": self.thresholds.reaction}
        return (f"collision: joint {joint + 1} external torque {value:+.3g} N m over its threshold {limit:.3g} N m "
                f"({self.thresholds.reaction})", {"joint": joint + 1, "tau_ext": value, "threshold": limit})

    def peaks(self) -> list[float]:
        """|tau_ext| peaks per joint since the last call (N m), then restarted (read and cleared under a lock, so a
        peak the cycle raises meanwhile is in this call's answer or in the next one's)."""
        with self._peak_lock:
            out = self.peak.tolist()
            self.peak[:] = 0.0
        return out

    def status(self) -> dict:
        b = self.back_off_setting
        return {**self.thresholds.as_dict(), "gains": self.observer.gains.tolist(), "collisions": self.collisions,
                "last": self.last, "latched": self.latched, "restarts": self.restarts,
                "back_off": None if b is None else {"distance": b.distance, "speed": b.speed}}
