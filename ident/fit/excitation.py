"""Excitation trajectories: finite Fourier series per joint (Zhang, Qin and Zou 2017, eq. 14) and their optimal design.

    q_j(t)   = q0_j + sum_l [ a_jl/(wf l) sin(wf l t) - b_jl/(wf l) cos(wf l t) ]
    qd_j(t)  = sum_l [ a_jl cos(wf l t) + b_jl sin(wf l t) ]
    qdd_j(t) = sum_l [ -a_jl wf l sin(wf l t) + b_jl wf l cos(wf l t) ]       wf = 2 pi f0, l = 1..H

`design` chooses the coefficients that minimise cond() of the base regressor stacked over one period
(or maximise log det, D-optimal) with scipy's SLSQP, under the model's position, velocity, acceleration and
torque limits, starting and ending at rest at a given pose, and optionally keeping the flange above a floor
plane. The file format is documented in docs/reference/trajectory-file.md.
"""
from __future__ import annotations

import math
import numbers
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.linalg
import scipy.optimize

from ident.model import dynamics
from ident.model.base_params import BaseParameters, base_parameters
from firmware_bridge.runtime.errors import InputError
from ident.model.limits import LimitError, check_motion
from ident.model import DRIVE_NAMES, INERTIAL_NAMES, PARAMS_PER_JOINT, Model

GRID_PER_PERIOD = 120      # samples per period for the criterion and the constraints during the search
MAX_SAMPLES = 1_000_000    # samples of one sampling (1000 s at 1 kHz): a few hundred MB of basis matrices
MAX_BASE_FREQUENCY = 100.0  # Hz: an arm's excitation is a few Hz; above, a period is a handful of samples at 1 kHz
MAX_GRID = 10_000          # samples per period during the search: the stacked regressor is grid x n rows
MAX_HARMONICS = 100        # harmonics per joint: the basis matrices grow with samples x harmonics
SAFETY = 0.95              # limits are tightened by 5 % during the search; the result is checked exactly


class TrajectoryFileError(InputError):
    """A trajectory file is unusable: the message names the file and the field."""


def smooth_ramp(x) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Smootherstep s(x) = 6x^5 - 15x^4 + 10x^3 on [0, 1] and its first two derivatives in x (s', s'' zero at
    both ends), clipped to 0 and 1 outside."""
    x = np.clip(np.asarray(x, dtype=float), 0.0, 1.0)
    return x ** 3 * (10 - 15 * x + 6 * x * x), 30 * x * x * (1 - x) ** 2, 60 * x * (1 - x) * (1 - 2 * x)


@dataclass(frozen=True, eq=False)
class FourierTrajectory:
    """A periodic joint motion: a finite Fourier series per joint.

    q_j(t) = q0_j + sum over l = 1..H of a_jl / (wf l) sin(wf l t) - b_jl / (wf l) cos(wf l t), with
    wf = 2 pi base_frequency.

    Parameters
    ----------
    base_frequency : float
        f0, Hz; the motion repeats every 1/f0 s.
    q0 : array_like, shape (n,)
        The offsets, rad.
    a, b : array_like, shape (n, H)
        The sine and cosine coefficients, rad/s.
    joint_names : tuple of str, optional
        One per joint.
    info : dict, optional
        How the trajectory was made (criterion, cond, seed, model, ...).
    source : str, optional
        The file it was read from, for messages.

    Raises
    ------
    InputError
        A base frequency out of range, or coefficients of mismatched shapes or not finite.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.fit.excitation import FourierTrajectory
    >>> traj = FourierTrajectory(0.5, q0=[0.1], a=[[1.0, 0.0]], b=[[0.0, 0.0]])
    >>> traj.n, traj.harmonics, traj.period
    (1, 2, 2.0)
    >>> t, q, qd, qdd = traj.sample(rate_hz=100.0)        # one period, end point included
    >>> t.shape, q.shape, bool(np.allclose(q[0], q[-1]))
    ((201,), (201, 1), True)
    >>> bool(np.allclose(qd[:, 0], np.cos(np.pi * t)))    # qd = a cos(wf t)
    True
    """

    base_frequency: float
    q0: np.ndarray
    a: np.ndarray
    b: np.ndarray
    joint_names: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)   # how it was made: criterion, cond, seed, model, ...
    source: str = ""                           # the file it was read from, for error messages

    def __post_init__(self) -> None:
        if not (_is_number(self.base_frequency) and 0 < self.base_frequency <= MAX_BASE_FREQUENCY):
            raise InputError(f"base_frequency: expected a number of Hz in (0, {MAX_BASE_FREQUENCY:g}], "
                             f"got {self.base_frequency!r}")
        a, b = np.array(self.a, dtype=float), np.array(self.b, dtype=float)
        q0 = np.array(self.q0, dtype=float)
        if a.ndim != 2 or a.shape[1] == 0 or b.shape != a.shape or q0.shape != (a.shape[0],):
            raise InputError(f"trajectory coefficients: expected q0 (n,), a and b (n, H), got {q0.shape}, "
                             f"{a.shape}, {b.shape}")
        if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(q0).all()):
            raise InputError("trajectory coefficients: not finite")
        if a.shape[1] > MAX_HARMONICS:
            raise InputError(f"trajectory coefficients: {a.shape[1]} harmonics, expected at most {MAX_HARMONICS}")
        if self.joint_names and len(self.joint_names) != a.shape[0]:
            raise InputError(f"joint_names: expected {a.shape[0]} names, got {len(self.joint_names)}")
        for name, value in (("q0", q0), ("a", a), ("b", b)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "base_frequency", float(self.base_frequency))

    @property
    def n(self) -> int:
        return self.a.shape[0]

    @property
    def harmonics(self) -> int:
        return self.a.shape[1]

    @property
    def period(self) -> float:
        """Seconds per period, 1/f0."""
        return 1.0 / self.base_frequency

    def evaluate(self, t) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, qd, qdd (N, n) at the times t (N,) in seconds."""
        Bq, Bv, Ba = basis(np.asarray(t, dtype=float), self.base_frequency, self.harmonics)
        X = coefficient_matrix(self)                        # (2H+1, n)
        return Bq @ X, Bv @ X, Ba @ X

    def blended(self, t, *, lead: float, end: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, qd, qdd (N, n) at the times t (N,) s of the motion blended in from rest at its mean pose q0:
        q0 + w(t) (q(t) - q0), where w rises smoothly (smooth_ramp) from 0 at t = -lead to 1 at t = 0 and,
        with end, falls back to 0 from t = end to end + lead. Position, velocity and acceleration are
        continuous, and the motion starts (and ends) at rest at q0 whatever the trajectory's own ends are."""
        if not (_is_number(lead) and lead > 0):
            raise InputError(f"blend: expected a positive number of seconds, got {lead!r}")
        t = np.asarray(t, dtype=float)
        q, qd, qdd = self.evaluate(t)
        w, dw, ddw = smooth_ramp((t + lead) / lead)
        dw, ddw = dw / lead, ddw / lead ** 2
        if end is not None:
            v, dv, ddv = smooth_ramp((end + lead - t) / lead)
            dv, ddv = -dv / lead, ddv / lead ** 2
            w, dw, ddw = w * v, dw * v + w * dv, ddw * v + 2 * dw * dv + w * ddv
        w, dw, ddw = w[:, None], dw[:, None], ddw[:, None]
        dq = q - self.q0
        return self.q0 + w * dq, dw * dq + w * qd, ddw * dq + 2 * dw * qd + w * qdd

    def sample(self, rate_hz: float, periods: float = 1.0) -> tuple[np.ndarray, ...]:
        """(t, q, qd, qdd) sampled at rate_hz over the given number of periods, end point included."""
        where = f"{self.source}: trajectory.base_frequency" if self.source else "base_frequency"
        count = sample_count(self.base_frequency, rate_hz, periods, where)
        t = np.arange(count) / rate_hz
        return (t, *self.evaluate(t))


def sample_count(base_frequency: float, rate_hz: float, periods: float = 1.0, where: str = "base_frequency") -> int:
    """Samples (end point included) of `periods` periods of a base_frequency (Hz) motion at rate_hz (Hz),
    refused with an InputError naming `where` before anything is allocated when above MAX_SAMPLES."""
    for name, value in (("rate", rate_hz), ("periods", periods), (where, base_frequency)):
        if not (_is_number(value) and value > 0):
            raise InputError(f"{name}: expected a positive number, got {value!r}")
    count = periods / base_frequency * rate_hz
    if not count <= MAX_SAMPLES:
        lowest = rate_hz / MAX_SAMPLES
        hint = f"a base frequency of at least {lowest:g} Hz at this rate" if base_frequency < lowest else \
            "fewer periods or a lower rate"
        raise InputError(f"{where}: {base_frequency:g} Hz is a period of {1 / base_frequency:g} s, {periods:g} period(s) "
                         f"at {rate_hz:g} Hz are {count:.3g} samples; expected at most {MAX_SAMPLES} ({hint})")
    return int(round(count)) + 1


def excitation_bandwidth(traj: FourierTrajectory) -> float:
    """The highest frequency in the motion (Hz): harmonics * base_frequency. preprocess.prepare takes it
    as bandwidth_hz to set its low-pass cut-off."""
    return traj.harmonics * traj.base_frequency


def at_rest(traj: FourierTrajectory, tol: float = 1e-9) -> bool:
    """True when qd and qdd are zero (within tol, rad/s and rad/s^2) at t = 0, and so at every period end."""
    _, qd, qdd = traj.evaluate(np.zeros(1))
    return bool(np.abs(qd).max() <= tol and np.abs(qdd).max() <= tol)


def basis(t: np.ndarray, f0: float, H: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Matrices (N, 2H+1) mapping the coefficient column [q0, a_1..a_H, b_1..b_H] to q, qd, qdd."""
    wf = 2 * math.pi * f0
    wl = wf * np.arange(1, H + 1)
    s, c = np.sin(np.outer(t, wl)), np.cos(np.outer(t, wl))
    N = len(t)
    Bq = np.hstack([np.ones((N, 1)), s / wl, -c / wl])
    Bv = np.hstack([np.zeros((N, 1)), c, s])
    Ba = np.hstack([np.zeros((N, 1)), -s * wl, c * wl])
    return Bq, Bv, Ba


def coefficient_matrix(traj: FourierTrajectory) -> np.ndarray:
    """The (2H+1, n) matrix whose column j is [q0_j, a_j1..a_jH, b_j1..b_jH]."""
    return np.vstack([traj.q0[None, :], traj.a.T, traj.b.T])


def _rest_constraints(f0: float, H: int) -> np.ndarray:
    """E (3, 2H+1): E @ x = [pose, 0, 0] means q(0) = pose, qd(0) = 0, qdd(0) = 0 (and so at t = T)."""
    Bq, Bv, Ba = basis(np.zeros(1), f0, H)
    return np.vstack([Bq, Bv, Ba])


# ---------------------------------------------------------------------------------------------------
# File format (TOML)

def save(traj: FourierTrajectory, path: str | Path) -> None:
    """Write a trajectory file (TOML, docs/reference/trajectory-file.md).

    Parameters
    ----------
    traj : FourierTrajectory
        The trajectory; its `info` is written as provenance.
    path : str or Path
        The file to write (replaced if it exists).

    Returns
    -------
    None

    Raises
    ------
    OSError
        The file cannot be written.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ident.fit import excitation
    >>> traj = excitation.preset("seed000")
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder) / "traj.toml"
    ...     excitation.save(traj, path)
    ...     again = excitation.load(path)
    >>> bool((again.a == traj.a).all() and (again.b == traj.b).all() and (again.q0 == traj.q0).all())
    True
    """
    import tomli_w

    doc = {"trajectory": {"kind": "fourier", "base_frequency": float(traj.base_frequency),
                          "harmonics": traj.harmonics, "period": traj.period,
                          **{k: v for k, v in traj.info.items() if v is not None}},
           "joint": [{"name": name, "q0": float(traj.q0[j]), "a": traj.a[j].tolist(), "b": traj.b[j].tolist()}
                     for j, name in enumerate(traj.joint_names or [f"joint{j + 1}" for j in range(traj.n)])]}
    header = ("# armid excitation trajectory: finite Fourier series per joint (docs/reference/trajectory-file.md).\n"
              "# q_j(t) = q0 + sum_l a_l/(wf l) sin(wf l t) - b_l/(wf l) cos(wf l t), wf = 2 pi base_frequency.\n"
              "# Units: Hz, s, rad, rad/s.\n")
    Path(path).write_text(header + tomli_w.dumps(doc))


_HEAD_FIELDS = ("kind", "base_frequency", "harmonics", "period")   # the rest of [trajectory] is provenance (info)
_JOINT_FIELDS = ("name", "q0", "a", "b")


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def load(path: str | Path) -> FourierTrajectory:
    """Read a trajectory file (docs/reference/trajectory-file.md), strictly.

    Parameters
    ----------
    path : str or Path
        The TOML file that `save` or `armid excite design` wrote.

    Returns
    -------
    FourierTrajectory
        With `source` set to the path.

    Raises
    ------
    TrajectoryFileError
        Names the file and the field at fault: a missing, mistyped, unknown or inconsistent field, a
        non-finite number, a file that is not TOML or cannot be read (an InputError).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ident.fit import excitation
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder) / "traj.toml"
    ...     _ = path.write_text('trajectory = {kind = "fourier", base_frequency = "fast"}')
    ...     excitation.load(path)
    Traceback (most recent call last):
    ...
    ident.fit.excitation.TrajectoryFileError: ...traj.toml: trajectory.base_frequency: expected a number of Hz ..., got 'fast'
    """
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise TrajectoryFileError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TrajectoryFileError(f"{path}: not valid TOML: {exc}") from None

    def fail(field: str, expected: str, got=None) -> TrajectoryFileError:
        return TrajectoryFileError(f"{path}: {field}: expected {expected}" + ("" if got is None else f", got {got!r}"))

    unknown = sorted(set(doc) - {"trajectory", "joint"})
    if unknown:
        raise fail(unknown[0], "only the tables [trajectory] and [[joint]]")
    head = doc.get("trajectory")
    if not isinstance(head, dict):
        raise fail("[trajectory]", "a table with kind = \"fourier\" and base_frequency")
    if head.get("kind") != "fourier":
        raise fail("trajectory.kind", '"fourier"', head.get("kind"))
    f0 = head.get("base_frequency")
    if not (_is_number(f0) and 0 < f0 <= MAX_BASE_FREQUENCY):
        raise fail("trajectory.base_frequency", f"a number of Hz in (0, {MAX_BASE_FREQUENCY:g}]", f0)
    joints = doc.get("joint")
    if not isinstance(joints, list) or not joints:
        raise fail("[[joint]]", "one table per joint")
    q0, a, b, names = [], [], [], []
    for j, entry in enumerate(joints):
        where = f"joint[{j + 1}]"
        if not isinstance(entry, dict):
            raise fail(where, "a table with q0, a and b")
        extra = sorted(set(entry) - set(_JOINT_FIELDS))
        if extra:
            raise fail(f"{where}.{extra[0]}", "only the fields " + ", ".join(_JOINT_FIELDS) + " (unknown field)")
        for key in ("q0", "a", "b"):
            if key not in entry:
                raise fail(f"{where}.{key}", "a value (missing)")
        if not _is_number(entry["q0"]):
            raise fail(f"{where}.q0", "a finite number in rad", entry["q0"])
        for key in ("a", "b"):
            values = entry[key]
            if not isinstance(values, list) or not values or not all(_is_number(v) for v in values):
                raise fail(f"{where}.{key}", "a non-empty list of finite numbers in rad/s", values)
            if len(values) > MAX_HARMONICS:
                raise fail(f"{where}.{key}", f"at most {MAX_HARMONICS} coefficients (one per harmonic)", len(values))
        H = len(joints[0]["a"]) if isinstance(joints[0].get("a"), list) else len(entry["a"])
        for key in ("a", "b"):
            if len(entry[key]) != H:
                raise fail(f"{where}.{key}", f"{H} coefficients like joint[1].a (one per harmonic)", len(entry[key]))
        name = entry.get("name", f"joint{j + 1}")
        if not isinstance(name, str) or not name or name in names:
            raise fail(f"{where}.name", "a non-empty name, unique among the joints", name)
        q0.append(float(entry["q0"])), a.append(entry["a"]), b.append(entry["b"]), names.append(name)
    if "harmonics" in head and head["harmonics"] != len(a[0]):
        raise fail("trajectory.harmonics", f"{len(a[0])}, the length of the coefficient lists", head["harmonics"])
    if "period" in head and not (_is_number(head["period"]) and math.isclose(head["period"], 1 / f0, rel_tol=1e-9)):
        raise fail("trajectory.period", f"1 / base_frequency = {1 / f0!r} s", head["period"])
    info = {k: v for k, v in head.items() if k not in _HEAD_FIELDS}
    return FourierTrajectory(float(f0), np.array(q0), np.array(a, dtype=float), np.array(b, dtype=float),
                             tuple(names), info, str(path))


def presets() -> list[str]:
    """Names of the trajectories shipped with armid.

    Returns
    -------
    list of str
        Names `preset` accepts.

    Examples
    --------
    >>> from ident.fit import excitation
    >>> "seed000" in excitation.presets()
    True
    """
    from importlib import resources

    return sorted(p.name[:-5] for p in (resources.files("ident") / "presets").iterdir() if p.name.endswith(".toml"))


def preset(name: str) -> FourierTrajectory:
    """A trajectory shipped with armid.

    Parameters
    ----------
    name : str
        One of `presets()`: "seed000" is the optimised excitation of Table 1 of Zhang, Qin and Zou (2017)
        (6 joints, 6 harmonics).

    Returns
    -------
    FourierTrajectory

    Raises
    ------
    TrajectoryFileError
        No preset of that name (the shipped ones are listed).

    Examples
    --------
    >>> from ident.fit import excitation
    >>> traj = excitation.preset("seed000")
    >>> traj.n, traj.harmonics, traj.base_frequency
    (6, 6, 0.1)
    """
    from importlib import resources

    if name not in presets():
        raise TrajectoryFileError(f"{name}: no such preset; shipped: {', '.join(presets())}")
    with resources.as_file(resources.files("ident") / "presets" / f"{name}.toml") as path:
        return load(path)


# ---------------------------------------------------------------------------------------------------
# Quality of a trajectory for identification

def stacked_base_regressor(model: Model, base: BaseParameters, traj: FourierTrajectory,
                           samples: int = GRID_PER_PERIOD) -> np.ndarray:
    """The base regressor (samples*n, b) over one period."""
    t = np.arange(samples) * (traj.period / samples)
    q, qd, qdd = traj.evaluate(t)
    return base.regressor(dynamics.regressor(model, q, qd, qdd)).reshape(-1, base.count)


@dataclass(frozen=True, eq=False)
class Criterion:
    """The regressor a design scores: Y @ columns (columns (14n, c), Y the standard regressor (..., n, 14n)),
    with only the rows of the joints in `rows` (default all). The base regressor is Y[..., base.indices]
    (base_columns); a payload regressor is Y @ (its map into the last link's parameters)."""

    columns: np.ndarray
    rows: np.ndarray | None = None

    def regressor(self, Y: np.ndarray) -> np.ndarray:
        """(..., n, c) from the standard regressor Y (..., n, 14n); rows outside `rows` are zero."""
        W = Y @ self.columns
        if self.rows is not None:
            dropped = np.setdiff1d(np.arange(W.shape[-2]), self.rows)
            W[..., dropped, :] = 0.0
        return W

    def stacked(self, model: Model, traj: FourierTrajectory, samples: int = GRID_PER_PERIOD) -> np.ndarray:
        """The criterion's regressor (samples*n, c) over one period."""
        t = np.arange(samples) * (traj.period / samples)
        return self.regressor(dynamics.regressor(model, *traj.evaluate(t))).reshape(-1, self.columns.shape[1])


def base_columns(model: Model, base: BaseParameters) -> np.ndarray:
    """(14n, b) selection matrix of the base columns: Y @ base_columns(...) == base.regressor(Y)."""
    S = np.zeros((PARAMS_PER_JOINT * model.n, base.count))
    S[base.indices, np.arange(base.count)] = 1.0
    return S


def criteria(W: np.ndarray) -> dict[str, float]:
    """cond(W) and log det(W^T W) of a stacked regressor, from the eigenvalues of W^T W (the squared
    singular values; exact enough for cond up to 1e6, and far cheaper than an SVD of the tall W)."""
    lam = np.linalg.eigvalsh(W.T @ W)
    if lam[0] <= lam[-1] * 1e-24:
        return {"cond": math.inf, "logdet": -math.inf}
    return {"cond": float(math.sqrt(lam[-1] / lam[0])), "logdet": float(np.sum(np.log(lam)))}


# ---------------------------------------------------------------------------------------------------
# Optimal design

STEP_Q = 1e-6              # rad: central-difference step of the regressor's derivative in q
SIGN_SMOOTHING = 0.05     # rad/s: sign(qd) ~ tanh(qd / 0.05) during the search
COULOMB = len(INERTIAL_NAMES) + DRIVE_NAMES.index("fc")   # fc among the standard parameters of a joint


class _Problem:
    """The design problem in the free coordinates z: coefficients X = X_p + Nul @ Z (Z = z as (k, n), column
    j for joint j) keep every joint at rest at the pose at t = 0 (and so at t = T).

    Objective and constraints come with exact-to-rounding gradients: the regressor is linear in qdd,
    quadratic in qd (central differences are exact) and smooth in q (central differences, step STEP_Q),
    and the chain rule through the Fourier basis gives d/dz."""

    def __init__(self, model: Model, base: BaseParameters, f0: float, H: int, pose: np.ndarray, criterion: str,
                 floor_z: float | None, grid: int, target: Criterion | None = None, moving: np.ndarray | None = None):
        self.model, self.base, self.criterion, self.floor_z = model, base, criterion, floor_z
        self.target = target or Criterion(base_columns(model, base))
        self.f0, self.H, self.pose = f0, H, pose
        E = _rest_constraints(f0, H)
        self.Nul = scipy.linalg.null_space(E)                                   # (2H+1, k)
        self.X_p = np.linalg.lstsq(E, np.vstack([pose, np.zeros((2, model.n))]), rcond=None)[0]
        self.t = np.arange(grid) / (grid * f0)
        self.B = basis(self.t, f0, H)
        self.BN = [Bx @ self.Nul for Bx in self.B]                             # (K, k) per quantity
        self.k = self.Nul.shape[1]
        self.chi = model.standard_parameters()
        self.limited = np.isfinite(model.tau_max)                               # joints with a torque limit
        moving = np.arange(model.n) if moving is None else np.asarray(moving, dtype=int)
        # the free coordinates: those of the moving joints (z index j * k + c); the others stay at the pose,
        # with the constant motion q = pose as their particular solution
        self.free = (moving[:, None] * self.k + np.arange(self.k)[None, :]).ravel()
        held = np.setdiff1d(np.arange(model.n), moving)
        self.X_p[:, held] = 0.0
        self.X_p[0, held] = pose[held]
        self._cache_key: bytes | None = None

    @property
    def size(self) -> int:
        return len(self.free)

    def _full(self, z: np.ndarray) -> np.ndarray:
        out = np.zeros(self.k * self.model.n)
        out[self.free] = z
        return out

    def coefficients(self, z: np.ndarray) -> np.ndarray:
        return self.X_p + self.Nul @ self._full(z).reshape(self.k, self.model.n, order="F")

    def trajectory(self, z: np.ndarray, info: dict | None = None) -> FourierTrajectory:
        X, H = self.coefficients(z), self.H
        return FourierTrajectory(self.f0, X[0].copy(), X[1:H + 1].T.copy(), X[H + 1:].T.copy(),
                                 self.model.joint_names, info or {})

    def motion(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        X = self.coefficients(z)
        return self.B[0] @ X, self.B[1] @ X, self.B[2] @ X

    def _chain_rule(self, dq: np.ndarray, dqd: np.ndarray, dqdd: np.ndarray, per_sample: bool) -> np.ndarray:
        """d/dz from derivatives with respect to q_j, qd_j, qdd_j at each grid sample k, each (n_j, K, ...):
        summed over the samples (a scalar's gradient, (size,)) or per sample ((K, ..., size))."""
        spec = "jk...,kc->k...jc" if per_sample else "jk,kc->jc"
        out = sum(np.einsum(spec, d, BN) for d, BN in zip((dq, dqd, dqdd), self.BN))
        out = out.reshape(out.shape[:-2] + (self.k * self.model.n,))          # z index j * k + c
        return out[..., self.free]

    def _evaluate(self, z: np.ndarray) -> None:
        """Objective, torques, floor heights and their gradients at z, cached for SLSQP's separate calls."""
        key = z.tobytes()
        if key == self._cache_key:
            return
        m, n, K = self.model, self.model.n, len(self.t)
        q, qd, qdd = self.motion(z)
        # the nominal motion and 5 perturbations per joint (q +-, qd +-, qdd +) in one regressor call
        Q, QD, QDD = (np.repeat(x[None], 1 + 5 * n, axis=0) for x in (q, qd, qdd))
        for j in range(n):
            r = 1 + 5 * j
            Q[r, :, j] += STEP_Q
            Q[r + 1, :, j] -= STEP_Q
            QD[r + 2, :, j] += 1.0
            QD[r + 3, :, j] -= 1.0
            QDD[r + 4, :, j] += 1.0
        Y = dynamics.regressor(m, Q.reshape(-1, n), QD.reshape(-1, n), QDD.reshape(-1, n)).reshape(1 + 5 * n, K, n, -1)
        # sign(qd_j) of Coulomb friction jumps where qd_j crosses 0: the search sees tanh(qd_j / SIGN_SMOOTHING)
        # instead, so that the criterion and the torques are differentiable (the result is scored exactly)
        joints, coulomb = np.arange(n), COULOMB + PARAMS_PER_JOINT * np.arange(n)
        sign = np.tanh(QD.reshape(1 + 5 * n, K, n) / SIGN_SMOOTHING)
        Y[:, :, joints, coulomb] = sign
        # derivatives of Y in q_j, qd_j, qdd_j: central differences are exact for qd (quadratic apart from the
        # sign columns, whose derivative is set analytically) and qdd (linear)
        D = [(Y[1::5] - Y[2::5]) / (2 * STEP_Q), (Y[3::5] - Y[4::5]) / 2.0, Y[5::5] - Y[0][None]]
        D[1][:, :, :, coulomb] = 0.0
        D[1][joints, :, joints, coulomb] = ((1 - sign[0] ** 2) / SIGN_SMOOTHING).T
        # objective from the eigenvalues of the Gram matrix G = W^T W (s_i^2): d lambda_i = 2 <W v_i v_i^T, dW>
        W = self.target.regressor(Y[0]).reshape(K * n, -1)
        lam, V = np.linalg.eigh(W.T @ W)
        lam = np.maximum(lam, 1e-300)
        if self.criterion == "cond":
            self.f = float(0.5 * (np.log(lam[-1]) - np.log(lam[0])))
            M = W @ (np.outer(V[:, -1], V[:, -1]) / lam[-1] - np.outer(V[:, 0], V[:, 0]) / lam[0])
        else:
            self.f = float(-0.5 * np.sum(np.log(lam)) / len(lam))
            M = -(W @ (V / lam) @ V.T) / len(lam)
        M = M.reshape(K, n, -1)
        self.grad = self._chain_rule(*(np.einsum("jkib,kib->jk", self.target.regressor(d), M) for d in D), False)
        # torque at every grid sample and its Jacobian (n_i * K rows)
        self.tau = Y[0] @ self.chi
        self.tau_jac = self._chain_rule(*(d @ self.chi for d in D), True)     # (K, n_i, size)
        if self.floor_z is not None:
            pose, jac = dynamics.flange_kinematics(m, q)
            self.height = pose[:, 2, 3]
            zero = np.zeros((n, K))
            self.height_jac = self._chain_rule(jac[:, 2, :].T, zero, zero, True)   # (K, size)
        self._cache_key = key

    def objective(self, z: np.ndarray) -> float:
        self._evaluate(z)
        return self.f

    def objective_grad(self, z: np.ndarray) -> np.ndarray:
        self._evaluate(z)
        return self.grad

    def nonlinear(self, z: np.ndarray) -> np.ndarray:
        """Slack >= 0 of the torque limits (every grid sample, both signs) and of the floor plane."""
        self._evaluate(z)
        limit = SAFETY * self.model.tau_max[self.limited]
        tau = self.tau[:, self.limited]
        out = [(limit - tau).ravel(), (limit + tau).ravel()]
        if self.floor_z is not None:
            out.append(self.height - self.floor_z)
        return np.concatenate(out)

    def nonlinear_jac(self, z: np.ndarray) -> np.ndarray:
        self._evaluate(z)
        J = self.tau_jac[:, self.limited].reshape(-1, self.size)
        out = [-J, J] + ([self.height_jac] if self.floor_z is not None else [])
        return np.vstack(out)

    def linear_constraints(self) -> tuple[np.ndarray, np.ndarray]:
        """A z <= c: positions, velocities and accelerations at the grid samples (finite limits times SAFETY)."""
        m, K = self.model, len(self.t)
        centre, half = (m.q_max + m.q_min) / 2, (m.q_max - m.q_min) / 2
        rows, rhs = [np.zeros((0, self.size))], [np.zeros(0)]
        for j in range(m.n):
            cols = slice(j * self.k, (j + 1) * self.k)
            for Bx, BN, lo, hi in ((self.B[0], self.BN[0], centre[j] - SAFETY * half[j], centre[j] + SAFETY * half[j]),
                                   (self.B[1], self.BN[1], -SAFETY * m.qd_max[j], SAFETY * m.qd_max[j]),
                                   (self.B[2], self.BN[2], -SAFETY * m.qdd_max[j], SAFETY * m.qdd_max[j])):
                if not (math.isfinite(lo) and math.isfinite(hi)):
                    continue
                block = np.zeros((K, self.k * m.n))
                block[:, cols] = BN
                block = block[:, self.free]
                offset = Bx @ self.X_p[:, j]
                rows += [block, -block]
                rhs += [hi - offset, offset - lo]
        A, c = np.vstack(rows), np.concatenate(rhs)
        live = np.abs(A).max(axis=1) > 0        # a joint that does not move only adds the rows 0 <= slack
        return A[live], c[live]


def _initial_point(p: _Problem, rng: np.random.Generator, A: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A random direction, shrunk until it keeps every limit on the grid (z = 0 is at rest at the pose)."""
    z = rng.uniform(-1.0, 1.0, p.size)
    for _ in range(80):
        if np.all(A @ z <= c) and np.all(p.nonlinear(z) >= 0):
            return z
        z *= 0.8
    return np.zeros(p.size)


def _fit_to_limits(model: Model, p: _Problem, z: np.ndarray, floor_z: float | None, rate_hz: float) -> np.ndarray:
    """z itself if the trajectory keeps every limit at rate_hz, else z shrunk (towards rest at the pose) until
    it does; the grid of the search can miss a peak between its samples."""
    for _ in range(40):
        try:
            check(p.model, p.trajectory(z), rate_hz=rate_hz, floor_z=floor_z)
            return z
        except LimitError:
            z = 0.97 * z
    check(p.model, p.trajectory(z), rate_hz=rate_hz, floor_z=floor_z)
    return z


def start_pose_or_mid_range(model: Model, start_pose=None) -> np.ndarray:
    """start_pose (n,) rad checked, or by default the middle of each joint's range (0 where unbounded)."""
    finite = np.isfinite(model.q_min) & np.isfinite(model.q_max)
    mid = np.where(finite, (np.where(finite, model.q_min, 0) + np.where(finite, model.q_max, 0)) / 2, 0.0)
    pose = mid if start_pose is None else np.asarray(start_pose, dtype=float)
    if pose.shape != (model.n,) or not np.isfinite(pose).all():
        raise InputError(f"start_pose: expected {model.n} finite joint values (rad), got {np.shape(start_pose)}")
    return pose


def design(model: Model, *, harmonics: int = 5, base_frequency: float = 0.1, start_pose=None,
           criterion: str = "cond", floor_z: float | None = None, seed: int = 0, max_iter: int = 200,
           restarts: int = 1, grid: int = GRID_PER_PERIOD, check_rate_hz: float = 1000.0,
           base: BaseParameters | None = None, exact_gradients: bool = True,
           progress: bool = False, target: Criterion | None = None, moving=None) -> FourierTrajectory:
    """Optimal excitation trajectory for identification, within the model's limits.

    Minimises cond() (criterion "cond") or maximises log det (criterion "logdet", D-optimal) of the base
    regressor over one period sampled at `grid` points, with scipy's SLSQP from `restarts` random feasible
    starts drawn from `seed`. The motion starts and ends at rest at start_pose and keeps the model's
    position, velocity, acceleration and torque limits (tightened by SAFETY on the grid, then checked
    exactly at check_rate_hz).

    Parameters
    ----------
    model : Model
        The arm.
    harmonics : int
        H, 2..MAX_HARMONICS (three coefficients per joint are spent on starting at rest).
    base_frequency : float
        Hz; the period is 1/base_frequency.
    start_pose : array_like, shape (n,), optional
        rad; default the middle of each joint's range.
    criterion : {"cond", "logdet"}
        What is optimised.
    floor_z : float, optional
        m: keep the flange origin above this plane of the base frame.
    seed : int
        Seed of the random starts.
    max_iter : int
        SLSQP iterations per start.
    restarts : int
        Random starts; the best feasible result is kept.
    grid : int
        Samples per period on which the criterion and the limits are evaluated.
    check_rate_hz : float
        The rate of the final exact limit check.
    base : BaseParameters, optional
        The model's base parameters, if already computed.
    exact_gradients : bool
        False lets SLSQP take finite differences (slower; kept for benchmarks/bench_excitation.py).
    progress : bool
        Show a progress bar.
    target : Criterion, optional
        The regressor whose cond / log det is the criterion (default: the base regressor; e.g. the payload
        regressor, ident.payload.excitation).
    moving : array_like of int, optional
        Indices of the joints that move (default all); the others stay at start_pose.

    Returns
    -------
    FourierTrajectory
        Its `info` holds model, criterion, cond and logdet of the result and of the best random start
        (both on GRID_PER_PERIOD samples), seed, restarts, start_pose and floor_z.

    Raises
    ------
    InputError
        Impossible settings (harmonics, frequency, grid, criterion, moving joints).
    LimitError
        The start pose itself breaks a limit.

    Examples
    --------
    >>> from ident.fit import excitation
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> traj = excitation.design(model, harmonics=2, base_frequency=0.25, max_iter=5, grid=24, seed=3)
    >>> traj.n, traj.harmonics, traj.info["criterion"]
    (6, 2, 'cond')
    >>> traj.info["cond"] <= traj.info["start_cond"], excitation.at_rest(traj)
    (True, True)
    >>> excitation.check(model, traj)                      # within every limit: no error
    """
    if criterion not in ("cond", "logdet"):
        raise InputError(f"criterion: expected 'cond' or 'logdet', got {criterion!r}")
    if int(harmonics) != harmonics or not 2 <= harmonics <= MAX_HARMONICS:
        raise InputError(f"harmonics: expected an integer 2..{MAX_HARMONICS} (3 coefficients per joint are spent on "
                         f"starting at rest), got {harmonics}")
    if not (math.isfinite(base_frequency) and 0 < base_frequency <= MAX_BASE_FREQUENCY):
        raise InputError(f"base_frequency: expected a number of Hz in (0, {MAX_BASE_FREQUENCY:g}], got {base_frequency}")
    sample_count(base_frequency, check_rate_hz)      # the exact check at the end samples one period at this rate
    if not 4 <= grid <= MAX_GRID:
        raise InputError(f"grid: expected 4..{MAX_GRID} samples per period, got {grid}")
    if restarts < 1 or max_iter < 0 or grid < 4:
        raise InputError(f"restarts >= 1, max_iter >= 0 and grid >= 4 expected, got {restarts}, {max_iter}, {grid}")
    pose = start_pose_or_mid_range(model, start_pose)
    zero = np.zeros((1, model.n))
    check_motion(model, [0.0], pose[None, :], zero, zero, floor_z=floor_z)

    base = base_parameters(model) if base is None else base
    if moving is not None:
        moving = np.unique(np.asarray(moving, dtype=int))
        if moving.size == 0 or moving.min() < 0 or moving.max() >= model.n:
            raise InputError(f"moving: expected joint indices 0..{model.n - 1}, got {moving.tolist()}")
    p = _Problem(model, base, float(base_frequency), int(harmonics), pose, criterion, floor_z, grid, target, moving)
    A, c = p.linear_constraints()
    rng = np.random.default_rng(seed)
    constraints = [{"type": "ineq", "fun": lambda z: c - A @ z, "jac": lambda z: -A},
                   {"type": "ineq", "fun": p.nonlinear, **({"jac": p.nonlinear_jac} if exact_gradients else {})}]
    best, start = None, None
    with _progress(max_iter * restarts, progress, f"excitation design ({criterion})") as bar:
        for _ in range(restarts):
            z0 = _initial_point(p, rng, A, c)
            if start is None or p.objective(z0) < p.objective(start):
                start = z0
            res = scipy.optimize.minimize(p.objective, z0, jac=p.objective_grad if exact_gradients else None,
                                          method="SLSQP",
                                          constraints=constraints, options={"maxiter": max_iter, "ftol": 1e-9},
                                          callback=lambda z: bar.update(1))
            feasible = np.all(A @ res.x <= c + 1e-9) and np.all(p.nonlinear(res.x) >= -1e-9)
            if feasible and (best is None or res.fun < best.fun):
                best = res
    z = _fit_to_limits(model, p, best.x if best is not None else start, floor_z, check_rate_hz)
    scores = criteria(p.target.stacked(model, p.trajectory(z)))
    initial = criteria(p.target.stacked(model, p.trajectory(start)))
    return p.trajectory(z, {"model": model.name, "criterion": criterion, "cond": scores["cond"], "logdet": scores["logdet"], "start_cond": initial["cond"],
                            "start_logdet": initial["logdet"], "seed": seed, "restarts": restarts,
                            "start_pose": pose.tolist(), "floor_z": floor_z})


def check(model: Model, traj: FourierTrajectory, *, rate_hz: float = 1000.0, floor_z: float | None = None) -> None:
    """Check a trajectory against every limit of a model.

    Parameters
    ----------
    model : Model
        The arm.
    traj : FourierTrajectory
        The motion, sampled over one period.
    rate_hz : float
        The sampling rate of the check.
    floor_z : float, optional
        m: the flange origin must stay above this plane of the base frame.

    Returns
    -------
    None

    Raises
    ------
    LimitError
        The first violation: joint, quantity and time (an InputError).
    InputError
        The trajectory has another number of joints than the model.

    Examples
    --------
    >>> from ident.fit import excitation
    >>> from ident.fit.excitation import FourierTrajectory
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> traj = excitation.preset("seed000")
    >>> excitation.check(model, traj)
    >>> fast = FourierTrajectory(traj.base_frequency, traj.q0, 4 * traj.a, 4 * traj.b)
    >>> excitation.check(model, fast)
    Traceback (most recent call last):
    ...
    ident.model.limits.LimitError: ...
    """
    if traj.n != model.n:
        raise InputError(f"trajectory has {traj.n} joints, model {model.name} has {model.n}")
    t, q, qd, qdd = traj.sample(rate_hz)
    check_motion(model, t, q, qd, qdd, floor_z=floor_z)


def _progress(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="it", leave=False)
