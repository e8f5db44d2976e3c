"""Pose planning (after Pashkevich 2004): per-joint optimal angle sets and their Cartesian product, and D-optimal
selection (greedy forward choice, then exchange) from candidates that respect the joint limits.

The information of a plan is J^T J of the identified columns of the scaled aggregated Jacobian (angle
columns and orientation rows times the reach, see ident.calibration.synthesis), so lengths and angles
weigh alike; the predicted sigma of each parameter is in its own unit (m or rad).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ident.calibration.model import tool_kinematics
from ident.calibration.synthesis import IrreducibleModel, measurement_rows, random_configurations
from firmware_bridge.runtime.errors import InputError
from ident.model import PRISMATIC


def axis_angles(count: int, q_min: float, q_max: float, prismatic: bool = False) -> np.ndarray:
    """Pashkevich's A-optimal values for one joint: count angles 2 pi / count apart (their unit vectors sum
    to zero), centred in [q_min, q_max]; where the range is too short (and for a prismatic joint) half
    the values at each limit. rad or m."""
    if count < 2:
        raise InputError(f"per-joint values: need at least 2 per joint, got {count}")
    if not (np.isfinite(q_min) and np.isfinite(q_max)):
        if prismatic:
            raise InputError("a prismatic joint needs finite limits to plan")
        q_min, q_max = -np.pi, np.pi
    span = 2 * np.pi * (count - 1) / count
    if not prismatic and q_max - q_min >= span - 1e-12:
        return q_min + (q_max - q_min - span) / 2 + 2 * np.pi * np.arange(count) / count
    return np.where(np.arange(count) < (count + 1) // 2, q_min, q_max).astype(np.float64)


def product_plan(sets: list[np.ndarray]) -> np.ndarray:
    """Cartesian product (K, n) of per-joint value sets (Pashkevich's rule for the full identification)."""
    return np.array(list(itertools.product(*[np.asarray(s, dtype=np.float64) for s in sets])))


MAX_CANDIDATES = 100_000   # candidate poses of a plan: their Jacobian blocks are held at once


def seed_plan(irr: IrreducibleModel, per_joint: int | list[int] = 2) -> np.ndarray:
    """Pashkevich's plan: per-joint optimal sets (per_joint values each) within the limits, all combinations."""
    cm = irr.model
    counts = [per_joint] * cm.n if np.isscalar(per_joint) else list(per_joint)
    total = math.prod(int(c) for c in counts)
    if total > MAX_CANDIDATES:
        raise InputError(f"per-joint values: {' x '.join(map(str, counts))} = {total} combinations, expected at most "
                         f"{MAX_CANDIDATES}")
    return product_plan([axis_angles(c, cm.q_min[j], cm.q_max[j], cm.joint_type[j] == PRISMATIC)
                         for j, c in enumerate(counts)])


@dataclass(frozen=True)
class PlanQuality:
    """log10 det(J^T J) and cond(J) of the scaled identified Jacobian; sigma (p,) the predicted one-sigma
    error of each identified parameter (m or rad) for a measurement noise `noise` (m) per coordinate."""

    log10_det: float
    cond: float
    sigma: np.ndarray
    names: tuple[str, ...]


def _blocks(irr: IrreducibleModel, q: np.ndarray, scaled: bool = True) -> np.ndarray:
    """(N, rows, p) Jacobian blocks of the identified terms at the nominal values."""
    cm = irr.model
    jac = tool_kinematics(cm, q)[1][:, measurement_rows(irr.measure), :][:, :, irr.identified]
    if scaled:
        jac = jac * cm.column_scale()[irr.identified]
        if irr.measure == "pose":
            jac[:, 3:, :] *= cm.length_scale
    return jac


def plan_quality(irr: IrreducibleModel, q, noise: float = 1e-4) -> PlanQuality:
    """det, cond and predicted parameter sigmas of the plan q (K, n) for measurement noise (m)."""
    q = np.atleast_2d(np.asarray(q, dtype=np.float64))
    J = _blocks(irr, q).reshape(-1, int(irr.identified.sum()))
    s = np.linalg.svd(J, compute_uv=False)
    Ju = _blocks(irr, q, scaled=False)
    if irr.measure == "pose":   # orientation rows weigh like positions at the reach
        Ju[:, 3:, :] *= irr.model.length_scale
    Ju = Ju.reshape(J.shape)
    with np.errstate(divide="ignore"):
        logdet = float(2 * np.sum(np.log10(s)))
    if s[-1] > 1e-10 * s[0]:
        sigma = noise * np.sqrt(np.diag(np.linalg.inv(Ju.T @ Ju)))
    else:   # the plan does not identify every parameter
        sigma = np.full(J.shape[1], np.inf)
    return PlanQuality(logdet, float(s[0] / s[-1]) if s[-1] > 0 else np.inf, sigma, tuple(irr.names()))


@njit(cache=True)
def _gains_kernel(F, Lt, out):
    """out[c] = log det(I + F_c Minv F_c^T) with Minv = L L^T (Lt = L^T, upper triangular)."""
    M, r, p = F.shape
    H = np.empty((r, p))
    G = np.empty((r, r))
    for c in range(M):
        for i in range(r):
            for k in range(p):
                acc = 0.0
                for j in range(k, p):
                    acc += F[c, i, j] * Lt[k, j]
                H[i, k] = acc
        for i in range(r):
            for k in range(i + 1):
                acc = 1.0 if i == k else 0.0
                for j in range(p):
                    acc += H[i, j] * H[k, j]
                G[i, k] = acc
        logdet = 0.0
        for i in range(r):          # Cholesky of the small SPD block, in place (lower triangle)
            for k in range(i + 1):
                acc = G[i, k]
                for j in range(k):
                    acc -= G[i, j] * G[k, j]
                if i == k:
                    acc = np.sqrt(max(acc, 1e-300))
                    G[i, i] = acc
                    logdet += 2.0 * np.log(acc)
                else:
                    G[i, k] = acc / G[k, k]
        out[c] = logdet


def _gains(F: np.ndarray, M: np.ndarray) -> np.ndarray:
    """log det(I + F_c M^-1 F_c^T) for every candidate block F_c (K, r, p): the log-det gain of adding it
    to a plan of information M (p, p). numba, so no BLAS threads fight over the shared cores."""
    Minv = np.linalg.inv(M)
    Lt = np.ascontiguousarray(np.linalg.cholesky((Minv + Minv.T) / 2).T)
    out = np.empty(F.shape[0])
    _gains_kernel(F, Lt, out)
    return out


def select_d_optimal(F: np.ndarray, count: int, *, max_passes: int = 10) -> np.ndarray:
    """Indices (count,) of the candidate blocks F (M, r, p) that maximise det(sum F_c^T F_c): greedy forward
    selection, then exchange passes (Fedorov): each pass tries to swap the quarter of the plan that adds
    least to the determinant for the best candidate, until no swap raises it. count <= M."""
    p = F.shape[2]
    M = np.eye(p) * 1e-9 * max(np.einsum("crp,crp->", F, F) / len(F), 1e-300)
    chosen: list[int] = []
    for _ in range(count):
        g = _gains(F, M)
        g[chosen] = -np.inf
        c = int(np.argmax(g))
        chosen.append(c)
        M += F[c].T @ F[c]
    tries = max(5, count // 4)
    for _ in range(max_passes):
        swapped = False
        Fd = F[chosen]
        A = (Fd.reshape(-1, p) @ np.linalg.inv(M)).reshape(Fd.shape)
        share = np.einsum("crp,crp->c", A, Fd)           # ~ what each pose adds to log det (leverage)
        for i in np.argsort(share)[:tries]:
            old = chosen[i]
            Mm = M - F[old].T @ F[old]
            g = _gains(F, Mm)
            g[chosen] = -np.inf
            c = int(np.argmax(g))
            g_old = _gains(F[old:old + 1], Mm)[0]
            if g[c] > g_old + 1e-10:
                chosen[i] = c
                M = Mm + F[c].T @ F[c]
                swapped = True
        if not swapped:
            break
    return np.array(chosen)


def d_optimal(irr: IrreducibleModel, count: int, candidates=None, *, n_candidates: int = 500, seed: int = 0,
              max_passes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """A D-optimal plan of measurement poses, chosen from candidate poses.

    Greedy forward selection, then exchange passes (Fedorov): each pass tries to swap the quarter of the
    plan that adds least to det(J^T J) for the best candidate, until no swap raises it.

    Parameters
    ----------
    irr : IrreducibleModel
        What is identified (`ident.calibration.synthesis.synthesize`).
    count : int
        Poses in the plan.
    candidates : array_like, shape (M, n), optional
        Poses to choose from, within the joint limits (default: n_candidates random poses within them).
    n_candidates : int
        Random candidates when none are given.
    seed : int
        Seed of the random candidates.
    max_passes : int
        Exchange passes at most.

    Returns
    -------
    plan : ndarray, shape (count, n)
        The poses (rad, m for prismatic joints).
    indices : ndarray, shape (count,)
        Their rows in the candidates.

    Raises
    ------
    InputError
        Candidates outside the limits, not finite or of the wrong shape, or fewer than count.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.calibration.model import from_model
    >>> from ident.calibration.planning import d_optimal, plan_quality
    >>> from ident.calibration.synthesis import random_configurations, synthesize
    >>> from ident.model import load_model
    >>> irr = synthesize(from_model(load_model("generic6"), tool=(0.0, 0.0, 0.1)), "position")
    >>> candidates = random_configurations(irr.model, 300, seed=0)
    >>> plan, rows = d_optimal(irr, 20, candidates)
    >>> plan.shape, bool(np.array_equal(plan, candidates[rows]))
    ((20, 6), True)
    >>> bool(plan_quality(irr, plan).log10_det > plan_quality(irr, candidates[:20]).log10_det)   # vs. 20 at random
    True
    """
    cm = irr.model
    if candidates is None and not 1 <= n_candidates <= MAX_CANDIDATES:
        raise InputError(f"candidates: expected 1..{MAX_CANDIDATES} random poses, got {n_candidates}")
    Q = random_configurations(cm, n_candidates, seed) if candidates is None else np.asarray(candidates, float)
    if Q.ndim != 2 or Q.shape[1] != cm.n or not np.all(np.isfinite(Q)):
        raise InputError(f"candidates: expected finite (M, {cm.n}) joint values")
    outside = np.flatnonzero(np.any((Q < cm.q_min - 1e-12) | (Q > cm.q_max + 1e-12), axis=1))
    if outside.size:
        raise InputError(f"candidates: pose {int(outside[0])} is outside the joint limits")
    if count > len(Q):
        raise InputError(f"plan: {count} poses requested from only {len(Q)} candidates")
    F = np.ascontiguousarray(_blocks(irr, Q))
    idx = select_d_optimal(F, count, max_passes=max_passes)
    return Q[idx], idx
