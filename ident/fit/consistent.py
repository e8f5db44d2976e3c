"""Physically consistent standard parameters from a base-parameter fit (cvxpy + Clarabel).

The decision variables are, per link j, its 4x4 pseudo-inertia matrix (Wensing, Kim, Slotine 2017)

    J_j = [[Sigma_j, h_j], [h_j^T, m_j]],  Sigma_j = tr(I_j)/2 * 1 - I_j,  J_j >= 0 (PSD)

(I_j the inertia about the link-frame origin, h_j = m_j c_j), which is exactly "a real body: m >= 0, and
the inertia about the centre of mass positive semidefinite with the triangle inequalities"; and per joint
Ia, fc, fv >= 0 and a free offset. The standard vector chi (14n) is linear in these.

The data term is the chi^2 distance of the base projection P chi from the WLS estimate beta in the covariance the
fit reports, ||F (P chi - beta)||^2 with F'F = C^-1 (ident.fit.estimate.Fit.information_factor; with the textbook
covariance this is ||W_w P chi - y_w||^2 less its minimum): the problem does not grow with the number of samples,
and a departure from beta is weighed by the precision the rows have (their noise correlated by the filters), not
the textbook's. Two stages (docs/guides/identification.md):

    1.  minimise  ||F P chi - F beta||^2  +  w || N^T ((chi - chi_0) / s) ||^2
    2.  minimise  || N^T ((chi - chi_0) / s) ||^2   s.t.  ||F P chi - F beta||^2 <= stage 1's + 1e-3

P maps chi to the base parameters; N is an orthonormal basis of the null space of P diag(s), i.e. of the
combinations of standard parameters that the data cannot see. The regulariser only pulls those
unidentifiable directions toward the model's nominal values chi_0 (scaled per parameter by s, the
nominal magnitude): its weight w is lambda (1e-2) times the data term's smallest curvature over the
identifiable directions, so it never outweighs the data there. Stage 2 makes the unidentifiable
directions exact even when stage 1's round-off (noise-free data) swamps the small regulariser.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from ident.model.base_params import BaseParameters
from firmware_bridge.runtime.errors import InputError
from ident.fit.estimate import Fit
from ident.model import PARAMS_PER_JOINT, Model

DEFAULT_LAMBDA = 1e-2
# tighter than Clarabel's defaults (1e-8): the base projection must reproduce an exact WLS to ~1e-6
STAGE2_CHI2_SLACK = 1e-3   # how much worse (chi^2 units) stage 2 may fit than stage 1
SOLVER_TOLERANCES = dict(tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12, tol_ktratio=1e-10)


class ConsistencyError(InputError):
    """The convex solver could not find physically consistent parameters."""


@dataclass(frozen=True, eq=False)
class ConsistentFit:
    """chi (14n,) physically consistent standard parameters; beta (b,) = P chi; chi2_increase: how much
    worse their weighted fit is than the WLS optimum (chi-squared units); status from the solver;
    seconds spent in the solver (build + solve)."""

    chi: np.ndarray
    beta: np.ndarray
    chi2_increase: float
    status: str
    seconds: float


def pseudo_inertia(chi10: np.ndarray) -> np.ndarray:
    """The 4x4 pseudo-inertia matrix [[tr(I)/2 1 - I, h], [h^T, m]] of [XX XY XZ YY YZ ZZ mX mY mZ m]."""
    xx, xy, xz, yy, yz, zz, hx, hy, hz, m = chi10
    inertia = np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])
    J = np.zeros((4, 4))
    J[:3, :3] = 0.5 * np.trace(inertia) * np.eye(3) - inertia
    J[:3, 3] = J[3, :3] = (hx, hy, hz)
    J[3, 3] = m
    return J


def _link_map() -> np.ndarray:
    """(10, 16): the 10 link parameters from vec(J) (column-major, as cvxpy's vec): I = tr(S) 1 - S."""
    L = np.zeros((10, 16))
    at = lambda r, c: c * 4 + r  # noqa: E731  (column-major index)
    S = lambda r, c: at(r, c)    # noqa: E731
    rows = {0: [(+1, S(1, 1)), (+1, S(2, 2))], 1: [(-1, S(0, 1))], 2: [(-1, S(0, 2))],
            3: [(+1, S(0, 0)), (+1, S(2, 2))], 4: [(-1, S(1, 2))], 5: [(+1, S(0, 0)), (+1, S(1, 1))],
            6: [(+1, at(0, 3))], 7: [(+1, at(1, 3))], 8: [(+1, at(2, 3))], 9: [(+1, at(3, 3))]}
    for k, terms in rows.items():
        for c, idx in terms:
            L[k, idx] = c
    return L


def parameter_scale(model: Model) -> np.ndarray:
    """(14n,) a magnitude per standard parameter for the regulariser: |nominal value|, floored per kind
    (XX..offset) at 1 % of that kind's largest nominal magnitude over the joints (and 1e-6)."""
    chi0 = np.abs(model.standard_parameters()).reshape(model.n, PARAMS_PER_JOINT)
    floor = np.maximum(0.01 * chi0.max(axis=0), 1e-6)
    return np.maximum(chi0, floor[None, :]).ravel()


def consistent_fit(model: Model, base: BaseParameters, fit: Fit, *, chi_nominal: np.ndarray | None = None,
                   regularisation: float = DEFAULT_LAMBDA) -> ConsistentFit:
    """Physically consistent standard parameters whose base projection explains the data of `fit`
    (a WLS Fit of the base parameters `base`). chi_nominal (14n) defaults to the model's values.
    Raises ConsistencyError if the solver fails."""
    from ident.extras import require

    cp = require("cvxpy", "the physically consistent fit")
    n, b = model.n, base.count
    if fit.beta.shape != (b,):
        raise ValueError(f"fit has {fit.beta.size} parameters, the base has {b}")
    chi0 = model.standard_parameters() if chi_nominal is None else np.asarray(chi_nominal, dtype=float)
    s = parameter_scale(model)
    null = scipy.linalg.null_space(base.P * s[None, :])           # (14n, 14n - b)
    started = time.perf_counter()

    # Scaled units u = (chi - chi0) / s. The data term's curvature in u is that of A_s = R P diag(s); it is
    # normalised so that its largest singular value is one, and the regulariser's weight is lambda times
    # its smallest non-zero one: weaker than the data in every identifiable direction, whatever the noise.
    F, target = fit.information_factor()    # the data term in the reported covariance's chi^2 units
    A = F @ base.P
    sv = np.linalg.svd(A * s[None, :], compute_uv=False)[:b]
    k = max(float(sv[0]), 1e-300)
    weight = regularisation * float(sv[-1] / k) ** 2
    G = null.T / s[None, :]

    # stage 1: the best consistent fit of the data
    chi = _consistent_parameters(cp, n)
    first = _solve(cp, cp.Problem(cp.Minimize(cp.sum_squares((A / k) @ chi - target / k)
                                              + weight * cp.sum_squares(G @ (chi - chi0)))))
    status = first.status
    value = np.asarray(chi.value, dtype=float)
    # stage 2: the unidentifiable directions closest to the nominal model, the fit kept within a thousandth
    # of a chi^2 unit (plus 1e-6 relative) of stage 1's: ||F (P chi - beta)||^2 is the chi^2 increase over WLS.
    # (With noise-free data, stage 1's round-off can swamp the small regulariser.) The constraint is
    # divided by its bound, and solved at Clarabel's default tolerances.
    data_1 = float(np.sum((A @ value - target) ** 2))
    bound = data_1 * (1.0 + 1e-6) + STAGE2_CHI2_SLACK
    chi2 = _consistent_parameters(cp, n)
    root = np.sqrt(bound)
    second = cp.Problem(cp.Minimize(cp.sum_squares(G @ (chi2 - chi0))),
                        [cp.sum_squares((A / root) @ chi2 - target / root) <= 1.0])
    try:
        _solve(cp, second, {})
        value, status = np.asarray(chi2.value, dtype=float), f"{first.status}, then {second.status}"
    except ConsistencyError:
        pass   # keep stage 1's answer (status says so)
    value = _project_consistent(value, n)
    seconds = time.perf_counter() - started
    beta = base.from_standard(value)
    r_cons = F @ beta - target
    return ConsistentFit(chi=value, beta=beta, chi2_increase=float(r_cons @ r_cons),
                         status=status, seconds=seconds)


def _consistent_parameters(cp, n: int):
    """chi (14n) as an affine cvxpy expression of n PSD pseudo-inertias, Ia, fc, fv >= 0 and free offsets."""
    L = _link_map()
    J = [cp.Variable((4, 4), PSD=True, name=f"J{j + 1}") for j in range(n)]
    drive_pos = cp.Variable((n, 3), nonneg=True, name="Ia_fc_fv")
    offset = cp.Variable(n, name="offset")
    return cp.hstack([cp.hstack([L @ cp.vec(J[j], order="F"), drive_pos[j], offset[j:j + 1]]) for j in range(n)])


def _solve(cp, problem, tolerances: dict | None = None):
    """Solve with Clarabel (SOLVER_TOLERANCES unless given); ConsistencyError unless (inaccurately) optimal."""
    try:
        with warnings.catch_warnings():   # "inaccurate" is reported in ConsistentFit.status instead
            warnings.simplefilter("ignore", UserWarning)
            problem.solve(solver=cp.CLARABEL, **(SOLVER_TOLERANCES if tolerances is None else tolerances))
    except cp.error.SolverError as exc:
        raise ConsistencyError(f"physically consistent fit: the solver failed ({exc})") from None
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise ConsistencyError(f"physically consistent fit: solver status {problem.status}")
    return problem


def _project_consistent(chi: np.ndarray, n: int) -> np.ndarray:
    """Remove the solver's round-off: clip each pseudo-inertia's eigenvalues and Ia, fc, fv at zero."""
    P = chi.reshape(n, PARAMS_PER_JOINT).copy()
    for j in range(n):   # n links, 4x4 each
        J = pseudo_inertia(P[j, :10])
        w, V = np.linalg.eigh(J)
        if w.min() < 0:
            J = (V * np.maximum(w, 0.0)) @ V.T
            S = J[:3, :3]
            inertia = np.trace(S) * np.eye(3) - S
            P[j, :10] = [inertia[0, 0], inertia[0, 1], inertia[0, 2], inertia[1, 1], inertia[1, 2],
                         inertia[2, 2], J[0, 3], J[1, 3], J[2, 3], J[3, 3]]
    P[:, 10:13] = np.maximum(P[:, 10:13], 0.0)
    return P.ravel()


def min_eigenvalues(chi: np.ndarray, n: int) -> np.ndarray:
    """(n,) the smallest eigenvalue of each link's pseudo-inertia matrix (kg m^2): >= 0 iff consistent."""
    P = np.asarray(chi, dtype=float).reshape(n, PARAMS_PER_JOINT)
    return np.array([np.linalg.eigvalsh(pseudo_inertia(P[j, :10]))[0] for j in range(n)])
