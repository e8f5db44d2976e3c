"""Identification (after Pashkevich 2004): the per-axis SVD fit as an initial estimate without nominal values, then
Gauss-Newton / Levenberg-Marquardt on the irreducible model with the analytic Jacobian.

Measurements are tool-point positions (N, 3) in m, optionally with tool orientations (N, 3, 3). The
orientation residual is the rotation vector of R_measured R_model^T (rad), weighted by the arm's reach
so that it compares with the position residual in m.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.spatial.transform import Rotation

from ident.calibration.model import CalibrationModel, from_axes, tool_kinematics, tool_pose
from ident.calibration.synthesis import IrreducibleModel, classify
from firmware_bridge.runtime.errors import InputError
from ident.model import PRISMATIC

# ---------------------------------------------------------------------------------------------------
# Stage 1: one joint at a time (Pashkevich's eqs. 9-16)


@dataclass(frozen=True)
class AxisFit:
    """g = mu R p(q) + t for one joint: R (3,3) with det +1 (its z column is the axis), t (3,) m the circle
    centre (revolute) or the point at q = 0 (prismatic), mu the radius in m (revolute) or the scale of
    the joint reading (prismatic); rms (m) the fit residual."""

    R: np.ndarray
    t: np.ndarray
    mu: float
    rms: float

    @property
    def axis(self) -> np.ndarray:
        """Unit direction of the joint axis (base frame)."""
        return self.R[:, 2]


def _unit_points(q: np.ndarray, prismatic: bool) -> np.ndarray:
    z = np.zeros_like(q)
    return np.column_stack([z, z, q]) if prismatic else np.column_stack([np.cos(q), np.sin(q), z])


def fit_axis(q, points, prismatic: bool = False) -> AxisFit:
    """Fit one joint's circle (revolute) or line (prismatic) to tool points (m, 3) m seen at joint values
    q (m,) rad or m, with every other joint still: S = sum p~ g~^T = U S V^T, R = V diag(1, 1, det) U^T."""
    q = np.asarray(q, dtype=np.float64).ravel()
    g = np.asarray(points, dtype=np.float64)
    if g.shape != (len(q), 3) or len(q) < (2 if prismatic else 3):
        raise InputError(f"axis fit: need at least {2 if prismatic else 3} points (m, 3) and m joint values, "
                         f"got points {g.shape} and {len(q)} values")
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(g))):
        raise InputError("axis fit: joint values and points must be finite")
    p = _unit_points(q, prismatic)
    pc, gc = p - p.mean(axis=0), g - g.mean(axis=0)
    U, _, Vt = np.linalg.svd(pc.T @ gc)
    V = Vt.T
    if prismatic:       # p~ spans z only: build a frame around the fitted direction
        d = V[:, 0] * np.sign(U[2, 0])
        x = np.cross(d, [1.0, 0.0, 0.0] if abs(d[0]) < 0.9 else [0.0, 1.0, 0.0])
        x /= np.linalg.norm(x)
        R = np.column_stack([x, np.cross(d, x), d])
    else:
        R = V @ np.diag([1.0, 1.0, np.linalg.det(V @ U.T)]) @ U.T
    mu = float(np.sum(gc * (pc @ R.T)) / np.sum(pc * pc))
    t = g.mean(axis=0) - mu * R @ p.mean(axis=0)
    rms = float(np.sqrt(np.mean(np.sum((g - mu * p @ R.T - t) ** 2, axis=1))))
    return AxisFit(R, t, mu, rms)


def axis_fit_covariance(fit: AxisFit, q, noise: float, prismatic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Pashkevich (2004): (cov of the small rotation dω of R (3, 3) rad^2, cov of t (3, 3) m^2) for independent
    point noise `noise` (m per coordinate; include r * sigma_q for joint noise):
    cov(dω) = noise^2 [sum skew(p~)^T skew(p~)]^-1, cov(dt) = noise^2 / m I."""
    p = fit.mu * _unit_points(np.asarray(q, dtype=np.float64).ravel(), prismatic) @ fit.R.T
    pc = p - p.mean(axis=0)
    S = np.sum(pc * pc) * np.eye(3) - pc.T @ pc
    return noise ** 2 * np.linalg.pinv(S), noise ** 2 / len(p) * np.eye(3)


def axis_fit_model(q, points, joint_type, *, name: str = "axis fit", joint_names: tuple[str, ...] | None = None,
                   q_min=None, q_max=None) -> tuple[CalibrationModel, list[AxisFit]]:
    """A complete chain from per-axis experiments, no nominal values needed.

    q (N, n): joint values where, in each row, at most one joint differs from 0 (the rows of joint j
    trace its circle or line); points (N, 3) m the measured tool point. Returns the chain (whose home
    geometry is the fitted axes and the tool point at q = 0) and the per-axis fits.
    """
    Q = np.asarray(q, dtype=np.float64)
    G = np.asarray(points, dtype=np.float64)
    n = Q.shape[1]
    jt = np.asarray(joint_type)
    short = [j + 1 for j in range(n) if np.count_nonzero(Q[:, j]) < (1 if jt[j] == PRISMATIC else 2)]
    if short:
        raise InputError(f"axis fit: joint(s) {', '.join(map(str, short))} need more poses that move them alone "
                         "(3 angles per revolute joint counting q = 0, 2 positions per prismatic joint)")
    fits = []
    moving = np.abs(Q) > 0.0
    if np.any(moving.sum(axis=1) > 1):
        bad = int(np.flatnonzero(moving.sum(axis=1) > 1)[0])
        raise InputError(f"axis fit: pose {bad} moves more than one joint; each row may move one joint only")
    home = ~moving.any(axis=1)
    for j in range(n):
        rows = moving[:, j] | home
        fits.append(fit_axis(Q[rows, j], G[rows], prismatic=jt[j] == PRISMATIC))
    f0 = fits[0]
    tool = f0.mu * f0.R @ _unit_points(np.zeros(1), jt[0] == PRISMATIC)[0] + f0.t
    points_on_axes = np.array([f.t for f in fits])
    cm = from_axes(points_on_axes, np.array([f.axis for f in fits]), jt, np.eye(3), tool, name=name,
                   joint_names=joint_names, q_min=q_min, q_max=q_max)
    return cm, fits


# ---------------------------------------------------------------------------------------------------
# Stage 2: least squares on the irreducible model


OUTLIER_SIGMAS = 3.0      # a pose is an outlier when its residual exceeds this many noise levels
ROUNDOFF_FLOOR = 1e-9     # of the reach (m): the noise level when none is stated (round-off of a noise-free fit)


class IdentificationError(InputError):
    """Measurements that cannot identify the model (names the poses or parameters at fault)."""


@dataclass(frozen=True, eq=False)
class Identification:
    """Result of identify().

    values (m,) all term values (m, rad); errors = values - nominal; sigma (m,) one-sigma uncertainty of
    identified terms (0 for fixed or deleted ones); cov (p, p) over the identified terms in chain order;
    residual_before / residual_after (N, 3) position residuals (m), orientation residuals (N, 3) rad
    when orientations were measured; noise (m) the residual standard deviation sqrt(RSS / (rows - p));
    outliers: pose indices whose residual (RMS per coordinate) exceeds `threshold` (m), 3 times the larger
    of `noise` and the stated measurement noise; iterations: function evaluations.
    """

    irreducible: IrreducibleModel
    values: np.ndarray
    errors: np.ndarray
    sigma: np.ndarray
    cov: np.ndarray
    residual_before: np.ndarray
    residual_after: np.ndarray
    orientation_before: np.ndarray | None
    orientation_after: np.ndarray | None
    noise: float
    outliers: np.ndarray
    iterations: int
    threshold: float = float("nan")

    @property
    def rms_before(self) -> float:
        """RMS position error before calibration (m)."""
        return float(np.sqrt(np.mean(np.sum(self.residual_before ** 2, axis=1))))

    @property
    def rms_after(self) -> float:
        """RMS position error after calibration (m)."""
        return float(np.sqrt(np.mean(np.sum(self.residual_after ** 2, axis=1))))


def _check_measurements(cm: CalibrationModel, q, p, R):
    Q = np.asarray(q, dtype=np.float64)
    P = np.asarray(p, dtype=np.float64)
    if Q.ndim != 2 or Q.shape[1] != cm.n:
        raise IdentificationError(f"joint angles: expected (N, {cm.n}), got {Q.shape}")
    if P.shape != (len(Q), 3):
        raise IdentificationError(f"measured positions: expected ({len(Q)}, 3), got {P.shape}")
    if R is not None:
        R = np.asarray(R, dtype=np.float64)
        if R.shape != (len(Q), 3, 3):
            raise IdentificationError(f"measured orientations: expected ({len(Q)}, 3, 3), got {R.shape}")
    for what, a in (("joint angles", Q), ("measured positions", P), ("measured orientations", R)):
        if a is not None and not np.all(np.isfinite(a)):
            bad = int(np.flatnonzero((~np.isfinite(a.reshape(len(Q), -1))).any(axis=1))[0])
            raise IdentificationError(f"{what}: pose {bad} is not finite (NaN or inf)")
    return np.ascontiguousarray(Q), P, R


def _residuals(cm, values, Q, P, R, scale_rows):
    pose, jac = tool_kinematics(cm, Q, values)
    e = P - pose[:, :3, 3]
    if R is None:
        return e, None, jac[:, :3, :]
    w = Rotation.from_matrix(R @ pose[:, :3, :3].transpose(0, 2, 1)).as_rotvec()
    J = jac.copy()
    J[:, 3:, :] *= scale_rows
    return e, w, J


def _stack(e, w, scale_rows):
    return e.ravel() if w is None else np.concatenate([e, w * scale_rows], axis=1).ravel()


def identify(irr: IrreducibleModel, q, positions, orientations=None, *, initial: np.ndarray | None = None,
             max_evaluations: int = 200, noise: float | None = None) -> Identification:
    """Identify the geometric errors of an arm from measured tool points (and orientations).

    Levenberg-Marquardt (scipy MINPACK) with the analytic Jacobian over the identified terms of irr;
    covariance sigma^2 (J^T J)^-1, sigma the residual standard deviation.

    Parameters
    ----------
    irr : IrreducibleModel
        What is identified (`ident.calibration.synthesis.synthesize`, for "position" or "pose").
    q : array_like, shape (N, n)
        Joint positions of the measured poses, rad (m for prismatic joints).
    positions : array_like, shape (N, 3)
        Measured tool points, m, in the sensor's (base) frame.
    orientations : array_like, shape (N, 3, 3), optional
        Measured tool orientations, for a model synthesised for "pose".
    initial : ndarray, shape (m,), optional
        Term values to start from (default: nominal).
    max_evaluations : int
        Function evaluations at most.
    noise : float, optional
        The stated measurement noise, m per coordinate: the floor of the outlier test. A pose is an
        outlier when its residual exceeds 3 max(s, noise), s the residual standard deviation (default: a
        round-off floor of 1e-9 of the arm's reach).

    Returns
    -------
    Identification
        values (m,) of every term, errors (values - nominal), sigma of the identified terms, the
        residuals before and after (rms_before, rms_after), outliers.

    Raises
    ------
    IdentificationError
        Measurements that do not fit the model or cannot identify it: wrong shapes, orientations missing
        or not expected, too few poses, terms these poses cannot identify (named), no convergence
        (an InputError).

    Examples
    --------
    Simulated measurements of an arm whose geometry is off by about a millimetre, noise-free:

    >>> import numpy as np
    >>> from ident.calibration.fit import identify
    >>> from ident.calibration.model import from_model, tool_pose
    >>> from ident.calibration.synthesis import random_configurations, synthesize
    >>> from ident.model import load_model
    >>> cm = from_model(load_model("generic6"), tool=(0.0, 0.0, 0.1))
    >>> irr = synthesize(cm, "position")
    >>> true = cm.nominal.copy()
    >>> true[irr.identified] += np.random.default_rng(1).normal(0.0, 1e-3, irr.count)
    >>> q = random_configurations(cm, 30, seed=2)
    >>> result = identify(irr, q, tool_pose(cm, q, true)[:, :3, 3])
    >>> bool(result.rms_before > 1e-3), bool(result.rms_after < 1e-9)
    (True, True)
    >>> bool(np.allclose(result.values[irr.identified], true[irr.identified], atol=1e-9))
    True
    """
    cm = irr.model
    if (orientations is None) != (irr.measure == "position"):
        raise IdentificationError(f"the model was synthesised for {irr.measure} measurements, "
                                  f"but orientations were {'not ' if orientations is None else ''}given")
    Q, P, R = _check_measurements(cm, q, positions, orientations)
    if noise is not None and not (np.isfinite(noise) and noise >= 0):
        raise IdentificationError(f"noise: expected the measurement noise in m (finite, >= 0), got {noise!r}")
    free = np.flatnonzero(irr.identified)
    rows = 3 if R is None else 6
    if rows * len(Q) <= len(free):
        raise IdentificationError(f"{len(Q)} poses give {rows * len(Q)} equations for {len(free)} parameters: "
                                  f"measure at least {len(free) // rows + 1} poses")
    L = cm.length_scale
    colscale = cm.column_scale()[free]
    v0 = np.array(cm.nominal if initial is None else initial, dtype=np.float64)
    if v0.shape != (cm.m,) or not np.all(np.isfinite(v0)):
        raise IdentificationError(f"initial values: expected {cm.m} finite numbers")

    cache = {}

    def evaluate(x):
        key = x.tobytes()
        if key not in cache:
            v = v0.copy()
            v[free] += x / colscale
            e, w, J = _residuals(cm, v, Q, P, R, L)
            cache.clear()
            cache[key] = (_stack(e, w, L), -J[:, :, free].reshape(-1, len(free)) / colscale)
        return cache[key]

    x0 = np.zeros(len(free))
    r0, J0 = evaluate(x0)
    idf = classify(J0)
    if idf.rank < len(free):
        names = [irr.names()[k] for k, s in enumerate(idf.status) if s != "identifiable"]
        raise IdentificationError(f"these poses cannot identify {len(free) - idf.rank} of the parameters; "
                                  f"not identifiable from them: {', '.join(names)} (add poses that move these terms)")
    sol = least_squares(lambda x: evaluate(x)[0], x0, jac=lambda x: evaluate(x)[1], method="lm",
                        xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=max_evaluations)
    if sol.status == 0:
        raise IdentificationError(f"Levenberg-Marquardt did not converge in {sol.nfev} evaluations; check that "
                                  "the positions are in m, the joint values in rad and the tool point is right")
    values = v0.copy()
    values[free] += sol.x / colscale
    e, w, J = _residuals(cm, values, Q, P, R, L)
    Jf = J[:, :, free].reshape(-1, len(free))
    dof = Jf.shape[0] - len(free)
    rss = float(np.sum(_stack(e, w, L) ** 2))
    s = float(np.sqrt(rss / dof))
    cov = s ** 2 * np.linalg.inv(Jf.T @ Jf)
    sigma = np.zeros(cm.m)
    sigma[free] = np.sqrt(np.diag(cov))
    e0, w0, _ = _residuals(cm, v0, Q, P, R, L)
    per_pose = np.sqrt(np.sum(_stack(e, w, L).reshape(len(Q), -1) ** 2, axis=1) / rows)
    threshold = OUTLIER_SIGMAS * max(s, ROUNDOFF_FLOOR * L if noise is None else noise)
    outliers = np.flatnonzero(per_pose > threshold)
    return Identification(irr, values, values - cm.nominal, sigma, cov, e0, e, w0, w, s, outliers, sol.nfev,
                          threshold)


def predicted_accuracy(result: Identification, q, noise: float | None = None) -> np.ndarray:
    """(N,) one-sigma tool-point position error (m) of the calibrated model at joint values q (N, n):
    sqrt(trace(J_p cov J_p^T)); noise (m) rescales cov to a given measurement noise."""
    irr = result.irreducible
    free = np.flatnonzero(irr.identified)
    _, jac = tool_kinematics(irr.model, q, result.values)
    Jp = jac[:, :3, free]
    cov = result.cov if noise is None else result.cov * (noise / result.noise) ** 2
    return np.sqrt(np.einsum("nij,jk,nik->n", Jp, cov, Jp))


def position_error(cm: CalibrationModel, values: np.ndarray, q, positions) -> np.ndarray:
    """(N,) distance (m) between measured tool points (N, 3) and the model with term values (m,)."""
    return np.linalg.norm(np.asarray(positions) - tool_pose(cm, q, values)[:, :3, 3], axis=1)
