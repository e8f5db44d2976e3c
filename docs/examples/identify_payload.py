"""Identify a payload (mass, centre of mass, inertia) from two runs of the same excitation, one with the
payload and one without; both are simulated here, so the true payload is known.

`armid payload identify --method global --loaded L.csv --unloaded U.csv --model generic6` does the same on
recorded files (docs/guides/payload.md); the result's set_payload request tells the driver about the payload.

usage: python identify_payload.py
"""
import numpy as np

from ident.model import dynamics
from ident.fit import excitation
from ident.model import load_model
from ident.payload import payload_parameters
from ident.payload.dynamic import identify
from ident.fit.preprocess import Recording

model = load_model("generic6")
traj = excitation.preset("seed000")
t, q, qd, qdd = traj.sample(rate_hz=200.0, periods=2)
true = payload_parameters(2.0, [0.01, -0.02, 0.05], [0.004, 0.0, 0.0, 0.005, 0.0, 0.003])  # kg, m, kg m^2
rng = np.random.default_rng(0)


def run(arm):                                      # the arm's joint torques along the excitation, with noise
    tau = dynamics.rnea(arm, q, qd, qdd) + rng.normal(0.0, 0.02, q.shape)
    return Recording(t=t, q=q, tau=tau, current=None, qd=None, source=arm.name)


loaded, unloaded = run(dynamics.merge_payload(model, true)), run(model)
est = identify(model, loaded, unloaded, method="global", trajectory=traj)
true_com = true[6:9] / true[9]
print(f"method {est.method}: mass {est.mass:.4f} +- {est.sigma[9]:.4f} kg (true {true[9]:.4f})")
print("centre of mass", *(f"{c:.5f} +- {s:.5f}" for c, s in zip(est.com, est.com_sigma)), "m; true", true_com)
within = abs(est.mass - true[9]) < 3 * est.sigma[9] and bool((abs(est.com - true_com) < 3 * est.com_sigma).all())
print(f"mass and centre of mass within 3 sigma of the truth: {within}; a body that can exist: {est.consistent}")
print("the driver's request:", est.set_payload_command())
