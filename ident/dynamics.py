"""Rigid-body dynamics of a Model over batches of samples (numba kernels in ident.kernels).

Every function takes float64 arrays of shape (N, n) (or one sample of shape (n,), answered without the
batch axis) and SI units: rad, rad/s, rad/s^2 (m for prismatic joints), N m.

    tau = rnea(model, q, qd, qdd)                  # (N, n)
    Y = regressor(model, q, qd, qdd)               # (N, n, 14n), tau == Y @ model.standard_parameters()
    M = mass_matrix(model, q)                      # (N, n, n)
    qdd = forward_dynamics(model, q, qd, tau)      # (N, n)
"""
from __future__ import annotations

import numpy as np

from ident import kernels, spatial
from ident.model import Model

_ZERO3 = np.zeros(3)


def _batch(model: Model, name: str, x, n: int | None = None) -> tuple[np.ndarray, bool]:
    """(N, n) contiguous float64 view of x, and whether x was a single sample."""
    n = model.n if n is None else n
    arr = np.asarray(x, dtype=np.float64)
    single = arr.ndim == 1
    if single:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != n:
        raise ValueError(f"{name}: expected shape (N, {n}) or ({n},), got {np.shape(x)}")
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"{name}: non-finite value at sample {bad[0]}, joint {bad[1] + 1}")
    return np.ascontiguousarray(arr), single


def _samples(model: Model, **arrays) -> tuple[list[np.ndarray], bool]:
    out, singles = [], set()
    for name, x in arrays.items():
        arr, single = _batch(model, name, x)
        out.append(arr)
        singles.add(single)
    lengths = {a.shape[0] for a in out}
    if len(lengths) != 1 or len(singles) != 1:
        raise ValueError("inputs must have the same shape: " + ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items()))
    return out, singles.pop()


def _chain(model: Model):
    return model.joint_type, model.placement_R, model.placement_p, model.axis


def _gravity(model: Model, gravity: bool) -> np.ndarray:
    return np.ascontiguousarray(model.gravity) if gravity else _ZERO3


def rnea(model: Model, q, qd, qdd, params: np.ndarray | None = None, *, gravity: bool = True,
         drive: bool = True) -> np.ndarray:
    """Joint torques (N, n) for the motion (q, qd, qdd), by the recursive Newton-Euler algorithm.

    params (14n,) replaces the model's standard parameters. drive=False leaves out Ia, friction and
    offset; gravity=False leaves out gravity.
    """
    (Q, QD, QDD), single = _samples(model, q=q, qd=qd, qdd=qdd)
    out = np.empty_like(Q)
    kernels.rnea(*_chain(model), _gravity(model, gravity), model.params_matrix(params), Q, QD, QDD, drive, out)
    return out[0] if single else out


def regressor(model: Model, q, qd, qdd, out: np.ndarray | None = None) -> np.ndarray:
    """Standard regressor Y (N, n, 14n) with tau = Y @ model.standard_parameters().

    Columns per joint j: XX XY XZ YY YZ ZZ mX mY mZ m of link j, then Ia, fc, fv, offset of joint j.
    `out` may be a preallocated C-contiguous float64 array of that shape (every entry is written).
    """
    (Q, QD, QDD), single = _samples(model, q=q, qd=qd, qdd=qdd)
    shape = (Q.shape[0], model.n, 14 * model.n)
    if out is None:
        out = np.empty(shape)
    elif out.shape != shape or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous float64 array of shape {shape}")
    kernels.regressor(*_chain(model), np.ascontiguousarray(model.gravity), Q, QD, QDD, out)
    return out[0] if single else out


def mass_matrix(model: Model, q, params: np.ndarray | None = None, *, drive: bool = True) -> np.ndarray:
    """Joint-space inertia matrix M(q) (N, n, n) by the composite-rigid-body algorithm; drive adds Ia."""
    Q, single = _batch(model, "q", q)
    out = np.empty((Q.shape[0], model.n, model.n))
    kernels.mass_matrix(*_chain(model), model.params_matrix(params), Q, drive, out)
    return out[0] if single else out


def gravity_torques(model: Model, q, params: np.ndarray | None = None) -> np.ndarray:
    """G(q) (N, n): the torques that hold the arm still against gravity (no friction, no offset)."""
    z = np.zeros_like(np.asarray(q, dtype=np.float64))
    return rnea(model, q, z, z, params, drive=False)


def coriolis_torques(model: Model, q, qd, params: np.ndarray | None = None) -> np.ndarray:
    """Centrifugal and Coriolis torques C(q, qd) qd (N, n), without gravity or drive terms."""
    return rnea(model, q, qd, np.zeros_like(np.asarray(q, dtype=np.float64)), params, gravity=False, drive=False)


def forward_dynamics(model: Model, q, qd, tau, params: np.ndarray | None = None, *,
                     drive: bool = True) -> np.ndarray:
    """Joint accelerations (N, n) under the joint torques tau: M(q) qdd = tau - rnea(q, qd, 0).

    drive=True includes Ia in M and Coulomb/viscous friction and offset in the bias; a simulator with
    its own friction model passes drive=False and subtracts its friction from tau.
    """
    (Q, QD, TAU), single = _samples(model, q=q, qd=qd, tau=tau)
    out = np.empty_like(Q)
    ok = np.empty(Q.shape[0], dtype=np.bool_)
    kernels.forward_dynamics(*_chain(model), np.ascontiguousarray(model.gravity), model.params_matrix(params),
                             Q, QD, TAU, drive, out, ok)
    if not ok.all():
        s = int(np.argmin(ok))
        raise ValueError(f"mass matrix is not positive definite at sample {s} (check the inertial parameters)")
    return out[0] if single else out


def flange_pose(model: Model, q) -> np.ndarray:
    """Homogeneous pose (N, 4, 4) of the flange frame in the base frame."""
    return flange_kinematics(model, q)[0]


def jacobian(model: Model, q) -> np.ndarray:
    """Geometric Jacobian (N, 6, n) of the flange origin, base axes, rows [v; ω]."""
    return flange_kinematics(model, q)[1]


def flange_kinematics(model: Model, q) -> tuple[np.ndarray, np.ndarray]:
    """(flange pose (N, 4, 4), geometric Jacobian (N, 6, n)) in one pass."""
    Q, single = _batch(model, "q", q)
    pose = np.empty((Q.shape[0], 4, 4))
    jac = np.empty((Q.shape[0], 6, model.n))
    kernels.flange_kinematics(*_chain(model), np.ascontiguousarray(model.flange_R),
                              np.ascontiguousarray(model.flange_p), Q, pose, jac)
    return (pose[0], jac[0]) if single else (pose, jac)


def flange_to_link_matrix(model: Model) -> np.ndarray:
    """10x10 map from payload parameters in the flange frame to parameters of link n (its frame)."""
    return spatial.body_transform_matrix(np.asarray(model.flange_R), np.asarray(model.flange_p))


def load_regressor(model: Model, q, qd, qdd, *, gravity: bool = True) -> np.ndarray:
    """Payload regressor Y_load (N, n, 10): tau_load = Y_load @ chi_load, with the payload's
    [XX XY XZ YY YZ ZZ mX mY mZ m] about the flange origin, in flange axes."""
    (Q, QD, QDD), single = _samples(model, q=q, qd=qd, qdd=qdd)
    out = np.empty((Q.shape[0], model.n, 10))
    kernels.load_regressor(*_chain(model), _gravity(model, gravity), flange_to_link_matrix(model), Q, QD, QDD, out)
    return out[0] if single else out


def merge_payload(model: Model, chi_load) -> Model:
    """The model with a payload (10 parameters in the flange frame) rigidly merged into the last link."""
    chi = model.standard_parameters()
    n = model.n
    chi[14 * (n - 1): 14 * (n - 1) + 10] += flange_to_link_matrix(model) @ np.asarray(chi_load, dtype=float)
    return model.with_parameters(chi)
