"""Recursive least squares for online identification: a numba kernel over batches of samples.

Model: y_k = Phi_k theta + e_k, with m rows per sample (one per joint), each row j weighted by w_j (Gautier's
WLS weights 1/sigma_j, so the weighted residuals have unit variance). Each sample is processed as m scalar
updates (no matrix inverse), then the covariance is divided by the forgetting factor lambda:

    for each row r = w_j Phi_kj,  z = w_j y_kj:
        g = P r / (1 + r' P r);  theta += g (z - r' theta);  P -= g r' P
    P /= lambda                                      (exponential forgetting)

Wind-up protection: when forgetting would push trace(P) above trace_max (the data carry no information in
some direction, so P grows without bound there), the division is skipped for that sample (bounded-trace
forgetting). P is kept symmetric. The row update is compiled with fastmath (vectorised reductions); the
finiteness checks before it are not.

With lambda = 1 and P0 = (Phi0' W Phi0)^-1, theta0 the WLS solution of an initial block, RLS reproduces
the batch WLS solution of all the data exactly (to rounding): the tests check this identity.

`RecursiveLS` holds theta and P (allocated once) and exposes sigma % per parameter: with unit-variance
weighted residuals, cov(theta) = P * s2, s2 the running mean of the squared weighted a-priori errors.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath=True)
def _row_update(theta, P, phi, wj, e, Pr):
    """One weighted scalar row: r = wj phi, z = wj e (e the a-priori error). Returns the weighted error.
    Only finite numbers reach here (fastmath: no NaN/inf semantics inside)."""
    p = phi.shape[0]
    denom = 1.0
    for a in range(p):
        s = 0.0
        for b in range(p):
            s += P[a, b] * phi[b]
        Pr[a] = wj * s
        denom += wj * phi[a] * Pr[a]
    ze = wj * e
    for a in range(p):
        theta[a] += Pr[a] * ze / denom
    for a in range(p):
        ga = Pr[a] / denom
        for b in range(p):
            P[a, b] -= ga * Pr[b]
    return ze


@njit(cache=True, nogil=True)
def rls_update(theta, P, Phi, y, w, lam, trace_max, err_out, stats):
    """Process N samples: Phi (N, m, p), y (N, m), w (N, m) row weights (0 leaves a row out). Updates theta (p,) and P (p, p)
    in place; writes the a-priori prediction errors (unweighted, units of y) into err_out (N, m);
    stats (3,) accumulates [sum of squared weighted a-priori errors, rows, skipped forgettings].
    Rows with a non-finite value anywhere in Phi or y are skipped whole (the sample's errors are NaN)."""
    N, m, p = Phi.shape
    Pr = np.empty(p)
    for k in range(N):
        finite = True
        for j in range(m):
            if not math.isfinite(y[k, j]) or not math.isfinite(w[k, j]):
                finite = False
            for i in range(p):
                if not math.isfinite(Phi[k, j, i]):
                    finite = False
        if not finite:
            for j in range(m):
                err_out[k, j] = math.nan
            continue
        for j in range(m):
            # a-priori error of the row (before its own update; rows of one sample are processed in turn)
            pred = 0.0
            for i in range(p):
                pred += Phi[k, j, i] * theta[i]
            e = y[k, j] - pred
            err_out[k, j] = e
            wj = w[k, j]
            if wj == 0.0:
                continue
            ze = _row_update(theta, P, Phi[k, j], wj, e, Pr)
            stats[0] += ze * ze
            stats[1] += 1.0
        # forgetting, bounded trace
        if lam < 1.0:
            tr = 0.0
            for a in range(p):
                tr += P[a, a]
            if tr / lam <= trace_max:
                inv = 1.0 / lam
                for a in range(p):
                    for b in range(p):
                        P[a, b] *= inv
            else:
                stats[2] += 1.0
        # symmetry (rounding in the row updates)
        for a in range(p):
            for b in range(a + 1, p):
                s = 0.5 * (P[a, b] + P[b, a])
                P[a, b] = s
                P[b, a] = s


class RecursiveLS:
    """RLS state for p parameters and m rows per sample.

    forgetting: lambda in (0, 1] per sample (1: no forgetting; 0.9999 at 1 kHz remembers ~10 s).
    weights: (m,) row weights (1/sigma_j), default ones. p0: initial covariance scale (P0 = p0 I).
    trace_max: bound on trace(P) under forgetting (default 10 * trace(P0)).
    """

    def __init__(self, p: int, m: int, *, forgetting: float = 1.0, weights=None, p0: float = 1e6,
                 trace_max: float | None = None, theta0=None):
        if not (0.0 < forgetting <= 1.0):
            raise ValueError(f"forgetting: expected 0 < lambda <= 1, got {forgetting!r}")
        self.p, self.m = p, m
        self.forgetting = float(forgetting)
        self.weights = np.ones(m) if weights is None else np.asarray(weights, dtype=float).copy()
        if self.weights.shape != (m,) or not np.all(np.isfinite(self.weights)) or np.any(self.weights < 0):
            raise ValueError(f"weights: expected {m} finite values >= 0")
        self.p0 = float(p0)
        self.trace_max = float(trace_max) if trace_max is not None else 10.0 * p0 * p
        self.theta = np.zeros(p) if theta0 is None else np.asarray(theta0, dtype=float).copy()
        self.P = np.eye(p) * p0
        self.stats = np.zeros(3)
        self._err = np.empty((0, m))

    def reset(self, theta0=None, P0=None) -> None:
        self.theta[:] = 0.0 if theta0 is None else theta0
        self.P[:] = np.eye(self.p) * self.p0 if P0 is None else P0
        self.stats[:] = 0.0

    def update(self, Phi: np.ndarray, y: np.ndarray, use=None) -> np.ndarray:
        """Process samples Phi (N, m, p), y (N, m); returns the a-priori prediction errors (N, m).
        use (N, m) bool, optional: rows to leave out of the fit where False (their errors are still computed)."""
        Phi = np.ascontiguousarray(Phi, dtype=float)
        y = np.ascontiguousarray(y, dtype=float)
        N = Phi.shape[0]
        if Phi.shape[1:] != (self.m, self.p) or y.shape != (N, self.m):
            raise ValueError(f"update: expected Phi (N, {self.m}, {self.p}) and y (N, {self.m}), got {Phi.shape} and {y.shape}")
        if self._err.shape[0] < N:
            self._err = np.empty((N, self.m))
        err = self._err[:N]
        w = np.empty((N, self.m))
        w[:] = self.weights
        if use is not None:
            w[~np.asarray(use, dtype=bool).reshape(N, self.m)] = 0.0
        rls_update(self.theta, self.P, Phi, y, w, self.forgetting, self.trace_max, err, self.stats)
        return err

    @property
    def rows(self) -> int:
        return int(self.stats[1])

    @property
    def residual_variance(self) -> float:
        """Mean squared weighted a-priori error (1 when the weights are 1/sigma_j and the model fits)."""
        return float(self.stats[0] / self.stats[1]) if self.stats[1] > 0 else math.nan

    def covariance(self) -> np.ndarray:
        return self.P * (self.residual_variance if self.rows > self.p else 1.0)

    def sigma_percent(self) -> np.ndarray:
        """Relative standard deviation of each parameter, % (inf where the estimate is 0)."""
        sd = np.sqrt(np.maximum(np.diag(self.covariance()), 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.theta != 0, 100.0 * sd / np.abs(self.theta), np.inf)
