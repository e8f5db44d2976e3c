"""Waiting for the next cycle without spinning a core.

`sleep_until(deadline_ns, spin_ns)` sleeps (the GIL released) until spin_ns before the deadline, then
busy-waits the rest on time.perf_counter_ns. Linux delays a sleeping thread's wake-up by up to its *timer
slack* (50 us by default) so that it can batch timers; `reduce_timer_slack()` sets the calling thread's slack
to 1 ns (prctl PR_SET_TIMERSLACK), so that a plain sleep wakes within the scheduler's latency and the spin
can stay short (the spin holds the GIL and a core: 200 us of spin per 1 ms cycle is 20 % of a core).
benchmarks/bench_driver.py --timer measures lateness and CPU of both settings.
"""
from __future__ import annotations

import ctypes
import sys
import time

PR_SET_TIMERSLACK = 29           # linux/prctl.h
DEFAULT_SPIN_S = 50e-6           # with the slack reduced, sleep overshoots by a few tens of us on an idle PC


def reduce_timer_slack(slack_ns: int = 1) -> bool:
    """Set the calling thread's timer slack (ns); True when the kernel took it (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def sleep_until(deadline_ns: int, spin_ns: int) -> None:
    """Return at deadline_ns (time.perf_counter_ns clock): sleep until spin_ns before it, then spin."""
    remaining = deadline_ns - time.perf_counter_ns()
    if remaining > spin_ns:
        time.sleep((remaining - spin_ns) * 1e-9)
    while time.perf_counter_ns() < deadline_ns:
        pass
