"""What the simulated drives make of the targets a host sends, the same on every transport's device side.

Targets (CSP target positions) reach a device at the host's pace, not exactly one per drive cycle: a frame is
lost, two arrive within one cycle and none within the next, or a host's periodic sender repeats the last
frame before its application has updated it. The device hands every target it receives to
`TargetStreams.receive`, and once per drive cycle `TargetStreams.cycle` decides the target each drive follows:

  * A target equal to the last one received is not a new target (a repeated frame). New targets are kept
    with the cycle each belongs to: one new target per cycle since the last belongs to each cycle in turn,
    the newest to this cycle, or to the next one when the host is one ahead (two new targets since the last
    SYNC after a cycle that had its own: the later is the next cycle's; never more than one cycle ahead).
    Targets of missed cycles that come late, with the next, fill those cycles.
  * A cycle with a new target: the drive follows the newest (synchronous targets replace each other).
  * A cycle whose target came early, the cycle before: the drive follows that one.
  * A cycle without its target (a miss): the drive continues the targets it *received* (never its own
    continuations), each at its own cycle (sim.drive_control.extrapolate): on the cubic through the last
    EXACT_DEGREE + 1 where they came one per cycle, else on the line through the last two (if they came
    within WINDOW cycles), for up to `max_extrapolated` misses in a row, then holds the last received target. Only a new target ends a run of misses; a
    repeated frame does not. A continuation that would move the target faster than the joint's maximum
    velocity from the last received one (a host that stepped its target is not moving at that speed) is
    not followed either: the drive holds.

A drive that is not streaming CSP targets (another mode, not operational) forgets its stream: a drive that
enters CSP again starts from its first new target.

`target_refusal` is the one rule for a target that lies outside a joint's limits, on every transport: the
device refuses it (nothing of the frame is applied), counts it, and the drive keeps what it had.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from firmware_bridge import cia402
from firmware_bridge.units import TORQUE_LSB
from firmware_bridge.runtime.counters import Counters
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.setpoint_buffer import MAX_DEPTH, TargetBuffer
from sim.drive_control import EXACT_DEGREE, extrapolate

KEPT = EXACT_DEGREE + 1          # received targets the continuation goes through, at most
WINDOW = 2 * KEPT                # cycles: a target received this much before the newest is not continued


@dataclass
class TargetCounts(Counters):
    """Drive cycles of CSP streaming without their own new target, summed over the drives. missed: nothing
    came; repeated: the last target came again (a host holding still, or one whose periodic sender ran
    before its application); early: the cycle's target had come with the cycle before; and what the drives
    did on a missed or repeated one: extrapolated (followed the continuation of the received targets) or
    held (the last one)."""

    missed: int = 0
    repeated: int = 0
    early: int = 0
    extrapolated: int = 0
    held: int = 0

    def as_dict(self, suffix: str = "_targets") -> dict[str, int]:
        """{name_targets: count}, as the link counters carry them."""
        return super().as_dict(suffix)


class TargetStreams:
    """The received-target streams of n drives. receive() from any thread, cycle() once per drive cycle.

    max_extrapolated: misses in a row for which a drive continues its received targets, before it holds the
    last one (0: hold at once). max_step (n,): the most a joint moves in one cycle (rad or m: its maximum
    velocity times the cycle; None: unbounded); a continuation beyond it is not followed.
    """

    def __init__(self, n: int, max_extrapolated: int = 4, max_step: np.ndarray | None = None):
        if isinstance(max_extrapolated, bool) or not isinstance(max_extrapolated, int) or max_extrapolated < 0:
            raise ValueError(f"max_extrapolated: expected an integer >= 0, got {max_extrapolated!r}")
        self.n, self.max_extrapolated = n, max_extrapolated
        self.max_step = np.full(n, np.inf) if max_step is None else np.array(max_step, dtype=float)
        self.counts = TargetCounts()
        self._lock = threading.Lock()
        self._cycle = 0
        self._pending: list[list[float]] = [[] for _ in range(n)]    # received since the last cycle (rad)
        self._stamps: list[list[int]] = [[] for _ in range(n)]       # the cycle each kept target belongs to
        self._values: list[list[float]] = [[] for _ in range(n)]     # received targets (rad), oldest first
        self._misses = [0] * n
        self.target = np.zeros(n)                   # what each drive follows this cycle (rad), where
        self.following = np.zeros(n, dtype=bool)    # it streams CSP targets and a first one came

    def receive(self, joint: int, value: float) -> None:
        """Drive `joint` received the target `value` (rad)."""
        with self._lock:
            self._pending[joint].append(float(value))

    def receive_all(self, values: np.ndarray) -> None:
        """Every drive received a target: values (n,) rad."""
        with self._lock:
            for j, v in enumerate(values.tolist()):
                self._pending[j].append(v)

    def forget(self, joint: int) -> None:
        """Drive `joint` stopped streaming (left CSP, reset): its next target starts a new stream."""
        with self._lock:
            self._forget(joint)

    def _forget(self, j: int) -> None:
        self._stamps[j].clear()
        self._values[j].clear()
        self._misses[j] = 0
        self.following[j] = False

    def cycle(self, streaming: np.ndarray) -> np.ndarray:
        """One drive cycle: streaming (n,) bool, the drive follows CSP targets (the others are forgotten).
        Returns the target each drive follows (rad; `self.target`, valid where `self.following`)."""
        with self._lock:
            self._cycle += 1
            for j in range(self.n):
                pending, self._pending[j] = self._pending[j], []
                if not streaming[j]:
                    if self._values[j]:
                        self._forget(j)
                    continue
                self._follow(j, pending)
        return self.target

    def _follow(self, j: int, pending: list[float]) -> None:
        values, stamps, now, c = self._values[j], self._stamps[j], self._cycle, self.counts
        new = []
        for v in pending:
            if v != (new[-1] if new else values[-1] if values else None):
                new.append(v)
        if not values and not new:
            return
        self.following[j] = True
        if new:
            last = stamps[-1] if stamps else now - 1
            newest = min(max(now, last + len(new)), now + 1)      # this cycle's, or the next one's
            for i, v in enumerate(new):
                stamp = newest - (len(new) - 1 - i)
                if stamp > last:
                    values.append(v)
                    stamps.append(stamp)
            del values[:-KEPT], stamps[:-KEPT]
            self._misses[j] = 0
            self.target[j] = new[-1]
            return
        if stamps[-1] >= now:                                     # the host sent it with the cycle before
            c.early += 1
            self.target[j] = values[-1]
            return
        if pending:
            c.repeated += 1
        else:
            c.missed += 1
        self._misses[j] += 1
        x = values[-1]
        if self._misses[j] <= self.max_extrapolated and len(stamps) >= 2 and stamps[-1] - stamps[-2] < WINDOW:
            # the cubic through the last KEPT where they came one per cycle (a clean stream that lost some),
            # else the line through the last two: a cubic through targets whose cycles are uncertain (a host
            # that lags and catches up) amplifies their timing errors eightfold
            k = KEPT if len(stamps) == KEPT and stamps[-1] - stamps[0] == KEPT - 1 else 2
            x = extrapolate(stamps[-k:], values[-k:], now)
        if x != values[-1] and abs(x - values[-1]) <= self.max_step[j] * (now - stamps[-1]):
            self.target[j] = x
            c.extrapolated += 1
        else:
            self.target[j] = values[-1]
            c.held += 1


def streams_for(sim) -> TargetStreams:
    """The target streams of a Simulator's drives: its DriveConfig's extrapolated_targets, each joint's maximum
    velocity (the model's qd_max) over one cycle."""
    return TargetStreams(sim.n, sim.drives.config.extrapolated_targets, np.asarray(sim.model.qd_max) * sim.dt)


def target_limits(model, counts_per_rad: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The joints' limits as a device checks targets against them: position lo, hi (rad or m) and torque
    tau_max (N m or N), each widened by half a wire unit (a limit rounded to counts or mN m may lie that far
    out). counts_per_rad: the position scaling per joint."""
    half_count = 0.5 / np.abs(np.asarray(counts_per_rad, dtype=float))
    return model.q_min - half_count, model.q_max + half_count, model.tau_max + 0.5 * TORQUE_LSB


def target_refusal(position: np.ndarray | None, torque: np.ndarray | None, lo: np.ndarray, hi: np.ndarray,
                   tau_max: np.ndarray, joint_names, first_joint: int = 0,
                   offset: np.ndarray | None = None) -> str | None:
    """Why targets are refused, or None: a target position (rad or m) outside [lo, hi], or a target torque
    (N m or N), a torque offset, or the two together (what the drive would apply), beyond +-tau_max, naming
    the first joint (first_joint: the index of position[0], for one drive's targets) and the value. lo, hi,
    tau_max: per joint, already widened by half a wire unit (the sum by one unit)."""
    checks = [("target_position", position, lo, hi), ("target_torque", torque, -tau_max, tau_max)]
    if offset is not None:
        checks.append(("torque_offset", offset, -tau_max, tau_max))
        if torque is not None:
            total = np.asarray(torque, dtype=float) + np.asarray(offset, dtype=float)
            wide = tau_max + 0.5 * TORQUE_LSB
            checks.append(("target_torque + torque_offset", total, -wide, wide))
    for name, value, low, high in checks:
        if value is None:
            continue
        value = np.atleast_1d(np.asarray(value, dtype=float))
        sel = slice(first_joint, first_joint + value.shape[0])
        bad = ~((value >= low[sel]) & (value <= high[sel]))       # NaN is bad too
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            j = first_joint + k
            return (f"{name}: drive {j + 1} ({joint_names[j]}): {value[k]:.6g} is outside "
                    f"[{low[j]:.6g}, {high[j]:.6g}] (SI units: rad or m, N m or N)")
    return None


STILL_FRACTION = 0.01     # a target this fraction of a joint's maximum velocity over a cycle from the next is at
                          # rest: the setpoint buffer may drop it (firmware_bridge.runtime.setpoint_buffer)
FREE_RUNNING_DEPTH = 3    # a free-running device's setpoint buffer: jitter of two cycles costs nothing (with 2,
                          # a loaded 2-core machine ran 3 % of the cycles without a target)
def setpoints_for_device(depth: int | None, host_clocked: bool, where: str) -> TargetBuffer | None:
    """The setpoint buffer of a device side: `depth` cycles (0: none), by default FREE_RUNNING_DEPTH when the
    device runs on its own clock and none when the host clocks it (one cycle per command: nothing to absorb)."""
    if depth is None:
        depth = 0 if host_clocked else FREE_RUNNING_DEPTH
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
        raise InputError(f"{where}: target_buffer: expected a number of cycles 0..{MAX_DEPTH}, got {depth!r}")
    return TargetBuffer(depth) if depth else None


class DeviceTargets:
    """The targets of a free-running or host-clocked device side (serial, gateway), from arrival to the drives.

    arrived(): a host frame's commands. The controlword and mode act at once; the targets go to the drives at
    once (host-clocked device, or no buffer) or into the setpoint buffer (firmware_bridge.runtime.setpoint_buffer, a free-running
    device: one consumed per drive cycle, in order, so that arrival jitter costs nothing).
    after_cycle(): before the next cycle, the buffer's next target (if any) becomes the simulator's and is
    received by the drives' target streams (TargetStreams); then, where a drive streaming CSP got no new target,
    the streams' continuation (bounded extrapolation, then hold) becomes the simulator's.
    Not thread-safe: each device calls both under its own lock.
    """

    def __init__(self, sim, setpoints: TargetBuffer | None):
        self.sim = sim
        self.streams = streams_for(sim)
        self.setpoints = setpoints
        if setpoints is not None:        # drop a burst's excess only where it moves nothing: never a jump
            setpoints.still = np.asarray(sim.model.qd_max, dtype=float) * sim.dt * STILL_FRACTION
            setpoints.extrapolated = self.streams.max_extrapolated
        self.commanded = sim.read_state().position.copy()   # the last target received (rad)
        self.applied = self.commanded.copy()               # the targets the simulator has (rad)
        self.csp = np.zeros(sim.n, dtype=bool)             # the last accepted frame's mode is CSP

    def start_from(self, position: np.ndarray) -> None:
        self.commanded[:] = position
        self.applied[:] = position

    def arrived(self, controlword, mode, target: np.ndarray, torque: np.ndarray, offset: np.ndarray) -> None:
        """An accepted frame's commands: target position (rad), target torque and torque offset (N m)
        (InputError from the simulator leaves nothing changed)."""
        if self.setpoints is None:
            self.sim.set_commands(controlword=controlword, mode=mode, target_position=target, target_torque=torque,
                                  torque_offset=offset)
            self._received(target)
        else:
            self.sim.set_commands(controlword=controlword, mode=mode)
            self.setpoints.push(target, torque, offset)
        np.equal(mode, cia402.Mode.CSP, out=self.csp)

    def after_cycle(self) -> None:
        if self.setpoints is not None:
            got = self.setpoints.take()
            if got is not None:
                self.sim.set_commands(target_position=got[0], target_torque=got[1], torque_offset=got[2])
                self._received(got[0])
        target = self.streams.cycle(self.csp)
        following = self.streams.following
        if (following & (target != self.applied)).any():
            np.copyto(self.applied, np.where(following, target, self.commanded))
            self.sim.set_commands(target_position=self.applied)

    def _received(self, target: np.ndarray) -> None:
        self.streams.receive_all(target)
        self.commanded[:] = target
        self.applied[:] = target
