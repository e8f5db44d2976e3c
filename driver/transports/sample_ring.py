"""The one rule of the transports' sample rings (serial, CAN, the gateway): samples are read once each, in order,
and when more than the ring holds wait unread, the oldest are lost (overwritten) and counted.

StateRing is that ring for a link that converts each sample into an ArmState (serial, the gateway); CAN keeps its
raw values in one array and uses the two functions below."""
from __future__ import annotations

from driver.hal import ArmState, copy_sample


def oldest_unread(read: int, written: int, capacity: int) -> tuple[int, int]:
    """(the sequence number of the oldest sample still in a ring of `capacity` that was not read, how many
    unread samples were overwritten) for `read` samples read and `written` written so far (read < written)."""
    lost = max(written - read - capacity, 0)
    return read + lost, lost


def unread_held(read: int, written: int, capacity: int) -> int:
    """Samples written and not read that the ring still holds."""
    return min(written - read, capacity)


class StateRing:
    """`capacity` preallocated ArmStates of n joints: a link thread fills next_slot() and commit()s it, the cycle
    take()s each once and in order. Not locked: its owner holds one lock around commit and take."""

    def __init__(self, n: int, capacity: int):
        self.capacity = capacity
        self._slots = [ArmState(n) for _ in range(capacity)]
        self.written = 0          # samples committed (the newest is _slots[(written - 1) % capacity])
        self.taken = 0            # samples take() has handed out (or skipped as overwritten)
        self.overwritten = 0      # samples lost unread (more than `capacity` waited)

    def next_slot(self) -> ArmState:
        """The slot the next sample goes into (it is not read before commit())."""
        return self._slots[self.written % self.capacity]

    def commit(self) -> None:
        """The sample in next_slot() is complete."""
        self.written += 1

    def take(self, out: ArmState) -> bool:
        """Copy the oldest sample not taken yet into out and return True; when every sample has been taken, copy
        the newest again (zeros before the first) and return False."""
        k, end = self.taken, self.written
        fresh = k != end
        if fresh:
            k, lost = oldest_unread(k, end, self.capacity)
            self.overwritten += lost
            self.taken = k + 1
        else:
            k = end - 1
        src = self._slots[k % self.capacity]
        out.device_time_ns, out.host_time_ns = src.device_time_ns, src.host_time_ns
        copy_sample(src, out)
        return fresh

    def unread(self) -> int:
        """Samples committed and not taken that the ring still holds."""
        return unread_held(self.taken, self.written, self.capacity)

    def has_unread(self) -> bool:
        return self.taken != self.written

    def skip_unread(self) -> None:
        """Forget the samples not taken (the next take() returns only later ones)."""
        self.taken = self.written
