"""Rate-limited log lines for events that can come in floods (bad frames, stale cycles, refused requests).

    bad_frames = Throttle(logging.getLogger(__name__), logging.WARNING, interval_s=5.0)
    ...
    bad_frames.hit("serial: frame dropped (%s)", reason, count=dropped)    # in the loop that sees them

The first occurrence is logged at once; later ones are counted and give at most one line per `interval_s`,
which says how many came since the previous line (`count`) and in all (`total`), also as extra fields of the
record (a JSON formatter prints them). `flush()` logs what is still counted (at the end of a run). A call
costs a counter and a clock read; a record is built only when a line is due and its level is enabled.

It lives in the bottom layer, beside the real-time helpers, so that the driver and the simulator share it.
Library code only logs: the application (the `armid` command) configures the handlers.
"""
from __future__ import annotations

import logging
import time


class Throttle:
    """One kind of recurring event: the first logged at once, then one line per interval at most, with the
    count since the previous line.

    Parameters
    ----------
    logger : logging.Logger
        Where the lines go.
    level : int
        Their level.
    interval_s : float
        The shortest time between two lines (s).
    """

    def __init__(self, logger: logging.Logger, level: int, interval_s: float = 5.0):
        self.logger = logger
        self.level = level
        self.interval_s = float(interval_s)
        self.total = 0            # occurrences in all
        self.pending = 0          # occurrences not yet in a line
        self._next = 0.0          # time.monotonic() from which the next line may go out
        self._last: tuple[str, tuple, dict] | None = None

    def hit(self, msg: str, *args, count: int = 1, **fields) -> bool:
        """Count occurrences of the event; log a line when one is due.

        Parameters
        ----------
        msg, *args
            The line's message and its arguments, as for Logger.log.
        count : int
            Occurrences this call reports (default 1).
        **fields
            Extra fields of the record (a JSON formatter prints them); `count` and `total` are added.

        Returns
        -------
        bool
            True when a line went out.
        """
        self.total += count
        self.pending += count
        now = time.monotonic()
        if now < self._next:
            self._last = (msg, args, fields)
            return False
        self._next = now + self.interval_s
        return self._emit(msg, args, fields)

    def flush(self) -> bool:
        """Log the occurrences counted since the last line, if any, with the last message seen.

        Returns
        -------
        bool
            True when a line went out.
        """
        if not self.pending or self._last is None:
            self.pending = 0
            return False
        msg, args, fields = self._last
        return self._emit(msg, args, fields)

    def _emit(self, msg: str, args: tuple, fields: dict) -> bool:
        count, self.pending, self._last = self.pending, 0, None
        if not self.logger.isEnabledFor(self.level):
            return False
        self.logger.log(self.level, msg + " (%d since the last line, %d in all)", *args, count, self.total,
                        extra={**fields, "count": count, "total": self.total})
        return True
