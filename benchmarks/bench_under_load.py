"""The free-running serial chain (`armid sim` on its own clock behind a pty, `armid driver` on the device's clock)
with nothing, with 2 other simulated chains, with 4 millisecond-ticking processes and with both beside it, with
and without real-time scheduling. The reference of every figure is the same chain with nothing beside it, real-time, in the
same run.

    python benchmarks/bench_under_load.py [--seconds 20] [--configs alone-rt,chains-rt,...]

Per configuration, over --seconds of moves back and forth (speed 0.8) measured on the stream (armid.stream_tap):
  lateness      how much later than the device's own spacing each fresh sample was read after the one before
                (host_time step - device_time step, 0 when not later: the simulator's tick, the link and the
                driver's cycle together; a simulator that skipped ticks or drifts does not count), p50/p99/p99.9/max;
  state gap     the longest host-time gap between consecutive state messages;
  faults        the driver's faults during the moves (each reset and the arm enabled again) and the messages
                flagged FAULT;
  lag           command-to-motion lag (cycles, median and max over the moves' middle parts);
  servo held    a normal-priority Python client streaming position setpoints at 1 kHz for 2 s: cycles the
                driver held the last setpoint / cycles of the session;
  quick_stop    with another process flooding status requests: end to end, the messages from the driver's
                count in a status reply right before quick_stop is sent during a move to the first message
                without FLAG_MOVING (the client's own delays included); in the driver, over QUICK_STOPS
                quick stops (at rest, enabled again after each), the messages from the one the driver was at
                when it read the request (the reply's read_seq) to the first that carries it (its seq), p50
                and p99;
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

from armid import chain                                  # noqa: E402
from armid.client import ArmClient, MotionFailed         # noqa: E402
from armid.neighbours import Neighbours                  # noqa: E402
from armid.stream_tap import StreamTap, motion_lag_cycles   # noqa: E402
from driver import motion                                # noqa: E402
from firmware_bridge import servo_wire, stream           # noqa: E402
from ident.model import load_model                       # noqa: E402

CONFIGS = {"alone-rt": (0, 0, True), "chains-rt": (2, 0, True), "tickers-rt": (0, 4, True),
           "both-rt": (2, 4, True), "alone": (0, 0, False), "chains": (2, 0, False), "tickers": (0, 4, False)}
GOAL = np.array([0.25, -0.15, 0.2, 0.1, -0.2, 0.3])
QUICK_STOPS = 100
FLOOD = """
import json, sys, zmq
sock = zmq.Context.instance().socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.connect(sys.argv[1])
req = json.dumps({"cmd": "status"}).encode()
while True:
    try:
        sock.send_multipart([b"", req], zmq.NOBLOCK)
    except zmq.Again:
        pass
    while sock.poll(0):
        sock.recv_multipart()
"""


def _move(client, tap, model, goal, speed=0.8):
    start = tap.count()
    q_from = np.array(client.status()["q"])          # the driver's own: a starved client reads its stream late
    client.move_to(goal, speed=speed, wait=True)
    tap.reach(client.status()["seq"])               # the bench process reads the stream late when starved
    _, flags, _, q = tap.arrays(start)
    planned = motion.plan_move(model, q_from, goal, 1000.0, speed=speed).q
    return motion_lag_cycles(flags, q, planned)


def _servo_held(client) -> float:
    """Fraction of a 2 s position session's cycles in which the driver held the last setpoint."""
    import zmq

    q = np.array(client.status()["q"])
    before = client.status()
    with client.servo("position", timeout_cycles=2000) as s:
        t0 = time.time_ns()
        while time.time_ns() < t0 + 2_000_000_000:
            s.send(q, t_ns=time.time_ns())
            time.sleep(0.001)
    ended = client.status().get("servo") or {}
    accepted, missed = ended.get("accepted", 0), ended.get("missed_cycles", 0)
    del before, zmq
    return missed / max(accepted + missed, 1)


def _quick_stop_cycles(client, run, tap, model) -> float:
    flooder = subprocess.Popen([sys.executable, "-c", FLOOD, run.commands], env=chain.child_environment())
    try:
        time.sleep(0.5)
        q_from = np.array(client.status()["q"])
        client.move_to(-GOAL * 0.5 if q_from[0] > 0 else GOAL * 0.5, speed=0.5)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, flags, _, _ = tap.arrays(max(tap.count() - 5, 0))
            if flags.size and flags[-1] & stream.FLAG_MOVING:
                break
            time.sleep(0.005)
        time.sleep(0.3)
        mark = tap.count()
        sent_seq = client.status()["seq"]       # the driver's message count as it answered, right before
        client.quick_stop()
        time.sleep(0.5)
        tap.reach(client.status()["seq"])
        seq, flags, _, _ = tap.arrays(mark)
        stopped = np.flatnonzero(((flags & stream.FLAG_MOVING) == 0) & (seq > sent_seq))
        end_to_end = float(seq[stopped[0]] - sent_seq) if stopped.size else float("nan")
        client.fault_reset()
        in_driver = []
        for _ in range(QUICK_STOPS):
            client.enable()
            reply = client.request("quick_stop")
            in_driver.append(reply["seq"] - reply["read_seq"])
        return end_to_end, float(np.percentile(in_driver, 50)), float(np.percentile(in_driver, 99))
    finally:
        flooder.kill()
        flooder.wait(5)
        client.fault_reset()
        client.enable()


def run_config(name: str, seconds: float, workdir: Path) -> dict:
    chains, tickers, realtime = CONFIGS[name]
    model = motion.rigid_body_model(load_model("generic6"))
    plan = chain.plan_for("serial", clocking="free")
    out = {"config": name}
    neighbours = Neighbours(workdir / "neighbours", chains=chains, tickers=tickers, realtime=realtime) \
        if chains or tickers else None
    run = chain.Chain(workdir / "chain", plan, realtime=realtime, relay_compiles=False).__enter__()
    client = None
    try:
        run.start_sim(seed=1)
        run.start_driver()
        client = ArmClient(run.state, run.commands, timeout_s=30.0)
        client.enable()
        cpu0, t0 = chain.cpu_seconds(run.driver.pid), time.monotonic()
        lags = []
        with StreamTap(run.state) as tap:
            k, faults, unmeasured = 0, [], 0
            while time.monotonic() < t0 + seconds:
                try:
                    lags.append(_move(client, tap, model, GOAL * (1 if k % 2 == 0 else -0.5)))
                except MotionFailed as exc:             # counted, then on as an operator would: reset, enable
                    faults.append(str(exc))
                    print(f"# {name}: {exc}", file=sys.stderr, flush=True)
                    client.fault_reset()
                    client.enable()
                except AssertionError as exc:           # the tap did not hear the motion in time: not measured
                    unmeasured += 1
                    print(f"# {name}: lag not measured: {exc}", file=sys.stderr, flush=True)
                k += 1
            out["driver_faults"] = len(faults)
            out["moves"], out["moves_unmeasured"] = k, unmeasured
            out["driver_cpu"] = (chain.cpu_seconds(run.driver.pid) - cpu0) / (time.monotonic() - t0)
            seq, flags, device_ns, _ = tap.arrays()
            host_ns = tap.host_times()[: seq.size]          # the same messages as arrays() gave
            for key, measure in (("servo_held", lambda: _servo_held(client)),
                                 ("quick_stop_cycles", lambda: _quick_stop_cycles(client, run, tap, model))):
                try:
                    out[key] = measure()
                except Exception as exc:  # noqa: BLE001 - a fault or a refusal under load: reported, not fatal
                    print(f"# {name}: {key}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                    out[key] = float("nan") if key == "servo_held" else (float("nan"),) * 3
                    client.fault_reset()
                    client.enable()
        fresh = (flags & stream.FLAG_STALE) == 0
        host, device = host_ns[fresh], device_ns[fresh]
        late = np.maximum(np.diff(host) - np.diff(device), 0) / 1e3   # later than its device spacing says
        out["lateness_us"] = [float(np.percentile(late, p)) for p in (50, 99, 99.9)] + [float(late.max())]
        out["gap_ms"] = float(np.diff(host_ns).max() / 1e6)
        out["faults"] = int(((flags & stream.FLAG_FAULT) != 0).sum())
        lag = np.concatenate(lags) if lags else np.full(1, np.nan)
        out["lag_cycles"] = [float(np.median(lag)), float(lag.max())]
        out["messages"] = int(seq.size)
    finally:
        if client is not None:
            client.close()
        run.stop()
        if neighbours is not None:
            neighbours.stop()
    return out


def _line(name: str, value: float, unit: str, ref: float) -> str:
    ratio = value / ref if ref else float("nan")
    return f"{name}: {value:.4g} {unit} (reference: {ref:.4g} {unit}, ratio {ratio:.2f}x)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="seconds of moves per configuration (default 20)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    args = p.parse_args()
    names = [n for n in args.configs.split(",") if n]
    if "alone-rt" not in names:
        names.insert(0, "alone-rt")              # the reference
    results = {}
    with tempfile.TemporaryDirectory(prefix="armid-bench-load-") as tmp:
        for name in names:
            print(f"# {name}: running {args.seconds:g} s ...", file=sys.stderr, flush=True)
            results[name] = run_config(name, args.seconds, Path(tmp) / name)
    ref = results["alone-rt"]
    print(f"# bench_under_load: serial free-running chain, {args.seconds:g} s of moves per configuration; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name, r in results.items():
        for i, pct in enumerate(("p50", "p99", "p99.9", "max")):
            print(_line(f"{name} lateness {pct}", r["lateness_us"][i], "us", ref["lateness_us"][i]))
        print(_line(f"{name} longest state gap", r["gap_ms"], "ms", ref["gap_ms"]))
        print(_line(f"{name} faults", r["driver_faults"], "faults", ref["driver_faults"]))
        print(_line(f"{name} fault messages", r["faults"], "messages", ref["faults"]))
        print(_line(f"{name} lag median", r["lag_cycles"][0], "cycles", ref["lag_cycles"][0]))
        print(_line(f"{name} lag max", r["lag_cycles"][1], "cycles", ref["lag_cycles"][1]))
        print(_line(f"{name} servo setpoints held", 100 * r["servo_held"], "%", 100 * ref["servo_held"]))
        for i, what in enumerate(("end to end", "in the driver p50", "in the driver p99")):
            print(_line(f"{name} quick_stop under a request flood, {what}", r["quick_stop_cycles"][i], "cycles",
                        ref["quick_stop_cycles"][i]))
        print(_line(f"{name} driver CPU", 100 * r["driver_cpu"], "% of a core", 100 * ref["driver_cpu"]))
        print(f"# {name}: {r['moves']} moves, {r['moves_unmeasured']} whose lag the tap could not measure")
    print("# raw: " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
