"""What checking a servo setpoint costs the cycle, beside a reference measured in the same run.

Ours: `ServoSession.next` in position mode (read what arrived, check the token, queue it in the setpoint buffer,
take one, check it against the limits over the 10 ms windows and the driver's clock, move the drives' target),
for a smooth stream of one setpoint per call on an inproc PUSH/PULL pair, called once per millisecond as the
cycle thread calls it (the setpoints are stamped for those milliseconds: the session holds their clock to its
own). Reference: the same reading and decoding of the same messages (`servo_wire.decode`) without any check
or buffer, paced the same way: the part no design can avoid.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_servo_check.py`.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import zmq

from driver.servo import ServoLimits, ServoSession
from firmware_bridge import servo_wire
from ident.model import load_model

TOKEN = 0x5EC0


def _messages(n: int, count: int, t0: int) -> list[bytes]:
    """A raised cosine of 0.1 rad over the stream on every joint, one setpoint per ms of the client's clock."""
    k = np.arange(count)
    q = 0.05 * (1 - np.cos(2 * np.pi * k / count))
    return [servo_wire.encode(servo_wire.MODE_POSITION, TOKEN, i + 1, t0 + i * 1_000_000, np.full(n, q[i]))
            for i in range(count)]


def _pair(ctx: zmq.Context, name: str) -> tuple[zmq.Socket, zmq.Socket]:
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for s in (pull, push):
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0) if s is push else s.setsockopt(zmq.RCVHWM, 0)
    pull.bind(name)
    push.connect(name)
    return push, pull


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setpoints", type=int, default=5_000)
    args = p.parse_args()
    model = load_model("generic6")
    limits = ServoLimits(model.q_min, model.q_max, model.qd_max, model.qdd_max, model.tau_max,
                         tuple(model.joint_names))
    ctx = zmq.Context.instance()
    messages = _messages(model.n, args.setpoints, time.time_ns() + 1_000_000)
    zero = np.zeros(model.n)

    push, pull = _pair(ctx, "inproc://bench-servo-check")
    session = ServoSession(servo_wire.MODE_POSITION, pull, limits, 1e-3, zero.copy(), timeout_cycles=1000,
                           token=TOKEN)
    ours = np.empty(len(messages))
    begin = time.perf_counter() + 1e-3
    for i, raw in enumerate(messages):
        time.sleep(max(0.0, begin + i * 1e-3 - time.perf_counter()))
        push.send(raw)
        start = time.perf_counter_ns()
        step = session.next(zero, zero)
        ours[i] = time.perf_counter_ns() - start
        if step.kind == "end":
            raise SystemExit(f"the stream was refused: {step.reason}")
    push.close()
    pull.close()

    push, pull = _pair(ctx, "inproc://bench-servo-decode")
    reference = np.empty(len(messages))
    begin = time.perf_counter() + 1e-3
    for i, raw in enumerate(messages):
        time.sleep(max(0.0, begin + i * 1e-3 - time.perf_counter()))
        push.send(raw)
        start = time.perf_counter_ns()
        while True:
            try:
                servo_wire.decode(pull.recv(zmq.NOBLOCK), model.n)
            except zmq.Again:
                break
        reference[i] = time.perf_counter_ns() - start
    push.close()
    pull.close()

    for name, q in (("p50", 50), ("p99", 99)):
        a, b = np.percentile(ours, q) / 1e3, np.percentile(reference, q) / 1e3
        print(f"servo_check_{name}: {a:.1f} us per cycle (reference: read and decode only {b:.1f} us, "
              f"ratio {a / b:.1f} x)")
    print(f"servo_check_share_of_1khz_cycle_p99: {np.percentile(ours, 99) / 1e4:.2f} % "
          f"(reference: read and decode only {np.percentile(reference, 99) / 1e4:.2f} %, "
          f"ratio {np.percentile(ours, 99) / np.percentile(reference, 99):.1f} x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
