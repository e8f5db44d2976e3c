"""sd_notify supervision: a driver started under systemd (NOTIFY_SOCKET, WATCHDOG_USEC as systemd sets them,
here a datagram socket this test binds) says READY once it serves, pings the watchdog while its cycle runs,
stops pinging while the cycle hangs (so systemd would restart it), and says STOPPING when it stops."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from driver.daemon import PLANNER_START_S, THREAD_STACK_BYTES
from driver.systemd import Supervision
from ident.model import load_model
from local_driver import local_driver

WATCHDOG_USEC = 200_000          # pings every 0.1 s


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.05)
    yield sock, str(path)
    sock.close()


def _received(sock, seconds: float) -> list[tuple[float, str]]:
    out, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            out.append((time.monotonic(), sock.recv(4096).decode()))
        except socket.timeout:
            pass
    return out


def test_ready_then_pings_while_the_cycle_runs_none_while_it_hangs_then_stopping(notify_socket, monkeypatch):
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    model = load_model("generic6")
    with local_driver(model, seed=2, watchdog_s=5.0) as (d, _):
        first = _received(sock, 1.0)
        assert first and first[0][1].startswith("READY=1\nSTATUS=generic6")
        assert sum(m == "WATCHDOG=1" for _, m in first) >= 5
        _received(sock, 0.06)                                            # drain what came before
        missed = d.supervision.missed
        d.cycle.submit(lambda: time.sleep(1.5), timeout=10.0)          # the cycle thread blocks in a call
        sock.setblocking(False)
        during = []
        while True:
            try:
                during.append(sock.recv(4096).decode())
            except BlockingIOError:
                break
        sock.settimeout(0.05)
        assert during.count("WATCHDOG=1") <= 1            # 1.5 s at a ping per 0.1 s: none (one as it resumes)
        assert d.supervision.missed - missed >= 10
        after = _received(sock, 0.8)
        assert any(m == "WATCHDOG=1" for _, m in after)                  # pings again once it runs
    end = _received(sock, 0.3)
    assert any(m == "STOPPING=1" for _, m in end)


def test_outside_systemd_nothing_is_sent_and_no_thread_runs():
    s = Supervision(lambda: 0, environ={})
    assert not s.active and s.interval_s is None
    s.ready("x")
    s.stopping()
    assert s._thread is None


def test_a_watchdog_meant_for_another_process_is_not_pinged(tmp_path):
    s = Supervision(lambda: 0, environ={"NOTIFY_SOCKET": str(tmp_path / "n"), "WATCHDOG_USEC": "100000",
                                        "WATCHDOG_PID": "1"})
    assert s.active and s.interval_s is None


def _unit() -> dict[str, str]:
    """The [Service] settings of the shipped unit (comments left out; a repeated key keeps its last value)."""
    out, section = {}, None
    for line in (Path(__file__).resolve().parents[1] / "deploy" / "armid-driver.service").read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key] = value
    return out


def _seconds(text: str) -> float:
    units = {"ms": 1e-3, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    return float(number) * units.get(text[len(number):] or "s")


def test_the_unit_waits_for_a_cold_start_and_bounds_locked_memory_without_assuming_the_cores():
    unit = _unit()
    # READY comes after the planner has loaded its kernels (at most PLANNER_START_S) and the cycle's own
    # compile on a cold cache, of the same order: the start timeout covers both
    assert _seconds(unit["TimeoutStartSec"]) >= 2 * PLANNER_START_S
    limit = unit["LimitMEMLOCK"]
    assert limit not in ("infinity", "") and limit[-1] in "KMG" and 0 < float(limit[:-1])
    assert "CPUAffinity" not in unit


STACKS = """
import ctypes, sys, threading
sys.path.insert(0, "tests")
from driver.realtime import Realtime
from ident.model import load_model
from local_driver import local_driver

def stack_bytes():
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    attr = ctypes.create_string_buffer(128)
    assert libc.pthread_getattr_np(ctypes.c_ulong(libc.pthread_self()), attr) == 0
    size = ctypes.c_size_t()
    libc.pthread_attr_getstacksize(attr, ctypes.byref(size))
    libc.pthread_attr_destroy(attr)
    return size.value

realtime = Realtime(lock_memory=True) if sys.argv[1] == "lock" else None
with local_driver(load_model("generic6"), seed=2, realtime=realtime) as (d, _):
    print(d.cycle.submit(stack_bytes, timeout=5.0), threading.stack_size())
"""


@pytest.mark.parametrize("lock", ["lock", "no-lock"])
def test_with_lock_memory_the_drivers_threads_have_small_stacks_and_others_keep_the_default(lock):
    # in a process of its own, as the daemon: glibc reuses the stack of a thread that ended for a new one
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", STACKS, lock], capture_output=True, text=True, timeout=120,
                         cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr[-2000:]
    cycle_stack, after = (int(x) for x in run.stdout.split())
    assert after == 0                                  # threads started after the driver: the default again
    if lock == "lock":
        assert cycle_stack <= THREAD_STACK_BYTES
    else:
        assert cycle_stack > THREAD_STACK_BYTES        # the default, without locking
