"""Torque servo's gravity and friction compensation: what it costs the cycle and how still it holds the arm.

It prints:
  - microseconds per cycle of the compensation kernel (driver/compensation.py: gravity by RNEA and the identified
    friction, the limit check, one numba call) beside the observer's update (driver/observer.py, the other
    per-cycle model computation) in the same run;
  - the largest excursion per joint over --seconds of a torque-servo client sending zero torque through the
    driver's own cycle in lockstep with the simulator (tests/collision_rig.py), the arm's dynamics --mismatch off
    the model: with gravity and friction compensation, beside the same client without it.

usage: python benchmarks/bench_compensation.py [--seconds 0.5] [--mismatch 0.05]
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))          # the lockstep rig the tests use

from driver.compensation import Compensation  # noqa: E402
from driver.observer import MomentumObserver  # noqa: E402
from ident.model import load_model  # noqa: E402

RATE = 1000.0
_names = itertools.count()


def per_call_us(fn, k: int = 20_000) -> float:
    for _ in range(1000):
        fn()
    t = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t) / k * 1e6


def hold(model, compensate, seconds: float, mismatch: float) -> np.ndarray:
    """Largest |q - q0| per joint (rad) over `seconds` of a torque client sending zeros."""
    import zmq
    from collision_rig import Rig
    from driver.collision import Watch
    from driver.servo import ServoSession
    from firmware_bridge import servo_wire

    rig = Rig(model, Watch(compensate=compensate), mismatch=mismatch)
    rig.enable()
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    name = f"inproc://bench-compensation-{next(_names)}"
    pull.bind(name)
    push.connect(name)
    session = ServoSession(servo_wire.MODE_TORQUE, pull, rig.driver._servo_limits(), 1.0 / RATE, rig.cycle.hold.copy(),
                           timeout_cycles=1000, buffer_cycles=0, token=1, compensate=compensate)
    rig.cycle.submit(lambda: rig.cycle.start_servo(session))
    q0 = rig.state()["q"].copy()
    worst = np.zeros(model.n)
    try:
        for k in range(int(seconds * RATE)):
            push.send(servo_wire.encode(servo_wire.MODE_TORQUE, 1, k + 1, time.time_ns(), np.zeros(model.n)))
            pull.poll(5000)
            rig.step()
            worst = np.maximum(worst, np.abs(rig.state()["q"] - q0))
    finally:
        push.close(0)
        pull.close(0)
    return worst


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--mismatch", type=float, default=0.05)
    args = p.parse_args()
    model = load_model("generic6")
    n = model.n
    q, qd, target, out = np.full(n, 0.3), np.full(n, 0.5), np.zeros(n), np.zeros(n)
    comp = Compensation(model, ("gravity", "friction"))
    comp_us = per_call_us(lambda: comp.compute(q, qd, target, model.tau_max))
    obs = MomentumObserver(model, RATE)
    obs_us = per_call_us(lambda: obs.update(q, qd, target, out))
    print(f"compensation per cycle (gravity + friction + limit check, 6 joints): {comp_us:.1f} us (reference: the "
          f"observer's update {obs_us:.1f} us, ratio {comp_us / obs_us:.2f} x)")
    with_c = hold(model, ("gravity", "friction"), args.seconds, args.mismatch)
    without = hold(model, (), args.seconds, args.mismatch)
    for j in range(n):
        print(f"hold with zero torque, joint {j + 1}, largest excursion in {args.seconds:g} s: {with_c[j] * 1e3:.3f} mrad "
              f"with compensation (reference: without {without[j] * 1e3:.3f} mrad, ratio "
              f"{with_c[j] / max(without[j], 1e-12):.4f} x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
