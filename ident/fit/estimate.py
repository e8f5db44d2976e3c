"""Least-squares estimation of base parameters: OLS, WLS with Gautier's weights, uncertainty, validation.

The regressor is (N, n, p) (N samples, n joints, p parameters) and the measurements (N, n), SI units.
Every joint's rows are reduced once by a QR factorisation of [W_j | y_j] (numpy/LAPACK, no per-sample
loop), leaving a (p+1) x (p+1) triangle per joint with

    || y_j - W_j beta ||^2 = || z_j - R_j beta ||^2 + rho_j^2

exactly, whatever beta. OLS, the per-joint residual variances, WLS (each row of joint j weighted by
1/sigma_j: Zhang, Qin and Zou 2017, eqs. 10-13, with Gautier's 1/sigma convention) and the covariance then
only touch these small triangles, so nothing is refactorised for the second pass. The weighted triangle (R, z) is kept in
the result: the physically consistent fit (ident.fit.consistent) works on it instead of the N*n rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from firmware_bridge.runtime.errors import InputError
from ident.fit import hac

COND_LIMIT = 1e10
REFINE_FACTOR = 4.0  # WLS: the weights' second estimate moves each joint's sigma by at most this factor   # a weighted regressor worse conditioned than this does not determine the parameters
COVARIANCES = ("correlated", "hac", "textbook")   # see ident.fit.hac and Fit


class EstimationError(InputError):
    """The data cannot determine the parameters (too few rows, or a direction that is not excited)."""


@dataclass(frozen=True, eq=False)
class Fit:
    """A least-squares estimate of p parameters from n joints' rows.

    beta (p,) the estimate; covariance (p, p); sigma_joint (n,) the per-joint residual standard deviation
    of the OLS fit, unbiased for the parameters the joints share (the weights of WLS are 1/sigma_joint; units of
    y); residual_rms (n,) RMS of y - W beta
    per joint for this estimate; rows (n,) rows used per joint; cond the condition number of the (weighted)
    stacked regressor; R (p, p), z (p,) its triangular factor, with ||W_w beta - y_w||^2 = ||R beta - z||^2
    + rss_floor for the weighted rows. covariance is the one named by covariance_kind: "correlated" (the
    rows' noise correlated in time as the filters that made them correlate white noise: ident.fit.hac,
    exact for any regressor), "hac" (Newey-West with Andrews' bandwidth, `bandwidth` its Bartlett lags M;
    assumes nothing of the noise but needs many more samples than parameters) or "textbook"
    (s^2 (W_w'W_w)^-1: white errors of one variance per joint); covariance_textbook is always the last, for
    comparison.
    """

    beta: np.ndarray
    covariance: np.ndarray
    sigma_joint: np.ndarray
    residual_rms: np.ndarray
    rows: np.ndarray
    cond: float
    R: np.ndarray
    z: np.ndarray
    rss_floor: float
    method: str
    covariance_textbook: np.ndarray | None = None
    covariance_kind: str = "textbook"
    bandwidth: int = 0

    @property
    def std(self) -> np.ndarray:
        """(p,) standard deviation of each parameter, in its own unit."""
        return np.sqrt(np.maximum(np.diag(self.covariance), 0.0))

    def information_factor(self) -> tuple[np.ndarray, np.ndarray]:
        """(F (p, p), F beta) with F'F = covariance^-1: ||F x - F beta||^2 is the chi^2 distance of x from beta
        in the reported covariance (the physically consistent fit measures its departure from beta by it)."""
        try:
            L = np.linalg.cholesky(self.covariance)
            F = scipy.linalg.solve_triangular(L, np.eye(len(self.beta)), lower=True)
        except np.linalg.LinAlgError:        # not positive definite to rounding: the pseudo-inverse square root
            lam, V = np.linalg.eigh(self.covariance)
            keep = lam > lam.max() * 1e-14
            F = (V[:, keep] / np.sqrt(lam[keep])).T
        return F, F @ self.beta

    @property
    def relative_std_pct(self) -> np.ndarray:
        """(p,) relative standard deviation in %, 100 sigma_k / |beta_k| (inf where beta_k == 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = 100.0 * self.std / np.abs(self.beta)
        return np.where(np.isnan(out), np.inf, out)


@dataclass(frozen=True, eq=False)
class _JointFactors:
    R: np.ndarray      # (n, p, p) upper triangles of W_j
    z: np.ndarray      # (n, p)    Q_j^T y_j
    rho2: np.ndarray   # (n,)      ||y_j||^2 not explained by any beta
    rows: np.ndarray   # (n,)
    y_ms: np.ndarray   # (n,)      mean square of y_j (a scale for tolerances)


def _check_shapes(W: np.ndarray, y: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if W.ndim != 3 or y.shape != W.shape[:2]:
        raise ValueError(f"regressor (N, n, p) and measurements (N, n) do not match: {W.shape}, {y.shape}")
    if mask is None:
        return np.ones(y.shape, dtype=bool)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != y.shape:
        raise ValueError(f"mask: expected shape {y.shape}, got {mask.shape}")
    return mask


def _factor(W: np.ndarray, y: np.ndarray, mask: np.ndarray | None) -> _JointFactors:
    """Per joint: QR of the rows [W_j | y_j] selected by mask (N, n); one LAPACK call per joint."""
    mask = _check_shapes(W, y, mask)
    N, n, p = W.shape
    R = np.zeros((n, p, p))
    z = np.zeros((n, p))
    rho2 = np.zeros(n)
    rows = mask.sum(axis=0)
    y_ms = np.zeros(n)
    for j in range(n):   # n joints, each one vectorised QR over its samples
        sel = mask[:, j]
        if not sel.any():
            continue
        A = np.empty((int(rows[j]), p + 1))
        A[:, :p] = W[sel, j, :]
        A[:, p] = y[sel, j]
        y_ms[j] = float(np.mean(A[:, p] ** 2))
        T = np.linalg.qr(A, mode="r")          # (min(rows, p+1), p+1)
        k = T.shape[0]
        R[j, :min(k, p)] = T[:p, :p]
        z[j, :min(k, p)] = T[:p, p]
        rho2[j] = T[p, p] ** 2 if k > p else 0.0
    return _JointFactors(R, z, rho2, rows, y_ms)


def _solve_stacked(f: _JointFactors, weights: np.ndarray, names: list[str] | None) -> tuple:
    """Least squares on the stacked weighted triangles; returns beta, R_w (p, p), z_w (p,), cond."""
    n, p, _ = f.R.shape
    total = int(f.rows.sum())
    if total <= p:
        raise EstimationError(f"{total} rows for {p} parameters: the recording is too short")
    stack = (f.R * weights[:, None, None]).reshape(n * p, p)
    rhs = (f.z * weights[:, None]).reshape(n * p)
    Q, Rw = np.linalg.qr(stack)
    zw = Q.T @ rhs
    s = np.linalg.svd(Rw, compute_uv=False)
    cond = float(s[0] / s[-1]) if s[-1] > 0 else np.inf
    if not cond < COND_LIMIT:
        _, _, Vt = np.linalg.svd(Rw)
        k = int(np.argmax(np.abs(Vt[-1])))
        what = names[k] if names else f"parameter {k + 1}"
        raise EstimationError(f"the data do not determine the parameters (condition number {cond:.3g}); "
                              f"least excited: {what}. Use a richer excitation trajectory")
    beta = scipy.linalg.solve_triangular(Rw, zw)
    return beta, Rw, zw, cond


def _joint_rss(f: _JointFactors, beta: np.ndarray) -> np.ndarray:
    """(n,) residual sum of squares of each joint's rows at beta (exact, from the triangles)."""
    e = f.z - np.einsum("jab,b->ja", f.R, beta)
    return np.sum(e * e, axis=1) + f.rho2


def _fit(f: _JointFactors, weights: np.ndarray, sigma_joint: np.ndarray, method: str,
         names: list[str] | None, data: tuple, covariance: str, segments, row_correlation) -> Fit:
    n, p, _ = f.R.shape
    beta, Rw, zw, cond = _solve_stacked(f, weights, names)
    rss = _joint_rss(f, beta)
    total = int(f.rows.sum())
    weighted_rss = float(np.sum(rss * weights ** 2))
    var_unit = weighted_rss / (total - p)                   # variance of a weighted row's error
    Rinv = scipy.linalg.solve_triangular(Rw, np.eye(p))
    textbook = var_unit * (Rinv @ Rinv.T)
    cov, lags = textbook, 0
    W, y, mask = data
    if covariance == "hac":
        scores = hac.leverage_adjusted_scores(W, y, mask, beta, weights, Rinv)
        cov, lags = hac.sandwich(Rinv, scores, segments)
    elif covariance == "correlated" and row_correlation is not None and len(row_correlation) > 1:
        A = W * np.where(mask, weights[None, :], 0.0)[:, :, None]
        e = np.where(mask, y - W @ beta, 0.0) * weights[None, :]
        cov = hac.correlated_covariance(Rinv, A, e, row_correlation, segments)
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.where(f.rows > 0, np.sqrt(rss / np.maximum(f.rows, 1)), np.nan)
    return Fit(beta=beta, covariance=cov, sigma_joint=sigma_joint, residual_rms=rms, rows=f.rows.copy(),
               cond=cond, R=Rw, z=zw, rss_floor=float(np.sum(f.rho2 * weights ** 2)), method=method,
               covariance_textbook=textbook, covariance_kind=covariance, bandwidth=lags)


def _joint_sigma(f: _JointFactors, weights: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Each joint's noise standard deviation (units of y) from its residuals at beta, a fit with the joints' rows
    weighted by `weights`, unbiased for parameters the joints share: ident.fit.hac.noise_variances on the weighted
    triangles (white rows), where Gautier's ||y_j - W_j beta||^2 / (r_j - p) charges every joint all p parameters
    (a joint with 56 rows of 58 parameters was given a sigma 6 times its noise, and so 1/36 of its weight). A floor
    of 1e-12 of the joint's RMS keeps exact data's weights finite."""
    Rw = f.R * weights[:, None, None]
    plain = np.einsum("jka,jkb->jab", Rw, Rw)                      # A_j' A_j of the weighted rows
    bread = np.linalg.pinv(plain.sum(axis=0), hermitian=True)
    s2 = hac.noise_variances(bread, plain, plain, f.rows, _joint_rss(f, beta) * weights ** 2)
    sigma = np.sqrt(s2) / weights
    floor = 1e-12 * np.sqrt(np.maximum(f.y_ms, np.max(f.y_ms)))
    return np.maximum(sigma, np.maximum(floor, 1e-300))


def _ols_sigma(f: _JointFactors, beta: np.ndarray) -> np.ndarray:
    """_joint_sigma of the OLS fit (unit weights)."""
    return _joint_sigma(f, np.ones(f.R.shape[0]), beta)


def ols(W: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None, *, names: list[str] | None = None,
        covariance: str = "correlated", segments: np.ndarray | None = None,
        row_correlation: np.ndarray | None = None) -> Fit:
    """Ordinary least squares: the beta minimising the sum of squares of y - W beta over the rows in mask.

    The covariance holds for rows whose noise is correlated in time by the filters that made them
    (row_correlation, ident.fit.hac; without it, sigma^2 (W^T W)^-1 with one sigma^2 for all rows);
    `Fit.sigma_joint` holds the per-joint residual standard deviations.

    Parameters
    ----------
    W : ndarray, shape (N, n, p)
        The regressor: N samples of n joints, p parameters.
    y : ndarray, shape (N, n)
        The measurements (N m, or the unit of the data).
    mask : ndarray of bool, shape (N, n), optional
        The rows to use (default: all).
    names : list of str, optional
        The p parameter names, for messages.
    covariance : {"correlated", "hac", "textbook"}
        "correlated": the sandwich for the noise correlation row_correlation (ident.fit.hac); "hac": Newey-West
        over the samples in time order, Andrews' bandwidth; "textbook": s^2 (W_w^T W_w)^-1 (white errors).
    segments : ndarray, shape (N,), optional
        Labels of the stretches of samples without a gap (no lag of the covariance crosses from one to
        another); default one stretch.
    row_correlation : ndarray, optional
        K[l], the correlation of a joint's noise l rows apart (ident.fit.hac.row_noise_correlation for rows
        made by ident.fit.preprocess); default white (K = [1]).

    Returns
    -------
    Fit
        beta (p,), covariance (p, p), std, the residuals per joint and the condition number.

    Raises
    ------
    EstimationError
        The rows cannot determine the parameters (too few rows, or a direction not excited; named when
        `names` are given).

    Examples
    --------
    >>> import numpy as np
    >>> from ident.fit import estimate
    >>> rng = np.random.default_rng(0)
    >>> W = rng.normal(size=(200, 2, 3))
    >>> y = W @ np.array([1.0, -2.0, 0.5])
    >>> fit = estimate.ols(W, y)
    >>> np.round(fit.beta, 12)
    array([ 1. , -2. ,  0.5])
    >>> bool(np.allclose(fit.beta, np.linalg.lstsq(W.reshape(-1, 3), y.ravel(), rcond=None)[0]))
    True
    """
    _check_covariance(covariance)
    f = _factor(W, y, mask)
    ones = np.ones(W.shape[1])
    beta = _solve_stacked(f, ones, names)[0]
    return _fit(f, ones, _ols_sigma(f, beta), "ols", names, (W, y, _check_shapes(W, y, mask)), covariance,
                segments, row_correlation)


def wls(W: np.ndarray, y: np.ndarray, mask: np.ndarray | None = None, *, names: list[str] | None = None,
        covariance: str = "correlated", segments: np.ndarray | None = None,
        row_correlation: np.ndarray | None = None) -> Fit:
    """Weighted least squares with Gautier's weights: OLS first, sigma_j from its residuals on joint j (unbiased
    for the parameters the joints share), refined once from a fit weighted by them, then every row of joint j
    weighted by 1/sigma_j; the covariance comes from the weighted residuals.

    Parameters
    ----------
    W : ndarray, shape (N, n, p)
        The regressor: N samples of n joints, p parameters.
    y : ndarray, shape (N, n)
        The measurements.
    mask : ndarray of bool, shape (N, n), optional
        The rows to use (default: all).
    names : list of str, optional
        The p parameter names, for messages.
    covariance : {"correlated", "hac", "textbook"}
        "correlated": the sandwich for the noise correlation row_correlation (ident.fit.hac); "hac": Newey-West
        over the samples in time order, Andrews' bandwidth; "textbook": s^2 (W_w^T W_w)^-1 (white errors).
    segments : ndarray, shape (N,), optional
        Labels of the stretches of samples without a gap (no lag of the covariance crosses from one to
        another); default one stretch.
    row_correlation : ndarray, optional
        K[l], the correlation of a joint's noise l rows apart (ident.fit.hac.row_noise_correlation for rows
        made by ident.fit.preprocess); default white (K = [1]).

    Returns
    -------
    Fit
        As `ols`, with method "wls" and `sigma_joint` the weights' sigma_j.

    Raises
    ------
    EstimationError
        The rows cannot determine the parameters.

    Examples
    --------
    Joint 2 is ten times noisier than joint 1; WLS finds each joint's noise and trusts joint 1 more:

    >>> import numpy as np
    >>> from ident.fit import estimate
    >>> rng = np.random.default_rng(1)
    >>> W = rng.normal(size=(5000, 2, 3))
    >>> y = W @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=(5000, 2)) * [0.01, 0.1]
    >>> fit = estimate.wls(W, y, names=["a", "b", "c"])
    >>> np.round(fit.sigma_joint, 2)
    array([0.01, 0.1 ])
    >>> bool(np.all(np.abs(fit.beta - [1.0, -2.0, 0.5]) < 3 * fit.std))
    True
    >>> bool(np.all(fit.std < estimate.ols(W, y).std))
    True
    """
    _check_covariance(covariance)
    f = _factor(W, y, mask)
    n = W.shape[1]
    beta_ols = _solve_stacked(f, np.ones(n), names)[0]
    sigma = _ols_sigma(f, beta_ols)
    # once more from the weighted fit: there the joints' residuals are of one size, so each joint's own variance
    # is told apart from the noise of the others that the shared parameters spread into it (from the OLS
    # residuals a small joint's is not: the large joints' noise dominates them)
    # (held within REFINE_FACTOR of the first: a joint whose residuals are only rounding, exact data, would
    # otherwise be weighted up without bound, and the weighted regressor's condition with it)
    refined = _joint_sigma(f, 1.0 / sigma, _solve_stacked(f, 1.0 / sigma, names)[0])
    sigma = np.clip(refined, sigma / REFINE_FACTOR, sigma * REFINE_FACTOR)
    return _fit(f, 1.0 / sigma, sigma, "wls", names, (W, y, _check_shapes(W, y, mask)), covariance, segments,
                row_correlation)


def _check_covariance(covariance: str) -> None:
    if covariance not in COVARIANCES:
        raise InputError(f"covariance: expected one of {', '.join(COVARIANCES)}, got {covariance!r}")


def predict(W: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Predicted measurements W @ beta.

    Parameters
    ----------
    W : ndarray, shape (N, n, p)
        The regressor.
    beta : ndarray, shape (p,)
        The parameters.

    Returns
    -------
    ndarray, shape (N, n)

    Examples
    --------
    >>> import numpy as np
    >>> from ident.fit import estimate
    >>> estimate.predict(np.ones((2, 1, 3)), np.array([1.0, 2.0, 3.0]))
    array([[6.],
           [6.]])
    """
    return W @ beta


def prediction_errors(W: np.ndarray, y: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How well parameters predict measurements, per joint (e.g. on a validation recording).

    Parameters
    ----------
    W : ndarray, shape (N, n, p)
        The regressor.
    y : ndarray, shape (N, n)
        The measurements.
    beta : ndarray, shape (p,)
        The parameters.

    Returns
    -------
    rms : ndarray, shape (n,)
        RMS of y - W beta, in the units of y.
    relative : ndarray, shape (n,)
        rms over the RMS of y (inf for a joint whose y is all zero).

    Examples
    --------
    >>> import numpy as np
    >>> from ident.fit import estimate
    >>> W = np.ones((4, 2, 1))
    >>> y = np.array([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0]])
    >>> rms, relative = estimate.prediction_errors(W, y, np.array([1.5]))
    >>> rms.tolist(), relative.tolist()
    ([0.5, 0.5], [0.5, 0.25])
    """
    e = y - predict(W, beta)
    rms = np.sqrt(np.mean(e * e, axis=0))
    scale = np.sqrt(np.mean(y * y, axis=0))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(scale > 0, rms / scale, np.inf)
    return rms, rel
