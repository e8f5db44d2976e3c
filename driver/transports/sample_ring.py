"""The one rule of the transports' sample rings (serial, CAN): samples are read once each, in order, and when
more than the ring holds wait unread, the oldest are lost (overwritten) and counted."""
from __future__ import annotations


def oldest_unread(read: int, written: int, capacity: int) -> tuple[int, int]:
    """(the sequence number of the oldest sample still in a ring of `capacity` that was not read, how many
    unread samples were overwritten) for `read` samples read and `written` written so far (read < written)."""
    lost = max(written - read - capacity, 0)
    return read + lost, lost


def unread_held(read: int, written: int, capacity: int) -> int:
    """Samples written and not read that the ring still holds."""
    return min(written - read, capacity)
