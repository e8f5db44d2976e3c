"""sd_notify supervision: a driver started under systemd (NOTIFY_SOCKET, WATCHDOG_USEC as systemd sets them,
here a datagram socket this test binds) says READY once it serves, pings the watchdog while its cycle runs,
stops pinging while the cycle hangs (so systemd would restart it), and says STOPPING when it stops."""
from __future__ import annotations

import socket
import time

import pytest

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
