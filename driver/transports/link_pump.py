"""Who reads a link, the cycle or the transport's link thread: the rule serial and CAN share (Arm.cycle_reads_link).

The cycle thread reads the link itself while it waits (pump_new for a new sample, pump_for until its deadline), so
that no other thread wakes per frame and takes the interpreter from it. The transport's link thread reads it only
while the cycle does not: before the cycle starts, once it stopped, or when it has not pumped for standby_s (a
stalled cycle); meanwhile it stands by (cycle_reads()) and does its other work (heartbeats, reconnections). One lock
(`reader`) is held by whoever reads. A pump that cannot take the link (it is down, or the link thread is in a read
of its own) waits for the link thread's sample instead (wait): the link thread stands by from its current read on.

The transport keeps its samples; it tells the pump when one is complete (notify) and how to see an unread one
(has_new); `read(timeout_s, until_new)` is its own reading loop, called with `reader` held.
"""
from __future__ import annotations

import math
import threading
import time
from typing import Callable

Read = Callable[[float, bool], None]


class LinkPump:
    """The reader arbitration and the wait for a new sample of one link. has_new() -> True while a complete sample
    is unread; standby_s: how long the link thread leaves the link to the cycle after its last pump."""

    def __init__(self, has_new: Callable[[], bool], standby_s: float):
        self.has_new = has_new
        self.standby_s = standby_s
        self.reader = threading.Lock()      # held by whoever reads the link (link thread, pump, a reconnection)
        self.pumping = False                # the cycle is in a pump (the link thread stands by from its next read)
        self.pumped = -math.inf             # time.monotonic() of the cycle's last pump
        self.arrived = threading.Event()    # set by notify() while a waiter is counted
        self.waiters = 0                    # threads in wait() (the cycle pumping itself needs no event)
        self._count = threading.Lock()

    # -- the link thread -------------------------------------------------------------------------------
    def cycle_reads(self) -> bool:
        """True while the cycle reads the link (in a pump, or pumped within standby_s): the link thread stands by."""
        return self.pumping or time.monotonic() - self.pumped < self.standby_s

    def take(self, read: Read, timeout_s: float, until_new: bool, wait_s: float = 0.0) -> bool:
        """read(timeout_s, until_new) holding `reader`, if it is free within wait_s (0: only if free now); False,
        without reading, otherwise."""
        if not self.reader.acquire(wait_s > 0.0, wait_s if wait_s > 0.0 else -1):
            return False
        try:
            read(timeout_s, until_new)
        finally:
            self.reader.release()
        return True

    # -- samples ---------------------------------------------------------------------------------------
    def notify(self) -> None:
        """A sample is complete (the caller stored it): wake a waiter (Event.set costs microseconds of Python: done
        only when one is counted)."""
        if self.waiters:
            self.arrived.set()

    def wait(self, timeout_s: float) -> bool:
        """Block until a sample not read yet is there (True) or timeout_s (s) passes (False); another thread reads."""
        if self.has_new():
            return True
        with self._count:
            self.waiters += 1
        try:
            self.arrived.clear()
            if self.has_new():              # arrived before the waiter was counted, or since the clear
                return True
            return self.arrived.wait(timeout_s)
        finally:
            with self._count:
                self.waiters -= 1

    # -- the cycle -------------------------------------------------------------------------------------
    def pump(self, read: Read, timeout_s: float, until_new: bool, wait_s: float = 0.0) -> bool:
        """take() in the cycle's thread, marked as the cycle's pump: the link thread stands by meanwhile and
        standby_s after. False when the link could not be taken within wait_s."""
        self.pumping = True
        self.pumped = time.monotonic()
        try:
            return self.take(read, timeout_s, until_new, wait_s)
        finally:
            self.pumped = time.monotonic()
            self.pumping = False

    def pump_new(self, read: Read | None, timeout_s: float, wait_s: float = 0.0) -> bool:
        """Arm.pump_new: True at once when a sample is unread; else read the link in this thread until one is
        complete (True) or timeout_s passes (False). When this thread cannot read it (read None: the link is down;
        or the link thread holds it longer than wait_s), wait for the link thread's sample instead."""
        if self.has_new():
            self.pumped = time.monotonic()
            return True
        end = time.monotonic() + timeout_s
        if read is None or not self.pump(read, timeout_s, True, wait_s):
            return self.wait(max(end - time.monotonic(), 0.0))
        return self.has_new()

    def pump_for(self, read: Read | None, timeout_s: float) -> bool:
        """Arm.pump_for: read the link in this thread for timeout_s, whatever arrives; False at once when it cannot
        (read None, or the link thread reads): the caller sleeps instead."""
        return read is not None and self.pump(read, timeout_s, False)
