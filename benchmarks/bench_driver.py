"""Driver streaming benchmark: delivered rate, drops, latency and CPU of `armid driver`, per transport.

For each transport the simulator runs as its own process (`armid sim`, real time) except for `sim`,
which runs inside the driver's process; the driver runs as `armid driver`; this script subscribes to
the state stream and measures:
  - delivered rate (messages per second) and dropped samples (gaps in seq);
  - latency from the sample's host timestamp (set when the driver read it) to the subscriber's receipt,
    p50 / p99 / max;
  - the driver process's CPU time as % of one core (from /proc/PID/stat).
Reference, measured in the same run: a bare pyzmq PUB loop at the same rate in its own process (the
floor any Python publisher pays: timer wake-ups and the socket).

usage: python benchmarks/bench_driver.py [--seconds 60] [--rate 1000] [--transports sim,serial,can,gateway]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from armid import chain  # noqa: E402
from armid.chain import cpu_seconds  # noqa: E402

BARE_PUBLISHER = textwrap.dedent("""
    import sys, time, zmq
    endpoint, rate = sys.argv[1], float(sys.argv[2])
    pub = zmq.Context().socket(zmq.PUB); pub.bind(endpoint)
    payload = bytearray(258); period = int(1e9 / rate); nxt = time.perf_counter_ns()
    seq = 0
    while True:
        payload[12:20] = seq.to_bytes(8, "little"); payload[28:36] = time.time_ns().to_bytes(8, "little")
        pub.send_multipart((b"state", payload)); seq += 1
        nxt += period
        rest = nxt - time.perf_counter_ns()
        if rest > 200_000: time.sleep((rest - 200_000) / 1e9)
        while time.perf_counter_ns() < nxt: pass
""")


def measure(endpoint: str, seconds: float, pid: int, raw: bool = False) -> dict:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(endpoint)
    sub.setsockopt(zmq.SUBSCRIBE, b"state")
    if not sub.poll(60000):
        raise RuntimeError(f"no state message on {endpoint} within 60 s")
    sub.recv_multipart()
    n_max = int(seconds * 5000) + 10
    seqs = np.zeros(n_max, np.int64)
    lat = np.zeros(n_max, np.int64)
    k = 0
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end and k < n_max:
        if not sub.poll(100):
            continue
        _, payload = sub.recv_multipart()
        now = time.time_ns()
        seqs[k] = int.from_bytes(payload[12:20], "little")
        lat[k] = now - int.from_bytes(payload[28:36], "little")
        k += 1
    wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    sub.close(0)
    seqs, lat = seqs[:k], lat[:k] / 1e3
    drops = int(np.sum(np.maximum(np.diff(seqs) - 1, 0))) if k > 1 else 0
    return {"rate": k / wall, "drops": drops, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()), "cpu": 100.0 * cpu / wall}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def run_driver(transport: str, rate: float, seconds: float, tmp: Path) -> dict:
    """`armid sim` (for serial, can, gateway) and `armid driver` as processes, wired by armid.chain, at the
    default priority like the reference."""
    with chain.Chain(tmp / transport, chain.plan_for(transport, rate), realtime=False) as c:
        if transport != "sim":
            c.start_sim()
        c.start_driver()
        return measure(c.state, seconds, c.driver.pid)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--transports", default="sim")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        ref_ep = f"ipc://{tmp}/bare"
        bare = subprocess.Popen([sys.executable, "-c", BARE_PUBLISHER, ref_ep, str(args.rate)])
        try:
            ref = measure(ref_ep, min(args.seconds, 20.0), bare.pid)
        finally:
            _stop(bare)
        for name in args.transports.split(","):
            r = run_driver(name, args.rate, args.seconds, tmp)
            tag = f"driver {name} {args.rate:g} Hz {args.seconds:g} s"
            print(f"{tag} delivered rate: {r['rate']:.1f} msg/s (reference: bare pyzmq publisher {ref['rate']:.1f} msg/s, "
                  f"ratio {r['rate'] / ref['rate']:.3f}x)")
            print(f"{tag} dropped samples: {r['drops']} (reference: bare publisher {ref['drops']})")
            print(f"{tag} latency p50/p99/max: {r['p50']:.0f}/{r['p99']:.0f}/{r['max']:.0f} us (reference: bare publisher "
                  f"{ref['p50']:.0f}/{ref['p99']:.0f}/{ref['max']:.0f} us, p99 ratio {r['p99'] / max(ref['p99'], 1e-9):.1f}x)")
            print(f"{tag} driver CPU: {r['cpu']:.1f} % of a core (reference: bare publisher {ref['cpu']:.1f} %, "
                  f"ratio {r['cpu'] / max(ref['cpu'], 1e-9):.1f}x)")


if __name__ == "__main__":
    main()
