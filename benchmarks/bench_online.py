"""Online identification: the RLS kernel's cost per sample, and the service on a live 1 kHz stream.

Prints `name: value unit (reference: value unit, ratio x)`:
  - CPU us per RLS update of one sample (6 rows) for the generic6 base set with friction (58 parameters),
    and for the UR5's (example-robot-data's URDF with rotor inertia and friction, 58 too) when Pinocchio's
    data are installed, on the rows the service feeds (the arm's base regressor on an exciting motion: joint k's row is 0 in the
    columns of the links before k, which the kernel skips) and on dense random rows (the worst case), and for
    the payload's 10 parameters, numba kernel (ident.online.rls, P = U D U' factored) beside a plain numpy
    implementation of the same update in covariance form (numpy matrix operations per sample), and beside
    the covariance-form block kernel it replaced (kept below, same run), issue 6 target <= 10 us;
  - the service's CPU (% of one core, from /proc/PID/stat) on a 1 kHz state stream, `armid ident-service`
    in its own process, without and with payload tracking, beside a bare subscriber that only receives and
    decodes the same stream (the floor of any Python consumer); issue 6 target < 30 %;
  - its lag: publication time of an estimate minus the driver's time stamp of the newest sample in it
    (percentiles after the first second, estimates that saw a new sample only), beside the filter's own
    delay (the window's half width, a property of the filter, not of the computation); then where the
    service's CPU went by stage and its longest filter block (from the service's status command).

usage: python benchmarks/bench_online.py [--seconds 10] [--rls (the kernels only)]
The machine may be shared: CPU time is what the service itself used, the wall-clock lag is not.
"""
from __future__ import annotations

import argparse
import json
import math
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

from ident.model import dynamics  # noqa: E402
from ident.model.base_params import base_parameters  # noqa: E402
from ident.fit.excitation import FourierTrajectory  # noqa: E402
from ident.model import load_model  # noqa: E402
from ident.online import SampleWindow  # noqa: E402
from ident.online.rls import FAST, RecursiveLS, _dot  # noqa: E402
from numba import njit  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

PUBLISHER = textwrap.dedent("""
    import sys, time
    import numpy as np, zmq
    from firmware_bridge import stream
    from ident.model import dynamics
    from ident.fit.excitation import FourierTrajectory
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


# -- the reference kernel: the covariance-form block update that ident.online.rls's factored (U D U') filter replaced
# (commit 4f4d7f8), kept here only to be timed beside it in the same run.
CHUNK = 6               # rows per unrolled pass over P (a sample's rows, padded with zero rows)


@njit(cache=True, nogil=True, fastmath=FAST)
def _ph(P, H, rows, PHt):
    """PHt[i] = P H[i] for the rows of H (rows a multiple of CHUNK; P symmetric): one pass over P per CHUNK
    rows, six dot products per row of P."""
    p = P.shape[0]
    for g in range(0, rows, CHUNK):
        for a in range(p):
            s0 = s1 = s2 = s3 = s4 = s5 = 0.0
            for b in range(p):
                x = P[a, b]
                s0 += x * H[g, b]
                s1 += x * H[g + 1, b]
                s2 += x * H[g + 2, b]
                s3 += x * H[g + 3, b]
                s4 += x * H[g + 4, b]
                s5 += x * H[g + 5, b]
            PHt[g, a] = s0
            PHt[g + 1, a] = s1
            PHt[g + 2, a] = s2
            PHt[g + 3, a] = s3
            PHt[g + 4, a] = s4
            PHt[g + 5, a] = s5


@njit(cache=True, nogil=True, fastmath={"contract"})
def _downdate(P, Kt, Gt, rows, scale):
    """P = scale P - K G' (K = Kt', G = Gt', rows a multiple of CHUNK, Kt = diag(+-1) Gt): one pass over P
    per CHUNK rows. Elements (a, b) and (b, a) are then the same products (up to an exact sign) summed in
    the same order, so a symmetric P stays exactly symmetric (no reassociation is allowed here)."""
    p = P.shape[0]
    for g in range(0, rows, CHUNK):
        f = scale if g == 0 else 1.0
        for a in range(p):
            k0, k1, k2 = Kt[g, a], Kt[g + 1, a], Kt[g + 2, a]
            k3, k4, k5 = Kt[g + 3, a], Kt[g + 4, a], Kt[g + 5, a]
            for b in range(p):
                P[a, b] = f * P[a, b] - (k0 * Gt[g, b] + k1 * Gt[g + 1, b] + k2 * Gt[g + 2, b]
                                         + k3 * Gt[g + 3, b] + k4 * Gt[g + 4, b] + k5 * Gt[g + 5, b])


@njit(cache=True, nogil=True)
def _ldl(S, mu, d) -> bool:
    """S = L D L' in place (unit L below the diagonal of the first mu rows, D into d); False when a pivot
    is 0 or not finite. No square roots: like the scalar row updates it replaces (whose denominators
    1 + r' P r are these pivots), it goes on through a covariance that rounding made indefinite."""
    for j in range(mu):
        dj = S[j, j]
        for k in range(j):
            dj -= S[j, k] * S[j, k] * d[k]
        if dj == 0.0 or not math.isfinite(dj):
            return False
        d[j] = dj
        for i in range(j + 1, mu):
            s = S[i, j]
            for k in range(j):
                s -= S[i, k] * S[j, k] * d[k]
            S[i, j] = s / dj
    return True


@njit(cache=True, nogil=True, fastmath=FAST)
def _forward(L, mu, B):
    """B[:mu] = L^-1 B[:mu] in place (L unit lower triangular, B (rows, p)): whole rows at a time."""
    p = B.shape[1]
    for i in range(mu):
        for k in range(i):
            c = L[i, k]
            for a in range(p):
                B[i, a] -= c * B[k, a]


@njit(cache=True, nogil=True, fastmath=FAST)
def _innovation_matrix(H, PHt, mu, S) -> None:
    """S = I + H P H' (lower triangle of the first mu rows), from PHt = (P H')'."""
    for i in range(mu):
        for l in range(i + 1):
            S[i, l] = _dot(H[i], PHt[l]) + (1.0 if i == l else 0.0)


@njit(cache=True, nogil=True)
def block_rls_update(theta, P, Phi, y, w, lam, trace_max, err_out, stats):
    """The kernel ident.online.rls replaced (4f4d7f8): covariance form, one block update per sample (P H' in one pass
    over P, S = L D L', a symmetric rank-m downdate with forgetting folded in). Process N samples: Phi
    (N, m, p), y (N, m), w (N, m) row weights. Updates theta (p,) and P (p, p, symmetric) in place; writes the a-priori prediction errors (unweighted, units of y, against
    the sample's prior theta) into err_out (N, m); stats (4,) accumulates [sum of e' S^-1 e (weighted
    errors), rows used, skipped forgettings, samples skipped for a zero or non-finite pivot of S].
    Samples with a non-finite value anywhere in Phi, y or w are skipped whole (their errors are NaN)."""
    N, m, p = Phi.shape
    rows = CHUNK * ((m + CHUNK - 1) // CHUNK)
    H = np.zeros((rows, p))          # the sample's weighted rows; rows past the used ones stay 0
    G = np.zeros((rows, p))          # P H', then G' = L^-1 H P (S = L D L'): P H' S^-1 H P = G D^-1 G'
    K = np.zeros((rows, p))          # G' scaled by sign(d_i) (the downdate's left factor)
    S = np.empty((m, m))
    d = np.empty(m)
    dinv = np.empty(m)
    zeros = np.zeros(p)
    u = np.empty((m, 1))
    inv = 1.0 / lam
    for k in range(N):
        finite = True
        for j in range(m):
            # x * 0 is NaN exactly when x is not finite (no fastmath flag here or in _dot lets it fold to 0)
            if not math.isfinite(y[k, j] * w[k, j] + _dot(Phi[k, j], zeros)):
                finite = False
        if not finite:
            for j in range(m):
                err_out[k, j] = math.nan
            continue
        mu = 0
        for j in range(m):
            e = y[k, j] - _dot(Phi[k, j], theta)
            err_out[k, j] = e
            wj = w[k, j]
            if wj != 0.0:
                for i in range(p):
                    H[mu, i] = wj * Phi[k, j, i]
                u[mu, 0] = wj * e
                mu += 1
        for i in range(mu, rows):
            for a in range(p):
                H[i, a] = 0.0
        if mu > 0:
            _ph(P, H, rows, G)
            _innovation_matrix(H, G, mu, S)
            if not _ldl(S, mu, d):
                stats[3] += 1.0
                for j in range(m):
                    err_out[k, j] = math.nan
                continue
            _forward(S, mu, u)                           # u = L^-1 e: e' S^-1 e = sum u_i^2 / d_i
            _forward(S, mu, G)                           # G' = L^-1 H P
            q = 0.0
            for i in range(mu):
                dinv[i] = 1.0 / d[i]
                c = u[i, 0] * dinv[i]
                q += u[i, 0] * c
                for a in range(p):
                    theta[a] += G[i, a] * c              # theta += P H' S^-1 e = G D^-1 L^-1 e
            stats[0] += q
            stats[1] += mu
        scale = 1.0                                      # forgetting: P = (P - G D^-1 G') / lambda
        if inv != 1.0:
            tr = 0.0
            for a in range(p):
                tr += P[a, a]
            for i in range(mu):
                tr -= _dot(G[i], G[i]) * dinv[i]
            if tr * inv <= trace_max:
                scale = inv
            else:
                stats[2] += 1.0
        if mu == 0:
            if scale != 1.0:                             # forgetting only
                for a in range(p):
                    for b in range(p):
                        P[a, b] *= scale
        else:
            for i in range(mu):                          # G_i sqrt(scale / |d_i|), K_i = sign(d_i) G_i
                r = math.sqrt(scale / abs(d[i]))
                sgn = 1.0 if d[i] > 0.0 else -1.0
                for a in range(p):
                    x = G[i, a] * r
                    G[i, a] = x
                    K[i, a] = sgn * x
            for i in range(mu, rows):
                for a in range(p):
                    G[i, a] = 0.0
                    K[i, a] = 0.0
            _downdate(P, K, G, rows, scale)


def numpy_rls(theta, P, Phi, y, w, lam):
    """The numpy reference: the same RLS update (the same theta and P, to rounding) as ident.online.rls.rls_update,
    in covariance form, one block per sample with numpy matrix operations (P H', S, a solve with S, the
    rank-m downdate, forgetting)."""
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


def ur5_with_drives():
    """The UR5 of example-robot-data with rotor inertia and friction (bench_identify's model: the issue's
    "UR5 base set with friction"), or None when Pinocchio's robot data are not installed (a test dependency)."""
    try:
        from bench_identify import arm_with_drives
        return load_model(arm_with_drives(Path(tempfile.mkdtemp(prefix="bench_online_"))))
    except ImportError:
        return None


def arm_rows(model, N: int = 4000, rate: float = 1000.0) -> np.ndarray:
    """The base regressor rows (N, 6, p) the service feeds its filter on an exciting motion of the arm: each
    joint's row is 0 in the columns of the links before it (the kernel skips those)."""
    rng = np.random.default_rng(1)
    traj = FourierTrajectory(0.25, rng.uniform(-0.3, 0.3, 6), rng.uniform(-0.6, 0.6, (6, 4)), rng.uniform(-0.6, 0.6, (6, 4)))
    q, qd, qdd = traj.evaluate(np.arange(N) / rate)
    return np.ascontiguousarray(base_parameters(model).regressor(dynamics.regressor(model, q, qd, qdd)))


def time_rls(Phi: np.ndarray, N_ref: int = 400) -> tuple[float, float, float]:
    """CPU us per sample (6 rows) on the rows Phi (N, 6, p): the numba kernel (ident.online.rls, factored), the old
    block kernel (covariance form), the numpy reference (best of 3, interleaved; all single-threaded, timed
    by time.process_time, which other processes on a shared machine disturb less than the wall clock). The
    two kernels are fed alike: batches of 100 samples, as the service's flushes, the same forgetting and
    trace bound."""
    rng = np.random.default_rng(1)
    N, _, p = Phi.shape
    y = Phi @ rng.normal(size=p) + 0.01 * rng.normal(size=(N, 6))
    w, err, stats = np.ones((100, 6)), np.empty((100, 6)), np.zeros(4)
    best, old, ref = np.inf, np.inf, np.inf
    RecursiveLS(p, 6, forgetting=0.9999).update(Phi[:10], y[:10])     # load the compiled kernels
    block_rls_update(np.zeros(p), np.eye(p), Phi[:10], y[:10], w[:10], 0.9999, np.inf, err[:10], stats)
    for _ in range(3):
        rls = RecursiveLS(p, 6, forgetting=0.9999)
        t = time.process_time()
        for k in range(0, N, 100):
            rls.update(Phi[k:k + 100], y[k:k + 100])
        best = min(best, (time.process_time() - t) / N * 1e6)
        theta, P = np.zeros(p), np.eye(p) * rls.p0
        t = time.process_time()
        for k in range(0, N, 100):
            w[:] = rls.weights
            block_rls_update(theta, P, Phi[k:k + 100], y[k:k + 100], w, rls.forgetting, rls.trace_max, err, stats)
        old = min(old, (time.process_time() - t) / N * 1e6)
        theta, P = np.zeros(p), np.eye(p) * 1e4
        t = time.process_time()
        numpy_rls(theta, P, Phi[:N_ref], y[:N_ref], np.ones(6), 0.9999)
        ref = min(ref, (time.process_time() - t) / N_ref * 1e6)
    return best, old, ref


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
    ap.add_argument("--rls", action="store_true", help="time the RLS kernels only (no service run)")
    args = ap.parse_args()
    model = load_model("generic6")
    p = base_parameters(model).count
    dense = np.random.default_rng(1).normal(size=(4000, 6, p))
    cases = [(f"rls update, {p} base parameters, 6 rows of the arm's base regressor", arm_rows(model))]
    ur5 = ur5_with_drives()
    if ur5 is not None:
        cases.append((f"rls update, UR5 base set with friction and rotor inertia ({base_parameters(ur5).count} "
                       f"parameters), 6 rows of its base regressor", arm_rows(ur5)))
    cases += [(f"rls update, {p} base parameters, 6 dense random rows", dense),
              ("payload rls update, 10 parameters, 6 rows", dense[..., :10].copy())]
    for label, Phi in cases:
        ours, old, ref = time_rls(Phi)
        print(f"{label}: {ours:.2f} us/sample CPU (reference: numpy {ref:.2f} us/sample CPU, ratio {ref / ours:.1f}x)")
        print(f"{label}: {ours:.2f} us/sample CPU (reference: old block kernel, covariance form, {old:.2f} "
              f"us/sample CPU, ratio {old / ours:.2f}x)")
    if args.rls:
        return
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
