"""Joint torques by RNEA and the standard regressor for the shipped generic6 model, and the identities
that tie them together: tau = Y chi, tau = M qdd + C qd + G, and forward dynamics inverting RNEA.

usage: python rnea_regressor.py
"""
import numpy as np

from ident.model import dynamics
from ident.fit import excitation
from ident.model.base_params import base_parameters
from ident.model import load_model

model = load_model("generic6")                     # or a TOML or URDF file (docs/reference/model-file.md)
chi = model.standard_parameters()                  # (14n,): XX XY XZ YY YZ ZZ mX mY mZ m Ia fc fv offset
t, q, qd, qdd = excitation.preset("seed000").sample(rate_hz=100.0)   # (N, n) arrays, rad, rad/s, rad/s^2
print(f"{model.name}: {model.n} joints, {len(t)} samples, {chi.size} standard parameters")

tau = dynamics.rnea(model, q, qd, qdd)             # (N, n) N m
Y = dynamics.regressor(model, q, qd, qdd)          # (N, n, 14n)
print(f"max |Y chi - tau| = {np.abs(Y @ chi - tau).max():.2e} N m (of max |tau| {np.abs(tau).max():.1f} N m)")

# Rigid-body terms apart (drive=False leaves out the rotor inertia Ia, friction and offset):
M = dynamics.mass_matrix(model, q, drive=False)    # (N, n, n)
split = np.einsum("kij,kj->ki", M, qdd) + dynamics.coriolis_torques(model, q, qd) + dynamics.gravity_torques(model, q)
print(f"max |M qdd + C qd + G - tau| = {np.abs(split - dynamics.rnea(model, q, qd, qdd, drive=False)).max():.2e} N m")

qdd_back = dynamics.forward_dynamics(model, q, qd, tau)
print(f"max |forward_dynamics(rnea(qdd)) - qdd| = {np.abs(qdd_back - qdd).max():.2e} rad/s^2")

base = base_parameters(model)                      # the identifiable combinations of chi
Yb = base.regressor(Y)
print(f"{base.count} base parameters; max |Yb beta - tau| = "
      f"{np.abs(Yb @ base.from_standard(chi) - tau).max():.2e} N m")
