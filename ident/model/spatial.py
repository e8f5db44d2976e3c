"""Small rigid-body helpers in plain numpy: rotations, transforms, inertia shifts.

These run once per model load, never per sample; the per-sample versions live in ident.model.kernels.
"""
from __future__ import annotations

import math

import numpy as np


def rot_x(a: float) -> np.ndarray:
    """Rotation matrix about x by angle a (rad)."""
    c, s = np.cos(a), np.sin(a)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def rot_y(a: float) -> np.ndarray:
    """Rotation matrix about y by angle a (rad)."""
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def rot_z(a: float) -> np.ndarray:
    """Rotation matrix about z by angle a (rad)."""
    c, s = np.cos(a), np.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def rpy_to_matrix(rpy) -> np.ndarray:
    """URDF roll-pitch-yaw (fixed axes x, then y, then z): R = Rz(yaw) Ry(pitch) Rx(roll)."""
    r, p, y = rpy
    return rot_z(y) @ rot_y(p) @ rot_x(r)


def mdh_placement(alpha: float, d: float, theta: float, r: float) -> tuple[np.ndarray, np.ndarray]:
    """Modified DH (Khalil-Kleinfinger) fixed part of j-1 -> j: Rot(x,alpha) Trans(x,d) Rot(z,theta) Trans(z,r).

    Returns (R, p): the joint variable then acts about / along the z axis of the new frame.
    """
    R = rot_x(alpha) @ rot_z(theta)
    p = np.array([d, -r * np.sin(alpha), r * np.cos(alpha)])
    return R, p


def skew(v) -> np.ndarray:
    """Cross-product matrix [v]x, so that skew(v) @ w == cross(v, w)."""
    return np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])


def inertia_matrix(six) -> np.ndarray:
    """3x3 symmetric matrix from [XX XY XZ YY YZ ZZ]."""
    xx, xy, xz, yy, yz, zz = six
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


def inertia_six(J: np.ndarray) -> np.ndarray:
    """[XX XY XZ YY YZ ZZ] of a symmetric 3x3 matrix."""
    return np.array([J[0, 0], J[0, 1], J[0, 2], J[1, 1], J[1, 2], J[2, 2]])


def body_parameters(mass: float, com, inertia_com: np.ndarray) -> np.ndarray:
    """The 10 standard parameters [XX XY XZ YY YZ ZZ mX mY mZ m] of a body about its frame origin.

    com in m and inertia_com (3x3, about the centre of mass, frame axes) in kg m^2.
    """
    c = np.asarray(com, dtype=float)
    J = inertia_com + mass * (skew(c).T @ skew(c))
    return np.concatenate([inertia_six(J), mass * c, [mass]])


def transform_body_parameters(chi10: np.ndarray, R: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Express a body's 10 parameters in another frame.

    chi10 is given in frame B; frame B sits at (R, p) in frame A (x_A = R x_B + p). Returns the
    10 parameters about A's origin in A's axes. Linear in chi10 (inertia shift with first moments).
    """
    J_b = inertia_matrix(chi10[:6])
    h_b = chi10[6:9]
    m = chi10[9]
    J_a = R @ J_b @ R.T
    h = R @ h_b
    P = skew(p)
    J_o = J_a + m * (P.T @ P) + P.T @ skew(h) + skew(h).T @ P
    return np.concatenate([inertia_six(J_o), h + m * p, [m]])


def body_transform_matrix(R: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The 10x10 matrix T with transform_body_parameters(chi, R, p) == T @ chi."""
    T = np.empty((10, 10))
    for k in range(10):
        e = np.zeros(10)
        e[k] = 1.0
        T[:, k] = transform_body_parameters(e, R, p)
    return T


def is_physically_consistent(chi10: np.ndarray, tol: float = 1e-9) -> tuple[bool, str]:
    """Whether the 10 parameters can belong to a real body: m >= 0, and the inertia about the centre of
    mass positive semidefinite with the triangle inequalities. Returns (ok, reason)."""
    m = chi10[9]
    if not np.isfinite(chi10).all():
        return False, "non-finite value"
    if m < -tol:
        return False, f"negative mass {m:g} kg"
    J = inertia_matrix(chi10[:6])
    if m > tol:
        c = chi10[6:9] / m
        J = J - m * (skew(c).T @ skew(c))
    elif np.linalg.norm(chi10[6:9]) > tol:
        return False, "first moments without mass"
    ev = np.linalg.eigvalsh(J)
    scale = max(1.0, float(np.abs(ev).max()))
    if ev.min() < -tol * scale:
        return False, f"inertia about the centre of mass has a negative eigenvalue {ev.min():g} kg m^2"
    a, b, c3 = np.sort(ev)
    if a + b < c3 - tol * scale:
        return False, "principal moments break the triangle inequality"
    return True, ""


def rpy(R: np.ndarray) -> list[float]:
    """URDF roll-pitch-yaw (rad) of a rotation matrix R = Rz(yaw) Ry(pitch) Rx(roll)."""
    pitch = math.atan2(-R[2, 0], math.hypot(R[0, 0], R[1, 0]))
    roll = math.atan2(R[2, 1], R[2, 2])
    yaw = math.atan2(R[1, 0], R[0, 0])
    return [roll, pitch, yaw]
