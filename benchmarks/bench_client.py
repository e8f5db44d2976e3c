"""Python client benchmark: the round trip of one `status` command through armid.client.ArmClient, whose sends
wait (bounded) for a connection that completed its handshake, beside a bare pyzmq REQ socket that sends at
once on the same driver (reference). The driver runs in this process on the simulated generic6 arm (1 kHz).

It prints the median round trip of each over the same number of requests, taken in alternating blocks so that
the machine's load falls on both alike.

usage: python benchmarks/bench_client.py [--requests 2000]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import zmq

from armid.client import ArmClient
from driver.daemon import Driver, Endpoints
from ident.model import load_model
from sim import Simulator
from sim.local_transport import LocalSimArm

BLOCK = 100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="status requests for each (default 2000)")
    args = parser.parse_args()
    model = load_model("generic6")
    sim = Simulator(model, seed=0, realtime=True)
    driver = Driver(model, LocalSimArm(model, simulator=sim),
                    endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), watchdog_s=0.5)
    driver.start()
    bare = zmq.Context.instance().socket(zmq.REQ)
    bare.setsockopt(zmq.LINGER, 0)
    bare.connect(driver.bound["commands"])
    status = json.dumps({"cmd": "status"}).encode()
    ours, ref = [], []
    try:
        with ArmClient(driver.bound["state"], driver.bound["commands"], timeout_s=10.0) as arm:
            arm.status()                                     # both connected before the clock starts
            bare.send(status)
            if not bare.poll(10_000):
                raise SystemExit("bench_client: the driver did not answer the bare socket within 10 s")
            bare.recv()
            for _ in range(max(1, args.requests // BLOCK)):
                for _ in range(BLOCK):
                    t = time.perf_counter()
                    arm.status()
                    ours.append(time.perf_counter() - t)
                for _ in range(BLOCK):
                    t = time.perf_counter()
                    bare.send(status)
                    if not bare.poll(10_000):
                        raise SystemExit("bench_client: no reply to the bare socket within 10 s")
                    bare.recv()
                    ref.append(time.perf_counter() - t)
    finally:
        bare.close(0)
        driver.stop()
        sim.stop()
    ours_us, ref_us = 1e6 * np.median(ours), 1e6 * np.median(ref)
    print(f"client status round trip (median of {len(ours)}): {ours_us:.0f} us "
          f"(reference: bare pyzmq REQ {ref_us:.0f} us, ratio {ours_us / ref_us:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
