"""Load-separated dynamics (Sun & Ma 1990): the payload's terms kept apart from the arm's.

    tau = H(q) qdd + h(q, qd) + G(q) + friction(qd)            (arm, with rotor inertias in H)
        + H_w(q) qdd + h_w(q, qd) + G_w(q)                      (payload w, 10 parameters in the flange frame)

The payload's H_w and G_w are computed as in the paper, from the partial velocities (Jacobians) of its
centre of mass: H_w = m J_c^T J_c + J_w^T I_c J_w, G_w = -m J_c^T g. h_w = C_w(q, qd) qd comes from the
payload regressor (ident.model.dynamics.load_regressor), which gives the symmetrised form of the paper's
h_wljk directly (NOTES-003 caveat). The arm's part is generated once; a payload change only swaps chi_load.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ident.model import dynamics, spatial
from ident.model.robot import Model


@dataclass(frozen=True)
class SeparatedTerms:
    """Torque terms (N, n) and inertia matrices (N, n, n) of the arm and of the payload."""

    H_arm: np.ndarray
    h_arm: np.ndarray
    G_arm: np.ndarray
    friction: np.ndarray   # fc sign(qd) + fv qd + offset
    H_load: np.ndarray
    h_load: np.ndarray
    G_load: np.ndarray
    qdd: np.ndarray

    def arm_torque(self) -> np.ndarray:
        return np.einsum("nij,nj->ni", self.H_arm, self.qdd) + self.h_arm + self.G_arm + self.friction

    def load_torque(self) -> np.ndarray:
        return np.einsum("nij,nj->ni", self.H_load, self.qdd) + self.h_load + self.G_load

    def total(self) -> np.ndarray:
        return self.arm_torque() + self.load_torque()


def payload_inertia_at_com(chi_load) -> tuple[float, np.ndarray, np.ndarray]:
    """(mass, centre of mass (3,), inertia about the centre of mass (3,3)) in the flange frame."""
    chi_load = np.asarray(chi_load, dtype=float)
    m = float(chi_load[9])
    J = spatial.inertia_matrix(chi_load[:6])
    if m <= 0.0:
        return m, np.zeros(3), J
    c = chi_load[6:9] / m
    return m, c, J - m * (spatial.skew(c).T @ spatial.skew(c))


def payload_terms(model: Model, q, chi_load) -> tuple[np.ndarray, np.ndarray]:
    """The payload's inertia matrix H_w (N, n, n) and gravity torques G_w (N, n), from the Jacobians of
    its centre of mass (Kane's partial velocities)."""
    m, c, I_c = payload_inertia_at_com(chi_load)
    pose, J = dynamics.flange_kinematics(model, np.atleast_2d(q))
    Jv, Jw = J[:, :3, :], J[:, 3:, :]
    Rf = pose[:, :3, :3]
    arm = np.einsum("nij,j->ni", Rf, c)                       # flange origin -> CoM, base axes
    Jc = Jv - np.cross(arm[:, :, None], Jw, axis=1)           # v_c = v_f + ω x arm = v_f - arm x ω
    I_base = np.einsum("nij,jk,nlk->nil", Rf, I_c, Rf)
    H = m * np.einsum("nki,nkj->nij", Jc, Jc) + np.einsum("nki,nkl,nlj->nij", Jw, I_base, Jw)
    G = -m * np.einsum("nki,k->ni", Jc, np.asarray(model.gravity))
    return H, G


def separated_dynamics(model: Model, q, qd, qdd, chi_load) -> SeparatedTerms:
    """All the terms of the load-separated model at the samples (q, qd, qdd) (each (N, n))."""
    q, qd, qdd = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (q, qd, qdd))
    zero = np.zeros_like(q)
    H_arm = dynamics.mass_matrix(model, q)
    h_arm = dynamics.coriolis_torques(model, q, qd)
    G_arm = dynamics.gravity_torques(model, q)
    friction = dynamics.rnea(model, q, qd, zero, gravity=False) - h_arm  # Ia qdd is in H_arm
    H_load, G_load = payload_terms(model, q, chi_load)
    h_load = dynamics.load_regressor(model, q, qd, zero, gravity=False) @ np.asarray(chi_load, dtype=float)
    return SeparatedTerms(H_arm, h_arm, G_arm, friction, H_load, h_load, G_load, qdd)
