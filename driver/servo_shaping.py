"""The position target a servo session writes to the drives, shaped on the driver's own cycle clock so that it
obeys each joint's position, velocity and acceleration limits whatever a client streams.

The target x moves once per cycle of period dt: its velocity v = (x_k - x_{k-1}) / dt and its acceleration
(v_k - v_{k-1}) / dt are what the drives get, whatever the client's stamps say. Each cycle (`track`), per joint:
  * the reference r is the newest accepted setpoint and vr = (r_k - r_{k-1}) / dt its velocity on the cycle
    clock (0 in a cycle without a new setpoint);
  * the wanted velocity is vr plus the time-optimal velocity that closes the error left from the last cycle
    (r_{k-1} - x_{k-1}) at the acceleration limit without overshooting it (`brake_speed`, exact for discrete
    steps): on track, that is vr itself, so a stream that is within the limits on the cycle clock is written
    unchanged (the target is the setpoint, no latency added);
  * the velocity taken is the wanted one clipped to: the last velocity +- qdd_max dt, +- qd_max, and the speeds
    from which the target can still stop before q_min and q_max at qdd_max. Since every velocity so taken
    leaves the next cycle one within all three, the target never passes a position limit, and its second
    difference over dt^2 never exceeds qdd_max (up to the rounding of the positions themselves).
A cycle whose velocity was clipped is counted (the session's `bridged_cycles`). `stop_ramp` brings the target
to rest within the same limits when a session ends while it moves: time-optimally at a goal (the newest
setpoint, after servo_stop), or as soon as the acceleration limit lets it (after a refusal).
"""
from __future__ import annotations

from typing import Callable

import numba
import numpy as np

from driver.motion import PlannedMotion

LIMIT_MARGIN = 1e-9     # rad: the target brakes to rest this far inside the position limits, so that the rounding
                        # of its positions on a braking curve (about 1e-12 rad) never meets a limit


@numba.njit(cache=True, nogil=True)
def brake_speed(distance, a_dt, dt):
    """The largest speed (rad/s, >= 0) of this cycle's step from which a target can still come to rest within
    `distance` (rad) of where it is, slowing by at most a_dt (acceleration limit times the period dt, rad/s)
    per cycle. Exact for discrete steps: with u = speed / a_dt and D = distance / (a_dt dt), the steps u,
    u - 1, ..., down to rest cover g(u) = u + sum_{i=1}^{floor u} (u - i) <= D; g is m (m + 1) / 2 at whole m and
    linear between, so u = D / (m + 1) + m / 2 with m the largest whole number with m (m + 1) / 2 <= D."""
    if not distance > 0.0:
        return 0.0
    d = distance / (a_dt * dt)
    m = np.floor((np.sqrt(8.0 * d + 1.0) - 1.0) * 0.5)
    if m * (m + 1.0) * 0.5 > d:             # the square root's rounding, either way
        m -= 1.0
    elif (m + 1.0) * (m + 2.0) * 0.5 <= d:
        m += 1.0
    return a_dt * (d / (m + 1.0) + 0.5 * m)


@numba.njit(cache=True, nogil=True)
def _track(x, v, r, r_prev, dt, qd_max, qdd_max, q_min, q_max):
    limited = False
    for j in range(x.shape[0]):
        a_dt = qdd_max[j] * dt
        e = r_prev[j] - x[j]                 # the error left from the last cycle
        closing = brake_speed(abs(e), a_dt, dt)
        want = (r[j] - r_prev[j]) / dt + (closing if e >= 0.0 else -closing)
        lo = max(-qd_max[j], -brake_speed(x[j] - q_min[j] - LIMIT_MARGIN, a_dt, dt))
        hi = min(qd_max[j], brake_speed(q_max[j] - LIMIT_MARGIN - x[j], a_dt, dt))
        # the acceleration bound wins a conflict (the rounding of positions on a braking curve): the margin
        # keeps the position limits
        lo = min(max(lo, v[j] - a_dt), v[j] + a_dt)
        hi = max(min(hi, v[j] + a_dt), v[j] - a_dt)
        vel = min(max(want, lo), hi)
        if vel == want and abs(e) <= a_dt * dt:
            new = r[j]                        # closes this cycle: exactly the setpoint
        else:
            new = x[j] + vel * dt
            limited = True
        new = min(max(new, q_min[j]), q_max[j])
        v[j] = (new - x[j]) / dt
        x[j] = new
    return limited


def track(x: np.ndarray, v: np.ndarray, r: np.ndarray, r_prev: np.ndarray, dt: float, qd_max: np.ndarray,
          qdd_max: np.ndarray, q_min: np.ndarray, q_max: np.ndarray) -> bool:
    """One cycle: move the target x (rad, (n,)) with velocity v (rad/s) towards the reference r (rad; r_prev
    the cycle before) within the limits, in place; True when some joint's velocity was clipped (the target is
    not the setpoint this cycle)."""
    return bool(_track(x, v, r, r_prev, float(dt), qd_max, qdd_max, q_min, q_max))


@numba.njit(cache=True, nogil=True)
def _ramp(x, v, goal, brake, dt, qd_max, qdd_max, q_min, q_max, out):
    reference = goal.copy()
    for k in range(out.shape[0]):
        if brake:
            reference[:] = x                 # a reference that stops where the target is
        _track(x, v, reference, reference, dt, qd_max, qdd_max, q_min, q_max)
        out[k] = x
        rest = True
        for j in range(x.shape[0]):
            if v[j] != 0.0 or (not brake and x[j] != goal[j]):
                rest = False
        if rest:
            return k + 1
    return -1


def stop_ramp(x: np.ndarray, v: np.ndarray, dt: float, qd_max: np.ndarray, qdd_max: np.ndarray,
              q_min: np.ndarray, q_max: np.ndarray, goal: np.ndarray | None = None) -> np.ndarray | None:
    """The targets (K, n) of the cycles after x (rad) that bring a target moving at v (rad/s) to rest within
    the limits: at `goal` (rad, within the position limits) when given, time-optimally; else as soon as the
    acceleration limit lets it. The last row is where it rests. None when it rests already (at `goal`).
    One numba call (it runs in the cycle thread when a session ends)."""
    x, v = np.array(x, dtype=float), np.array(v, dtype=float)
    if not np.any(v) and (goal is None or np.array_equal(x, goal)):
        return None
    # cycles enough for any joint: stop, then cross to the goal rest to rest (and back from a limit's margin)
    a, speed = np.asarray(qdd_max, dtype=float), np.asarray(qd_max, dtype=float)
    distance = (0.0 if goal is None else np.abs(np.asarray(goal) - x)) + v * v / (2 * a)
    seconds = np.abs(v) / a + distance / speed + 2 * speed / a + 2 * np.sqrt(distance / a)
    out = np.empty((int(np.ceil(seconds.max() / dt)) + 10, x.shape[0]))
    rows = _ramp(x, v, x.copy() if goal is None else np.array(goal, dtype=float), goal is None, float(dt),
                 speed, a, np.asarray(q_min, dtype=float), np.asarray(q_max, dtype=float), out)
    return out[:rows] if rows > 0 else out      # rows < 0 cannot happen: the bound above covers the ramp


def warm_up(limits, q: np.ndarray) -> None:
    """Compile (or load from numba's disk cache) the kernels for the arrays a servo session passes: the limits'
    own arrays (a model's are read-only, another type to numba than a scratch array) and targets like q.
    Compiling holds the interpreter lock for seconds, which the cycle thread must never wait for: the driver
    calls this before its cycle runs. Nothing is changed (scratch targets)."""
    x, v = np.array(q, dtype=float), np.zeros(len(q))
    track(x, v, x.copy(), x.copy(), 1e-3, limits.qd_max, limits.qdd_max, limits.q_min, limits.q_max)
    v[:] = 1e-3
    for goal in (None, np.array(q, dtype=float)):
        stop_ramp(x, v, 1e-3, limits.qd_max, limits.qdd_max, limits.q_min, limits.q_max, goal)


def stop_motion(ramp: np.ndarray, rate_hz: float, tau_start: np.ndarray,
                gravity: Callable[[np.ndarray], np.ndarray] | None) -> PlannedMotion:
    """A stop ramp (`stop_ramp`) as the cycle's motion "servo stop": its torque feed-forward goes from
    tau_start (N m, the feed-forward the target had) to gravity where it rests, linearly over the samples (two
    gravity evaluations, not one per sample: it runs in the cycle thread)."""
    k = ramp.shape[0]
    tau_end = np.asarray(gravity(ramp[-1].copy()), dtype=float) if gravity is not None else tau_start
    share = np.linspace(1.0 / k, 1.0, k)[:, None]
    tau = (1.0 - share) * tau_start + share * tau_end
    dt = 1.0 / rate_hz
    qd = np.diff(ramp, axis=0, prepend=ramp[:1]) / dt
    qdd = np.diff(qd, axis=0, prepend=qd[:1]) / dt
    return PlannedMotion("servo stop", rate_hz, ramp, qd, qdd, tau, (("servo stop", 0),))
