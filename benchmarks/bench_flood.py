"""Request-flood benchmark: the driver's memory and another client's status round trip while other processes
flood the command socket without reading a reply.

`armid driver` runs as its own process (the sim transport, 1 kHz); the floods are processes of their own
(tests/flood_clients.py: requests just under the size limit that reach the planner, 20 000 status and 2000
move_to requests on one connection, 300 connections of one request each, the hostile corpus). It prints:
  - the driver's RSS at its peak during the flood and after it (once the command server has been idle for its
    trim interval), beside its RSS before the flood (reference);
  - a fresh client's first status round trip (a new REQ socket per request, as `armid command` makes) during
    the flood, p50 and max, beside the same on the quiet driver just before (reference); and the same for a
    client connected before the flood.

usage: python benchmarks/bench_flood.py [--hold 8] [--samples 20]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import flood_clients  # noqa: E402
from armid.chain import request, start_child  # noqa: E402
from driver.command_server import TRIM_INTERVAL_S  # noqa: E402

PLAN = [("large", 40), ("large", 40), ("status", 20_000), ("connections", 300), ("move", 2000), ("hostile", 5000)]
MIB = 2 ** 20


def _line(name: str, value: float, unit: str, ref_label: str, ref: float) -> None:
    print(f"{name}: {value:.4g} {unit} (reference: {ref_label} {ref:.4g} {unit}, ratio {value / ref:.3g}x)",
          flush=True)


def _fresh_status(endpoint: str) -> float:
    t0 = time.perf_counter()
    request(endpoint, timeout_s=30.0, cmd="status")
    return (time.perf_counter() - t0) * 1e3


def _connected_status(sock: zmq.Socket) -> float:
    t0 = time.perf_counter()
    sock.send(b'{"cmd": "status"}')
    if not sock.poll(30_000):
        raise SystemExit("a connected client's status had no reply within 30 s")
    sock.recv()
    return (time.perf_counter() - t0) * 1e3


def _round_trips(endpoint: str, sock: zmq.Socket, samples: int, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Fresh and connected status round trips (ms), `samples` of each spread over `seconds`."""
    fresh, connected = [], []
    for k in range(samples):
        fresh.append(_fresh_status(endpoint))
        connected.append(_connected_status(sock))
        time.sleep(max(0.0, seconds / samples - (fresh[-1] + connected[-1]) / 1e3))
    return np.array(fresh), np.array(connected)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hold", type=float, default=8.0, help="seconds the flooders keep their sockets open")
    ap.add_argument("--samples", type=int, default=20, help="status round trips of each kind, quiet and flooded")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="armid-bench-flood-") as tmp:
        folder = Path(tmp)
        commands = f"ipc://{folder}/commands"
        cfg = folder / "driver.toml"
        cfg.write_text(f'[driver]\nmodel = "generic6"\nwatchdog_ms = 500\n[transport]\nname = "sim"\n'
                       f'[zmq]\nstate = "ipc://{folder}/state"\ncommands = "{commands}"\n')
        driver = start_child("driver", ["driver", "--config", str(cfg)], folder, realtime=False)
        sock = zmq.Context.instance().socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        floods = []
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    request(commands, timeout_s=1.0, cmd="status")
                    break
                except Exception:  # noqa: BLE001 - not up yet
                    if not driver.alive() or time.monotonic() > deadline:
                        raise SystemExit(f"the driver did not start: {driver.tail()}")
            sock.connect(commands)
            quiet_fresh, quiet_connected = _round_trips(commands, sock, args.samples, 2.0)
            before = flood_clients.rss_bytes(driver.pid)
            peak, stop = [before], threading.Event()

            def sample() -> None:
                while not stop.wait(0.005):
                    peak[0] = max(peak[0], flood_clients.rss_bytes(driver.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            floods = flood_clients.start(PLAN, commands, args.hold)
            time.sleep(0.5)
            loud_fresh, loud_connected = _round_trips(commands, sock, args.samples, args.hold - 2.0)
            outputs = flood_clients.stop(floods, args.hold + 60)
            stop.set()
            sampler.join(5)
            time.sleep(TRIM_INTERVAL_S + 2.0)
            after = flood_clients.rss_bytes(driver.pid)
            stats = json.loads(json.dumps(request(commands, cmd="status")))
        finally:
            flood_clients.stop(floods, 10)
            sock.close(0)
            driver.stop()
    sent = sum(o.startswith("sent") for o in outputs)
    plan = ", ".join(f"{kind} {count}" for kind, count in PLAN)
    print(f"flood: {plan} ({sent} of {len(PLAN)} flooders sent everything), held {args.hold:g} s, never read")
    _line("flood driver RSS peak during the flood", peak[0] / MIB, "MiB", "before the flood", before / MIB)
    _line("flood driver RSS after the flood", after / MIB, "MiB", "before the flood", before / MIB)
    for label, loud, quiet in (("fresh client's first status", loud_fresh, quiet_fresh),
                               ("connected client's status", loud_connected, quiet_connected)):
        for stat, fn in (("p50", np.median), ("max", np.max)):
            _line(f"flood {label} round trip {stat} during the flood", float(fn(loud)), "ms", "quiet driver",
                  float(fn(quiet)))
    print(f"driver ok after the flood: {stats['ok']}; load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
