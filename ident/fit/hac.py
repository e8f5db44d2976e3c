"""Covariances of a least-squares estimate whose rows' errors are correlated in time.

Two estimates of the covariance that hold where the textbook s^2 (A'A)^-1 does not (ident.fit.estimate uses
them; docs/design/science.md says which is the default and why):

- **Known row correlation** (`correlated_covariance`): the rows were made by known linear filters (the
  zero-phase low-pass, the decimation FIR) from samples whose noise is white, so the rows' noise of joint j has
  the autocorrelation K (`row_noise_correlation`) times an unknown variance s_j^2; then exactly

      C = (A'A)^-1 (sum_j s_j^2 A_j' K A_j) (A'A)^-1

  with each s_j^2 unbiased from the joints' residual sums of squares (`noise_variances`: the expectation of
  each joint's sum is linear in the s_k^2 through the hat matrix).
- **Newey-West HAC** (`sandwich`), which assumes nothing about the noise but needs many more samples than
  parameters:

The rows of an identification are filtered, differentiated and decimated, so their errors are correlated in
time, and torque noise differs per joint and with speed. For the estimate beta = (A'A)^-1 A'y of weighted rows
A (sample t holds the n rows A_t of the joints) the covariance that holds for such errors is the sandwich

    C = (A'A)^-1  Omega  (A'A)^-1,    Omega = sum_{|l| < M} (1 - |l| / M) Gamma_l,    Gamma_l = sum_t s_t s_{t-l}'

with the score of sample t, s_t = A_t' r_t (its weighted residuals r_t, the joints' rows of one sample
together, so that their correlation at the same instant counts), the Bartlett kernel of Newey and West (1987)
and the bandwidth M chosen from the data by Andrews' (1991) AR(1) plug-in rule, M = 1.1447 (alpha T)^(1/3).
Lags never cross from one segment (a stretch of rows sampled without a gap) to another.

Omega is computed without a loop over lags: the Bartlett sum equals (1/M) B'B with B the sums of M consecutive
scores over every window that overlaps the segment (the scores padded with zeros), an exact identity
(`bartlett_direct` is the lag-by-lag definition, for tests). Its cost is that of one Gram matrix of the scores.
"""
from __future__ import annotations

import numpy as np
import scipy.ndimage
import scipy.signal

MAX_RHO = 0.97        # AR(1) coefficients of the scores are clipped here: the plug-in rule diverges at 1
ANDREWS_BARTLETT = 1.1447


def sample_scores(W: np.ndarray, y: np.ndarray, mask: np.ndarray, beta: np.ndarray,
                  weights: np.ndarray) -> np.ndarray:
    """(N, p) the score s_t = sum_j w_j^2 W_tj (y_tj - W_tj beta) of each sample over its rows in mask: the
    weighted regressor rows times their weighted residuals. W (N, n, p), y and mask (N, n), weights (n,)."""
    r = np.where(mask, y - W @ beta, 0.0) * (weights ** 2)[None, :]
    return np.einsum("tjp,tj->tp", W, r, optimize=True)


def leverage_adjusted_scores(W: np.ndarray, y: np.ndarray, mask: np.ndarray, beta: np.ndarray,
                             weights: np.ndarray, Rinv: np.ndarray, power: float = 0.5) -> np.ndarray:
    """(N, p) scores with each sample's weighted residuals e_t (its n rows) replaced by (I - H_tt)^-power e_t,
    H_tt = A_t (A'A)^-1 A_t' the sample's block of the hat matrix (power 1/2: Bell and McCaffrey's CR2, which
    undoes the shrinking of residuals by the fit of p parameters; 0: plain residuals)."""
    A = W * np.where(mask, weights[None, :], 0.0)[:, :, None]              # (N, n, p) weighted rows
    e = np.where(mask, y - W @ beta, 0.0) * weights[None, :]               # (N, n)
    if power == 0:
        return np.einsum("tjp,tj->tp", A, e, optimize=True)
    G = A @ Rinv                                                           # (N, n, p)
    H = G @ np.swapaxes(G, 1, 2)                                           # (N, n, n)
    n = H.shape[1]
    lam, V = np.linalg.eigh(np.eye(n)[None] - H)
    lam = np.clip(lam, 1e-6, None) ** (-power)
    Vt_e = np.einsum("tkj,tk->tj", V, e)
    adj = np.einsum("tjk,tk->tj", V, lam * Vt_e)
    return np.einsum("tjp,tj->tp", A, adj, optimize=True)


def segment_bounds(segments: np.ndarray | None, N: int) -> list[tuple[int, int]]:
    """[(start, stop)] of the runs of equal labels in segments (N,), or one segment of N rows when None."""
    if segments is None:
        return [(0, N)]
    segments = np.asarray(segments)
    if segments.shape != (N,):
        raise ValueError(f"segments: expected shape ({N},), got {segments.shape}")
    cut = np.flatnonzero(segments[1:] != segments[:-1]) + 1
    edges = np.concatenate([[0], cut, [N]])
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def andrews_bandwidth(S: np.ndarray, bounds: list[tuple[int, int]]) -> int:
    """Bartlett bandwidth M (>= 1; M = 1 is no lag) by Andrews' (1991) AR(1) plug-in rule on the scores S (N, p):
    each column's AR(1) coefficient rho_a and innovation variance v_a (pooled over the segments, the columns
    standardised so that every parameter counts alike),

        alpha = sum_a 4 rho_a^2 v_a^2 / ((1 - rho_a)^6 (1 + rho_a)^2) / sum_a v_a^2 / (1 - rho_a)^4,
        M = round(1.1447 (alpha T)^(1/3))."""
    T = sum(b - a for a, b in bounds)
    if T < 3:
        return 1
    scale = np.sqrt(np.mean(S * S, axis=0))
    keep = scale > 0
    if not keep.any():
        return 1
    Z = S[:, keep] / scale[keep]
    num = np.zeros(Z.shape[1])
    den = np.zeros(Z.shape[1])
    for a, b in bounds:
        if b - a >= 2:
            num += np.sum(Z[a + 1:b] * Z[a:b - 1], axis=0)
            den += np.sum(Z[a:b - 1] ** 2, axis=0)
    rho = np.clip(np.divide(num, den, out=np.zeros_like(num), where=den > 0), -MAX_RHO, MAX_RHO)
    v = np.zeros(Z.shape[1])
    for a, b in bounds:
        if b - a >= 2:
            e = Z[a + 1:b] - rho * Z[a:b - 1]
            v += np.sum(e * e, axis=0)
    v /= max(T - len(bounds), 1)
    top = np.sum(4 * rho ** 2 * v ** 2 / ((1 - rho) ** 6 * (1 + rho) ** 2))
    bottom = np.sum(v ** 2 / (1 - rho) ** 4)
    if not bottom > 0:
        return 1
    M = ANDREWS_BARTLETT * (top / bottom * T) ** (1.0 / 3.0)
    longest = max(b - a for a, b in bounds)
    return int(min(max(round(M), 1), longest))


def bartlett_sum(S: np.ndarray, bounds: list[tuple[int, int]], M: int) -> np.ndarray:
    """Omega (p, p) = sum_{|l| < M} (1 - |l|/M) Gamma_l, each segment's lags apart, as (1/M) B'B with B the
    zero-padded moving sums of M scores."""
    p = S.shape[1]
    out = np.zeros((p, p))
    for a, b in bounds:
        seg = S[a:b]
        if M == 1:
            out += seg.T @ seg
            continue
        c = np.zeros((b - a + M, p))
        np.cumsum(seg, axis=0, out=c[1:b - a + 1])
        c[b - a + 1:] = c[b - a]
        # window ending at row k (k = 0 .. len+M-2) sums rows k-M+1 .. k: c[k+1] - c[max(k+1-M, 0)]
        k = np.arange(b - a + M - 1)
        B = c[k + 1] - c[np.maximum(k + 1 - M, 0)]
        out += B.T @ B / M
    return out


def bartlett_direct(S: np.ndarray, bounds: list[tuple[int, int]], M: int) -> np.ndarray:
    """The Bartlett sum by its definition, lag by lag (slow; the oracle of `bartlett_sum`)."""
    p = S.shape[1]
    out = np.zeros((p, p))
    for a, b in bounds:
        seg = S[a:b]
        out += seg.T @ seg
        for lag in range(1, min(M, b - a)):
            G = seg[lag:].T @ seg[:-lag]
            out += (1.0 - lag / M) * (G + G.T)
    return out


def sandwich(Rinv: np.ndarray, S: np.ndarray, segments: np.ndarray | None = None, *,
             bandwidth: int | None = None, dof_factor: float = 1.0) -> tuple[np.ndarray, int]:
    """The HAC covariance (p, p) and the bandwidth M used. Rinv (p, p): the inverse of the weighted regressor's
    triangular factor, (A'A)^-1 = Rinv Rinv'; S (N, p) the samples' scores in time order; segments (N,) labels
    of the stretches without gaps (None: one); bandwidth: M instead of Andrews' rule; dof_factor multiplies
    Omega (rows / (rows - p) for the parameters' own use of the residuals)."""
    bounds = segment_bounds(segments, S.shape[0])
    M = andrews_bandwidth(S, bounds) if bandwidth is None else int(bandwidth)
    if M < 1:
        raise ValueError(f"bandwidth: expected a positive number of lags, got {bandwidth}")
    bread = Rinv @ Rinv.T
    omega = bartlett_sum(S, bounds, M) * dof_factor
    C = bread @ omega @ bread
    return 0.5 * (C + C.T), M


K_TOLERANCE = 1e-6    # the row correlation K is cut where |K| stays below this


def row_noise_correlation(rate_hz: float, cutoff_hz: float | None, factor: int, order: int = 4) -> np.ndarray:
    """K (L,) with K[0] = 1: the autocorrelation, at lags of 0, 1, ... rows, of the noise that white noise at
    rate_hz becomes after the zero-phase Butterworth low-pass (order, cutoff_hz; None: none) and the
    decimation FIR of `factor` (ident.fit.preprocess.decimation_filter; 1: none), as
    ident.fit.preprocess.prepare and decimate_parallel apply them."""
    from ident.fit.preprocess import decimation_filter

    g = np.ones(1) if factor <= 1 else decimation_filter(factor)
    if cutoff_hz is not None and 0 < cutoff_hz < rate_hz / 2:
        sos = scipy.signal.butter(order, cutoff_hz, fs=rate_hz, output="sos")
        span = int(np.ceil(20 * rate_hz / cutoff_hz)) + len(g)
        impulse = np.zeros(2 * span + 1)
        impulse[span] = 1.0
        g = np.convolve(scipy.signal.sosfiltfilt(sos, impulse), g)
    full = np.correlate(g, g, mode="full")[len(g) - 1:]        # lags 0 .. len(g) - 1 samples
    K = full[::max(int(factor), 1)] / full[0]
    big = np.flatnonzero(np.abs(K) >= K_TOLERANCE)
    return K[:int(big[-1]) + 1].copy()


def joint_grams(A: np.ndarray, K: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """(n, p, p) A_j' K A_j per joint for weighted rows A (N, n, p) (left-out rows zero), each segment apart: the
    rows convolved along time with the symmetric kernel [K_L-1 .. K_1 K_0 K_1 .. K_L-1] (zeros beyond the
    segment), then one product per joint; the same as the lag-by-lag sum (`correlated_gram_direct`)."""
    N, n, p = A.shape
    kernel = np.concatenate([K[:0:-1], K])
    out = np.zeros((n, p, p))
    for a, b in bounds:
        seg = A[a:b]
        smooth = seg if len(K) == 1 and K[0] == 1.0 else scipy.ndimage.convolve1d(
            seg.reshape(b - a, n * p), kernel, axis=0, mode="constant", cval=0.0).reshape(b - a, n, p)
        out += np.matmul(seg.transpose(1, 2, 0), smooth.transpose(1, 0, 2))      # per joint, one BLAS product
    return 0.5 * (out + np.swapaxes(out, 1, 2))


def correlated_gram(A: np.ndarray, K: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """(p, p) sum_j A_j' K A_j (`joint_grams` summed over the joints)."""
    return joint_grams(A, K, bounds).sum(axis=0)


def noise_variances(bread: np.ndarray, grams: np.ndarray, plain: np.ndarray, rows: np.ndarray,
                    rss: np.ndarray) -> np.ndarray:
    """(n,) unbiased variances s_j^2 of each joint's row noise, from its residual sums of squares rss (n,) after a
    least-squares fit of p parameters shared by all joints. bread (p, p) = (A'A)^-1; grams (n, p, p) A_j' K A_j;
    plain (n, p, p) A_j' A_j; rows (n,) each joint's rows used. With e = (I - H) noise and joint k's noise of
    covariance s_k^2 K (independent between joints), E ||e_j||^2 = sum_k T_jk s_k^2,

        T_jk = [j = k] (rows_j - 2 tr(bread A_j' K A_j)) + tr(bread A_k' K A_k bread A_j' A_j),

    which is solved for s^2. The fit's parameters are shared: a joint's residuals lose only its part of the p
    degrees of freedom, not all p (Gautier's r_j - p, which leaves nothing to a joint with few rows). Where the
    solution is not positive (residuals of a few rows, by chance), each joint alone: s_j^2 = rss_j / sum_k T_jk,
    unbiased when the joints' variances are equal (with white rows sum_k T_jk = rows_j - tr(bread A_j' A_j), the
    joint's rows less its leverages)."""
    n = len(rows)
    rss = np.asarray(rss, dtype=float)
    used = np.flatnonzero(np.asarray(rows) > 0)
    own = np.einsum("ab,jba->j", bread, grams)                       # tr(bread G_j)
    spread = np.einsum("ab,kbc->kac", bread, grams) @ bread           # bread G_k bread
    T = np.einsum("kab,jba->jk", spread, plain)
    T[np.arange(n), np.arange(n)] += np.asarray(rows, dtype=float) - 2.0 * own
    s2 = np.zeros(n)
    if used.size:
        Tu = T[np.ix_(used, used)]
        try:
            s2[used] = np.linalg.solve(Tu, rss[used])
        except np.linalg.LinAlgError:
            s2[used] = -1.0
        if not np.all(s2[used] > 0):
            s2[used] = rss[used] / np.maximum(Tu.sum(axis=1), 1e-12)
    return s2


def correlated_gram_direct(A: np.ndarray, K: np.ndarray, bounds: list[tuple[int, int]]) -> np.ndarray:
    """correlated_gram by its definition, lag by lag (the oracle of the fast one)."""
    N, n, p = A.shape
    out = np.zeros((p, p))
    for a, b in bounds:
        for lag in range(min(len(K), b - a)):
            X, Y = A[a + lag:b], A[a:b - lag]
            G = np.einsum("tja,tjb->ab", X, Y)
            out += K[lag] * (G if lag == 0 else G + G.T)
    return out


def correlated_covariance(Rinv: np.ndarray, A: np.ndarray, e: np.ndarray, K: np.ndarray,
                          segments: np.ndarray | None = None) -> np.ndarray:
    """C (p, p) for weighted rows A (N, n, p) and weighted residuals e (N, n) (left-out rows zero in both)
    whose noise has the row autocorrelation K and its own variance per joint (see the module docstring)."""
    bounds = segment_bounds(segments, A.shape[0])
    bread = Rinv @ Rinv.T
    K = np.asarray(K, dtype=float)
    grams = joint_grams(A, K, bounds)
    plain = grams if len(K) == 1 else joint_grams(A, np.ones(1), bounds)
    rows = np.count_nonzero(np.any(A != 0.0, axis=2), axis=0)
    dof = int(rows.sum()) - float(np.trace(bread @ grams.sum(axis=0)))
    if not dof > 0:
        raise ValueError(f"{int(rows.sum())} rows leave no degrees of freedom for the noise with this correlation")
    s2 = noise_variances(bread, grams, plain, rows, np.sum(e * e, axis=0))
    C = bread @ np.einsum("j,jab->ab", s2, grams) @ bread
    return 0.5 * (C + C.T)
