"""Waiting for the next cycle without spinning a core, and naming real-time threads: the driver's cycle and
link threads and the simulator's clock use these (so they sit in the bottom layer, under both).

`sleep_until(deadline_ns)` blocks (the GIL released) until an absolute deadline on the time.perf_counter_ns
clock (CLOCK_MONOTONIC on Linux) with one `clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)` through ctypes:
the kernel wakes the thread at the deadline itself, so no relative duration is computed (and overshot) in
Python. Linux delays a sleeping thread's wake-up by up to its *timer slack* (50 us by default) so that it can
batch timers; `reduce_timer_slack()` sets the calling thread's slack to 1 ns (prctl PR_SET_TIMERSLACK), so the
wake-up comes within the scheduler's latency (tens of us on an idle kernel, well inside a 1 ms period).
A spin (busy-wait on the clock for the last spin_ns, holding the GIL and a core) is still available for a
caller that wants single-microsecond wake-ups and can pay for them; the default is no spin
(benchmarks/bench_driver.py --timer measures lateness and CPU of both).
"""
from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
import time

PR_SET_NAME = 15                 # linux/prctl.h
PR_SET_TIMERSLACK = 29
CLOCK_MONOTONIC = 1              # linux/time.h; time.perf_counter_ns reads this clock on Linux
TIMER_ABSTIME = 1
DEFAULT_SPIN_S = 0.0             # no spin: clock_nanosleep with 1 ns slack wakes within the scheduler latency


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc_clock_nanosleep():
    """libc's clock_nanosleep (argtypes set), or None off Linux / when it cannot be loaded."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).clock_nanosleep
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Timespec), ctypes.POINTER(_Timespec))
    fn.restype = ctypes.c_int
    return fn


_CLOCK_NANOSLEEP = _libc_clock_nanosleep()
_MONOTONIC_IS_PERF = sys.platform.startswith("linux") and \
    time.get_clock_info("perf_counter").implementation == "clock_gettime(CLOCK_MONOTONIC)"


def reduce_timer_slack(slack_ns: int = 1) -> bool:
    """Set the calling thread's timer slack (ns); True when the kernel took it (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def name_os_thread(name: str | None = None) -> bool:
    """Give the calling thread a name in the kernel too (first 15 bytes; `top -H`, /proc/PID/task/TID/comm and
    per-thread CPU figures show it): by default its Python name without the "armid-" prefix. True when the
    kernel took it (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    if name is None:
        name = threading.current_thread().name.removeprefix("armid-")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def sleep_until(deadline_ns: int, spin_ns: int = 0) -> None:
    """Return at or after deadline_ns (time.perf_counter_ns clock): block until spin_ns before it (an absolute
    clock_nanosleep on Linux, else time.sleep), then busy-wait the rest (nothing with spin_ns 0)."""
    wake_ns = deadline_ns - spin_ns
    if _CLOCK_NANOSLEEP is not None and _MONOTONIC_IS_PERF:
        if wake_ns > time.perf_counter_ns():
            ts = _Timespec(wake_ns // 1_000_000_000, wake_ns % 1_000_000_000)
            while _CLOCK_NANOSLEEP(CLOCK_MONOTONIC, TIMER_ABSTIME, ts, None) == errno.EINTR:
                pass            # a signal: the absolute deadline is unchanged, sleep again
    else:
        remaining = wake_ns - time.perf_counter_ns()
        if remaining > 0:
            time.sleep(remaining * 1e-9)
    while time.perf_counter_ns() < deadline_ns:
        pass


# -- real-time scheduling where the process may take it ---------------------------------------------------------
DEFAULT_RT_PRIORITY = 50         # SCHED_FIFO priority of the 1 kHz loops by default: above the kernel's threaded
                                 # interrupts' default (50 is theirs on PREEMPT_RT; equal is fair FIFO order) and
                                 # far below the watchdog/migration threads (99)
_CAP_SYS_NICE = 23               # linux/capability.h
RT_OFF_ENV = "ARMID_REALTIME"    # "0" in the environment: no real-time scheduling by default (a benchmark's reference)


def rt_permission(priority: int = DEFAULT_RT_PRIORITY) -> str | None:
    """Why this process may take SCHED_FIFO at `priority` ("root", "CAP_SYS_NICE", "RLIMIT_RTPRIO N"), or None
    when it may not (off Linux, or ARMID_REALTIME=0 in the environment). Every thread that takes it sleeps each period (an absolute clock_nanosleep),
    and the kernel's real-time throttling (sched_rt_runtime_us, 950 ms of each 1 s by default) leaves the rest of
    the machine 5 % even if one never did."""
    if not sys.platform.startswith("linux") or not hasattr(os, "sched_setscheduler"):
        return None
    if os.environ.get(RT_OFF_ENV) == "0":
        return None
    if os.geteuid() == 0:
        return "root"
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:") and int(line.split()[1], 16) >> _CAP_SYS_NICE & 1:
                    return "CAP_SYS_NICE"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
    except (ImportError, OSError, AttributeError):
        return None
    if soft == resource.RLIM_INFINITY or soft >= priority:
        return f"RLIMIT_RTPRIO {'unlimited' if soft == resource.RLIM_INFINITY else soft}"
    return None


def rt_priority_within_limit(priority: int = DEFAULT_RT_PRIORITY) -> int:
    """`priority`, lowered to RLIMIT_RTPRIO when that is what permits real time (and below it)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_RTPRIO)
    except (ImportError, OSError, AttributeError):
        return priority
    if os.geteuid() != 0 and soft != resource.RLIM_INFINITY and 0 < soft < priority:
        return int(soft)
    return priority


def take_fifo(priority: int, tid: int = 0) -> bool:
    """SCHED_FIFO at `priority` for the thread `tid` (0: the calling one); False when the OS refuses."""
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
        return True
    except (OSError, AttributeError):
        return False
