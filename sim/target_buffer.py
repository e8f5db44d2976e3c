"""The setpoint buffer of a free-running drive: targets are consumed one per drive cycle, in the order they
arrived, a fixed number of cycles behind the newest.

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
  * more than MAX_QUEUED queued (the drive's loop stalled for seconds) drops the oldest at once;
  * `reset` empties the queue (a drive leaving CSP, a restart): the next targets prime it again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from firmware_bridge.errors import InputError

MAX_DEPTH = 16
FREE_RUNNING_DEPTH = 3    # a free-running device's default: jitter of two cycles costs nothing (with 2, a
                          # loaded 2-core machine ran 3 % of the cycles without a target)
MAX_QUEUED = 4096         # targets: seconds of a stalled drive loop at 1 kHz
WINDOW = 1000             # cycles over which the queue's shortest length is watched


@dataclass
class BufferCounts:
    """What the buffer did so far: targets received, consumed, underruns (cycles with none queued while
    running) and targets skipped to bound the latency."""

    received: int = 0
    consumed: int = 0
    underruns: int = 0
    skipped: int = 0


class TargetBuffer:
    """A FIFO of (target position (n,), target torque (n,)) pairs, consumed one per drive cycle. Not
    thread-safe: the simulator calls it under its I/O lock."""

    def __init__(self, depth: int, window: int = WINDOW):
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
            raise InputError(f"target_buffer: expected a number of cycles 1..{MAX_DEPTH}, got {depth!r}")
        self.depth = depth
        self.window = int(window)
        self._low = MAX_QUEUED
        self._cycles = 0
        self._queue: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._running = False
        self.counts = BufferCounts()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, position: np.ndarray, torque: np.ndarray) -> None:
        """A target arrived (copied)."""
        self._queue.append((np.array(position, dtype=float), np.array(torque, dtype=float)))
        self.counts.received += 1
        if len(self._queue) > MAX_QUEUED:               # a drive loop stalled for seconds: keep the newest
            self.counts.skipped += 1
            self._queue.popleft()

    def take(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The target of this drive cycle, or None when the drive keeps its last one (priming, underrun)."""
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


def for_device(depth: int | None, host_clocked: bool, where: str) -> TargetBuffer | None:
    """The setpoint buffer of a device side: `depth` cycles (0: none), by default FREE_RUNNING_DEPTH when the
    device runs on its own clock and none when the host clocks it (one cycle per command: nothing to absorb)."""
    if depth is None:
        depth = 0 if host_clocked else FREE_RUNNING_DEPTH
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH:
        raise InputError(f"{where}: target_buffer: expected a number of cycles 0..{MAX_DEPTH}, got {depth!r}")
    return TargetBuffer(depth) if depth else None
