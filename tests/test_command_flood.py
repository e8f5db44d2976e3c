"""A request flood as a user meets it: `armid driver` (the sim transport) in its own process, floods from other
processes that never read a reply (requests just under the size limit that reach the planner, thousands of
status and move_to requests on one connection, hundreds of connections with one request each, the hostile
corpus). The driver's resident memory stays within what its configured queue bounds let clients make it
hold, returns to where it was once the flood is over, and another client's first status is answered within
its normal timeout while the flood goes on."""
from __future__ import annotations

import inspect
import threading
import time
from pathlib import Path


import flood_clients
from armid.chain import request, start_child
from armid.client import ArmClient
from driver.command_server import READ_BATCH_BYTES, RECEIVE_QUEUE, REPLY_QUEUE, TRIM_INTERVAL_S, WAITING_BYTES

HOLD_S = 6.0
PLAN = [("large", 40), ("large", 40), ("status", 20_000), ("connections", 300), ("move", 2000),
        ("hostile", 5000)]
# libzmq's own per connection: two pipes (their first chunk of 256 messages of 64 bytes each), the engine's
# input and output batches (8 KiB each), the session and engine objects: well under this
PER_CONNECTION_BYTES = 64 * 1024
TIMEOUT_S = inspect.signature(ArmClient).parameters["timeout_s"].default    # a client's normal timeout


class Peak:
    """The largest RSS of a process, sampled every few milliseconds in a thread."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, flood_clients.rss_bytes(self.pid))

    def close(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def start_driver(folder: Path):
    """`armid driver` on the sim transport, ipc endpoints in folder; (child, command endpoint)."""
    commands = f"ipc://{folder}/commands"
    cfg = folder / "driver.toml"
    cfg.write_text(f'[driver]\nmodel = "generic6"\nwatchdog_ms = 500\n[transport]\nname = "sim"\n'
                   f'[zmq]\nstate = "ipc://{folder}/state"\ncommands = "{commands}"\n')
    child = start_child("driver", ["driver", "--config", str(cfg)], folder, realtime=False)
    deadline = time.monotonic() + 90
    while True:
        try:
            request(commands, timeout_s=1.0, cmd="status")
            return child, commands
        except Exception:  # noqa: BLE001 - not up yet
            if not child.alive() or time.monotonic() > deadline:
                child.stop()
                raise AssertionError(f"the driver did not answer within 90 s: {child.tail()}")


def test_a_flood_from_other_processes_leaves_the_driver_small_and_answering(tmp_path):
    driver, commands = start_driver(tmp_path)
    floods = []
    try:
        for _ in range(5):
            reply_bytes = len(str(request(commands, cmd="status")).encode())
        base = flood_clients.rss_bytes(driver.pid)
        peak = Peak(driver.pid)
        floods = flood_clients.start(PLAN, commands, HOLD_S)
        answered, start = [], time.monotonic()
        while time.monotonic() - start < HOLD_S - 1:
            t0 = time.monotonic()
            reply = request(commands, timeout_s=TIMEOUT_S, cmd="status")   # a fresh client's first request
            answered.append((time.monotonic() - t0, reply["ok"]))
            time.sleep(0.2)
        outputs = flood_clients.stop(floods, HOLD_S + 60)
        during = peak.close() - base
        deadline = time.monotonic() + TRIM_INTERVAL_S + 10
        while (after := flood_clients.rss_bytes(driver.pid) - base) > flood_clients.LARGE_BYTES and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        stats = request(commands, cmd="status")
        assert driver.alive(), driver.tail()
    finally:
        flood_clients.stop(floods, 10)
        driver.stop()
    assert all(o.startswith("sent") for o in outputs), outputs
    assert len(answered) >= 3 and all(ok for _, ok in answered), answered
    # what the configured bounds let the flood make the driver hold: per connection its queued requests (and
    # the one being read) and the replies it never reads, ZeroMQ's own structures; the requests waiting; a
    # turn's reading; the job of a request handed to the planner
    bound = (sum(flood_clients.connections([(kind, count)])
                 * ((RECEIVE_QUEUE + 1) * flood_clients.largest(kind, count) + REPLY_QUEUE * reply_bytes)
                 for kind, count in PLAN)
             + flood_clients.connections(PLAN) * PER_CONNECTION_BYTES
             + WAITING_BYTES + READ_BATCH_BYTES + 2 * flood_clients.LARGE_BYTES)
    print(f"RSS +{during / 2**20:.1f} MiB during the flood (bound {bound / 2**20:.1f} MiB), +{after / 2**20:.2f} MiB "
          f"after; status answered in at most {max(t for t, _ in answered):.3f} s")
    assert during <= bound, f"RSS grew {during / 2**20:.1f} MiB during the flood, bound {bound / 2**20:.1f} MiB"
    assert after <= flood_clients.LARGE_BYTES, f"RSS still {after / 2**20:.1f} MiB higher after the flood"
    assert stats["ok"] and stats["fault"] is None
