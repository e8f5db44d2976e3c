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

Two more measurements of the hot path, each beside its reference:
  --cycle  the CPU one cycle costs in the driver (driver.cycle.Cycle.step over an arm that hands it a new
           sample every time, publishing on a real PUB socket), beside a bare pyzmq send of the same message;
  --timer  the cycle's wait for its deadline (driver.timer: timer slack 1 ns, 50 us spin) beside the previous
           one (default 50 us slack, 200 us spin): CPU as % of a core and wake-up lateness, each in its own
           process at --rate.

usage: python benchmarks/bench_driver.py [--seconds 60] [--rate 1000] [--transports sim,serial,can,gateway]
                                         [--cycle] [--timer] [--no-transports]
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


TIMER_LOOP = textwrap.dedent("""
    import resource, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from driver.timer import reduce_timer_slack, sleep_until
    rate, seconds, spin_us, slack = float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
    if slack:
        reduce_timer_slack()
    period, n = int(1e9 / rate), int(seconds * rate)
    late = np.zeros(n)
    r0 = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    nxt = time.perf_counter_ns() + period
    for i in range(n):
        sleep_until(nxt, int(spin_us * 1000))
        late[i] = time.perf_counter_ns() - nxt
        nxt += period
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / (time.perf_counter() - t0) * 100
    print(cpu, *np.percentile(late / 1e3, [50, 99]), late.max() / 1e3)
""")


def timer_figures(rate: float, seconds: float, spin_us: float, slack: bool) -> list[float]:
    """CPU % and lateness p50/p99/max (us) of driver.timer's wait loop, in its own process."""
    out = subprocess.run([sys.executable, "-c", TIMER_LOOP, str(ROOT), str(rate), str(seconds), str(spin_us),
                          "1" if slack else "0"], capture_output=True, text=True, check=True, timeout=seconds + 60)
    return [float(x) for x in out.stdout.split()]


class _ReplayArm:
    """A new sample every read (no device): what the cycle itself costs."""

    def __init__(self, n: int):
        self.n, self.k = n, 0

    def begin_cycle(self) -> None:
        pass

    def read(self, out) -> bool:
        self.k += 1
        out.device_time_ns, out.host_time_ns = self.k * 1_000_000, time.time_ns()
        out.q[:] = 0.1
        out.statusword[:] = 0x237
        return True

    def write(self, command) -> None:
        pass


def cycle_figures(tmp: Path, steps: int = 20000) -> tuple[float, float]:
    """CPU per Cycle.step (us) publishing on a PUB socket the way the daemon does, and per bare send (us)."""
    from driver.cycle import Cycle
    from driver.daemon import Driver

    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{tmp}/cycle")
    holder = type("Pub", (), {"_pub": sock})()
    cycle = Cycle(_ReplayArm(6), publish=lambda topic, payload: Driver._publish(holder, topic, payload))
    cycle.want_power = True
    for _ in range(1000):
        cycle.step()
    t0 = time.thread_time_ns()
    for _ in range(steps):
        cycle.step()
    per_step = (time.thread_time_ns() - t0) / steps / 1e3
    payload = bytes(cycle.message.buffer)
    t0 = time.thread_time_ns()
    for _ in range(steps):
        sock.send_multipart((b"state", payload))
    per_send = (time.thread_time_ns() - t0) / steps / 1e3
    sock.close(0)
    return per_step, per_send


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
    ap.add_argument("--cycle", action="store_true", help="measure the CPU of one cycle (in this process)")
    ap.add_argument("--timer", action="store_true", help="measure the timer's CPU and lateness at --rate")
    ap.add_argument("--no-transports", action="store_true", help="only --cycle / --timer")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        if args.cycle:
            step_us, send_us = cycle_figures(tmp)
            print(f"driver cycle: {step_us:.1f} us CPU per cycle (reference: bare pyzmq send_multipart of the same "
                  f"message {send_us:.1f} us, ratio {step_us / send_us:.1f}x)")
        if args.timer:
            secs = min(args.seconds, 10.0)
            new = timer_figures(args.rate, secs, 50, True)
            old = timer_figures(args.rate, secs, 200, False)
            print(f"driver timer {args.rate:g} Hz (slack 1 ns, spin 50 us): CPU {new[0]:.1f} % of a core, lateness "
                  f"p50/p99/max {new[1]:.0f}/{new[2]:.0f}/{new[3]:.0f} us (reference: default slack, spin 200 us: "
                  f"CPU {old[0]:.1f} %, lateness {old[1]:.0f}/{old[2]:.0f}/{old[3]:.0f} us, CPU ratio "
                  f"{new[0] / max(old[0], 1e-9):.2f}x)")
        if args.no_transports:
            return
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
