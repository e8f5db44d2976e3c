"""Batch regressor and RNEA speed against Pinocchio called in a Python loop, and warm-start time.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_regressor.py`.
Targets (issue 2): regressor <= 0.5 us/sample for the UR5 at N = 100 000 with friction and Ia columns,
and >= 10x faster than pinocchio.computeJointTorqueRegressor in a loop; warm start < 2 s.

The machine may be shared: the regressor is also timed on one thread, and both it and the Pinocchio loop
by CPU time (time.process_time), which other processes disturb less than the wall clock.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pinocchio as pin

from ident.model import dynamics
from ident.model import load_model

N = 100_000
N_PIN = 20_000


def best_of(fn, repeats: int = 3, clock=time.perf_counter) -> float:
    """Fastest of `repeats` runs after one warm-up (which compiles on the first run of a fresh install)."""
    fn()
    times = []
    for _ in range(repeats):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def report(name: str, ours_us: float, ref_name: str, ref_us: float, unit: str = "us/sample") -> None:
    print(f"{name}: {ours_us:.3f} {unit} (reference: {ref_name} {ref_us:.3f} {unit}, ratio {ref_us / ours_us:.1f}x)")


def subprocess_seconds(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)
    return time.perf_counter() - t


def main() -> None:
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    urdf = prefix / "share/example-robot-data/robots/ur_description/urdf/ur5_robot.urdf"
    ours = load_model(urdf)
    model = pin.buildModelFromUrdf(str(urdf))
    data = model.createData()
    rng = np.random.default_rng(0)
    q = rng.uniform(-np.pi, np.pi, (N, ours.n))
    qd, qdd = rng.normal(0, 1, (2, N, ours.n))
    out = np.empty((N, ours.n, 14 * ours.n))
    tau = np.empty((N, ours.n))

    threads = numba.get_num_threads()

    def ours_regressor():
        dynamics.regressor(ours, q, qd, qdd, out=out)

    def pin_regressor():
        for s in range(N_PIN):
            pin.computeJointTorqueRegressor(model, data, q[s], qd[s], qdd[s])

    t_ours = best_of(ours_regressor, 5) / N * 1e6
    t_pin = best_of(pin_regressor, 1) / N_PIN * 1e6
    report(f"regressor UR5 N={N} (14n columns, {threads} threads)", t_ours,
           "pinocchio.computeJointTorqueRegressor loop", t_pin)
    numba.set_num_threads(1)
    t_one = best_of(ours_regressor, 5) / N * 1e6
    report(f"regressor UR5 N={N} (14n columns, 1 thread)", t_one, "pinocchio.computeJointTorqueRegressor loop", t_pin)
    c_one = best_of(ours_regressor, 5, time.process_time) / N * 1e6
    c_pin = best_of(pin_regressor, 1, time.process_time) / N_PIN * 1e6
    report(f"regressor UR5 N={N} (14n columns, 1 thread, CPU time)", c_one,
           "pinocchio.computeJointTorqueRegressor loop, CPU time", c_pin)
    numba.set_num_threads(threads)

    t_rnea = best_of(lambda: dynamics.rnea(ours, q, qd, qdd)) / N * 1e6

    def pin_rnea():
        for s in range(N_PIN):
            tau[s] = pin.rnea(model, data, q[s], qd[s], qdd[s])

    t_pin_rnea = best_of(pin_rnea, 1) / N_PIN * 1e6
    report("rnea UR5 N=100000", t_rnea, "pinocchio.rnea loop", t_pin_rnea)

    warm = "import numpy as np; from ident.model import load_model, dynamics; " \
           "m = load_model('generic6'); q = np.zeros((10, 6)); dynamics.regressor(m, q, q, q); dynamics.rnea(m, q, q, q)"
    subprocess_seconds(warm)  # fills numba's disk cache if this install has not yet
    t_warm = min(subprocess_seconds(warm) for _ in range(3))
    t_numpy = min(subprocess_seconds("import numpy") for _ in range(3))
    print(f"warm start, import + load generic6 + first regressor and rnea call: {t_warm:.2f} s "
          f"(reference: python -c 'import numpy' {t_numpy:.2f} s, ratio {t_warm / t_numpy:.1f}x)")


if __name__ == "__main__":
    main()
