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
  * the latency is bounded by the depth, as in a drive's interpolation buffer of fixed size: a target that
    arrives while `max_queued` (default: `depth`) are queued pushes out the oldest (counted as skipped). A host
    that was late sends its backlog in a burst; the drive keeps the newest `depth` of it and goes on a fixed
    `depth` cycles behind the host, never more, instead of carrying the burst as lasting latency;
  * `reset` empties the queue (a drive leaving CSP, a restart): the next targets prime it again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.errors import InputError

MAX_DEPTH = 16


@dataclass
class BufferCounts:
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
    the oldest."""

    def __init__(self, depth: int, max_queued: int | None = None):
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise InputError(f"target_buffer: expected a number of cycles 1..{MAX_DEPTH}, got {depth!r}")
        self.depth = depth
        self.max_queued = depth if max_queued is None else int(max_queued)
        if self.max_queued < depth:
            raise InputError(f"target_buffer: max_queued {max_queued!r} is below the depth {depth}")
        self._queue: deque[tuple] = deque()
        self._running = False
        self.counts = BufferCounts()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, *items) -> None:
        """A setpoint arrived (its arrays copied)."""
        self._queue.append(tuple(np.array(x) for x in items))
        self.counts.received += 1
        if len(self._queue) > self.max_queued:          # a burst from a late host: keep the newest
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
            return None
        self.counts.consumed += 1
        return queue.popleft()

    def reset(self) -> None:
        """Forget the queued targets; the next ones prime the buffer again."""
        self._queue.clear()
        self._running = False

