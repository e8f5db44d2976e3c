"""Servo benchmark: setpoint-to-cycle latency and missed setpoints at the transport's cycle rate.

The chain of `armid demo` runs (armid sim free-running behind the transport, armid driver, both processes on
loopback); this script is the client (armid.client.ArmClient). It enables the drives, starts servo mode and
streams a smooth position setpoint (a 0.1 rad raised cosine on joint 1) at the driver's cycle rate for
--seconds, each stamped with the time it is for. It prints:
  - the latency from a setpoint's stamp to the driver's cycle that took it (p50, p99; the driver measures it,
    `status.servo.latency_us`), beside the latency of the state stream the other way in the same run, from the
    driver's host_time_ns to this process receiving the message (reference: the same machine, ZeroMQ and
    processes, the opposite direction);
  - missed setpoints: the cycles in which the driver found no new setpoint (it held the last), as a share of
    the setpoints sent; the setpoints this client could not queue (and the gaps in seq the driver saw), the
    setpoints the driver dropped to bound its buffer's latency, and the cycles its drives spent crossing a gap.
The driver's setpoint buffer (--buffer-cycles, default 2 as the servo command's) trades latency for carrying
out every setpoint: with 0 the newest setpoint of each cycle is taken.

usage: python benchmarks/bench_servo.py [--transport serial|can|gateway] [--seconds 5] [--buffer-cycles 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from armid import chain
from armid.client import ArmClient


def stream_latency_us(arm: ArmClient, count: int) -> np.ndarray:
    """Latency (us) of `count` state messages: this process's receive time minus the driver's host_time_ns."""
    out = np.empty(count)
    for k, s in enumerate(arm.samples(count=count)):
        out[k] = (time.time_ns() - s.host_time_ns) / 1e3
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transport", default="serial", choices=chain.TRANSPORTS)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--buffer-cycles", type=int, default=2)
    args = p.parse_args()
    plan = chain.plan_for(args.transport, clocking="free")
    rate = plan.rate_hz
    with tempfile.TemporaryDirectory(prefix="bench-servo-") as tmp, chain.Chain(Path(tmp), plan) as run:
        run.start_sim()
        run.start_driver()
        with ArmClient(run.state, run.commands, timeout_s=10.0) as arm:
            arm.enable()
            q0 = np.array(arm.status()["q"])
            reference = stream_latency_us(arm, int(rate))
            with arm.servo(timeout_cycles=int(rate), buffer_cycles=args.buffer_cycles) as servo:
                start = time.time_ns()
                k = 0
                while (t := ((now := time.time_ns()) - start) * 1e-9) < args.seconds:
                    q = q0.copy()
                    q[0] += 0.1 * (1 - np.cos(2 * np.pi * t / args.seconds)) / 2
                    servo.send(q, now)
                    k += 1
                    time.sleep(max(0.0, k / rate - (time.time_ns() - start) * 1e-9))
                time.sleep(0.1)
                stats = arm.status()["servo"]
            sent, dropped = servo.sent, servo.dropped
            fault = arm.status()["fault"]
    lat = stats["latency_us"]
    ref50, ref99 = np.percentile(reference, [50, 99])
    print(f"servo on {args.transport} at {rate:g} Hz, free-running simulator, {args.seconds:g} s, "
          f"setpoint buffer {args.buffer_cycles} cycles")
    print(f"setpoint-to-cycle latency p50 {lat['p50']:.0f} us, p99 {lat['p99']:.0f} us "
          f"(reference: the state stream to this client, p50 {ref50:.0f} us, p99 {ref99:.0f} us; "
          f"p99 ratio {lat['p99'] / ref99:.2f})")
    print(f"missed setpoints: {stats['missed_cycles']} cycles held of {sent} sent ({100 * stats['missed_cycles'] / max(sent, 1):.2f} %), "
          f"{stats['accepted']} taken, {dropped} not queued by the client ({stats['lost']} lost seen by the driver), "
          f"{stats['dropped']} dropped by the driver, {stats['bridged_cycles']} cycles crossing a gap; "
          f"ended: {stats.get('ended')}; fault: {fault}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
