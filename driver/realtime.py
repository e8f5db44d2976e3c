"""The driver's own real-time settings (the `[realtime]` section of its config; deploy/RT.md).

    rt = Realtime(priority=80, threads=("cycle", "zmq-io"), cpus=(3,), lock_memory=True)
    applied = apply(rt, {"cycle": tid, "zmq-io": tid2}, warn=log)   # per thread, by native thread id
    in_effect({"cycle": tid, ...})     # what the kernel reports now: policy, priority, CPUs, locked memory
    applied.restore()                  # back to what the threads had (the driver's stop)

Per thread, not per process: SCHED_FIFO at `priority` (os.sched_setscheduler on the native thread id, Linux
threading.get_native_id) and the CPU affinity `cpus` (os.sched_setaffinity) for the threads named in
`threads`: the cycle, libzmq's I/O threads (the state stream leaves through them: kernel names ZMQbg/IO/N,
found in /proc/self/task) and, when asked, the serial transport's link thread. The health reporter, the
command server and the recorder stay at the default policy: they plan, format JSON and write files, and a
SCHED_FIFO thread doing that would hold a core from everything else. libzmq's own ZMQ_THREAD_SCHED_POLICY
context option is not used: it applies only to I/O threads started after it is set (the driver may share a
running context), and libzmq aborts the process when the OS refuses it.

lock_memory: mlockall(MCL_CURRENT), then mlockall(MCL_FUTURE | MCL_ONFAULT), through libc (ctypes): what is
mapped stays resident (no page faults in the cycle), and memory mapped later is locked page by page as it is
first touched rather than filled in whole at mmap (thread stacks count in full).

When the OS refuses a setting (EPERM: no CAP_SYS_NICE and RLIMIT_RTPRIO below the priority; ENOMEM:
RLIMIT_MEMLOCK too small; EINVAL: a CPU outside the process's cpuset) the driver logs one warning naming the
setting and runs on; with required = true it is a RealtimeError instead (and the driver does not start).
"""
from __future__ import annotations

import ctypes
import gc
import os
import sys
from dataclasses import dataclass, field
from typing import Callable

from firmware_bridge.runtime.errors import InputError

THREADS = ("cycle", "zmq-io", "serial-link")   # the threads [realtime] may make real-time
DEFAULT_THREADS = ("cycle", "zmq-io")
ZMQ_IO_PREFIX = "ZMQbg/IO/"                    # libzmq's kernel name for its I/O threads
MCL_CURRENT, MCL_FUTURE, MCL_ONFAULT = 1, 2, 4  # sys/mman.h (MCL_ONFAULT: Linux 4.4)
PRIORITY_RANGE = (1, 99)                       # SCHED_FIFO on Linux
_POLICY_NAMES = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH", "SCHED_IDLE")
                 if hasattr(os, n)}


class RealtimeError(InputError):
    """A real-time setting the OS refused while the config says required = true."""


@dataclass(frozen=True)
class Realtime:
    """What [realtime] asks for. priority: SCHED_FIFO priority 1-99 of `threads` (None: leave the policy);
    cpus: CPU numbers those threads may run on (None: leave the affinity); lock_memory: mlockall the process;
    required: a refused setting stops the driver instead of a warning."""

    priority: int | None = None
    threads: tuple[str, ...] = DEFAULT_THREADS
    cpus: tuple[int, ...] | None = None
    lock_memory: bool = False
    required: bool = False


@dataclass
class Applied:
    """What apply() changed, so that restore() can undo it: per thread id its previous policy, priority and
    CPUs; whether the memory was locked; the warnings given."""

    saved: list[tuple[int, int, int, set[int]]] = field(default_factory=list)
    locked: bool = False
    warnings: list[str] = field(default_factory=list)

    def restore(self) -> None:
        """Give the threads still alive their previous scheduling and affinity back; unlock the memory."""
        for tid, policy, priority, cpus in self.saved:
            for undo in (lambda: os.sched_setscheduler(tid, policy, os.sched_param(priority)),
                         lambda: os.sched_setaffinity(tid, cpus)):
                try:
                    undo()
                except OSError:  # the thread has ended (the cycle's), or the OS refused the setting: nothing to undo
                    pass
        self.saved.clear()
        if self.locked:
            _libc().munlockall()
            self.locked = False


def by_default(info: Callable[[str], None]) -> Realtime | None:
    """What a driver without a [realtime] section takes: SCHED_FIFO at DEFAULT_RT_PRIORITY (lowered to
    RLIMIT_RTPRIO when that is what permits it) for the cycle and libzmq's I/O threads, and locked memory, when
    the process may (root, CAP_SYS_NICE or RLIMIT_RTPRIO > 0); else None, the default scheduler. One line
    through info either way."""
    from firmware_bridge.runtime.rt_timing import DEFAULT_RT_PRIORITY, rt_permission, rt_priority_within_limit

    why = rt_permission(1)
    if why is None:
        info("realtime: not permitted (not root, no CAP_SYS_NICE, RLIMIT_RTPRIO 0, or ARMID_REALTIME=0): the "
             "cycle runs at the default priority; deploy/RT.md says how to allow it")
        return None
    priority = rt_priority_within_limit(DEFAULT_RT_PRIORITY)
    info(f"realtime: SCHED_FIFO {priority} for the {' and '.join(DEFAULT_THREADS)} threads, memory locked "
         f"(permitted: {why}; a [realtime] section overrides)")
    return Realtime(priority=priority, lock_memory=True)


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def threads_named(prefix: str, pid: int | str = "self") -> list[int]:
    """Native ids of the threads of a process whose kernel name (/proc/PID/task/TID/comm) starts with prefix."""
    out = []
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/comm") as f:
                if f.read().rstrip("\n").startswith(prefix):
                    out.append(int(tid))
        except OSError:       # the thread ended meanwhile
            continue
    return sorted(out)


def apply(settings: Realtime, threads: dict[str, int | list[int]], warn: Callable[[str], None],
          applied: Applied | None = None) -> Applied:
    """Apply settings to the threads (label -> native thread id or ids) and the process; one warning per
    refused setting through warn, or RealtimeError when settings.required (what was applied before it is
    undone first). applied: an earlier apply's result to extend (its changes are undone with these)."""
    applied = Applied() if applied is None else applied
    try:
        _apply(settings, threads, warn, applied)
    except RealtimeError:
        applied.restore()
        raise
    return applied


def _apply(settings: Realtime, threads: dict[str, int | list[int]], warn: Callable[[str], None],
           applied: Applied) -> None:
    def refused(key: str, what: str, exc: OSError) -> None:
        hint = {"priority": "run as root, with CAP_SYS_NICE, or with RLIMIT_RTPRIO >= the priority "
                            "(systemd LimitRTPRIO=, /etc/security/limits.conf rtprio)",
                "cpus": "use CPUs of this machine that the process may run on (its cpuset, systemd CPUAffinity=)",
                "lock_memory": "run as root, with CAP_IPC_LOCK, or with RLIMIT_MEMLOCK unlimited "
                               "(systemd LimitMEMLOCK=infinity)"}[key]
        text = f"realtime.{key}: {what} refused by the OS: {os.strerror(exc.errno or 0)}; {hint}"
        if settings.required:
            raise RealtimeError(f"{text} (required = true)")
        if not any(w.startswith(f"realtime.{key}:") for w in applied.warnings):
            applied.warnings.append(f"{text}; running without it")
            warn(applied.warnings[-1])

    if not sys.platform.startswith("linux"):
        if settings.priority is not None or settings.cpus is not None or settings.lock_memory:
            refused("priority", "real-time settings off Linux", OSError(38, "not supported"))
        return
    if settings.lock_memory:
        libc = _libc()
        if libc.mlockall(MCL_CURRENT) == 0:
            # later mappings are locked as their pages are touched, not filled in whole by mmap: a motion's
            # setpoints (driver/planner.py maps them, up to a hundred MB) would otherwise hold the process's memory
            # map for tens of ms, and every thread that faults meanwhile, the cycle too, with it
            if libc.mlockall(MCL_FUTURE | MCL_ONFAULT) != 0:
                libc.mlockall(MCL_CURRENT | MCL_FUTURE)      # a kernel without MCL_ONFAULT
            applied.locked = True
        else:
            refused("lock_memory", "mlockall(MCL_CURRENT | MCL_FUTURE)", OSError(ctypes.get_errno(), ""))
    for label, ids in threads.items():
        for tid in [ids] if isinstance(ids, int) else ids:
            try:
                before = (tid, os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority,
                          os.sched_getaffinity(tid))
            except OSError:
                continue             # the thread ended
            applied.saved.append(before)
            if settings.cpus is not None:
                try:
                    os.sched_setaffinity(tid, settings.cpus)
                except OSError as exc:
                    refused("cpus", f"CPUs {list(settings.cpus)} for the {label} thread", exc)
            if settings.priority is not None:
                try:
                    os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(settings.priority))
                except OSError as exc:
                    refused("priority", f"SCHED_FIFO {settings.priority} for the {label} thread", exc)


def in_effect(threads: dict[str, int | list[int]], applied: Applied | None = None, gc_frozen: int = 0) -> dict:
    """What the kernel reports now for the threads (label -> id or ids): policy, priority and CPUs per thread;
    locked memory (VmLck, KiB); the garbage collector (gc_frozen: the objects frozen at start-up, as the caller
    counted them once -- gc.get_freeze_count() walks them all, ~30 ms holding the interpreter; collections per
    generation); the warnings of a refused setting. Read from the OS, so a systemd unit's settings show as well
    as ours. Costs ~0.1 ms: the health reporter calls it every second."""
    out: dict[str, object] = {}
    per_thread = {}
    for label, ids in threads.items():
        for i, tid in enumerate([ids] if isinstance(ids, int) else ids):
            name = label if isinstance(ids, int) or len(ids) == 1 else f"{label}/{i}"
            try:
                policy = os.sched_getscheduler(tid)
                per_thread[name] = {"tid": tid, "policy": _POLICY_NAMES.get(policy, str(policy)),
                                    "priority": os.sched_getparam(tid).sched_priority,
                                    "cpus": sorted(os.sched_getaffinity(tid))}
            except OSError:
                continue
    out["threads"] = per_thread
    out["locked_kib"] = _status_kib("VmLck")
    out["memory_locked"] = bool(applied is not None and applied.locked) or out["locked_kib"] > 0
    out["gc_frozen"] = gc_frozen
    out["gc_collections"] = [s["collections"] for s in gc.get_stats()]
    out["refused"] = [] if applied is None else list(applied.warnings)
    return out


def _status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0
