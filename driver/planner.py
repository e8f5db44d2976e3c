"""Motion planning in a process of its own, so that no plan can pause the cycle or the stream.

Planning a long motion allocates and computes for up to seconds (spline, inverse dynamics, the limit
checks over every sample), and reading a trajectory file can block. In the daemon's process either would
hold the interpreter lock and stall the 1 kHz cycle. The planner process (`python -m driver.planner`, a
fresh interpreter that shares nothing with the daemon; jobs and answers are pickled over its stdin and
stdout with multiprocessing.connection) takes one job at a time: the raw request bytes and what the plan needs
(the planning model, the current pose, the rate, the bounds). It decodes and checks the request, plans
(driver.motion), and writes the setpoints into a file in a private folder (in /dev/shm when there is one);
the daemon maps that file (numpy memmap), so a plan of any allowed size crosses without a copy.

Jobs cross the same way: the daemon writes the pickled job into the folder and sends only its short name.
A message that small is written whole or not at all (POSIX PIPE_BUF), and the daemon's end of the pipe is
non-blocking, so no write can wait on a planner that is still starting, busy or hung: a full pipe is a
planner that cannot be reached, and it is restarted.

The daemon's command server owns the Planner and polls `fileno()` with its socket: `submit` sends a job and
returns at once, `collect` takes the answer when it is ready. A job that runs past `timeout_s`, or a
process that dies, costs that job only: the process is killed and started again.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from driver.motion import MAX_MOTION_S
from ident.errors import InputError

_log = logging.getLogger(__name__)

PLANNER_NICE = 10             # the planner process's niceness, added to the daemon's
PLAN_TIMEOUT_S = 60.0          # the longest a plan may take (the largest allowed plans take a few seconds)


@dataclass(frozen=True)
class PlanBounds:
    """What a plan may be: its longest duration (s), where trajectory files may be read from (None: no
    files; only the trajectory inline), and whether its torque feed-forward holds the model's friction."""

    max_motion_s: float = MAX_MOTION_S
    trajectory_dir: str | None = None
    friction: bool = True


@dataclass(frozen=True)
class PlanJob:
    raw: bytes
    model: object                 # ident.model.Model with the payload merged
    q_now: np.ndarray
    rate_hz: float
    bounds: PlanBounds


class PlannerError(InputError):
    """The planner could not answer (busy, timed out, its process died)."""


def _mkdir() -> str:
    shm = Path("/dev/shm")
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="armid-plans-", dir=base)


def _spawn(folder: str) -> tuple[subprocess.Popen, Connection, Connection]:
    """Start `python -m driver.planner FOLDER`: the process, the pipe its jobs go on (non-blocking) and the
    pipe its answers come on."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent.parent)        # the folder that holds the driver package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "driver.planner", folder], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, close_fds=True, start_new_session=True)
    send = Connection(os.dup(proc.stdin.fileno()), readable=False)
    os.set_blocking(send.fileno(), False)      # a write never waits (module docstring)
    conn = Connection(os.dup(proc.stdout.fileno()), writable=False)
    proc.stdin.close()
    proc.stdout.close()
    return proc, send, conn


# -- processes started ahead, and handed back ---------------------------------------------------------------
@dataclass
class _Spare:
    folder: str
    proc: subprocess.Popen
    send: Connection
    conn: Connection
    ready: bool               # its ready message was read already (a process handed back by a driver)


SPARES_KEPT = 2                 # at most this many idle planner processes wait for the next driver
_spare_lock = threading.Lock()
_spares: list[_Spare] = []
_keeping = False
_spare_pid = 0                  # the process that started the spares (a forked child must not stop them)


def keep_spare(on: bool = True) -> None:
    """Keep (on) a planner process started ahead in this process, loading its kernels meanwhile: the next Driver
    to start takes it, ready or nearly so, instead of waiting for a fresh one, and a stopping driver hands its
    process back, idle and ready, for the one after (at most SPARES_KEPT wait). For a process that starts drivers
    one after another (a test run); a daemon that starts one driver gains nothing. keep_spare(False) stops the
    spares. Planner() alone (spare=False) never takes one."""
    global _keeping, _spare_pid
    with _spare_lock:
        _keeping = on
        if on and not _spares:
            _spare_pid = os.getpid()
            _start_spare()
        elif not on:
            while _spares:
                _end(_spares.pop())


def _start_spare() -> None:
    folder = _mkdir()
    _spares.append(_Spare(folder, *_spawn(folder), ready=False))


def _end(spare: _Spare) -> None:
    spare.send.close()
    spare.conn.close()
    spare.proc.kill()
    try:
        spare.proc.wait(5.0)
    except subprocess.TimeoutExpired:
        pass
    shutil.rmtree(spare.folder, ignore_errors=True)


def _take_spare() -> _Spare | None:
    """A spare process, one that a driver handed back first (then, when none is left, the next one is started);
    None when none is kept."""
    with _spare_lock:
        if not _keeping or os.getpid() != _spare_pid:
            return None
        for spare in [s for s in _spares if s.proc.poll() is not None]:     # ended (killed from outside)
            _spares.remove(spare)
            _end(spare)
        if not _spares:
            _start_spare()
            return None
        _spares.sort(key=lambda s: s.ready)
        taken = _spares.pop()
        if not _spares:
            _start_spare()
        return taken


def _hand_back(spare: _Spare) -> bool:
    """Keep a stopping driver's planner process (idle, ready, nothing unread on its pipe) for the next driver:
    True when kept; False when the caller must end it (no spares kept, or SPARES_KEPT wait already)."""
    with _spare_lock:
        if not _keeping or os.getpid() != _spare_pid or len(_spares) >= SPARES_KEPT:
            return False
        try:
            left = os.listdir(spare.folder)               # what a job left (a plan never mapped): not the next's
        except OSError:
            return False
        for name in left:
            _unlink(os.path.join(spare.folder, name))
        _spares.append(spare)
        return True


def _stop_at_exit() -> None:
    if os.getpid() == _spare_pid:
        keep_spare(False)


atexit.register(_stop_at_exit)


class Planner:
    """The planner process seen from the daemon (module docstring). Not thread-safe: one owner thread."""

    def __init__(self, timeout_s: float = PLAN_TIMEOUT_S, *, spare: bool = False):
        self.timeout_s = float(timeout_s)
        self._spare = spare                          # take the process keep_spare() started ahead
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._conn: Connection | None = None         # answers come on this one
        self._dir: str | None = None
        self._pending: tuple[str, float] | None = None     # (command, deadline) of the job in flight
        self.ready = False                           # the process has loaded its kernels (its ready message read)
        self._jobs = 0
        self.restarts = 0
        self.timeouts = 0

    # -- life cycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the process (its imports and kernels load in the background: the first job waits). A planner
        made with spare=True takes the process that keep_spare() started ahead, when there is one."""
        if self._dir is None and self._spare and (taken := _take_spare()) is not None:
            self._dir, self._proc, self._send, self._conn = taken.folder, taken.proc, taken.send, taken.conn
            self.ready = taken.ready
            return
        if self._dir is None:
            self._dir = _mkdir()
        self._proc, self._send, self._conn = _spawn(self._dir)
        self.ready = False

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until the process has loaded its kernels (at most timeout_s); True when it has."""
        deadline = time.monotonic() + timeout_s
        while not self.ready and self._pending is None and time.monotonic() < deadline:
            if self._conn.poll(min(0.1, max(0.0, deadline - time.monotonic()))):
                self._take_ready()
        return self.ready

    def _take_ready(self) -> bool:
        """Read the process's ready message if it is next on the pipe (True when it was)."""
        try:
            answer = self._conn.recv()
        except (EOFError, OSError):
            self._restart("its process ended while starting")
            return False
        if answer != ("ready",):
            raise RuntimeError(f"planner: unexpected message {answer[:1]!r} before ready")
        self.ready = True
        return True

    def close(self) -> None:
        """End the process; one taken as a spare (spare=True) goes back to the spares instead when it is ready and
        idle (keep_spare)."""
        if (self._spare and self.ready and self._pending is None and self._proc is not None
                and self._proc.poll() is None and not self._conn.poll(0)
                and _hand_back(_Spare(self._dir, self._proc, self._send, self._conn, ready=True))):
            self._dir = self._proc = self._send = self._conn = None
            return
        self._kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _kill(self) -> None:
        for conn in (self._send, self._conn):
            if conn is not None:
                conn.close()
        self._send = self._conn = None
        if self._proc is not None:
            self._proc.kill()
            try:
                self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
            self._proc = None
        self._pending = None

    def _restart(self, why: str) -> None:
        _log.error("planner: %s; restarting it", why)
        self.restarts += 1
        self._kill()
        self.start()

    # -- jobs ----------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self._pending is not None

    def fileno(self) -> int:
        """The pipe the answers come on (for zmq.Poller / select)."""
        if self._conn is None:
            self.start()
        return self._conn.fileno()

    def submit(self, cmd: str, job: PlanJob) -> None:
        """Send a job; PlannerError when one is still in flight."""
        if self._pending is not None:
            raise PlannerError(f"{cmd}: the planner is busy with {self._pending[0]}; send it again when that "
                               f"one has been answered")
        if self._conn is None or self._proc is None or self._proc.poll() is not None:
            self._restart("its process is not running")
        path = os.path.join(self._dir, f"job-{self._jobs + 1}.pkl")
        try:
            with open(path, "wb") as f:
                pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)
            self._send.send(("job", path))
        except (OSError, ValueError) as exc:
            _unlink(path)
            self._restart(f"cannot send it a job ({exc})")
            raise PlannerError(f"{cmd}: the planner was not reachable; send it again") from None
        self._pending = (cmd, time.monotonic() + self.timeout_s)
        self._jobs += 1

    def overdue(self) -> str | None:
        """When the job in flight has run past timeout_s: restart the process and return the job's error."""
        if self._pending is None or time.monotonic() < self._pending[1]:
            return None
        cmd = self._pending[0]
        self.timeouts += 1
        self._restart(f"{cmd} took longer than {self.timeout_s:g} s")
        return f"{cmd}: planning took longer than {self.timeout_s:g} s and was stopped"

    def collect(self):
        """The answer of the job in flight once it is ready (the pipe is readable): a motion.PlannedMotion,
        or an error text; None when nothing is ready."""
        if self._pending is None or self._conn is None or not self._conn.poll(0):
            return None
        if not self.ready:
            self._take_ready()
            return None
        cmd = self._pending[0]
        try:
            answer = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._restart(f"its process ended during {cmd} ({type(exc).__name__})")
            return f"{cmd}: the planner process ended while planning; send it again"
        self._pending = None
        kind = answer[0]
        if kind != "plan":
            return answer[1]
        return _load_plan(*answer[1:])

    def stats(self) -> dict:
        return {"ready": self.ready, "jobs": self._jobs, "restarts": self.restarts, "timeouts": self.timeouts,
                "busy": None if self._pending is None else self._pending[0]}


def _load_plan(path: str, name: str, rate_hz: float, segments, preempt: bool = False, friction: bool = True):
    from driver.motion import PlannedMotion

    try:
        arr = np.asarray(np.load(path, mmap_mode="r"))
    finally:
        _unlink(path)           # the mapping stays valid; nothing is left behind
    q, qd, qdd, tau = arr
    return PlannedMotion(name, rate_hz, q, qd, qdd, tau, tuple((str(n), int(k)) for n, k in segments), bool(preempt),
                         bool(friction))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _read_job(message) -> PlanJob:
    """The job a ("job", path) message names; the file is removed once read."""
    kind, path = message
    if kind != "job":
        raise RuntimeError(f"planner: unexpected message {kind!r}")
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    finally:
        _unlink(path)


# -- the planner process -----------------------------------------------------------------------------
def background() -> None:
    """This process (its one thread, before numba starts any) at the default policy and PLANNER_NICE more:
    a daemon run with a real-time policy for the whole process (chrt, a parent's setting) would hand it down,
    and a plan computed at a real-time priority holds a core, and every thread waiting for it, for its length."""
    if hasattr(os, "sched_setscheduler") and os.sched_getscheduler(0) != os.SCHED_OTHER:
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass
    try:
        os.nice(PLANNER_NICE)                            # background work: the cycle wins the CPU
    except OSError:
        pass


def _serve(jobs: Connection, answers: Connection, folder: str) -> None:
    """The planner process's loop: a job in, ("plan", path, name, rate, segments) or ("error", text) out."""
    import signal

    import warnings

    signal.signal(signal.SIGINT, signal.SIG_IGN)        # Ctrl-C is the daemon's to handle
    background()
    warnings.simplefilter("ignore", RuntimeWarning)      # overflow on a hostile request: its refusal says why
    from driver import motion
    from driver.plan_requests import plan_request

    _warm_up(motion)
    try:
        answers.send(("ready",))
    except (OSError, ValueError):        # the daemon stopped while this process started: nothing to serve
        return
    count = 0
    while True:
        try:
            message = jobs.recv()
        except (EOFError, OSError):
            return
        try:
            job = _read_job(message)
            plan = plan_request(job.raw, job.model, job.q_now, job.rate_hz, job.bounds)
            count += 1
            path = os.path.join(folder, f"plan-{count}.npy")
            np.save(path, np.stack([plan.q, plan.qd, plan.qdd, plan.tau_ff]))
            answer = ("plan", path, plan.name, plan.rate_hz, [(n, int(k)) for n, k in plan.segments], plan.preempt,
                      plan.friction)
        except InputError as exc:
            answer = ("error", str(exc))
        except MemoryError:
            answer = ("error", "planning ran out of memory")
        except Exception as exc:  # noqa: BLE001 - reported to the client, the process goes on
            answer = ("error", f"planning failed: {type(exc).__name__}: {exc}")
        try:
            answers.send(answer)
        except (OSError, ValueError):
            return


def _warm_up(motion) -> None:
    """Load the planning kernels before the first job (a short move of a small arm's model)."""
    try:
        from ident.model import load_model

        model = load_model("generic6")
        motion.plan_move(model, np.zeros(model.n), np.full(model.n, 0.01), 1000.0)
    except Exception:  # noqa: BLE001 - only a warm-up
        pass


def main(argv: list[str]) -> None:
    """`python -m driver.planner FOLDER`: jobs on stdin, answers on stdout (anything else printed goes to
    stderr, so that nothing stray reaches the answers)."""
    answers = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    _serve(Connection(os.dup(0), writable=False), answers, argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
