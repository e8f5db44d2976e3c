"""Online identification: the RLS kernel's cost per sample, and the service on a live 1 kHz stream.

Prints `name: value unit (reference: value unit, ratio x)`:
  - CPU us per RLS update of one sample (6 rows) for the generic6 base set with friction (58 parameters) and
    for the payload's 10 parameters, numba kernel (ident.rls) beside a plain numpy implementation of the
    same block update (numpy matrix operations per sample), issue 6 target <= 10 us;
  - the service's CPU (% of one core, from /proc/PID/stat) on a 1 kHz state stream, `armid ident-service`
    in its own process, without and with payload tracking, beside a bare subscriber that only receives and
    decodes the same stream (the floor of any Python consumer); issue 6 target < 30 %;
  - its lag: publication time of an estimate minus the driver's time stamp of the newest sample in it
    (percentiles after the first second, estimates that saw a new sample only), beside the filter's own
    delay (the window's half width, a property of the filter, not of the computation); then where the
    service's CPU went by stage and its longest filter block (from the service's status command).

usage: python benchmarks/bench_online.py [--seconds 10]
The machine may be shared: CPU time is what the service itself used, the wall-clock lag is not.
"""
from __future__ import annotations

import argparse
import json
import os
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

from ident.base_params import base_parameters  # noqa: E402
from ident.model import load_model  # noqa: E402
from ident.online import SampleWindow  # noqa: E402
from ident.rls import RecursiveLS  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

PUBLISHER = textwrap.dedent("""
    import sys, time
    import numpy as np, zmq
    from firmware_bridge import stream
    from ident import dynamics
    from ident.excitation import FourierTrajectory
    from ident.model import load_model
    endpoint, rate, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    model = load_model("generic6")
    rng = np.random.default_rng(0)
    traj = FourierTrajectory(0.25, rng.uniform(-0.3, 0.3, 6), rng.uniform(-0.6, 0.6, (6, 4)), rng.uniform(-0.6, 0.6, (6, 4)))
    t = np.arange(int(seconds * rate) + 1) / rate
    q, qd, qdd = traj.evaluate(t)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(size=q.shape) * 0.02
    msg = stream.StateMessage(6)
    pub = zmq.Context().socket(zmq.PUB); pub.setsockopt(zmq.SNDHWM, 100000); pub.bind(endpoint)
    time.sleep(1.0)                                    # subscribers connect
    t0 = time.time(); period = 1.0 / rate
    print(t0, flush=True)
    for k in range(t.size):
        rest = t0 + k * period - time.time()
        if rest > 0:
            time.sleep(rest)
        msg.set_header(k, 0, int(round(k * 1e9 / rate)), time.time_ns())
        msg.q[:] = q[k]; msg.qd[:] = qd[k]; msg.torque[:] = tau[k]
        pub.send_multipart((stream.TOPIC_STATE, bytes(msg.buffer)))
    time.sleep(0.5)
""")

BARE_SUBSCRIBER = textwrap.dedent("""
    import sys, zmq
    from firmware_bridge import stream
    sub = zmq.Context().socket(zmq.SUB); sub.connect(sys.argv[1]); sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
    print("ready", flush=True)
    while True:
        frames = sub.recv_multipart()
        stream.decode_state(frames[1])
""")


def _text(f) -> str:
    f.seek(0)
    return f.read()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def numpy_rls(theta, P, Phi, y, w, lam):
    """The reference: the same block update as ident.rls.rls_update, one sample at a time with numpy
    (P H', S, a solve with S, the rank-m downdate, forgetting)."""
    I = np.eye(Phi.shape[1])
    for k in range(Phi.shape[0]):
        H = w[:, None] * Phi[k]
        e = w * (y[k] - Phi[k] @ theta)
        PH = P @ H.T
        K = np.linalg.solve(I + H @ PH, PH.T).T
        theta += K @ e
        P -= K @ PH.T
        if lam < 1.0:
            P /= lam


def time_rls(p: int, N: int = 4000, N_ref: int = 400) -> tuple[float, float]:
    """CPU us per sample (6 rows): numba kernel, numpy reference (best of 3; both single-threaded, timed by
    time.process_time, which other processes on a shared machine disturb less than the wall clock)."""
    rng = np.random.default_rng(1)
    Phi = rng.normal(size=(N, 6, p))
    y = Phi @ rng.normal(size=p) + 0.01 * rng.normal(size=(N, 6))
    best, ref = np.inf, np.inf
    RecursiveLS(p, 6, forgetting=0.9999).update(Phi[:10], y[:10])     # load the compiled kernel
    for _ in range(3):
        rls = RecursiveLS(p, 6, forgetting=0.9999)
        t = time.process_time()
        for k in range(0, N, 100):              # batches of 100 samples, as the service's 10 Hz flushes
            rls.update(Phi[k:k + 100], y[k:k + 100])
        best = min(best, (time.process_time() - t) / N * 1e6)
        theta, P = np.zeros(p), np.eye(p) * 1e4
        t = time.process_time()
        numpy_rls(theta, P, Phi[:N_ref], y[:N_ref], np.ones(6), 0.9999)
        ref = min(ref, (time.process_time() - t) / N_ref * 1e6)
    return best, ref


def run_consumer(args: list[str], state: str, rate: float, seconds: float, commands: str | None,
                 estimates: str | None) -> dict:
    """Start the publisher and a consumer process; CPU of the consumer over the streaming, and the lag of
    its published estimates."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    log = tempfile.TemporaryFile("w+")
    consumer = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        if estimates is None:
            assert consumer.stdout.readline().strip() == "ready"
        else:
            deadline = time.monotonic() + 180
            while "listening" not in _text(log) and time.monotonic() < deadline and consumer.poll() is None:
                time.sleep(0.1)
            if "listening" not in _text(log):
                raise RuntimeError(f"ident-service did not start: {_text(log)}")
        sub = None
        if estimates is not None:
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.connect(estimates)
            sub.setsockopt(zmq.SUBSCRIBE, b"estimate")
        pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, state, str(rate), str(seconds)], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, text=True)
        t0 = float(pub.stdout.readline())
        cpu0, wall0 = cpu_seconds(consumer.pid), time.monotonic()
        lags, at, newest = [], [], None
        last = int(seconds * rate) + 1                  # samples the publisher sends
        while pub.poll() is None:
            if sub is not None and sub.poll(50):
                msg = json.loads(sub.recv_multipart()[1])
                # lag: publication time - the driver's host time stamp of the newest sample in the estimate;
                # past the first second (warm-up), while the stream runs (not the estimate holding its last
                # sample: it waits for the next publication with nothing newer to include) and only
                # estimates that saw a new sample (after the end, the silence would count as lag)
                s = msg["counters"]["samples"]
                if rate < s < last and msg["newest_sample_time"] != newest:
                    lags.append(msg["time"] - msg["newest_sample_time"])
                    at.append(s)
                newest = msg["newest_sample_time"]
            elif sub is None:
                time.sleep(0.05)
        cpu = (cpu_seconds(consumer.pid) - cpu0) / (time.monotonic() - wall0)
        timing = None
        if sub is not None:
            sub.close(0)
            timing = _status(commands)["timing"]
        return {"cpu": 100.0 * cpu, "lags": np.array(lags), "at": np.array(at), "log": _text(log), "timing": timing}
    finally:
        consumer.terminate()
        try:
            consumer.wait(10)
        except subprocess.TimeoutExpired:
            consumer.kill()
            consumer.wait(5)


def _status(endpoint: str) -> dict:
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(endpoint)
    try:
        req.send(json.dumps({"cmd": "status"}).encode())
        if not req.poll(10000):
            raise RuntimeError("ident-service: no reply to status")
        return json.loads(req.recv())
    finally:
        req.close(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    args = ap.parse_args()
    model = load_model("generic6")
    p = base_parameters(model).count
    ours, ref = time_rls(p)
    print(f"rls update, {p} base parameters, 6 rows: {ours:.2f} us/sample CPU (reference: numpy {ref:.2f} "
          f"us/sample CPU, ratio {ref / ours:.1f}x)")
    ours, ref = time_rls(10)
    print(f"payload rls update, 10 parameters, 6 rows: {ours:.2f} us/sample CPU (reference: numpy {ref:.2f} "
          f"us/sample CPU, ratio {ref / ours:.1f}x)")
    delay_ms = SampleWindow(6, rate_hz=args.rate).delay / args.rate * 1e3
    with tempfile.TemporaryDirectory() as tmp:
        state = f"ipc://{tmp}/state"
        bare = run_consumer([sys.executable, "-c", BARE_SUBSCRIBER, state], state, args.rate, args.seconds, None, None)
        for label, extra in (("ident-service", []), ("ident-service --payload", ["--payload", "model"])):
            est, cmd = f"ipc://{tmp}/est", f"ipc://{tmp}/cmd"
            svc = run_consumer([sys.executable, "-m", "armid.cli", "ident-service", "--model", "generic6",
                                "--state", state, "--publish", est, "--commands", cmd, *extra],
                               state, args.rate, args.seconds, cmd, est)
            print(f"{label} CPU at {args.rate:g} Hz: {svc['cpu']:.1f} % of a core (reference: bare subscriber "
                  f"{bare['cpu']:.1f} % of a core, ratio {bare['cpu'] / svc['cpu']:.2f}x)")
            lags = svc["lags"] * 1e3
            if lags.size:
                p50, p90, p99 = np.percentile(lags, [50, 90, 99])
                print(f"{label} lag behind the stream: median {p50:.1f} ms, p90 {p90:.1f} ms, p99 {p99:.1f} ms, "
                      f"max {lags.max():.1f} ms (reference: filter delay {delay_ms:.0f} ms, ratio "
                      f"{delay_ms / p50:.2f}x)")
            t = svc["timing"]
            seconds = args.seconds
            if lags.size:
                # the estimate with the largest lag: was the longest filter block (the first pass's replay)
                # among the samples it was the first to include?
                i = int(np.argmax(lags))
                prev = svc["at"][i - 1] if i else 0
                stalled = t["max_flush_ms"] > 2 * t["max_flush_cpu_ms"] + 5
                made = ("the longest filter block (below), run just before that estimate" +
                        (", most of it waiting for a CPU (its wall time >> its CPU time)" if stalled else "")
                        if prev < t["max_flush_at"] <= svc["at"][i] else
                        "not the longest filter block: a wait for the next read of the stream, one block's "
                        "filtering, and the machine's scheduling (the other processes)")
                print(f"  {label} max lag (the estimate at sample {svc['at'][i]}) is {made}")
            print(f"  {label} CPU by stage over the run: receive+decode {100 * t['receive_cpu_s'] / seconds:.1f} %, "
                  f"filter (window, regressor, RLS) {100 * t['flush_cpu_s'] / seconds:.1f} % in {t['flushes']} "
                  f"blocks of {t['flushed_samples'] / max(t['flushes'], 1):.0f} samples, publish "
                  f"{100 * t['publish_cpu_s'] / seconds:.1f} %; longest block: {t['max_flush_ms']:.1f} ms wall, "
                  f"{t['max_flush_cpu_ms']:.1f} ms CPU, {t['max_flush_samples']} samples, at sample "
                  f"{t['max_flush_at']}")


if __name__ == "__main__":
    main()
