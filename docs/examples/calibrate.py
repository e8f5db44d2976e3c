"""Kinematic calibration: plan measurement poses, measure the tool point (simulated here with known
geometric errors and 50 um of sensor noise), identify the errors and compare them with the truth.

`armid calibrate plan` and `armid calibrate identify MEAS.csv` do the same with files (docs/guides/calibration.md).

usage: python calibrate.py
"""
import numpy as np

from ident.calibration.fit import identify
from ident.calibration.model import from_model, tool_pose
from ident.calibration.planning import d_optimal
from ident.calibration.synthesis import describe, synthesize
from ident.model import load_model

model = load_model("generic6")
cm = from_model(model, tool=(0.0, 0.0, 0.1))         # the measured point: 0.1 m out along the flange z axis
irr = synthesize(cm, "position")                     # which geometric errors points can identify
print(f"{irr.count} identifiable terms: {describe(irr)}")
q, _ = d_optimal(irr, 40, seed=0)                    # 40 poses from random candidates within the limits

rng = np.random.default_rng(1)
true = cm.nominal.copy()
free = np.flatnonzero(irr.identified)
true[free] += rng.normal(0.0, 1e-3, free.size)       # the real arm: errors of ~1 mm and ~1 mrad
noise = 5e-5                                         # m per coordinate, a laser tracker's order
measured = tool_pose(cm, q, true)[:, :3, 3] + rng.normal(0.0, noise, (len(q), 3))

result = identify(irr, q, measured, noise=noise)
print(f"RMS position error {result.rms_before * 1e3:.3f} mm with the nominal model, "
      f"{result.rms_after * 1e3:.4f} mm calibrated")
z = np.abs(result.values[free] - true[free]) / result.sigma[free]
print(f"largest error of an identified term: {z.max():.2f} sigma; "
      f"{int((z < 3).sum())} of {free.size} within 3 sigma")
