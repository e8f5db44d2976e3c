"""A setpoint buffer: setpoints are consumed one per cycle, in the order they arrived, a fixed number of
cycles behind the newest. The simulated free-running drives keep one (sim.drive_targets.DeviceTargets), and
so does the driver's servo mode for a client's streamed setpoints (driver.servo).

A drive on its own clock receives its master's targets over a link whose delay varies: one cycle none
arrives, the next two. Latching the newest target each cycle turns that jitter into a skipped target and a
repeated one, each a step in the target's second difference, i.e. a torque kick that the drive's feed-forward
and its following-error monitor see. A drive with a setpoint buffer (CiA 402's interpolation data buffer,
0x60C4, or a joint board's FIFO) instead consumes one target per cycle from a queue it lets fill to `depth`
targets first, so arrival jitter of up to depth - 1 cycles costs nothing but that fixed latency.

Rules, per drive cycle (`take`):
  * priming: until `depth` targets are queued, the drive keeps its last target (nothing is consumed);
  * running: the oldest queued target is consumed; an empty queue is an underrun (counted): the drive has no
    new target this cycle (`take` returns None) and the stream goes on with the next arrival;
  * the latency is bounded by the depth, as in a drive's interpolation buffer of fixed size: beyond
    `max_queued` (default: `depth`) queued targets the oldest are dropped (counted as skipped). A host that was
    late sends its backlog in a burst; the drive keeps the newest `depth` of it and goes on a fixed `depth`
    cycles behind the host instead of carrying the burst as lasting latency;
  * never a jump: with `still` (per joint, position units; the simulated drives set it) a target is dropped
    only where dropping it moves nothing:
      - a target of a cycle the drive went through without one and continued its stream over (`extrapolated`:
        the drive extrapolates up to that many missed cycles in a row, sim.drive_targets): when it comes late,
        its time has passed and the drive already went where it leads, so the oldest beyond the depth go, up
        to one per such cycle. A host late by a few cycles (the common case on a loaded machine) costs no
        lasting latency, in motion or not;
      - a target within `still` of the next one (the arm is at rest there). A longer stall in the middle of a
        motion (the drive held after `extrapolated` misses) is carried out in full, one target per cycle, as
        the host sent it (dropping it would step the target by the whole backlog: 73 mrad for 150 ms at
        0.5 rad/s, a following-error fault), and its excess goes as soon as the motion comes to rest.
    HARD_LIMIT queued targets (a loop stalled for seconds) drop the oldest regardless;
  * `reset` empties the queue (a drive leaving CSP, a restart): the next targets prime it again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.counters import Counters

MAX_DEPTH = 16
HARD_LIMIT = 4096         # targets: seconds of a stalled loop at 1 kHz; beyond, the oldest go whatever they are


@dataclass
class BufferCounts(Counters):
    """What the buffer did so far: targets received, consumed, underruns (cycles with none queued while
    running) and targets skipped (dropped, oldest first) to bound the latency."""

    received: int = 0
    consumed: int = 0
    underruns: int = 0
    skipped: int = 0


class TargetBuffer:
    """A FIFO of setpoints (tuples of arrays: a drive's target position and torque, a servo setpoint and its
    stamp), consumed one per cycle. Not thread-safe: its owner calls it under its own lock or from one thread.

    max_queued: targets kept at most (default `depth`: the latency is at most `depth` cycles); more push out
    the oldest. still (per joint, the first array's units; None: drop whatever the targets are): drop a target
    only where the next one lies within it, or where it belongs to one of the last `extrapolated` cycles that
    went without a target (the drive continued its stream over them)."""

    def __init__(self, depth: int, max_queued: int | None = None, still: np.ndarray | None = None,
                 extrapolated: int = 0):
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise InputError(f"target_buffer: expected a number of cycles 1..{MAX_DEPTH}, got {depth!r}")
        self.depth = depth
        self.max_queued = depth if max_queued is None else int(max_queued)
        if self.max_queued < depth:
            raise InputError(f"target_buffer: max_queued {max_queued!r} is below the depth {depth}")
        self.still = None if still is None else np.asarray(still, dtype=float)
        self.extrapolated = int(extrapolated)
        self._owed = 0                   # cycles without a target whose late targets may go (<= extrapolated)
        self._queue: deque[tuple] = deque()
        self._running = False
        self.counts = BufferCounts()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, *items) -> None:
        """A setpoint arrived (its arrays copied)."""
        self._queue.append(tuple(np.array(x) for x in items))
        self.counts.received += 1
        if len(self._queue) > (self.max_queued if self.still is None else HARD_LIMIT):   # keep the newest
            self.counts.skipped += 1
            self._queue.popleft()

    def take(self) -> tuple | None:
        """The setpoint of this cycle, or None when the last one is kept (priming, underrun)."""
        queue = self._queue
        if not self._running:
            if len(queue) < self.depth:
                return None
            self._running = True
        if not queue:
            self.counts.underruns += 1
            self._owed = min(self._owed + 1, self.extrapolated)
            return None
        if self.still is not None:                   # the excess of a burst, where dropping it moves nothing
            while len(queue) > self.max_queued and self._owed:       # late: the drive went on without them
                queue.popleft()
                self.counts.skipped += 1
                self._owed -= 1
            while len(queue) > self.max_queued and np.all(np.abs(queue[1][0] - queue[0][0]) <= self.still):
                queue.popleft()
                self.counts.skipped += 1
        self.counts.consumed += 1
        return queue.popleft()

    def reset(self) -> None:
        """Forget the queued targets; the next ones prime the buffer again."""
        self._queue.clear()
        self._running = False
        self._owed = 0

