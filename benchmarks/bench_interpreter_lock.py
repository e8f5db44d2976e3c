"""How much the driver's other threads hold the cycle off through the interpreter lock: the free-running serial
chain (`armid sim` behind a pty, `armid driver` on the device's clock, real-time scheduling where permitted),
the arm enabled at rest, with the command server idle (the reference) and busy with a flood from another
process, in the same run.

    python benchmarks/bench_interpreter_lock.py [--seconds 8]

Floods (each a process of its own that never waits for a reply): `status`, status requests as fast as the socket
takes them (each answered by the command server's thread); `large`, requests just under the size limit (4 MiB,
tests/flood_clients.py: read and refused by the command server's thread). Figures over --seconds, from the stream
(armid.stream_tap; host_time is the driver's stamp of each sample as its cycle read it, so the subscriber's own
delays do not count):
  state gap     the longest host-time gap between consecutive state messages;
  lateness      how much later than the device's own spacing each fresh sample was read after the one before
                (as benchmarks/bench_under_load.py), p99/p99.9/max;
  cycle start   the driver's own: from a sample's arrival to the start of its cycle (health `lateness`, the
                last 4096 cycles), p99/max: what the cycle thread waited for the interpreter lock and the CPU;
  requests      the command server's requests read per second (how busy it was; from the health messages);
  driver CPU    the driver process's CPU time / wall time.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from armid import chain                                  # noqa: E402
from armid.client import ArmClient                       # noqa: E402
from armid.stream_tap import StreamTap                   # noqa: E402
from firmware_bridge import stream                       # noqa: E402
from bench_under_load import FLOOD                       # noqa: E402

FLOODS = ("idle", "status", "large")


def _flood(kind: str, endpoint: str, seconds: float) -> subprocess.Popen | None:
    if kind == "idle":
        return None
    if kind == "status":
        return subprocess.Popen([sys.executable, "-c", FLOOD, endpoint], env=chain.child_environment())
    return subprocess.Popen([sys.executable, str(ROOT / "tests" / "flood_clients.py"), "large", endpoint, "200",
                             str(seconds + 5)], env=chain.child_environment(), stdout=subprocess.DEVNULL)


def measure(kind: str, run, client, seconds: float) -> dict:
    h0 = client.health()                     # the health messages' command counters (one a second)
    proc = _flood(kind, run.commands, seconds)
    try:
        time.sleep(0.5)
        cpu0, t0 = chain.cpu_seconds(run.driver.pid), time.monotonic()
        with StreamTap(run.state) as tap:
            time.sleep(seconds)
            seq, flags, device_ns, _ = tap.arrays()
            host_ns = tap.host_times()[: seq.size]
        cpu = (chain.cpu_seconds(run.driver.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
    h1 = client.health()
    fresh = (flags & stream.FLAG_STALE) == 0
    late = np.maximum(np.diff(host_ns[fresh]) - np.diff(device_ns[fresh]), 0) / 1e3
    return {"gap_ms": float(np.diff(host_ns).max() / 1e6),
            "lateness_us": [float(np.percentile(late, p)) for p in (99, 99.9)] + [float(late.max())],
            "requests_per_s": (h1["commands"]["received"] - h0["commands"]["received"]) / (h1["time"] - h0["time"]),
            "cycle_lateness_us": [h1["lateness"]["p99_us"], h1["lateness"]["max_us"]], "driver_cpu": cpu, "faults": int(((flags & stream.FLAG_FAULT) != 0).sum()), "messages": int(seq.size)}


def _line(name: str, value: float, unit: str, ref: float) -> str:
    ratio = value / ref if ref else float("nan")
    return f"{name}: {value:.4g} {unit} (reference: {ref:.4g} {unit}, ratio {ratio:.2f}x)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per flood (default 8)")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="armid-bench-gil-") as tmp:
        run = chain.Chain(Path(tmp), chain.plan_for("serial", clocking="free"), relay_compiles=False).__enter__()
        client = None
        try:
            run.start_sim(seed=1)
            run.start_driver()
            client = ArmClient(run.state, run.commands, timeout_s=30.0)
            client.enable()
            for kind in FLOODS:
                print(f"# {kind}: {args.seconds:g} s ...", file=sys.stderr, flush=True)
                results[kind] = measure(kind, run, client, args.seconds)
        finally:
            if client is not None:
                client.close()
            run.stop()
    ref = results["idle"]
    print(f"# bench_interpreter_lock: serial free-running chain at rest, {args.seconds:g} s per flood; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for kind, r in results.items():
        name = f"command server {kind}"
        print(_line(f"{name} longest state gap", r["gap_ms"], "ms", ref["gap_ms"]))
        for i, pct in enumerate(("p99", "p99.9", "max")):
            print(_line(f"{name} lateness {pct}", r["lateness_us"][i], "us", ref["lateness_us"][i]))
        print(_line(f"{name} cycle start after its sample p99", r["cycle_lateness_us"][0], "us",
                    ref["cycle_lateness_us"][0]))
        print(_line(f"{name} cycle start after its sample max", r["cycle_lateness_us"][1], "us",
                    ref["cycle_lateness_us"][1]))
        print(_line(f"{name} requests read", r["requests_per_s"], "per s", ref["requests_per_s"]))
        print(_line(f"{name} driver CPU", 100 * r["driver_cpu"], "% of a core", 100 * ref["driver_cpu"]))
        print(_line(f"{name} fault messages", r["faults"], "messages", ref["faults"]))
    print("# raw: " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
