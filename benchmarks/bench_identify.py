"""Batch identification end to end against building the same regressors with Pinocchio in a Python loop.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_identify.py`.
The arm: the UR5 of example-robot-data with rotor inertia and Coulomb/viscous friction on every joint (a
TOML overlay), 30 000 samples at 1 kHz of seed 000's excitation, torques with noise. End to end = read the
file (NPZ or CSV), zero-phase filter, central differences, regressor, base parameters and base regressor,
parallel decimation, WLS (and the physically consistent fit). Targets (issue 3): at most 0.3 s for WLS and
1 s with the consistent fit; FIGAROH took 0.87 s to build plus 3.75 s to solve, 6.6 s with its consistent
fit, on the same machine (its figures, not measured here).
"""
from __future__ import annotations

import os

# The fit's linear algebra is on small matrices (about 900 x 59 per joint, 59 x 59 stacked): OpenBLAS's
# threads only add synchronisation, and on a shared 2-core machine they spin. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pinocchio as pin  # noqa: E402

from bench_regressor import best_of  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from ident.fit import batch, excitation  # noqa: E402
from ident.model import dynamics
from ident.model.base_params import base_parameters  # noqa: E402
from ident.model import load_model  # noqa: E402

N = 30_000
RATE = 1000.0
UR5_JOINTS = ("shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint", "wrist_2_joint",
              "wrist_3_joint")


def ur5_urdf() -> Path:
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    return prefix / "share/example-robot-data/robots/ur_description/urdf/ur5_robot.urdf"


def arm_with_drives(folder: Path) -> Path:
    """A TOML overlay: the UR5 URDF plus rotor inertia and friction per joint."""
    lines = ["[robot]", f'urdf = "{ur5_urdf()}"', ""]
    for k, name in enumerate(UR5_JOINTS):
        big = k < 3
        lines += ["[[joint]]", f'name = "{name}"',
                  f"drive = {{ Ia = {0.4 if big else 0.05}, fc = {3.0 if big else 1.0}, fv = {2.0 if big else 0.6}, "
                  f"offset = 0.1, gear_ratio = 100.0, torque_constant = 0.1 }}", ""]
    path = folder / "ur5_drives.toml"
    path.write_text("\n".join(lines))
    return path


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench_identify_"))
    model = load_model(arm_with_drives(folder))
    traj = excitation.preset("seed000")
    t = np.arange(N) / RATE
    q, qd, qdd = traj.evaluate(t)
    rng = np.random.default_rng(0)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(0, 0.05, q.shape)
    q_meas = q + rng.normal(0, 1e-5, q.shape)
    np.savez(folder / "run.npz", t=t, q=q_meas, tau=tau)
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(6)] + [f"tau{j + 1}" for j in range(6)])
    np.savetxt(folder / "run.csv", np.column_stack([t, q_meas, tau]), delimiter=",", header=header, comments="",
               fmt="%.10g")

    def run(path: str, consistent: bool):
        # base parameters are computed inside the timing (no cache), as a first run on a new model would
        return batch.identify(model, folder / path, trajectory=traj, consistent=consistent,
                              base=base_parameters(model))

    t_wls = best_of(lambda: run("run.npz", False))
    t_cons = best_of(lambda: run("run.npz", True))
    t_csv = best_of(lambda: run("run.csv", False), 1)
    ident = run("run.npz", True)

    pmodel = pin.buildModelFromUrdf(str(ur5_urdf()))
    pdata = pmodel.createData()
    Q, QD, QDD = q_meas, qd, qdd

    def pin_regressors():
        for s in range(N):
            pin.computeJointTorqueRegressor(pmodel, pdata, Q[s], QD[s], QDD[s])

    t_pin = best_of(pin_regressors, 1)
    ref = f"pinocchio.computeJointTorqueRegressor loop, regressors only {t_pin:.3f} s"
    label = f"N={N} UR5 + Ia + friction, {ident.base.count} base parameters"
    print(f"identify end to end, WLS, NPZ, {label}: {t_wls:.3f} s (reference: {ref}, ratio {t_pin / t_wls:.1f}x)")
    print(f"identify end to end, WLS + physically consistent fit, NPZ: {t_cons:.3f} s "
          f"(reference: {ref}, ratio {t_pin / t_cons:.1f}x)")
    print(f"identify end to end, WLS, CSV: {t_csv:.3f} s (reference: {ref}, ratio {t_pin / t_csv:.1f}x)")
    steps = ", ".join(f"{k} {v:.3f}" for k, v in ident.seconds.items())
    print(f"# steps of the last run (s): {steps}", file=sys.stderr)
    print(f"# fit: cond {ident.fit.cond:.4g}, rows {len(ident.rows.t)}, decimation {ident.rows.factor}, "
          f"cut-off {ident.rows.cutoff_hz:g} Hz, residual RMS {np.round(ident.fit.residual_rms, 4).tolist()} N m",
          file=sys.stderr)


if __name__ == "__main__":
    main()
