"""Soak test: `armid sim --transport serial` and `armid driver` at 1 kHz as processes (armid.chain) for 10
minutes, the drives enabled, a small move every 30 s (a driver fault on the way, e.g. a watchdog trip on
a loaded machine, is reset, counted and printed: the soak is about the stream and leaks). The stream loses no message, the driver's resident
memory grows by less than 5 MB after a one-minute warm-up, and its open file descriptors do not grow.

Not in the default run (10 minutes): `python -m pytest -m soak tests/test_soak.py -s` (or ARMID_SOAK=1);
ARMID_SOAK_SECONDS shortens or lengthens it (default 600)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq

from armid import chain

SECONDS = float(os.environ.get("ARMID_SOAK_SECONDS", "600"))
WARM_UP_S = min(60.0, SECONDS / 5)
SAMPLE_EVERY_S = 10.0
MOVE_EVERY_S = 30.0
RSS_GROWTH_LIMIT = 5 * 1024 * 1024    # bytes


class SeqCounter:
    """Subscribes to the state topic and counts messages and missing seq numbers."""

    def __init__(self, endpoint: str):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"state")
        self.messages = self.missing = 0
        self.last = None

    def drain(self, wait_ms: int) -> None:
        if not self.sock.poll(wait_ms):
            return
        while True:
            try:
                _, payload = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            seq = int.from_bytes(payload[12:20], "little")
            if self.last is not None:
                self.missing += max(seq - self.last - 1, 0)
            self.last = seq
            self.messages += 1

    def close(self) -> None:
        self.sock.close(0)


@pytest.mark.soak
@pytest.mark.timeout(SECONDS + 600)      # the soak itself, and a loaded machine's start and stop
def test_driver_and_simulator_at_1_khz_drop_nothing_and_leak_neither_memory_nor_file_descriptors(tmp_path):
    with chain.Chain(tmp_path / "soak", chain.plan_for("serial", 1000.0)) as c:
        c.start_sim()
        c.start_driver()
        sub = SeqCounter(c.state)
        try:
            c.enable()
            home = np.array(chain.request(c.commands, cmd="status")["q"])
            pid = c.driver.pid
            started = time.monotonic()
            end = started + SECONDS
            baseline = None
            samples = []          # (s since start, rss bytes, fds)
            faults = []           # driver faults seen (and recovered from) on the way
            next_sample, next_move, away = started + WARM_UP_S, started + MOVE_EVERY_S, False
            while time.monotonic() < end:
                sub.drain(100)
                now = time.monotonic()
                if now >= next_move:
                    target = home + (0.1 if not away else 0.0)
                    chain.request(c.commands, cmd="move_to", q=target.tolist(), speed=0.2)   # refused while faulted
                    away, next_move = not away, now + MOVE_EVERY_S
                if now >= next_sample:
                    status = chain.request(c.commands, cmd="status")
                    if status["fault"] is not None:          # recovered, counted and reported: the soak
                        faults.append(status["fault"])       # measures drops and leaks, and the recovery
                        chain.command(c.commands, "soak recovery", c.driver, cmd="fault_reset")   # path is part
                        c.enable()                                                                # of the run
                    point = (now - started, chain.rss_bytes(pid), chain.fd_count(pid))
                    baseline = baseline or point
                    samples.append(point)
                    next_sample = now + SAMPLE_EVERY_S
            sub.drain(100)
            assert c.driver.alive(), c.driver.tail()
        finally:
            sub.close()
    rss = np.array([s[1] for s in samples], dtype=float)
    fds = [s[2] for s in samples]
    print(f"\nsoak: {SECONDS:g} s, {sub.messages} state messages ({sub.messages / SECONDS:.1f}/s), {sub.missing} missing; "
          f"driver RSS after warm-up {rss[0] / 2**20:.2f} MB, at the end {rss[-1] / 2**20:.2f} MB, "
          f"max growth {(rss.max() - rss[0]) / 2**20:.2f} MB; fds {fds[0]} -> {fds[-1]} (max {max(fds)}); "
          f"{len(faults)} driver faults recovered {sorted(set(faults))}")
    assert sub.messages > 0.9 * 1000.0 * (SECONDS - 1.0)          # the stream ran at its 1 kHz
    assert sub.missing == 0
    assert rss.max() - rss[0] < RSS_GROWTH_LIMIT
    assert max(fds) <= fds[0]
