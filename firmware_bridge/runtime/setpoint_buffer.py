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
  * a late target does not get dropped when it comes: the queue's standing level (and the latency) grows by
    the cycles it was late, as a master that sends every target once and in order expects, so the buffer
    learns the link's jitter. When even the shortest queue over a whole window of `window` cycles held two
    targets more than it needs (the master's clock runs faster than the drive's, or a spell of lateness is
    over), the oldest one is dropped (counted as skipped): the latency comes down at most one target per
    window, never in a jump, and keeps one cycle of margin over what the window needed;
  * more than `max_queued` queued (default MAX_QUEUED: a drive's loop stalled for seconds; a servo session bounds
    its latency lower) drops the oldest at once;
  * `reset` empties the queue (a drive leaving CSP, a restart): the next targets prime it again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.counters import Counters

MAX_DEPTH = 16
MAX_QUEUED = 4096         # targets: seconds of a stalled drive loop at 1 kHz
WINDOW = 1000             # cycles over which the queue's shortest length is watched


@dataclass
class BufferCounts(Counters):
    """What the buffer did so far: targets received, consumed, underruns (cycles with none queued while
    running) and targets skipped to bound the latency."""

    received: int = 0
    consumed: int = 0
    underruns: int = 0
    skipped: int = 0


class TargetBuffer:
    """A FIFO of setpoints (tuples of arrays: a drive's target position and torque, a servo setpoint and its
    stamp), consumed one per cycle. Not thread-safe: its owner calls it under its own lock or from one thread."""

    def __init__(self, depth: int, window: int = WINDOW, max_queued: int = MAX_QUEUED):
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise InputError(f"target_buffer: expected a number of cycles 1..{MAX_DEPTH}, got {depth!r}")
        self.depth = depth
        self.window = int(window)
        self.max_queued = int(max_queued)
        self._low = MAX_QUEUED
        self._cycles = 0
        self._queue: deque[tuple] = deque()
        self._running = False
        self.counts = BufferCounts()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, *items) -> None:
        """A setpoint arrived (its arrays copied)."""
        self._queue.append(tuple(np.array(x) for x in items))
        self.counts.received += 1
        if len(self._queue) > self.max_queued:          # a loop stalled (for a drive: seconds): keep the newest
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
        target = queue.popleft()
        self.counts.consumed += 1
        self._low = min(self._low, len(queue))
        self._cycles += 1
        if self._cycles >= self.window:
            if self._low > self.depth and queue:       # two or more spare after every take of the window
                queue.popleft()
                self.counts.skipped += 1
            self._low, self._cycles = MAX_QUEUED, 0
        return target

    def reset(self) -> None:
        """Forget the queued targets; the next ones prime the buffer again."""
        self._queue.clear()
        self._running = False
        self._low, self._cycles = MAX_QUEUED, 0

