"""Kinematic models as products of elementary transforms (after Pashkevich 2004), and their batched kinematics.

A calibration model is the chain

    [Tx Ty Tz Rx Ry Rz]_0  J(q1)  [Tx Ty Tz Rx Ry Rz]_1  J(q2) ...  J(qn)  [Tx Ty Tz Rx Ry Rz]_n

of elementary transforms, each a value (nominal + error) in m or rad. Joint terms are Rz(q_j + offset)
for a revolute and Tz(q_j + offset) for a prismatic joint. Segment 0 is the base, segment n the tool
(its last frame is the tool frame; its origin is the measured tool point). This 6(n+1) + n term chain is
the *complete redundant* model; ident.calibration.synthesis selects the irreducible subset.

The nominal values are built from the home geometry (joint axis lines and tool pose at q = 0) with
modified-DH-like frames: after joint j the frame's x axis lies along the common normal to axis j+1, so
no intermediate segment ever meets the Rx-Ry-Rz singularity. ident Models (modified DH or URDF) and the
per-axis SVD fit (ident.calibration.fit) both reach the chain through the same `from_axes`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from firmware_bridge.runtime.errors import InputError
from ident.model import PRISMATIC, REVOLUTE, Model
from ident.model.spatial import rot_x, rot_y

KINDS = ("Tx", "Ty", "Tz", "Rx", "Ry", "Rz")
TX, TY, TZ, RX, RY, RZ = range(6)
SEGMENT_KINDS = (TX, TY, TZ, RX, RY, RZ)


class CalibrationModelError(InputError):
    """A geometry that the elementary-transform model cannot represent (names the segment or joint)."""


@dataclass(frozen=True, eq=False)
class CalibrationModel:
    """A serial chain of m elementary transforms over n joints.

    kind (m,) int 0..5 for Tx Ty Tz Rx Ry Rz; joint (m,) the joint index 0..n-1 of a joint term, -1 for a
    constant term; segment (m,) 0 (base) .. n (tool), a joint term carries the segment it opens;
    nominal (m,) values in m or rad (joint terms: the offset added to q). length_scale (m/rad) makes an
    angle comparable with a length (the arm's reach).
    """

    name: str
    kind: np.ndarray
    joint: np.ndarray
    segment: np.ndarray
    nominal: np.ndarray
    joint_names: tuple[str, ...]
    joint_type: np.ndarray
    q_min: np.ndarray
    q_max: np.ndarray
    length_scale: float

    @property
    def n(self) -> int:
        """Number of joints."""
        return len(self.joint_names)

    @property
    def m(self) -> int:
        """Number of elementary terms."""
        return len(self.kind)

    @property
    def is_rotation(self) -> np.ndarray:
        """(m,) True for the Rx Ry Rz terms (values in rad)."""
        return self.kind >= RX

    @property
    def is_joint(self) -> np.ndarray:
        """(m,) True for the joint terms."""
        return self.joint >= 0

    def names(self) -> list[str]:
        """Term names: 'Tx0' (segment 0), 'Rz(q2)' (offset of joint 2), 'Ry6' (tool of a 6-joint arm)."""
        return [f"{KINDS[k]}(q{j + 1})" if j >= 0 else f"{KINDS[k]}{s}"
                for k, j, s in zip(self.kind, self.joint, self.segment)]

    def unit(self) -> list[str]:
        """Unit of each term value: 'm' or 'rad'."""
        return ["rad" if r else "m" for r in self.is_rotation]

    def column_scale(self) -> np.ndarray:
        """(m,) factors that turn angle columns into lengths: length_scale for rotations, 1 for translations."""
        return np.where(self.is_rotation, self.length_scale, 1.0)


# ---------------------------------------------------------------------------------------------------
# Kinematics (numba, batched over poses)

@njit(cache=True)
def _chain_kinematics(kind, joint, values, Q, pose, jac, want_jac):
    """Tool pose (N,4,4) and d(pose)/d(values) (N,6,m) rows [dp; dω] in the base frame."""
    N = Q.shape[0]
    m = kind.shape[0]
    ax = np.empty((m, 3))
    org = np.empty((m, 3))
    R = np.empty((3, 3))
    p = np.empty(3)
    for i in range(N):
        for r in range(3):
            p[r] = 0.0
            for c in range(3):
                R[r, c] = 1.0 if r == c else 0.0
        for k in range(m):
            v = values[k]
            if joint[k] >= 0:
                v += Q[i, joint[k]]
            a = kind[k] % 3
            for r in range(3):
                ax[k, r] = R[r, a]
                org[k, r] = p[r]
            if kind[k] < 3:
                for r in range(3):
                    p[r] += v * R[r, a]
            else:
                b = (a + 1) % 3
                e = (a + 2) % 3
                cv = np.cos(v)
                sv = np.sin(v)
                for r in range(3):
                    rb = R[r, b]
                    re = R[r, e]
                    R[r, b] = cv * rb + sv * re
                    R[r, e] = -sv * rb + cv * re
        for r in range(3):
            for c in range(3):
                pose[i, r, c] = R[r, c]
            pose[i, r, 3] = p[r]
            pose[i, 3, r] = 0.0
        pose[i, 3, 3] = 1.0
        if want_jac:
            for k in range(m):
                if kind[k] < 3:
                    for r in range(3):
                        jac[i, r, k] = ax[k, r]
                        jac[i, 3 + r, k] = 0.0
                else:
                    d0 = p[0] - org[k, 0]
                    d1 = p[1] - org[k, 1]
                    d2 = p[2] - org[k, 2]
                    jac[i, 0, k] = ax[k, 1] * d2 - ax[k, 2] * d1
                    jac[i, 1, k] = ax[k, 2] * d0 - ax[k, 0] * d2
                    jac[i, 2, k] = ax[k, 0] * d1 - ax[k, 1] * d0
                    for r in range(3):
                        jac[i, 3 + r, k] = ax[k, r]


def _poses(cm: CalibrationModel, q) -> np.ndarray:
    Q = np.ascontiguousarray(np.atleast_2d(np.asarray(q, dtype=np.float64)))
    if Q.ndim != 2 or Q.shape[1] != cm.n:
        raise InputError(f"joint angles: expected shape (N, {cm.n}), got {np.shape(q)}")
    return Q


def _values(cm: CalibrationModel, values) -> np.ndarray:
    v = cm.nominal if values is None else np.asarray(values, dtype=np.float64)
    if v.shape != (cm.m,):
        raise ValueError(f"term values: expected shape ({cm.m},), got {v.shape}")
    return np.ascontiguousarray(v)


def tool_pose(cm: CalibrationModel, q, values: np.ndarray | None = None) -> np.ndarray:
    """Tool frame in the base frame at joint positions q.

    Parameters
    ----------
    cm : CalibrationModel
        The chain.
    q : array_like, shape (N, n)
        Joint positions, rad (m for prismatic joints).
    values : ndarray, shape (m,), optional
        The term values (default: nominal), e.g. `Identification.values` of a calibration.

    Returns
    -------
    ndarray, shape (N, 4, 4)
        Homogeneous transforms; the origin is the tool point (m).

    Raises
    ------
    ValueError
        q or values of the wrong shape.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.calibration.model import from_model, tool_pose
    >>> from ident.model import load_model
    >>> cm = from_model(load_model("generic6"))
    >>> T = tool_pose(cm, np.zeros((1, 6)))
    >>> T.shape, bool(np.allclose(T[0, :3, :3] @ T[0, :3, :3].T, np.eye(3)))
    ((1, 4, 4), True)
    """
    Q = _poses(cm, q)
    pose = np.empty((Q.shape[0], 4, 4))
    _chain_kinematics(cm.kind, cm.joint, _values(cm, values), Q, pose, np.empty((1, 6, 1)), False)
    return pose


def tool_kinematics(cm: CalibrationModel, q, values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(tool pose (N,4,4), identification Jacobian (N,6,m)): rows [dp (m); dω (rad)] per term value.

    Column k is the derivative of the tool point position and the tool orientation (small rotation
    vector in the base frame) with respect to the value of term k (m or rad).
    """
    Q = _poses(cm, q)
    pose = np.empty((Q.shape[0], 4, 4))
    jac = np.empty((Q.shape[0], 6, cm.m))
    _chain_kinematics(cm.kind, cm.joint, _values(cm, values), Q, pose, jac, True)
    return pose, jac


# ---------------------------------------------------------------------------------------------------
# Building the complete redundant model from home geometry

def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _perpendicular(v: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Component of v perpendicular to the unit z."""
    return v - (v @ z) * z


def _any_perpendicular(z: np.ndarray, hint: np.ndarray) -> np.ndarray:
    for cand in (hint, np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])):
        w = _perpendicular(cand, z)
        if np.linalg.norm(w) > 1e-6:
            return _unit(w)
    raise AssertionError("unreachable")


def _post_frames(points: np.ndarray, dirs: np.ndarray, tool_R: np.ndarray, tool_p: np.ndarray, tol: float):
    """Frame after each joint at home: z on the axis, x along the common normal to the next axis."""
    n = len(points)
    origins, frames = [], []
    prev_o, prev_x = np.zeros(3), np.array([1.0, 0.0, 0.0])
    for j in range(n):
        z = dirs[j]
        pj = points[j]
        if j + 1 < n:
            z2, p2 = dirs[j + 1], points[j + 1]
            c = np.cross(z, z2)
            if np.linalg.norm(c) > tol:
                w = pj - p2
                b, d, e = z @ z2, z @ w, z2 @ w
                t = (b * e - d) / (1.0 - b * b)
                o = pj + t * z
                x = _unit(c)
                s = (p2 - o) @ x
                if s < -tol or (abs(s) <= tol and x @ prev_x < 0.0):
                    x = -x
            else:
                o = pj + ((prev_o - pj) @ z) * z
                x = _perpendicular(p2 - o, z)
                x = _unit(x) if np.linalg.norm(x) > tol else _any_perpendicular(z, prev_x)
        else:   # the last frame's x follows the tool's x (or y): the tool rotation stays far from Ry = ±90 deg
            o = pj + ((tool_p - pj) @ z) * z
            x = _any_perpendicular(z, tool_R[:, 0] if abs(tool_R[:, 0] @ z) < 0.9 else tool_R[:, 1])
        R = np.column_stack([x, np.cross(z, x), z])
        origins.append(o)
        frames.append(R)
        prev_o, prev_x = o, x
    return origins, frames


def _euler_xyz(R: np.ndarray, where: str) -> tuple[float, float, float]:
    """(a, b, c) with R = Rx(a) Ry(b) Rz(c); raises at the b = ±90 deg singularity."""
    sb = float(np.clip(R[0, 2], -1.0, 1.0))
    if abs(sb) > 1.0 - 1e-9:
        raise CalibrationModelError(f"{where}: the nominal rotation has Ry = ±90 deg, where the Rx Ry Rz terms "
                                    "are singular; rotate the base or tool frame of the model")
    return float(np.arctan2(-R[1, 2], R[2, 2])), float(np.arcsin(sb)), float(np.arctan2(-R[0, 1], R[0, 0]))


def _signed_angle(x_from: np.ndarray, x_to: np.ndarray, z: np.ndarray) -> float:
    return float(np.arctan2(np.cross(x_from, x_to) @ z, x_from @ x_to))


def from_axes(points, dirs, joint_type, tool_R, tool_p, *, name: str = "arm",
              joint_names: tuple[str, ...] | None = None, q_min=None, q_max=None) -> CalibrationModel:
    """The complete redundant model from the home geometry, in the base frame.

    points, dirs (n, 3): a point (m) and the direction of each joint axis at q = 0; joint_type (n,) 0
    revolute / 1 prismatic; tool_R (3, 3), tool_p (3,): the tool frame at q = 0. No nominal DH values
    are needed: this is how the per-axis fit turns measured circles into a model.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    dirs = np.array([_unit(np.asarray(d, dtype=np.float64)) for d in np.asarray(dirs).reshape(-1, 3)])
    n = len(points)
    jt = np.asarray(joint_type, dtype=np.int64).reshape(n)
    tool_R = np.asarray(tool_R, dtype=np.float64)
    tool_p = np.asarray(tool_p, dtype=np.float64)
    reach = max(0.1, float(np.linalg.norm(points - tool_p, axis=1).max()))
    origins, frames = _post_frames(points, dirs, tool_R, tool_p, 1e-9 * reach + 1e-12)

    kind, joint, segment, nominal = [], [], [], []
    prev_R, prev_o = np.eye(3), np.zeros(3)
    for j in range(n + 1):
        where = "base segment" if j == 0 else ("tool segment" if j == n else f"segment {j}")
        t = prev_R.T @ ((tool_p if j == n else origins[j]) - prev_o)
        offset = 0.0
        if j == n:
            a, b, c = _euler_xyz(prev_R.T @ tool_R, where)
        else:
            zz = prev_R.T @ dirs[j]
            if abs(zz[0]) > 1.0 - 1e-9:
                raise CalibrationModelError(f"{where}: joint {j + 1}'s axis lies along x of the frame before it, "
                                            "where the Rx Ry terms are singular; rotate the base frame")
            a, b = float(np.arctan2(-zz[1], zz[2])), float(np.arcsin(zz[0]))
            pre_R = prev_R @ rot_x(a) @ rot_y(b)
            theta = _signed_angle(pre_R[:, 0], frames[j][:, 0], dirs[j])
            c, offset = (0.0, theta) if jt[j] == REVOLUTE else (theta, 0.0)
        for k, v in zip(SEGMENT_KINDS, (t[0], t[1], t[2], a, b, c)):
            kind.append(k), joint.append(-1), segment.append(j), nominal.append(v)
        if j < n:
            kind.append(RZ if jt[j] == REVOLUTE else TZ), joint.append(j), segment.append(j + 1)
            nominal.append(offset)
            prev_R, prev_o = frames[j], origins[j]
    nominal = np.array(nominal)
    nominal[np.abs(nominal) < 1e-12] = 0.0
    inf = np.full(n, np.inf)
    return CalibrationModel(
        name=name,
        kind=np.array(kind, dtype=np.int64),
        joint=np.array(joint, dtype=np.int64),
        segment=np.array(segment, dtype=np.int64),
        nominal=nominal,
        joint_names=tuple(joint_names) if joint_names else tuple(f"j{j + 1}" for j in range(n)),
        joint_type=jt,
        q_min=-inf if q_min is None else np.asarray(q_min, dtype=np.float64),
        q_max=inf if q_max is None else np.asarray(q_max, dtype=np.float64),
        length_scale=reach,
    )


def home_geometry(model: Model) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(axis points (n,3), axis directions (n,3), flange R (3,3), flange p (3,)) of an ident Model at q = 0."""
    R, p = np.eye(3), np.zeros(3)
    points, dirs = [], []
    for j in range(model.n):
        p = p + R @ model.placement_p[j]
        R = R @ model.placement_R[j]
        points.append(p.copy())
        dirs.append(R @ model.axis[j])
    return np.array(points), np.array(dirs), R @ model.flange_R, R @ model.flange_p + p


def from_model(model: Model, tool=(0.0, 0.0, 0.0)) -> CalibrationModel:
    """The complete redundant calibration model of an arm: its nominal geometry as elementary transforms.

    Parameters
    ----------
    model : Model
        The arm (modified DH or URDF).
    tool : array_like, shape (3,)
        The measured point in the flange frame, m.

    Returns
    -------
    CalibrationModel
        6(n+1) + n terms whose nominal values reproduce the model's kinematics.

    Raises
    ------
    InputError
        A tool point that is not 3 finite numbers.
    CalibrationModelError
        A geometry the elementary-transform model cannot represent (naming the joint).

    Examples
    --------
    At nominal values the tool point is where the model's flange kinematics put it:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.calibration.model import from_model, tool_pose
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> cm = from_model(model, tool=(0.0, 0.0, 0.1))
    >>> cm.n, cm.m
    (6, 48)
    >>> q = np.random.default_rng(0).uniform(-1, 1, (5, 6))
    >>> T = dynamics.flange_pose(model, q)
    >>> bool(np.allclose(tool_pose(cm, q)[:, :3, 3], T[:, :3, 3] + 0.1 * T[:, :3, 2]))
    True
    """
    tool = np.asarray(tool, dtype=np.float64)
    if tool.shape != (3,) or not np.all(np.isfinite(tool)):
        raise InputError(f"tool point: expected 3 finite numbers (m, flange frame), got {tool.tolist()}")
    points, dirs, fR, fp = home_geometry(model)
    return from_axes(points, dirs, model.joint_type, fR, fp + fR @ tool, name=model.name,
                     joint_names=model.joint_names, q_min=np.asarray(model.q_min), q_max=np.asarray(model.q_max))
