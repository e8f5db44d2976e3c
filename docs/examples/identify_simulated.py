"""Identify the base dynamic parameters of an arm from a recording: here a simulated one, the generic6
model's torques along a shipped excitation plus sensor noise, so the truth is known.

`armid identify run.csv --model generic6` runs the same pipeline on a recorded file.

usage: python identify_simulated.py
"""
import numpy as np

from ident.model import dynamics
from ident.fit import excitation
from ident.model.base_params import base_parameters
from ident.fit.batch import identify
from ident.model import load_model
from ident.fit.preprocess import Recording

model = load_model("generic6")
traj = excitation.preset("seed000")                       # an optimised excitation shipped with armid
t, q, qd, qdd = traj.sample(rate_hz=200.0, periods=2)
noise = 0.02                                              # N m, normal, on every joint
tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(0).normal(0.0, noise, q.shape)
rec = Recording(t=t, q=q, tau=tau, current=None, qd=None, source="simulated")

base = base_parameters(model)
result = identify(model, rec, trajectory=traj, base=base)  # filter, differentiate, decimate, WLS
fit = result.fit
truth = base.from_standard(model.standard_parameters())
z = np.abs(fit.beta - truth) / fit.std                    # error in standard deviations
print(f"{base.count} base parameters from {len(result.rows.t)} rows, condition number {fit.cond:.0f}")
for name, b, s, true in list(zip(base.names, fit.beta, fit.std, truth))[:5]:
    print(f"  {name:>8} {b:10.5f} +- {s:.5f}   (true {true:.5f})")
print(f"residual RMS per joint: {' '.join(f'{r:.4f}' for r in fit.residual_rms)} N m (noise {noise} N m)")
print(f"{int((z < 3).sum())} of {base.count} base parameters within 3 sigma of the truth")
