"""systemd supervision of the daemon (sd_notify): READY when the driver serves, STOPPING when it stops, and
WATCHDOG pings only while its cycle advances, so that a `Type=notify` unit with `WatchdogSec=` restarts a
daemon whose cycle hangs (deploy/armid-driver.service).

Nothing happens outside systemd (no NOTIFY_SOCKET in the environment). The pings come from a thread of their
own, every half of WATCHDOG_USEC, and only when the cycle counter moved since the last one: a cycle blocked
in a call, a deadlock or a stopped interpreter thread stops them, and systemd kills and restarts the
process after WatchdogSec (Restart=on-failure). The cycle itself sends nothing: a datagram per cycle would be
a system call in the 1 kHz loop.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import sdnotify

_log = logging.getLogger(__name__)


class Supervision:
    """sd_notify for one daemon. `progress()` returns a number that grows while the daemon is healthy (the
    cycle count)."""

    def __init__(self, progress: Callable[[], int], environ: dict | None = None):
        env = os.environ if environ is None else environ
        self.active = bool(env.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.active else None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        ours = not pid or pid == str(os.getpid())
        self.interval_s = int(usec) / 2e6 if self.active and usec.isdigit() and int(usec) > 0 and ours else None
        self._progress = progress
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pings = 0
        self.missed = 0

    def notify(self, text: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(text)

    def ready(self, status: str) -> None:
        """READY=1 with a status line; starts the watchdog pings when systemd asked for them."""
        self.notify(f"READY=1\nSTATUS={status}")
        if self.interval_s is not None and self._thread is None:
            self._thread = threading.Thread(target=self._ping, name="armid-watchdog", daemon=True)
            self._thread.start()

    def stopping(self) -> None:
        """STOPPING=1, and no more pings."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None
        self.notify("STOPPING=1")

    def _ping(self) -> None:
        last = self._progress()
        while not self._stop.wait(self.interval_s):
            now = self._progress()
            if now != last:
                self.notify("WATCHDOG=1")
                self.pings += 1
            else:
                self.missed += 1
                if self.missed == 1 or self.missed % 10 == 0:
                    _log.error("watchdog: the cycle has not advanced for %g s; no ping to systemd (%d missed)",
                               self.interval_s, self.missed, extra={"missed": self.missed})
            last = now
