"""Excitation trajectories: finite Fourier series per joint (seed 000 eq. 14) and their optimal design.

    q_j(t)   = q0_j + sum_l [ a_jl/(wf l) sin(wf l t) - b_jl/(wf l) cos(wf l t) ]
    qd_j(t)  = sum_l [ a_jl cos(wf l t) + b_jl sin(wf l t) ]
    qdd_j(t) = sum_l [ -a_jl wf l sin(wf l t) + b_jl wf l cos(wf l t) ]       wf = 2 pi f0, l = 1..H

`design` chooses the coefficients that minimise cond() of the base regressor stacked over one period
(or maximise log det, D-optimal) with scipy's SLSQP, under the model's position, velocity, acceleration and
torque limits, starting and ending at rest at a given pose, and optionally keeping the flange above a floor
plane. The file format is documented in docs/trajectory-file.md.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.linalg
import scipy.optimize

from ident import dynamics
from ident.base_params import BaseParameters, base_parameters
from ident.errors import InputError
from ident.limits import check_motion
from ident.model import Model

GRID_PER_PERIOD = 120      # samples per period for the criterion and the constraints during the search
SAFETY = 0.95              # limits are tightened by 5 % during the search; the result is checked exactly


class TrajectoryFileError(InputError):
    """A trajectory file is unusable: the message names the file and the field."""


@dataclass(frozen=True, eq=False)
class FourierTrajectory:
    """A periodic joint motion. base_frequency f0 in Hz; q0 (n,) rad; a, b (n, H) rad/s."""

    base_frequency: float
    q0: np.ndarray
    a: np.ndarray
    b: np.ndarray
    joint_names: tuple[str, ...] = ()
    info: dict = field(default_factory=dict)   # how it was made: criterion, cond, seed, model, ...

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

    def sample(self, rate_hz: float, periods: float = 1.0) -> tuple[np.ndarray, ...]:
        """(t, q, qd, qdd) sampled at rate_hz over the given number of periods, end point included."""
        count = int(round(periods * self.period * rate_hz)) + 1
        t = np.arange(count) / rate_hz
        return (t, *self.evaluate(t))


def excitation_bandwidth(traj: FourierTrajectory) -> float:
    """The highest frequency in the motion (Hz): harmonics * base_frequency. preprocess.prepare takes it
    as bandwidth_hz to set its low-pass cut-off."""
    return traj.harmonics * traj.base_frequency


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
    """Write the trajectory file (docs/trajectory-file.md)."""
    import tomli_w

    doc = {"trajectory": {"kind": "fourier", "base_frequency": float(traj.base_frequency),
                          "harmonics": traj.harmonics, "period": traj.period,
                          **{k: v for k, v in traj.info.items() if v is not None}},
           "joint": [{"name": name, "q0": float(traj.q0[j]), "a": traj.a[j].tolist(), "b": traj.b[j].tolist()}
                     for j, name in enumerate(traj.joint_names or [f"joint{j + 1}" for j in range(traj.n)])]}
    header = ("# armid excitation trajectory: finite Fourier series per joint (docs/trajectory-file.md).\n"
              "# q_j(t) = q0 + sum_l a_l/(wf l) sin(wf l t) - b_l/(wf l) cos(wf l t), wf = 2 pi base_frequency.\n"
              "# Units: Hz, s, rad, rad/s.\n")
    Path(path).write_text(header + tomli_w.dumps(doc))


def load(path: str | Path) -> FourierTrajectory:
    """Read a trajectory file; TrajectoryFileError names the file and the field at fault."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise TrajectoryFileError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TrajectoryFileError(f"{path}: not valid TOML: {exc}") from None
    head = doc.get("trajectory")
    if not isinstance(head, dict) or head.get("kind") != "fourier":
        raise TrajectoryFileError(f"{path}: [trajectory] kind: expected \"fourier\"")
    f0 = head.get("base_frequency")
    if not isinstance(f0, (int, float)) or not (math.isfinite(f0) and f0 > 0):
        raise TrajectoryFileError(f"{path}: trajectory.base_frequency: expected a positive number in Hz, got {f0!r}")
    joints = doc.get("joint")
    if not isinstance(joints, list) or not joints:
        raise TrajectoryFileError(f"{path}: [[joint]]: expected one table per joint")
    H = None
    q0, a, b, names = [], [], [], []
    for j, entry in enumerate(joints):
        where = f"{path}: joint[{j + 1}]"
        for key in ("q0", "a", "b"):
            if key not in entry:
                raise TrajectoryFileError(f"{where}.{key}: missing")
        a_j, b_j = np.asarray(entry["a"], dtype=float), np.asarray(entry["b"], dtype=float)
        H = a_j.size if H is None else H
        if a_j.ndim != 1 or a_j.size != H or b_j.shape != a_j.shape or H == 0:
            raise TrajectoryFileError(f"{where}: a and b: expected two lists of {H} numbers, "
                                      f"got {a_j.size} and {b_j.size}")
        values = np.concatenate([[float(entry["q0"])], a_j, b_j])
        if not np.isfinite(values).all():
            raise TrajectoryFileError(f"{where}: non-finite coefficient")
        q0.append(values[0]), a.append(a_j), b.append(b_j)
        names.append(str(entry.get("name", f"joint{j + 1}")))
    info = {k: v for k, v in head.items() if k not in ("kind", "base_frequency", "harmonics", "period")}
    return FourierTrajectory(float(f0), np.array(q0), np.array(a), np.array(b), tuple(names), info)


def preset(name: str) -> FourierTrajectory:
    """A shipped trajectory: 'seed000' is Table 1 of seed 000 (6 joints, 6 harmonics)."""
    from importlib import resources

    ref = resources.files("ident") / "presets" / f"{name}.toml"
    if not ref.is_file():
        shipped = sorted(p.name[:-5] for p in (resources.files("ident") / "presets").iterdir() if p.name.endswith(".toml"))
        raise TrajectoryFileError(f"{name}: no such preset; shipped: {', '.join(shipped)}")
    with resources.as_file(ref) as path:
        return load(path)


# ---------------------------------------------------------------------------------------------------
# Quality of a trajectory for identification

def stacked_base_regressor(model: Model, base: BaseParameters, traj: FourierTrajectory,
                           samples: int = GRID_PER_PERIOD) -> np.ndarray:
    """The base regressor (samples*n, b) over one period."""
    t = np.arange(samples) * (traj.period / samples)
    q, qd, qdd = traj.evaluate(t)
    return base.regressor(dynamics.regressor(model, q, qd, qdd)).reshape(-1, base.count)


def criteria(W: np.ndarray) -> dict[str, float]:
    """cond(W) and log det(W^T W) of a stacked regressor."""
    s = np.linalg.svd(W, compute_uv=False)
    return {"cond": float(s[0] / s[-1]) if s[-1] > 0 else math.inf,
            "logdet": float(2 * np.sum(np.log(s))) if s[-1] > 0 else -math.inf}


# ---------------------------------------------------------------------------------------------------
# Optimal design

@dataclass
class _Problem:
    model: Model
    base: BaseParameters
    f0: float
    H: int
    pose: np.ndarray
    criterion: str
    floor_z: float | None
    t: np.ndarray = field(init=False)
    X_p: np.ndarray = field(init=False)    # (2H+1, n) particular solution: at rest at the pose
    Nul: np.ndarray = field(init=False)    # (2H+1, 2H-2) null space of the rest constraints
    B: tuple = field(init=False)

    def __post_init__(self):
        E = _rest_constraints(self.f0, self.H)
        self.Nul = scipy.linalg.null_space(E)
        self.X_p = np.linalg.lstsq(E, np.vstack([self.pose, np.zeros((2, len(self.pose)))]), rcond=None)[0]
        self.t = np.arange(GRID_PER_PERIOD) / (GRID_PER_PERIOD * self.f0)
        self.B = basis(self.t, self.f0, self.H)

    @property
    def size(self) -> int:
        return self.Nul.shape[1] * self.model.n

    def coefficients(self, z: np.ndarray) -> np.ndarray:
        return self.X_p + self.Nul @ z.reshape(self.Nul.shape[1], self.model.n, order="F")

    def trajectory(self, z: np.ndarray, info: dict | None = None) -> FourierTrajectory:
        X = self.coefficients(z)
        H = self.H
        return FourierTrajectory(self.f0, X[0].copy(), X[1:H + 1].T.copy(), X[H + 1:].T.copy(),
                                 self.model.joint_names, info or {})

    def motion(self, z):
        X = self.coefficients(z)
        return self.B[0] @ X, self.B[1] @ X, self.B[2] @ X

    def objective(self, z) -> float:
        q, qd, qdd = self.motion(z)
        W = self.base.regressor(dynamics.regressor(self.model, q, qd, qdd)).reshape(-1, self.base.count)
        s = np.linalg.svd(W, compute_uv=False)
        if self.criterion == "cond":
            return float(np.log(s[0]) - np.log(max(s[-1], 1e-300)))
        return float(-np.sum(np.log(np.maximum(s, 1e-300))) / len(s))

    def linear_constraints(self) -> tuple[np.ndarray, np.ndarray]:
        """A z <= c for positions, velocities and accelerations on the grid (limits times SAFETY)."""
        m = self.model
        centre, half = (m.q_max + m.q_min) / 2, (m.q_max - m.q_min) / 2
        rows, rhs = [], []
        k = self.Nul.shape[1]
        for j in range(m.n):
            cols = np.arange(k) + j * k
            for Bx, lo, hi in ((self.B[0], centre[j] - SAFETY * half[j], centre[j] + SAFETY * half[j]),
                               (self.B[1], -SAFETY * m.qd_max[j], SAFETY * m.qd_max[j]),
                               (self.B[2], -SAFETY * m.qdd_max[j], SAFETY * m.qdd_max[j])):
                G = Bx @ self.Nul                       # (K, k): effect of z_j on this quantity
                base = Bx @ self.X_p[:, j]
                block = np.zeros((len(self.t), self.size))
                block[:, cols] = G
                rows += [block, -block]
                rhs += [hi - base, base - lo]
        return np.vstack(rows), np.concatenate(rhs)

    def nonlinear_slack(self, z) -> np.ndarray:
        """Slack >= 0 of the torque limits (per joint, worst sample) and of the floor plane."""
        q, qd, qdd = self.motion(z)
        tau = dynamics.rnea(self.model, q, qd, qdd)
        out = SAFETY * self.model.tau_max - np.abs(tau).max(axis=0)
        if self.floor_z is not None:
            z_flange = dynamics.flange_pose(self.model, q)[:, 2, 3]
            out = np.append(out, z_flange.min() - self.floor_z)
        return out


def _initial_point(p: _Problem, rng: np.random.Generator, A: np.ndarray, c: np.ndarray) -> np.ndarray:
    """A random direction, shrunk until it keeps the kinematic limits (z = 0 is at rest at the pose)."""
    z = rng.uniform(-1.0, 1.0, p.size)
    for _ in range(60):
        if np.all(A @ z <= c):
            return z
        z *= 0.7
    return np.zeros(p.size)


def design(model: Model, *, harmonics: int = 5, base_frequency: float = 0.1, start_pose=None,
           criterion: str = "cond", floor_z: float | None = None, seed: int = 0, max_iter: int = 150,
           restarts: int = 1, progress: bool = False) -> FourierTrajectory:
    """Optimal excitation: minimise cond() (criterion="cond") or maximise log det (criterion="logdet") of the
    base regressor over one period, at rest at start_pose (default: mid-range) at t = 0 and t = T.

    Reproducible from `seed`. Raises LimitError if even the best point found breaks a limit.
    """
    if criterion not in ("cond", "logdet"):
        raise InputError(f"criterion: expected 'cond' or 'logdet', got {criterion!r}")
    if harmonics < 2:
        raise InputError(f"harmonics: expected at least 2 (3 are spent on starting at rest), got {harmonics}")
    if not (base_frequency > 0 and math.isfinite(base_frequency)):
        raise InputError(f"base_frequency: expected a positive number in Hz, got {base_frequency}")
    pose = (model.q_min + model.q_max) / 2 if start_pose is None else np.asarray(start_pose, dtype=float)
    if pose.shape != (model.n,):
        raise InputError(f"start_pose: expected {model.n} joint values, got {pose.shape}")
    check_motion(model, [0.0], pose[None, :], np.zeros((1, model.n)), np.zeros((1, model.n)), floor_z=floor_z)

    base = base_parameters(model)
    p = _Problem(model, base, base_frequency, harmonics, pose, criterion, floor_z)
    A, c = p.linear_constraints()
    rng = np.random.default_rng(seed)
    constraints = [{"type": "ineq", "fun": lambda z: c - A @ z, "jac": lambda z: -A},
                   {"type": "ineq", "fun": p.nonlinear_slack}]
    bar = _progress(max_iter * restarts, progress, f"excitation design ({criterion})")
    best = None
    for _ in range(restarts):
        z0 = _initial_point(p, rng, A, c)
        res = scipy.optimize.minimize(p.objective, z0, method="SLSQP", constraints=constraints,
                                      options={"maxiter": max_iter, "ftol": 1e-7},
                                      callback=lambda z: bar.update(1))
        feasible = np.all(A @ res.x <= c + 1e-9) and np.all(p.nonlinear_slack(res.x) >= -1e-9)
        if feasible and (best is None or res.fun < best.fun):
            best = res
    bar.close()
    z = best.x if best is not None else np.zeros(p.size)
    traj = p.trajectory(z)
    scores = criteria(stacked_base_regressor(model, base, traj))
    traj = p.trajectory(z, {"model": model.name, "criterion": criterion, "cond": scores["cond"],
                            "logdet": scores["logdet"], "seed": seed, "start_pose": pose.tolist(),
                            "floor_z": floor_z})
    check(model, traj, floor_z=floor_z)
    return traj


def check(model: Model, traj: FourierTrajectory, *, rate_hz: float = 1000.0, floor_z: float | None = None) -> None:
    """Raise LimitError (joint, quantity, time) unless the trajectory, sampled at rate_hz over one period,
    keeps every limit of the model."""
    if traj.n != model.n:
        raise InputError(f"trajectory has {traj.n} joints, model {model.name} has {model.n}")
    t, q, qd, qdd = traj.sample(rate_hz)
    check_motion(model, t, q, qd, qdd, floor_z=floor_z)


def _progress(total: int, enabled: bool, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, unit="it", leave=False)
