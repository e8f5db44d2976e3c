"""Recursive least squares for online identification: a numba kernel over batches of samples.

Model: y_k = Phi_k theta + v_k, with m rows per sample (one per joint), each row j weighted by w_j (Gautier's
WLS weights 1/sigma_j, so the weighted noise has unit variance). Each sample is ONE block update of its
weighted rows H = diag(w) Phi_k (m', p) (rows of weight 0 left out, m' <= m), z = diag(w) y_k:

    e = z - H theta                          (a-priori errors, all rows against the sample's prior theta)
    PH = P H'  (p, m'),   S = I + H PH = L D L'  (m' x m', a tiny factorisation),   G = PH L^-T  (p, m')
    theta += G D^-1 L^-1 e                   (= K e, K = PH S^-1)
    P = (P - G D^-1 G') / lambda             (= (P - K PH') / lambda: one pass over P, forgetting folded in)

This is the textbook block form: every row of a sample sees the same prior theta (the m' scalar updates it
replaces let row 2 see row 1's update; both end at the same theta and P, tested). The covariance update is
the symmetric rank-m' downdate K G' with G_i scaled by sqrt(1 / (lambda |d_i|)) and K_i = sign(d_i) G_i:
elements (a, b) and (b, a) are the same products (up to an exact sign) summed in the same order, so P
stays exactly symmetric without a symmetrising pass. Per sample that is one pass over P for PH (six dot
products per row of P, vectorised) and one for the downdate (the scalar form made about 14: two per row,
one to forget, one to symmetrise). On the 2-core machine this full-row pass was faster than an
upper-triangle pass plus mirroring (whose rows start unaligned, and whose mirror writes go down columns).

Why L D L' and not Cholesky: its pivots d_i are the denominators 1 + r' P r of the scalar updates.
With a huge prior (p0 = 1e8 with Gautier's weights: ~1e20 times a row's weight) the covariance form
goes through rounding-indefinite states early on. The scalar updates went on through them and so does
L D L'; Cholesky would have to stop (a negative pivot has no square root), and skipping those samples
froze the filter. A pivot of exactly 0 (or a non-finite one) skips the sample (counted, stats[3]).

Wind-up protection: when forgetting would push trace(P) above trace_max (the data carry no information in
some direction, so P grows without bound there), the division by lambda is skipped for that sample
(bounded-trace forgetting).

With lambda = 1 and P0 = (Phi0' W Phi0)^-1, theta0 the WLS solution of an initial block, RLS reproduces
the batch WLS solution of all the data exactly (to rounding): the tests check this identity.

`RecursiveLS` holds theta and P (allocated once) and exposes sigma % per parameter: cov(theta) =
P s2 row_correlation, with s2 the running mean of e' S^-1 e per row, over the samples (row_correlation: 1
for independent rows; see ident.online.SampleWindow.noise_correlation for rows of a filtered stream). The innovation e of a sample has covariance
s2 S when the weighted noise has variance s2 (S = I + H P H' adds the prior uncertainty of theta to the
noise), so E[e' S^-1 e] = s2 m' and the mean is a unit-variance estimate from the first sample on (the
squared a-priori errors alone overstate s2 while P is large). With lambda = 1, sum_k e_k' S_k^-1 e_k is
exactly the ridge (prior-weighted) residual sum of squares of the final estimate (tested).

The loops over P are compiled with numba's fastmath flags for reassociation (the vectorised sums; not in
the downdate, whose operation order keeps P symmetric) and contraction only, not its no-NaN/no-inf
assumptions; non-finite samples are refused before them anyway.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

# reassociation (vectorised sums) and fused multiply-add, but no "no NaN / no inf" assumption
FAST = {"reassoc", "contract", "nsz"}
CHUNK = 6               # rows per unrolled pass over P (a sample's rows, padded with zero rows)


@njit(cache=True, nogil=True, fastmath=FAST)
def _ph(P, H, rows, PHt):
    """PHt[i] = P H[i] for the rows of H (rows a multiple of CHUNK; P symmetric): one pass over P per CHUNK
    rows, six dot products per row of P."""
    p = P.shape[0]
    for g in range(0, rows, CHUNK):
        for a in range(p):
            s0 = s1 = s2 = s3 = s4 = s5 = 0.0
            for b in range(p):
                x = P[a, b]
                s0 += x * H[g, b]
                s1 += x * H[g + 1, b]
                s2 += x * H[g + 2, b]
                s3 += x * H[g + 3, b]
                s4 += x * H[g + 4, b]
                s5 += x * H[g + 5, b]
            PHt[g, a] = s0
            PHt[g + 1, a] = s1
            PHt[g + 2, a] = s2
            PHt[g + 3, a] = s3
            PHt[g + 4, a] = s4
            PHt[g + 5, a] = s5


@njit(cache=True, nogil=True, fastmath={"contract"})
def _downdate(P, Kt, Gt, rows, scale):
    """P = scale P - K G' (K = Kt', G = Gt', rows a multiple of CHUNK, Kt = diag(+-1) Gt): one pass over P
    per CHUNK rows. Elements (a, b) and (b, a) are then the same products (up to an exact sign) summed in
    the same order, so a symmetric P stays exactly symmetric (no reassociation is allowed here)."""
    p = P.shape[0]
    for g in range(0, rows, CHUNK):
        f = scale if g == 0 else 1.0
        for a in range(p):
            k0, k1, k2 = Kt[g, a], Kt[g + 1, a], Kt[g + 2, a]
            k3, k4, k5 = Kt[g + 3, a], Kt[g + 4, a], Kt[g + 5, a]
            for b in range(p):
                P[a, b] = f * P[a, b] - (k0 * Gt[g, b] + k1 * Gt[g + 1, b] + k2 * Gt[g + 2, b]
                                         + k3 * Gt[g + 3, b] + k4 * Gt[g + 4, b] + k5 * Gt[g + 5, b])


@njit(cache=True, nogil=True)
def _ldl(S, mu, d) -> bool:
    """S = L D L' in place (unit L below the diagonal of the first mu rows, D into d); False when a pivot
    is 0 or not finite. No square roots: like the scalar row updates it replaces (whose denominators
    1 + r' P r are these pivots), it goes on through a covariance that rounding made indefinite."""
    for j in range(mu):
        dj = S[j, j]
        for k in range(j):
            dj -= S[j, k] * S[j, k] * d[k]
        if dj == 0.0 or not math.isfinite(dj):
            return False
        d[j] = dj
        for i in range(j + 1, mu):
            s = S[i, j]
            for k in range(j):
                s -= S[i, k] * S[j, k] * d[k]
            S[i, j] = s / dj
    return True


@njit(cache=True, nogil=True, fastmath=FAST)
def _forward(L, mu, B):
    """B[:mu] = L^-1 B[:mu] in place (L unit lower triangular, B (rows, p)): whole rows at a time."""
    p = B.shape[1]
    for i in range(mu):
        for k in range(i):
            c = L[i, k]
            for a in range(p):
                B[i, a] -= c * B[k, a]


@njit(cache=True, nogil=True, fastmath=FAST)
def _dot(x, y) -> float:
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


@njit(cache=True, nogil=True, fastmath=FAST)
def _innovation_matrix(H, PHt, mu, S) -> None:
    """S = I + H P H' (lower triangle of the first mu rows), from PHt = (P H')'."""
    for i in range(mu):
        for l in range(i + 1):
            S[i, l] = _dot(H[i], PHt[l]) + (1.0 if i == l else 0.0)


@njit(cache=True, nogil=True)
def rls_update(theta, P, Phi, y, w, lam, trace_max, err_out, stats):
    """Process N samples: Phi (N, m, p), y (N, m), w (N, m) row weights (0 leaves a row out). Updates theta (p,)
    and P (p, p, symmetric) in place; writes the a-priori prediction errors (unweighted, units of y, against
    the sample's prior theta) into err_out (N, m); stats (4,) accumulates [sum of e' S^-1 e (weighted
    errors), rows used, skipped forgettings, samples skipped for a zero or non-finite pivot of S].
    Samples with a non-finite value anywhere in Phi, y or w are skipped whole (their errors are NaN)."""
    N, m, p = Phi.shape
    rows = CHUNK * ((m + CHUNK - 1) // CHUNK)
    H = np.zeros((rows, p))          # the sample's weighted rows; rows past the used ones stay 0
    G = np.zeros((rows, p))          # P H', then G' = L^-1 H P (S = L D L'): P H' S^-1 H P = G D^-1 G'
    K = np.zeros((rows, p))          # G' scaled by sign(d_i) (the downdate's left factor)
    S = np.empty((m, m))
    d = np.empty(m)
    dinv = np.empty(m)
    zeros = np.zeros(p)
    u = np.empty((m, 1))
    inv = 1.0 / lam
    for k in range(N):
        finite = True
        for j in range(m):
            # x * 0 is NaN exactly when x is not finite (no fastmath flag here or in _dot lets it fold to 0)
            if not math.isfinite(y[k, j] * w[k, j] + _dot(Phi[k, j], zeros)):
                finite = False
        if not finite:
            for j in range(m):
                err_out[k, j] = math.nan
            continue
        mu = 0
        for j in range(m):
            e = y[k, j] - _dot(Phi[k, j], theta)
            err_out[k, j] = e
            wj = w[k, j]
            if wj != 0.0:
                for i in range(p):
                    H[mu, i] = wj * Phi[k, j, i]
                u[mu, 0] = wj * e
                mu += 1
        for i in range(mu, rows):
            for a in range(p):
                H[i, a] = 0.0
        if mu > 0:
            _ph(P, H, rows, G)
            _innovation_matrix(H, G, mu, S)
            if not _ldl(S, mu, d):
                stats[3] += 1.0
                for j in range(m):
                    err_out[k, j] = math.nan
                continue
            _forward(S, mu, u)                           # u = L^-1 e: e' S^-1 e = sum u_i^2 / d_i
            _forward(S, mu, G)                           # G' = L^-1 H P
            q = 0.0
            for i in range(mu):
                dinv[i] = 1.0 / d[i]
                c = u[i, 0] * dinv[i]
                q += u[i, 0] * c
                for a in range(p):
                    theta[a] += G[i, a] * c              # theta += P H' S^-1 e = G D^-1 L^-1 e
            stats[0] += q
            stats[1] += mu
        scale = 1.0                                      # forgetting: P = (P - G D^-1 G') / lambda
        if inv != 1.0:
            tr = 0.0
            for a in range(p):
                tr += P[a, a]
            for i in range(mu):
                tr -= _dot(G[i], G[i]) * dinv[i]
            if tr * inv <= trace_max:
                scale = inv
            else:
                stats[2] += 1.0
        if mu == 0:
            if scale != 1.0:                             # forgetting only
                for a in range(p):
                    for b in range(p):
                        P[a, b] *= scale
        else:
            for i in range(mu):                          # G_i sqrt(scale / |d_i|), K_i = sign(d_i) G_i
                r = math.sqrt(scale / abs(d[i]))
                sgn = 1.0 if d[i] > 0.0 else -1.0
                for a in range(p):
                    x = G[i, a] * r
                    G[i, a] = x
                    K[i, a] = sgn * x
            for i in range(mu, rows):
                for a in range(p):
                    G[i, a] = 0.0
                    K[i, a] = 0.0
            _downdate(P, K, G, rows, scale)


class RecursiveLS:
    """RLS state for p parameters and m rows per sample.

    forgetting: lambda in (0, 1] per sample (1: no forgetting; 0.9999 at 1 kHz remembers ~10 s).
    weights: (m,) row weights (1/sigma_j), default ones. p0: initial covariance scale (P0 = p0 I).
    trace_max: bound on trace(P) under forgetting (default 10 * trace(P0)).
    row_correlation: how many consecutive rows carry one independent row's information (1: white noise;
    rows of a low-passed stream: ident.online.SampleWindow.noise_correlation); it scales covariance().
    """

    def __init__(self, p: int, m: int, *, forgetting: float = 1.0, weights=None, p0: float = 1e6,
                 trace_max: float | None = None, theta0=None, row_correlation: float = 1.0):
        if not (0.0 < forgetting <= 1.0):
            raise ValueError(f"forgetting: expected 0 < lambda <= 1, got {forgetting!r}")
        self.p, self.m = p, m
        self.forgetting = float(forgetting)
        self.weights = np.ones(m) if weights is None else np.asarray(weights, dtype=float).copy()
        if self.weights.shape != (m,) or not np.all(np.isfinite(self.weights)) or np.any(self.weights < 0):
            raise ValueError(f"weights: expected {m} finite values >= 0")
        self.p0 = float(p0)
        if not row_correlation >= 1.0:
            raise ValueError(f"row_correlation: expected a number >= 1, got {row_correlation!r}")
        self.row_correlation = float(row_correlation)
        self.trace_max = float(trace_max) if trace_max is not None else 10.0 * p0 * p
        self.theta = np.zeros(p) if theta0 is None else np.asarray(theta0, dtype=float).copy()
        self.P = np.eye(p) * p0
        self.stats = np.zeros(4)
        self._err = np.empty((0, m))

    def reset(self, theta0=None, P0=None) -> None:
        self.theta[:] = 0.0 if theta0 is None else theta0
        if P0 is None:
            self.P[:] = np.eye(self.p) * self.p0
        else:                      # the kernel keeps a symmetric P symmetric; start it exactly so
            P0 = np.asarray(P0, dtype=float)
            self.P[:] = 0.5 * (P0 + P0.T)
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
        """s2: the mean of e' S^-1 e per row used (the module docstring), 1 when the weights are 1/sigma_j and
        the model fits."""
        return float(self.stats[0] / self.stats[1]) if self.stats[1] > 0 else math.nan

    def covariance(self) -> np.ndarray:
        """cov(theta) = P s2 row_correlation (s2 = 1 until more rows than parameters were used)."""
        return self.P * ((self.residual_variance if self.rows > self.p else 1.0) * self.row_correlation)

    def sigma_percent(self) -> np.ndarray:
        """Relative standard deviation of each parameter, % (inf where the estimate is 0)."""
        sd = np.sqrt(np.maximum(np.diag(self.covariance()), 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.theta != 0, 100.0 * sd / np.abs(self.theta), np.inf)
