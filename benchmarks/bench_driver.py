"""Driver streaming benchmark: delivered rate, drops, latency and CPU of `armid driver`, per transport.

For each transport the simulator runs as its own process (`armid sim`, real time) except for `sim`,
which runs inside the driver's process; the driver runs as `armid driver`; this script subscribes to
the state stream and measures:
  - delivered rate (messages per second) and dropped messages (gaps in seq);
  - device samples: fresh samples per second, samples lost (gaps in the device timestamps of the fresh
    messages, in device periods), stale messages (FLAG_STALE: a cycle without a new sample);
  - latency of the fresh samples from their host timestamp (when the host received them) to the
    subscriber's receipt, p50 / p99 / max;
  - the driver process's CPU time as % of one core (from /proc/PID/stat), and per thread with its wake-ups per
    second (voluntary context switches, /proc/PID/task/TID/status; the driver names its threads in the kernel:
    cycle, serial-link, gateway-link, can-rx, can-supervisor, health, commands; ZMQbg/IO/0 is libzmq's I/O
    thread); the simulator process's CPU beside it (it shares the machine).
Transports: sim, can, gateway, serial (as armid.chain runs it: the simulated boards step on each COMMAND,
the driver's host clock sets the pace) and serial-device (the boards on their own real-time clock, the
driver on the device clock, as a deployed driver with `clock = "auto"` runs a real board).
Reference, measured in the same run: a bare pyzmq PUB loop at the same rate in its own process, waiting
with the driver's own timer (firmware_bridge.runtime.rt_timing: absolute clock_nanosleep, 1 ns slack, no spin): the floor any
Python publisher pays, timer wake-ups and the socket.
Two more references bound the links, each measured in the same run: for the gateway a bare pymodbus FC23
client loop against the same simulated gateway before the driver connects (benchmarks/bench_gateway.py's
round_trips with codec=False: pymodbus's sync client alone, the same 38 words written every time and the 80
registers read not decoded; exchanges per second and CPU per exchange, printed as the CPU it takes at the
driver's exchange rate); for CAN python-can's udp_multicast alone (benchmarks/bench_can.py's interface_cost: CPU
per frame sent and received, printed as the CPU of one cycle's 13 sends and 13 receives at the rate: TPDO1 and
TPDO2 of six drives and the first drive's TPDO4; its own 13 frames, which udp_multicast returns to the sender,
are dropped by the driver's socket filter in the kernel, as SocketCAN does not return them; 26 receives where
that filter cannot be attached). CAN at a rate beyond
what one 1 Mbit/s bus carries for six drives (276 Hz) is also run at 250 Hz.

--realtime PRIO: the driver runs with a [realtime] section (priority = PRIO for its cycle thread and libzmq's
I/O thread, lock_memory = true; driver/realtime.py), and so that the comparison stays fair the reference
publisher gets the same (its loop thread and its libzmq I/O thread SCHED_FIFO PRIO, memory locked), and so
does this script's subscriber (its thread and its libzmq I/O thread): a consumer that cares about the
stream's latency (a controller on the same PC) runs real-time too, while a consumer at the default policy
measures its own wake-ups under load, not the driver's. The simulator processes stay at the default policy
in both runs: with their threads at SCHED_FIFO the host-clocked serial chain often never started, because the
driver's handshake drops a STATE that arrives in the same read as the HELLO_ACK (fixed since, tests/test_driver_serial.py), which a fast device makes likely. Without --realtime everything runs at the default policy. The script checks that the driver reports SCHED_FIFO for its
cycle (status) and stops if it does not. The load average (`uptime`) is printed before and after.

Two more measurements of the hot path, each beside its reference:
  --cycle  the CPU one cycle costs in the driver (driver.cycle.Cycle.step over an arm that hands it a new
           sample every time, publishing on a real PUB socket), beside a bare pyzmq send of the same message,
           in a tight loop and each after a sleep of one period (as the running driver wakes for each cycle);
  --timer  the cycle's wait for its deadline (firmware_bridge.runtime.rt_timing: absolute clock_nanosleep, timer slack 1 ns, no
           spin) beside the previous one (slack 1 ns, sleep then a 50 us spin) and the one before (default
           slack, 200 us spin): CPU as % of a core and wake-up lateness, each in its own process at --rate.

usage: python benchmarks/bench_driver.py [--seconds 60] [--rate 1000]
                                         [--transports sim,serial,serial-device,can,gateway]
                                         [--realtime PRIO] [--cycle] [--timer] [--no-transports]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import threading
import os
import struct
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
from armid.chain import CLK_TCK, cpu_seconds  # noqa: E402
from driver import realtime as rt  # noqa: E402
from driver.hal import Arm  # noqa: E402
from firmware_bridge.stream import FLAG_STALE  # noqa: E402

HEADER = struct.Struct("<IQqq")     # flags, seq, device_time_ns, host_time_ns at offset 8 (docs/reference/stream.md)

BARE_PUBLISHER = textwrap.dedent("""
    import sys, threading, time, zmq
    sys.path.insert(0, sys.argv[3])
    from firmware_bridge.runtime.rt_timing import reduce_timer_slack, sleep_until
    from driver import realtime as rt
    endpoint, rate, prio = sys.argv[1], float(sys.argv[2]), int(sys.argv[4])
    pub = zmq.Context().socket(zmq.PUB); pub.bind(endpoint)
    if prio:          # the driver's own [realtime] treatment: this thread and libzmq's I/O thread, memory locked
        rt.apply(rt.Realtime(priority=prio, lock_memory=True, required=True),
                 {"cycle": threading.get_native_id(), "zmq-io": rt.threads_named(rt.ZMQ_IO_PREFIX)}, print)
    reduce_timer_slack()
    payload = bytearray(258); period = int(1e9 / rate); nxt = time.perf_counter_ns()
    seq = 0
    while True:
        payload[12:20] = seq.to_bytes(8, "little"); now = time.time_ns()
        payload[20:28] = now.to_bytes(8, "little"); payload[28:36] = now.to_bytes(8, "little")
        pub.send_multipart((b"state", payload)); seq += 1
        nxt += period
        sleep_until(nxt)
""")


TIMER_LOOP = textwrap.dedent("""
    import resource, sys, time
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from firmware_bridge.runtime.rt_timing import reduce_timer_slack, sleep_until
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
    """CPU % and lateness p50/p99/max (us) of firmware_bridge.runtime.rt_timing's wait loop, in its own process."""
    out = subprocess.run([sys.executable, "-c", TIMER_LOOP, str(ROOT), str(rate), str(seconds), str(spin_us),
                          "1" if slack else "0"], capture_output=True, text=True, check=True, timeout=seconds + 60)
    return [float(x) for x in out.stdout.split()]


class _ReplayArm(Arm):
    """A new sample every read (no device): what the cycle itself costs."""

    def __init__(self, n: int):
        self.n, self.k = n, 0

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

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

    def link_stats(self) -> dict:
        return {}


def cycle_figures(tmp: Path, steps: int = 20000, gap_us: float = 0.0) -> tuple[float, float]:
    """CPU per Cycle.step (us) publishing on a PUB socket the way the daemon does, and per bare send (us).
    gap_us > 0: each step (and each send) comes right after a sleep of gap_us (firmware_bridge.runtime.rt_timing's wait), as in the
    running driver, whose thread wakes for every cycle: on this VM the caches and predictors are cold then, and
    the same code costs 2-3x what it costs in a tight loop (docs/design/decisions.md, "Where a Python driver's CPU goes")."""
    from driver.cycle import Cycle
    from driver.daemon import Driver
    from firmware_bridge.runtime.rt_timing import reduce_timer_slack, sleep_until

    reduce_timer_slack()
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"ipc://{tmp}/cycle")
    holder = type("Pub", (), {"_pub": sock})()
    cycle = Cycle(_ReplayArm(6), publish=lambda topic, payload: Driver._publish(holder, topic, payload))
    cycle.want_power = True
    for _ in range(1000):
        cycle.step()
    payload = bytes(cycle.message.buffer)
    gap_ns = int(gap_us * 1000)

    def per_call(fn) -> float:
        spent, nxt = 0, time.perf_counter_ns()
        for _ in range(steps):
            if gap_ns:
                nxt += gap_ns
                sleep_until(nxt)
            t0 = time.thread_time_ns()
            fn()
            spent += time.thread_time_ns() - t0
        return spent / steps / 1e3

    per_step = per_call(cycle.step)
    per_send = per_call(lambda: sock.send_multipart((b"state", payload)))
    sock.close(0)
    return per_step, per_send


def thread_cpu(pid: int) -> dict[str, tuple[float, int]]:
    """(CPU seconds, wake-ups) of each thread of a process, by its kernel name: utime + stime from
    /proc/PID/task/TID/stat, and voluntary_ctxt_switches from its status (each is a sleep that ended in a
    wake-up); threads of the same name are added."""
    out: dict[str, tuple[float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        f = text.rsplit(")", 1)[1].split()
        wakes = int(status.split("voluntary_ctxt_switches:", 1)[1].split()[0])
        cpu, n = out.get(name, (0.0, 0))
        out[name] = (cpu + (int(f[11]) + int(f[12])) / CLK_TCK, n + wakes)
    return out


@contextlib.contextmanager
def realtime_subscriber(priority: int):
    """This thread and libzmq's I/O threads SCHED_FIFO at priority (0: unchanged) while inside, the memory
    locked: the subscriber of a --realtime run (driver.realtime, as the driver applies it)."""
    if not priority:
        yield
        return
    applied = rt.apply(rt.Realtime(priority=priority, lock_memory=True, required=True),
                       {"subscriber": threading.get_native_id(), "zmq-io": rt.threads_named(rt.ZMQ_IO_PREFIX)},
                       print)
    try:
        yield
    finally:
        applied.restore()


def measure(endpoint: str, seconds: float, pid: int, sim_pid: int | None = None, priority: int = 0) -> dict:
    """Subscribe to endpoint's state topic for seconds and measure (module docstring); priority: the
    subscriber's SCHED_FIFO priority (0: the default policy)."""
    sub = zmq.Context.instance().socket(zmq.SUB)      # libzmq's I/O thread exists from here on
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.RCVHWM, 0)
    with realtime_subscriber(priority):                # before the first message: mlockall takes a while
        sub.connect(endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"state")
        if not sub.poll(60000):
            raise RuntimeError(f"no state message on {endpoint} within 60 s")
        while sub.poll(0):                             # what queued before: not part of the measurement
            sub.recv_multipart()
        return _collect(sub, seconds, pid, sim_pid)


def _collect(sub: zmq.Socket, seconds: float, pid: int, sim_pid: int | None) -> dict:
    n_max = int(seconds * 10000) + 10
    rows = np.zeros((n_max, 5), np.int64)     # flags, seq, device time, host time, receipt time
    k = 0
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    threads0, sim0 = thread_cpu(pid), cpu_seconds(sim_pid) if sim_pid else 0.0
    end = t0 + seconds
    while time.monotonic() < end and k < n_max:
        if not sub.poll(100):
            continue
        _, payload = sub.recv_multipart()
        rows[k, 4] = time.time_ns()
        rows[k, :4] = HEADER.unpack_from(payload, 8)
        k += 1
    wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0
    threads = {}                                 # name -> (% of a core, wake-ups per second)
    for name, (cpu_s, wakes) in thread_cpu(pid).items():
        cpu0_s, wakes0 = threads0.get(name, (0.0, 0))
        threads[name] = (100.0 * (cpu_s - cpu0_s) / wall, (wakes - wakes0) / wall)
    sim_cpu = 100.0 * (cpu_seconds(sim_pid) - sim0) / wall if sim_pid else None
    sub.close(0)
    rows = rows[:k]
    seqs = rows[:, 1]
    drops = int(np.sum(np.maximum(np.diff(seqs) - 1, 0))) if k > 1 else 0
    stale = (rows[:, 0] & FLAG_STALE) != 0
    fresh = rows[~stale & (rows[:, 3] != 0)]
    lat = (fresh[:, 4] - fresh[:, 3]) / 1e3 if len(fresh) else np.full(1, np.nan)   # no fresh sample: nan
    steps = np.diff(fresh[:, 2])
    steps = steps[steps > 0]
    period = float(np.median(steps)) if steps.size else 0.0          # the device's sample period (its clock, ns)
    lost = int(np.sum(np.maximum(np.rint(steps / period) - 1, 0))) if period else 0
    return {"rate": k / wall, "drops": drops, "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()), "cpu": 100.0 * cpu / wall, "fresh_rate": len(fresh) / wall, "lost": lost,
            "stale": int(stale.sum()), "threads": threads, "sim_cpu": sim_cpu}


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def plan(transport: str, rate: float) -> chain.TransportPlan:
    """The chain's plan of a transport at rate; serial-device: the serial boards on their own real-time clock
    at rate (no step_on_command) and the driver on the device clock."""
    if transport == "serial-device":
        serial = chain.plan_for("serial", rate)
        args = list(serial.sim_args)
        if "step_on_command=true" in args:
            i = args.index("step_on_command=true")
            del args[i - 1:i + 1]                     # its "-o" too
        return dataclasses.replace(serial, sim_rate_hz=rate, clock="device", sim_args=tuple(args))
    return chain.plan_for(transport, rate)


REALTIME_SECTION = "[realtime]\npriority = {priority}\nthreads = {threads}\nlock_memory = true\nrequired = true\n"


@contextlib.contextmanager
def realtime_config(priority: int, threads: tuple[str, ...] = rt.DEFAULT_THREADS):
    """While inside, the driver configs armid.chain writes carry a [realtime] section at priority (0: none)
    for these threads."""
    if not priority:
        yield
        return
    plain = chain.driver_config

    def with_section(*args, **kwargs) -> str:
        return plain(*args, **kwargs) + REALTIME_SECTION.format(priority=priority, threads=json.dumps(list(threads)))

    chain.driver_config = with_section
    try:
        yield
    finally:
        chain.driver_config = plain


CAN_BUS_MAX_HZ = 285.0      # six drives with the default PDO maps on one 1 Mbit/s bus, worst-case bit stuffing
CAN_REALISTIC_HZ = 250.0    # what the chain and deploy/ run CAN at (docs/reference/driver-config.md, "Transport can")
LINK_REFERENCE_S = 5.0      # seconds of the bare library loops (gateway, CAN)


def gateway_reference(connection: dict, seconds: float = LINK_REFERENCE_S) -> tuple[float, float]:
    """A bare pymodbus FC23 client loop (benchmarks/bench_gateway.round_trips, codec=False: the driver link thread's
    request, write the output image and read the input mirror, TCP_NODELAY; pymodbus alone: the same words sent
    every time, the registers read not decoded) against the simulated gateway the driver is about to use:
    (exchanges per second, process CPU per exchange in us). The drives get a disabled command (controlword 0),
    so nothing moves."""
    from bench_gateway import round_trips
    from firmware_bridge import cia402, gateway as gw

    n = 6
    idle = gw.OutputImage(0, 2000, np.full(n, cia402.CW_DISABLE_VOLTAGE), np.full(n, int(cia402.Mode.CSP)),
                          np.zeros(n, np.int64), np.zeros(n, np.int64))
    cpu: list[float] = []
    rate = round_trips(int(connection["port"]), idle, seconds, cpu, fc23=True, codec=False)
    return rate, cpu[0] * 1e6


def can_reference() -> tuple[float, float, int, int]:
    """python-can's udp_multicast on its own (benchmarks/bench_can.interface_cost, a group of this run's own):
    (send, receive) CPU per frame in us, and the frames the driver sends and receives per cycle for six drives
    (driver.transports.can.frames_per_cycle: SYNC and two RPDOs per drive; TPDO1 and TPDO2 per drive and the first
    drive's TPDO4; and its own frames, which udp_multicast loops back, unless the driver's socket filter drops them
    in the kernel: firmware_bridge.can_socket.own_frames_filter)."""
    from bench_can import interface_cost, own_frames_dropped_by_the_kernel
    from driver.transports.can import frames_per_cycle

    pid = os.getpid() + 101
    group = f"239.75.{pid % 250}.{pid // 250 % 250 + 1}"
    send, receive = interface_cost("udp_multicast", group)
    sent, received = frames_per_cycle(6)
    own = 0 if own_frames_dropped_by_the_kernel(group) else sent
    return send * 1e6, receive * 1e6, sent, received + own


def run_driver(transport: str, rate: float, seconds: float, tmp: Path, priority: int = 0,
               threads: tuple[str, ...] = rt.DEFAULT_THREADS) -> dict:
    """`armid sim` (for serial, can, gateway) and `armid driver` as processes, wired by armid.chain, at the
    default policy like the reference; priority > 0: the driver with [realtime] at that priority (and the
    subscriber too); the simulator stays at the default policy. For the gateway, the bare FC23 client loop
    (gateway_reference) runs against the simulator before the driver starts: r["gateway"]."""
    p = plan(transport, rate)
    with chain.Chain(tmp / f"{transport}-{rate:g}", p, realtime=False) as c:
        extra = {}
        if p.name != "sim":
            c.start_sim()
        if p.name == "gateway":
            extra["gateway"] = gateway_reference(c.connection)
        with realtime_config(priority, threads):
            status = c.start_driver()
        cycle = status.get("realtime", {}).get("threads", {}).get("cycle", {})
        if priority and (cycle.get("policy"), cycle.get("priority")) != ("SCHED_FIFO", priority):
            raise RuntimeError(f"the driver did not apply [realtime] priority = {priority} (its status: {cycle or 'none'}); "
                               f"`armid driver` must pass realtime=cfg.realtime to Driver (armid/commands/driver.py)")
        return measure(c.state, seconds, c.driver.pid, c.sim.pid if c.sim is not None else None, priority) | extra


def runs(transports: str, rate: float) -> list[tuple[str, float]]:
    """(transport, rate) pairs to run: each transport at rate, and CAN also at CAN_REALISTIC_HZ when rate is
    more than one 1 Mbit/s bus carries."""
    out = []
    for name in transports.split(","):
        out.append((name, rate))
        if name == "can" and rate > CAN_BUS_MAX_HZ:
            out.append((name, CAN_REALISTIC_HZ))
    return out


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--transports", default="sim")
    ap.add_argument("--realtime", type=int, default=0, metavar="PRIO",
                    help="SCHED_FIFO priority of the driver ([realtime]), the reference publisher and the subscriber")
    ap.add_argument("--rt-threads", default=",".join(rt.DEFAULT_THREADS),
                    help="with --realtime: the driver's [realtime] threads (cycle, zmq-io, serial-link)")
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
            step_us, send_us = cycle_figures(tmp, steps=3000, gap_us=1e6 / args.rate)
            print(f"driver cycle after a {1e3 / args.rate:g} ms sleep: {step_us:.1f} us CPU per cycle (reference: bare "
                  f"pyzmq send_multipart of the same message after the same sleep {send_us:.1f} us, ratio "
                  f"{step_us / send_us:.1f}x)")
        if args.timer:
            secs = min(args.seconds, 10.0)
            new = timer_figures(args.rate, secs, 0, True)
            for what, old in (("slack 1 ns, spin 50 us", timer_figures(args.rate, secs, 50, True)),
                              ("default slack, spin 200 us", timer_figures(args.rate, secs, 200, False))):
                print(f"driver timer {args.rate:g} Hz (clock_nanosleep, slack 1 ns, no spin): CPU {new[0]:.1f} % of a "
                      f"core, lateness p50/p99/max {new[1]:.0f}/{new[2]:.0f}/{new[3]:.0f} us (reference: {what}: "
                      f"CPU {old[0]:.1f} %, lateness {old[1]:.0f}/{old[2]:.0f}/{old[3]:.0f} us, CPU ratio "
                      f"{new[0] / max(old[0], 1e-9):.2f}x)")
        if args.no_transports:
            return
        prio = args.realtime
        rt_tag = f" SCHED_FIFO {prio}" if prio else ""
        if prio and args.rt_threads != ",".join(rt.DEFAULT_THREADS):
            rt_tag += f" ({args.rt_threads})"
        print(f"# load average {load_average()} at the start")
        refs: dict[float, dict] = {}

        def reference(rate: float) -> dict:
            """The bare publisher at rate, measured once per rate in this run."""
            if rate not in refs:
                ref_ep = f"ipc://{tmp}/bare-{rate:g}"
                bare = subprocess.Popen([sys.executable, "-c", BARE_PUBLISHER, ref_ep, str(rate), str(ROOT), str(prio)])
                try:
                    refs[rate] = measure(ref_ep, min(args.seconds, 20.0), bare.pid, priority=prio)
                finally:
                    _stop(bare)
            return refs[rate]

        todo = runs(args.transports, args.rate)
        reference(args.rate)
        can_ref = can_reference() if any(name == "can" for name, _ in todo) else None
        for name, rate in todo:
            ref = reference(rate)
            r = run_driver(name, rate, args.seconds, tmp, prio, tuple(args.rt_threads.split(",")))
            tag = f"driver {name} {rate:g} Hz {args.seconds:g} s{rt_tag}"
            print(f"{tag} delivered rate: {r['rate']:.1f} msg/s (reference: bare pyzmq publisher {ref['rate']:.1f} msg/s, "
                  f"ratio {r['rate'] / ref['rate']:.3f}x)")
            print(f"{tag} dropped messages: {r['drops']} (reference: bare publisher {ref['drops']})")
            made = r["fresh_rate"] + r["lost"] / args.seconds
            print(f"{tag} fresh samples: {r['fresh_rate']:.1f} samples/s, {r['lost']} lost, {r['stale']} stale messages "
                  f"(reference: the device made {made:.1f} samples/s, ratio {r['fresh_rate'] / max(made, 1e-9):.4f}x)")
            print(f"{tag} latency p50/p99/max: {r['p50']:.0f}/{r['p99']:.0f}/{r['max']:.0f} us (reference: bare publisher "
                  f"{ref['p50']:.0f}/{ref['p99']:.0f}/{ref['max']:.0f} us, p99 ratio {r['p99'] / max(ref['p99'], 1e-9):.1f}x)")
            print(f"{tag} driver CPU: {r['cpu']:.1f} % of a core (reference: bare publisher {ref['cpu']:.1f} %, "
                  f"ratio {r['cpu'] / max(ref['cpu'], 1e-9):.1f}x)")
            if "gateway" in r:          # what pymodbus alone costs at the exchange rate the driver ran
                bare_rate, per_exchange_us = r["gateway"]
                alone = per_exchange_us * made / 1e4
                print(f"{tag} driver CPU: {r['cpu']:.1f} % of a core (reference: a bare pymodbus FC23 client loop, fixed "
                      f"words, registers not decoded, against the same simulated gateway, {per_exchange_us:.0f} us CPU "
                      f"per exchange, {alone:.1f} % at the "
                      f"driver's {made:.0f} exchanges/s; alone it made {bare_rate:.0f} exchanges/s; ratio "
                      f"{r['cpu'] / max(alone, 1e-9):.1f}x)")
            if name == "can" and can_ref is not None:    # what python-can alone costs for a cycle's frames
                send_us, receive_us, sent, received = can_ref
                alone = (sent * send_us + received * receive_us) * rate / 1e4
                print(f"{tag} driver CPU: {r['cpu']:.1f} % of a core (reference: python-can udp_multicast alone, {sent} "
                      f"sends at {send_us:.1f} us + {received} receives at {receive_us:.1f} us CPU per cycle, {alone:.1f} % "
                      f"at {rate:g} Hz; ratio {r['cpu'] / max(alone, 1e-9):.1f}x)")
            by_thread = ", ".join(f"{name} {v:.1f} ({w:.0f}/s)" for name, (v, w) in
                                  sorted(r["threads"].items(), key=lambda x: -x[1][0]) if v >= 0.05)
            sim = "" if r["sim_cpu"] is None else f"; simulator process {r['sim_cpu']:.1f} %"
            print(f"{tag} driver CPU by thread (% of a core, wake-ups per second): {by_thread}{sim}")
        print(f"# load average {load_average()} at the end")


if __name__ == "__main__":
    main()
