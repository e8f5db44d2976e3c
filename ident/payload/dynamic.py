"""The three dynamic payload methods of Zhang, Qin and Zou (2017) (docs/guides/payload.md, "Dynamic methods").

Two runs of the same excitation, without and with the payload (Recordings or CSV/NPZ files, torques in N m
or motor currents in A), and the arm's model:

    est = identify(model, loaded="loaded.npz", unloaded="unloaded.npz", method="global")

- "difference" (eqs. 16-19): each run is identified by the batch pipeline (filter, differentiate, base
  regressor, parallel decimation, WLS); the payload is what changed in the base parameters it enters,
  delta beta = M chi_load with M = P[:, last link] @ T (T the flange-to-link map), solved by generalised
  least squares with the two fits' covariances.
- "torque" (eqs. 20-21): chi_load = pinv(Y_load) (tau_loaded - tau_unloaded) at the same instants, with
  Gautier's per-joint weights; it assumes both runs tracked the trajectory identically.
- "global" (eqs. 22-23): one WLS over both runs, [tau_u; tau_l] = [W_u 0; W_l Y_load] [beta; chi_load].
  consistent=True adds the physically consistent variant: the payload's pseudo-inertia constrained PSD
  (cvxpy + Clarabel, as ident.fit.consistent), the arm's base parameters free.

What the data can tell is found numerically, never listed by hand: the identifiable directions are the
row space of the stacked (column-normalised) regressor; a payload combination c . chi is identifiable when
(0, c) lies in it. The result names each payload parameter identified on its own (chi, sigma; NaN for
the others) and lists the other identifiable combinations (reduced row echelon form, e.g. "XX - YY").
Every estimate says whether it is a body that can exist (`physical_consistency`).
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.linalg

from ident.fit import batch, estimate
from ident.model import dynamics, spatial
from ident.model.base_params import BaseParameters, base_parameters
from ident.model.base_set import _linear_text, clean_coefficients
from ident.fit.consistent import _link_map
from firmware_bridge.runtime.errors import InputError
from ident.fit.excitation import FourierTrajectory, excitation_bandwidth
from ident.model import PARAMS_PER_JOINT, Model
from ident.fit.preprocess import Recording, estimate_bandwidth, load_recording, nominal_rate
from ident.payload.identifiability import Identifiable, PayloadError, identifiable
from ident.payload.result import PARAMETER_NAMES, Combination, PayloadEstimate
from ident.payload import excitation as payload_excitation

METHODS = ("difference", "torque", "global")
OPTIONS = ("trajectory", "cutoff_hz", "decimate", "slow_velocity", "gains", "base")   # identify(**options)
COEFFICIENT_TOL = 1e-6   # combination coefficients below this are zeros (the basis is orthonormal: entries O(1))
SAME_TIME_TOL = 1e-6     # s: the torque method pairs samples whose times agree within this
CONSISTENT_LAMBDA = 1e-6  # weight of the pull of unidentified directions toward the least-squares estimate
SCALE_NOTE = ("currents converted into torques with the model's nominal drive gains (gear_ratio * torque_constant): "
              "an error in a gain scales that joint's torques, and so biases the payload")


# ---------------------------------------------------------------------------------------------------
# The two runs as fit rows

@dataclass(frozen=True, eq=False)
class Runs:
    """Both runs reduced to fit rows (ident.fit.batch.Rows, with the payload regressor), their torques (N', n)
    N m, and the arm's base parameters. gains (n,) N m/A turned currents into torques (None for torques);
    notes: what the estimates should say about the data (e.g. nominal drive gains)."""

    unloaded: batch.Rows
    loaded: batch.Rows
    tau_unloaded: np.ndarray
    tau_loaded: np.ndarray
    base: BaseParameters
    gains: np.ndarray | None
    notes: tuple[str, ...] = ()


def prepare_runs(model: Model, loaded: str | Path | Recording, unloaded: str | Path | Recording, *,
                 trajectory: FourierTrajectory | None = None, cutoff_hz: float | None = None,
                 decimate: int | None = None, slow_velocity: float = batch.DEFAULT_SLOW_VELOCITY,
                 gains=None, base: BaseParameters | None = None, same_instants: bool = False) -> Runs:
    """Read, check, filter, differentiate and decimate both runs alike (one cut-off and one decimation
    factor, from the trajectory's bandwidth or the unloaded run's). Currents become torques with `gains`
    (n,) N m/A (default: the model's nominal gear_ratio * torque_constant). same_instants: the runs must
    be sampled at the same times (the torque method). Raises InputError naming the run at fault."""
    rec_u = _load(unloaded, model, "unloaded run")
    rec_l = _load(loaded, model, "loaded run")
    if rec_u.kind != rec_l.kind:
        raise PayloadError(f"{rec_l.source}: the loaded run holds {rec_l.kind}s, the unloaded run "
                           f"{rec_u.source} {rec_u.kind}s: record both alike")
    rate_u, rate_l = nominal_rate(rec_u.t, rec_u.source), nominal_rate(rec_l.t, rec_l.source)
    if abs(rate_l / rate_u - 1.0) > 1e-3:
        raise PayloadError(f"{rec_l.source}: sampled at {rate_l:.6g} Hz, the unloaded run {rec_u.source} at "
                           f"{rate_u:.6g} Hz: both runs need the same rate")
    if same_instants and (rec_u.N != rec_l.N or np.abs(rec_u.t - rec_l.t).max() > SAME_TIME_TOL):
        raise PayloadError(f"{rec_l.source}: {rec_l.N} samples from t = {rec_l.t[0]:.4f} s, the unloaded run "
                           f"{rec_u.source} {rec_u.N} from t = {rec_u.t[0]:.4f} s: the torque method subtracts "
                           "the runs sample by sample, record the same trajectory at the same instants")
    notes = ()
    if gains is None and rec_u.kind == "current":
        gains, notes = model.joint_torque_per_amp(), (SCALE_NOTE,)
    if gains is not None:
        gains = np.asarray(gains, dtype=float)
        if gains.shape != (model.n,) or not (np.isfinite(gains).all() and (gains > 0).all()):
            raise PayloadError(f"gains: expected {model.n} positive numbers of N m/A, got {gains.tolist()}")
    if trajectory is not None:
        bandwidth = excitation_bandwidth(trajectory)
    else:
        try:
            bandwidth = estimate_bandwidth(rec_u.q, rate_u)
        except InputError as exc:
            raise PayloadError(f"{rec_u.source}: {exc}") from None
    base = base_parameters(model) if base is None else base
    if decimate is None:   # one factor for both runs, never leaving fewer than 2 rows per parameter
        shortest = min(rec_u.N, rec_l.N)
        decimate = min(batch.decimation_factor(rate_u, bandwidth), max(1, shortest // (2 * (base.count + 10) + 20)))
    opts = dict(bandwidth_hz=bandwidth, cutoff_hz=cutoff_hz, decimate=decimate, slow_velocity=slow_velocity,
                with_load=True)
    rows_u = batch.recording_rows(model, base, rec_u, **opts)
    rows_l = batch.recording_rows(model, base, rec_l, **opts)
    torque = (lambda r: r.in_torque(gains)) if gains is not None else (lambda r: r.y)
    return Runs(rows_u, rows_l, torque(rows_u), torque(rows_l), base, gains, notes)


def _load(data, model: Model, role: str) -> Recording:
    rec = data if isinstance(data, Recording) else load_recording(data, n=model.n)
    if rec.n != model.n:
        raise PayloadError(f"{rec.source} ({role}): {rec.n} joints recorded, the model {model.name} has {model.n}")
    return rec


def canonical_combinations(basis: np.ndarray) -> np.ndarray:
    """Reduced row echelon form (k, 10) of the rows of `basis` (k, 10), in PARAMETER_NAMES order, with
    round-off cleaned: a row with one non-zero is a parameter identified on its own, others are
    combinations such as XX - YY."""
    A = np.array(basis, dtype=float)
    k = A.shape[0]
    r = 0
    for col in range(A.shape[1]):
        if r == k:
            break
        pivot = r + int(np.argmax(np.abs(A[r:, col])))
        if abs(A[pivot, col]) < COEFFICIENT_TOL:
            continue
        A[[r, pivot]] = A[[pivot, r]]
        A[r] /= A[r, col]
        others = np.arange(k) != r
        A[others] -= np.outer(A[others, col], A[r])
        r += 1
    A[np.abs(A) < COEFFICIENT_TOL] = 0.0
    return clean_coefficients(A[:r])


# ---------------------------------------------------------------------------------------------------
# Results

def physical_consistency(chi: np.ndarray, combinations: list[Combination] | None = None) -> tuple[bool, str]:
    """Whether a payload estimate can be a real body: positive mass, and the inertia about the centre of
    mass positive semidefinite with the triangle inequalities. chi (10,) NaN where not identified on its
    own; when some are only identified as combinations, whether a body exists that matches every identified
    value and combination (a feasibility problem over the pseudo-inertia, cvxpy + Clarabel). Returns
    (ok, reason)."""
    chi = np.asarray(chi, dtype=float)
    if np.isfinite(chi[9]) and not chi[9] > 0:
        return False, f"mass {chi[9]:.6g} kg is not positive"
    if np.isfinite(chi).all():
        return spatial.is_physically_consistent(chi)
    from ident.extras import require

    cp = require("cvxpy", "the payload's consistency check")

    rows = [np.eye(10)[k] for k in np.flatnonzero(np.isfinite(chi))] + [c.coefficients for c in combinations or []]
    values = [chi[k] for k in np.flatnonzero(np.isfinite(chi))] + [c.value for c in combinations or []]
    C, v = np.array(rows), np.array(values)
    J = cp.Variable((4, 4), PSD=True)
    x = _link_map() @ cp.vec(J, order="F")
    scale = np.maximum(np.abs(v), 1e-9)
    slack = cp.Variable()
    problem = cp.Problem(cp.Minimize(slack), [cp.abs(cp.multiply(1.0 / scale, C @ x - v)) <= slack,
                                               x[9] >= 0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        problem.solve(solver=cp.CLARABEL)
    if problem.status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        return False, f"the consistency check failed (solver status {problem.status})"
    if slack.value > 1e-6:
        return False, (f"no body matches the identified values: the closest is {100 * float(slack.value):.3g} % "
                       "off in one of them")
    return True, ""


def _estimate(method: str, chi_min: np.ndarray, cov: np.ndarray, payload_basis: np.ndarray, samples: int,
              notes: list[str]) -> PayloadEstimate:
    """A PayloadEstimate from a least-squares payload vector chi_min (10,) (right in every identifiable
    combination) with covariance (10, 10) and the identifiable combinations' basis."""
    chi = np.full(10, np.nan)
    sigma = np.full(10, np.nan)
    combos = []
    for row in canonical_combinations(payload_basis):
        nz = np.flatnonzero(row)
        value, sd = float(row @ chi_min), float(np.sqrt(max(row @ cov @ row, 0.0)))
        if len(nz) == 1:
            chi[nz[0]], sigma[nz[0]] = value, sd
        else:
            combos.append(Combination(_linear_text(row, PARAMETER_NAMES), row, value, sd))
    ok, why = physical_consistency(chi, combos)
    return PayloadEstimate(method=method, chi=chi, sigma=sigma, samples=samples, combinations=combos,
                           consistent=ok, consistency=why, notes=list(notes))


# ---------------------------------------------------------------------------------------------------
# The methods

def payload_map(model: Model, base: BaseParameters) -> np.ndarray:
    """M (b, 10): the change of the base parameters when a payload chi_load (flange frame) is merged into the
    last link, delta beta = M chi_load."""
    last = PARAMS_PER_JOINT * (model.n - 1)
    return base.P[:, last:last + 10] @ dynamics.flange_to_link_matrix(model)


def _time_series(method: str, A: np.ndarray, y: np.ndarray, mask: np.ndarray, samples: int,
                 notes: list[str], correlation: np.ndarray | None = None,
                 segments: np.ndarray | None = None) -> tuple[PayloadEstimate, Identifiable, estimate.Fit]:
    """WLS (Gautier's per-joint weights) of y (N, n) = A (N, n, p) x over the rows in mask, the payload the
    last 10 parameters, in the identifiable directions only."""
    p = A.shape[2]
    payload = slice(p - 10, p)
    if mask.sum() < p:
        raise PayloadError(f"{int(mask.sum())} usable rows for {p} parameters: the runs are too short (or too slow)")
    ident = identifiable(A[mask], payload)
    fit = estimate.wls(A @ ident.T, y, mask, row_correlation=correlation, segments=segments)
    x = ident.T @ fit.beta
    cov = ident.T @ fit.covariance @ ident.T.T
    return _estimate(method, x[payload], cov[payload, payload], ident.payload, samples, notes), ident, fit


def torque_method(runs: Runs) -> PayloadEstimate:
    """Zhang, Qin and Zou (2017) eqs. 20-21: (tau_loaded - tau_unloaded) = Y_load chi_load at the same
    instants, by WLS."""
    u, l = runs.unloaded, runs.loaded
    if u.t.shape != l.t.shape:
        raise PayloadError(f"{l.source}: {len(l.t)} rows, the unloaded run {len(u.t)}: the runs do not pair up")
    mask = u.mask & l.mask
    return _time_series("torque", l.Yl, runs.tau_loaded - runs.tau_unloaded, mask, len(l.t), list(runs.notes),
                        l.noise_correlation(), l.segment_id)[0]


def _global_system(runs: Runs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[W_u 0; W_l Y_load] (N_u + N_l, n, b + 10), [tau_u; tau_l] and the rows' mask."""
    u, l = runs.unloaded, runs.loaded
    b = runs.base.count
    A = np.zeros((len(u.t) + len(l.t), u.W.shape[1], b + 10))
    A[:len(u.t), :, :b] = u.W
    A[len(u.t):, :, :b] = l.W
    A[len(u.t):, :, b:] = l.Yl
    return A, np.concatenate([runs.tau_unloaded, runs.tau_loaded]), np.concatenate([u.mask, l.mask])


def global_method(runs: Runs, *, consistent: bool = False) -> PayloadEstimate:
    """Zhang, Qin and Zou (2017) eqs. 22-23: one WLS over both runs for [beta; chi_load]. consistent: the payload part
    constrained to a real body (pseudo-inertia PSD, mass >= 0), the arm's base parameters free."""
    A, y, mask = _global_system(runs)
    u, l = runs.unloaded, runs.loaded
    segments = None if u.segment_id is None or l.segment_id is None else \
        np.concatenate([u.segment_id, l.segment_id + u.segment_id.max() + 1])
    est, ident, fit = _time_series("global", A, y, mask, len(y), list(runs.notes), u.noise_correlation(), segments)
    if not consistent:
        return est
    return _consistent_global(est, ident, fit, runs.base.count)


def difference_method(runs: Runs, model: Model) -> PayloadEstimate:
    """Zhang, Qin and Zou (2017) eqs. 16-19: WLS of each run's base parameters, delta beta = beta_l - beta_u
    = M chi_load over the base parameters the payload enters (those of the last link(s), regrouped), by
    generalised least squares with covariance cov_l + cov_u."""
    fits = []
    for rows, tau, role in ((runs.unloaded, runs.tau_unloaded, "unloaded"), (runs.loaded, runs.tau_loaded, "loaded")):
        try:
            fits.append(estimate.wls(rows.W, tau, rows.mask, names=runs.base.names,
                                     row_correlation=rows.noise_correlation(), segments=rows.segment_id))
        except InputError as exc:
            raise PayloadError(f"{rows.source} ({role} run): {exc}") from None
    M = payload_map(model, runs.base)
    entered = np.flatnonzero(np.abs(M).max(axis=1) > 0)
    delta = fits[1].beta[entered] - fits[0].beta[entered]
    cov = (fits[1].covariance + fits[0].covariance)[np.ix_(entered, entered)]
    # whiten with the covariance's inverse square root (eigh: robust to a nearly singular covariance)
    w, V = np.linalg.eigh(cov)
    w = np.maximum(w, 1e-300 + 1e-15 * w.max())
    whiten = (V / np.sqrt(w)).T
    A, y = whiten @ M[entered], whiten @ delta
    ident = identifiable(A, slice(0, 10))
    Q, R = np.linalg.qr(A @ ident.T)
    theta = scipy.linalg.solve_triangular(R, Q.T @ y)
    Rinv = scipy.linalg.solve_triangular(R, np.eye(R.shape[0]))
    x, cov_x = ident.T @ theta, ident.T @ (Rinv @ Rinv.T) @ ident.T.T
    notes = list(runs.notes) + [f"base parameters the payload enters: {', '.join(runs.base.names[k] for k in entered)}"]
    return _estimate("difference", x, cov_x, ident.payload, len(runs.unloaded.t) + len(runs.loaded.t), notes)


def _consistent_global(est: PayloadEstimate, ident: Identifiable, fit: estimate.Fit, b: int) -> PayloadEstimate:
    """The global fit with the payload constrained to a real body: minimise the weighted residual
    ||R theta(x) - z||^2 (the WLS triangle, theta(x) = V_r^T diag(scale) x) over x = [beta; chi_load(J)],
    J the payload's 4x4 pseudo-inertia, PSD. Directions the data do not determine are pulled (weight
    CONSISTENT_LAMBDA of the weakest identified one) toward the least-squares estimate."""
    from ident.fit.consistent import _project_consistent, _solve
    from ident.extras import require

    cp = require("cvxpy", "the physically consistent payload fit")

    started = time.perf_counter()
    Vr = ident.T * ident.scale[:, None]
    A = (fit.R @ Vr.T) * ident.scale[None, :]              # (r, p)
    sv = np.linalg.svd(A, compute_uv=False)
    k = max(float(sv[0]), 1e-300)
    x_ls = ident.T @ fit.beta
    beta = cp.Variable(b)
    J = cp.Variable((4, 4), PSD=True)
    x = cp.hstack([beta, _link_map() @ cp.vec(J, order="F")])
    objective = cp.sum_squares((A / k) @ x - fit.z / k)
    if ident.null.shape[1]:
        G = ident.null.T * ident.scale[None, :]
        objective = objective + CONSISTENT_LAMBDA * float(sv[-1] / k) ** 2 * cp.sum_squares(G @ (x - x_ls))
    problem = _solve(cp, cp.Problem(cp.Minimize(objective)))
    chi_c = _project_consistent(np.concatenate([np.asarray(x.value)[b:], np.zeros(4)]), 1)[:10]
    x_c = np.concatenate([np.asarray(beta.value), chi_c])
    r_c, r_ls = A @ x_c - fit.z, A @ x_ls - fit.z
    chi = np.where(np.isfinite(est.chi), chi_c, np.nan)
    combos = [Combination(c.expression, c.coefficients, float(c.coefficients @ chi_c), c.sigma)
              for c in est.combinations]
    ok, why = physical_consistency(chi, combos)
    notes = est.notes + [f"physically consistent fit (cvxpy, Clarabel: {problem.status}): chi^2 increase "
                         f"{float(r_c @ r_c - r_ls @ r_ls):.4g} over WLS in {time.perf_counter() - started:.3f} s; "
                         "sigmas are those of the unconstrained fit"]
    return PayloadEstimate(method="global-consistent", chi=chi, sigma=est.sigma, samples=est.samples,
                           combinations=combos, consistent=ok, consistency=why, notes=notes)


def plan(model: Model, joints: str = "wrist", **options) -> FourierTrajectory:
    """The payload excitation, ident.payload.excitation.plan: the Fourier design with the payload
    regressor's condition number as its criterion, moving the "wrist" joints only or "all" joints."""
    return payload_excitation.plan(model, joints, **options)


def identify(model: Model, loaded: str | Path | Recording, unloaded: str | Path | Recording,
             method: str = "global", *, consistent: bool = False, **options) -> PayloadEstimate:
    """A payload from a loaded and an unloaded run of the same excitation, by one of the dynamic methods of
    Zhang, Qin and Zou (2017).

    "difference": each run's base parameters identified, the payload from what changed in them;
    "torque": the loaded minus the unloaded torques at the same instants; "global": one fit of the arm's
    base parameters and the payload's over both runs (see the module docstring).

    Parameters
    ----------
    model : Model
        The arm (without the payload).
    loaded, unloaded : str, Path or Recording
        The runs with and without the payload (a CSV or NPZ file, or an ident.fit.preprocess.Recording).
    method : {"global", "torque", "difference"}
        The method.
    consistent : bool
        The physically consistent global fit (method "global" only).
    **options
        Of `prepare_runs`: trajectory (sets the filter bandwidth), cutoff_hz, decimate, slow_velocity,
        gains (n,) N m/A for currents, base.

    Returns
    -------
    PayloadEstimate
        In the model's flange frame (`Model.flange_frame`); NaN for what the method cannot identify.

    Raises
    ------
    PayloadError
        An unknown method or option, consistent with another method than "global" (an InputError).
    InputError
        Unusable runs, in one line naming the run, file or field.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.fit import excitation
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> from ident.payload.dynamic import identify
    >>> from ident.fit.preprocess import Recording
    >>> model = load_model("generic6")
    >>> traj = excitation.preset("seed000")
    >>> t, q, qd, qdd = traj.sample(rate_hz=100.0)
    >>> def run(arm):
    ...     return Recording(t=t, q=q, tau=dynamics.rnea(arm, q, qd, qdd), current=None, qd=None, source=arm.name)
    >>> load = payload_parameters(1.5, [0.0, 0.02, 0.08])
    >>> est = identify(model, run(dynamics.merge_payload(model, load)), run(model), method="torque", trajectory=traj)
    >>> est.method, round(est.mass, 3)
    ('torque', 1.5)
    >>> identify(model, "loaded.csv", "unloaded.csv", method="static")
    Traceback (most recent call last):
    ...
    ident.payload.identifiability.PayloadError: method: expected one of difference, torque, global, got 'static'
    """
    if method not in METHODS:
        raise PayloadError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if consistent and method != "global":
        raise PayloadError(f"consistent: the constrained fit is offered for the global method, not {method!r}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise PayloadError(f"unknown option {unknown[0]!r}: expected some of {', '.join(OPTIONS)}")
    started = time.perf_counter()
    runs = prepare_runs(model, loaded, unloaded, same_instants=method == "torque", **options)
    if method == "torque":
        est = torque_method(runs)
    elif method == "global":
        est = global_method(runs, consistent=consistent)
    else:
        est = difference_method(runs, model)
    est.seconds = time.perf_counter() - started
    est.frame = model.flange_frame
    return est
