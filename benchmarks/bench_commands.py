"""Command-plane benchmark: hostile requests per second, the stream while the largest plan is made, and
quick_stop latency under a request flood.

`armid driver` runs as its own process (simulated arm in its process, 1 kHz, the default scheduling policy);
this script is the client. It prints:
  - hostile requests answered per second (the corpus of tests/hostile_requests.py, pipelined 48 in flight),
    beside plain `status` requests pipelined the same way (reference);
  - the longest gap between consecutive state messages (from their host timestamps, so the subscriber's own
    wake-ups do not count) while the planner makes the largest motion the driver allows (max_motion_s of
    samples), beside the longest gap over the same time with nothing planned (reference). Target: no gap
    beyond two cycles;
  - quick_stop latency (request sent to reply received; the reply leaves after the cycle has acted on it)
    while a second process floods the socket, beside the same without a flood (reference). Target: one cycle.

usage: python benchmarks/bench_commands.py [--seconds 5] [--requests 20000] [--realtime PRIO]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from firmware_bridge import stream  # noqa: E402
from hostile_requests import hostile_requests  # noqa: E402

WINDOW = 48
RATE_HZ = 1000.0


def _line(name: str, value: float, unit: str, ref_label: str, ref: float, ratio: float | None = None) -> None:
    r = value / ref if ratio is None and ref else ratio
    print(f"{name}: {value:.4g} {unit} (reference: {ref_label} {ref:.4g} {unit}, ratio {r:.3g}x)", flush=True)


def _start_driver(folder: Path, max_motion_s: float, priority: int | None) -> tuple[subprocess.Popen, str, str]:
    state, commands = f"ipc://{folder}/state", f"ipc://{folder}/commands"
    cfg = folder / "driver.toml"
    realtime = "" if priority is None else f"[realtime]\npriority = {priority}\nlock_memory = true\nrequired = true\n"
    cfg.write_text(f'[driver]\nmodel = "generic6"\nwatchdog_ms = 500\nmax_motion_s = {max_motion_s}\n'
                   f'[transport]\nname = "sim"\n[zmq]\nstate = "{state}"\ncommands = "{commands}"\n{realtime}')
    proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "driver", "--config", str(cfg)],
                            stderr=subprocess.DEVNULL)
    return proc, state, commands


def _req(endpoint: str) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.REQ)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    return s


def _call(sock: zmq.Socket, request: dict, timeout_s: float = 120.0) -> dict:
    sock.send(json.dumps(request).encode())
    if not sock.poll(int(timeout_s * 1000)):
        raise SystemExit(f"no reply to {request['cmd']} within {timeout_s} s")
    return json.loads(sock.recv())


def _pipelined(endpoint: str, requests, count: int) -> float:
    """Requests answered per second, WINDOW in flight."""
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(endpoint)
    sent = got = 0
    t0 = time.perf_counter()
    it = iter(requests)
    while got < count:
        while sent < count and sent - got < WINDOW:
            d.send_multipart([b"", next(it)])
            sent += 1
        if not d.poll(60_000):
            raise SystemExit("the driver stopped answering")
        d.recv_multipart()
        got += 1
    rate = count / (time.perf_counter() - t0)
    d.close(0)
    return rate


def _max_gap_ms(sub: zmq.Socket, seconds: float, until=None) -> tuple[float, int]:
    """The longest gap between consecutive state messages' host timestamps (ms) over `seconds` (or until
    until() is true), and the number of seq gaps."""
    t_end = time.monotonic() + seconds
    last_t = last_seq = None
    worst, seq_gaps = 0.0, 0
    while time.monotonic() < t_end and not (until is not None and until()):
        if not sub.poll(100):
            continue
        rec = stream.decode_state(sub.recv_multipart()[1])
        t, seq = int(rec["host_time_ns"]), int(rec["seq"])
        if last_t is not None:
            worst = max(worst, (t - last_t) / 1e6)
            seq_gaps += seq != last_seq + 1
        last_t, last_seq = t, seq
    return worst, seq_gaps


def _drain(sub: zmq.Socket) -> None:
    while sub.poll(0):
        sub.recv_multipart()


def _flooder(endpoint: str, seconds: float) -> subprocess.Popen:
    code = f"""
import sys, time, zmq
sys.path.insert(0, {str(ROOT / 'tests')!r})
from hostile_requests import hostile_requests
d = zmq.Context().socket(zmq.DEALER); d.setsockopt(zmq.LINGER, 0); d.connect({endpoint!r})
end = time.monotonic() + {seconds}
it = hostile_requests(6, 10**9, seed=7)
sent = got = 0
while time.monotonic() < end:
    while sent - got < {WINDOW}:
        d.send_multipart([b"", next(it)]); sent += 1
    if d.poll(1000):
        d.recv_multipart(); got += 1
print(got)
"""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _quick_stop_latencies(cmd: zmq.Socket, count: int) -> np.ndarray:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        reply = _call(cmd, {"cmd": "quick_stop"})
        out.append((time.perf_counter() - t0) * 1e3)
        if not reply["ok"]:
            raise SystemExit(f"quick_stop: {reply}")
        time.sleep(0.01)
    return np.array(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the flood and of the reference windows")
    ap.add_argument("--requests", type=int, default=20000, help="hostile requests for the rate figure")
    ap.add_argument("--max-motion", type=float, default=600.0, help="the driver's max_motion_s (s)")
    ap.add_argument("--realtime", type=int, default=None, metavar="PRIO",
                    help="run the driver with [realtime] priority = PRIO (cycle and libzmq's I/O thread SCHED_FIFO, "
                         "memory locked; required: the run stops if the OS refuses)")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}; driver at "
          f"{'the default policy' if args.realtime is None else f'SCHED_FIFO {args.realtime}'}")
    with tempfile.TemporaryDirectory(prefix="armid-bench-commands-") as tmp:
        proc, state, commands = _start_driver(Path(tmp), args.max_motion, args.realtime)
        cmd = _req(commands)
        sub = zmq.Context.instance().socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.connect(state)
        sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
        try:
            _call(cmd, {"cmd": "status"})
            # 1. requests per second
            status = json.dumps({"cmd": "status"}).encode()
            ref = _pipelined(commands, iter(lambda: status, None), args.requests // 4)
            rate = _pipelined(commands, hostile_requests(6, args.requests, seed=1), args.requests)
            health = _call(cmd, {"cmd": "status"})
            _line("commands hostile requests answered", rate, "requests/s", "plain status requests", ref)
            # 2. the stream while the largest plan is made
            _drain(sub)
            base_gap, base_seq = _max_gap_ms(sub, args.seconds)
            n_samples = 4000
            t = np.linspace(0.0, args.max_motion - 1.0, n_samples)
            q = 0.2 * np.sin(2 * np.pi * t / (args.max_motion - 1.0))[:, None] ** 2 * np.ones(6)
            big = {"cmd": "run_trajectory", "samples": {"t": t.tolist(), "q": q.tolist()}}
            planner = _req(commands)
            _call(cmd, {"cmd": "enable"})
            raw = json.dumps(big).encode()
            planner.send(raw)
            t0 = time.perf_counter()
            _drain(sub)
            gap, seq_gaps = _max_gap_ms(sub, 300.0, until=lambda: planner.poll(0))
            plan_s = time.perf_counter() - t0
            reply = json.loads(planner.recv())
            if not reply["ok"]:
                raise SystemExit(f"the largest plan was refused: {reply['error']}")
            _line(f"commands longest state gap while planning {reply['duration']:.0f} s of motion "
                  f"({len(raw) / 1e6:.2f} MB request, {plan_s:.1f} s to plan)",
                  gap, "ms", f"nothing planned, {args.seconds:g} s", base_gap)
            print(f"commands state gap in cycles while planning: {gap * RATE_HZ / 1e3:.2f} (target: <= 2; seq gaps "
                  f"{seq_gaps}, reference seq gaps {base_seq})", flush=True)
            _call(cmd, {"cmd": "quick_stop"})
            # 3. quick_stop latency, quiet and under a flood
            quiet = _quick_stop_latencies(cmd, 50)
            flood = _flooder(commands, args.seconds + 2)
            time.sleep(1.0)
            loud = _quick_stop_latencies(cmd, 100)
            flood_replies = int(flood.communicate(timeout=60)[0].strip() or 0)
            for label, q_ in (("p50", 50), ("p99", 99)):
                _line(f"commands quick_stop latency {label} under a flood ({flood_replies / (args.seconds + 2):.0f} "
                      f"hostile requests/s answered meanwhile)", float(np.percentile(loud, q_)), "ms",
                      "no flood", float(np.percentile(quiet, q_)))
            print(f"commands quick_stop latency under a flood in cycles: p99 {np.percentile(loud, 99) * RATE_HZ / 1e3:.2f}, "
                  f"max {loud.max() * RATE_HZ / 1e3:.2f} (target: one cycle)", flush=True)
            _ = health
        finally:
            try:
                _call(cmd, {"cmd": "disable"}, timeout_s=5)
            except SystemExit:
                pass
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
