"""Recursive least squares for online identification: a numba kernel over batches of samples, in factored
(U D U') form.

Model: y_k = Phi_k theta + v_k, with m rows per sample (one per joint), each row j weighted by w_j (Gautier's
WLS weights 1/sigma_j, so the weighted noise has unit variance). The sample's weighted rows are
h_r = w_j Phi_k[j] (rows of weight 0 left out, m' <= m of them), z_r = w_j y_k[j].

The covariance is kept as P = U D U' (Bierman's UD filter): U unit upper triangular, D > 0 diagonal. Each
row is one scalar update with unit noise variance:

    f = U' h,  v = D f,  alpha_0 = 1
    for each column j:  alpha_j = alpha_{j-1} + f_j v_j,   D_j *= alpha_{j-1} / alpha_j,
                        U[:j, j] += b[:j] (-f_j / alpha_{j-1}),   b[:j] += U_old[:j, j] v_j,   b_j = v_j
    theta += b (z - h' theta) / alpha_p          (b / alpha_p is the gain P h / (1 + h' P h))

alpha_p = 1 + h' P h >= 1 and D_j only ever shrinks by a factor in (0, 1]: D > 0 and so P positive
definite by construction, whatever the prior. The covariance form, P - K H P, loses what the data say
when they say much more than the prior: on the generic arm's excitation with Gautier's weights its P was
3e-5 off the ridge-WLS covariance at p0 = 1e4, 9 % off and indefinite at p0 = 1e8 (a prior ~1e20 times a
row's information), where its sigma % could be NaN; this form stays within 1e-10 (tested at 1e8).
Forgetting is D /= lambda (no pass over P).

One pass over the columns per sample: the m' rows are fused. Row r needs f_j only from column j as rows
< r left it, so for each column j the rows take their turn, and row r's pass over the column also
accumulates row r+1's f_j; the last row's pass accumulates ||U[:, j]||^2, so trace(P) = sum_j D_j
||U[:, j]||^2 comes out of the same pass (bounded-trace forgetting needs no extra one). U is stored as its
transpose (column j of U = row j of the stored array, contiguous, zero-padded so that every loop runs
in whole vectors; 1 / alpha is kept so that no division lies between one row and the next). Per row that
is ~1.5 p^2 multiply-adds (the block covariance form: ~2 p^2 over all of P), but in short rows and with
two stores per element (the column and the row's gain vector) where the covariance form stores each
element of P once per sample. Three columns go together where they can (one load and store of the gain
for all three), and each row skips its leading zero columns (exact no-ops): on the arm's base regressor rows the
update takes about 1.1x the covariance form's time, on dense rows about 1.3x (benchmarks/bench_online.py
prints both).

The rows of a sample are applied in turn (row 2 sees row 1's update); the final theta and P are those of
the block update with every row against the sample's prior theta (the same least-squares problem). The
errors err_out keep the block form's meaning: all rows against the sample's prior theta. The sequential
innovations e_r (row r against theta after rows < r) over their variances alpha_r are exactly the u_i^2 /
d_i of S = I + H P H' = L D L': sum_r e_r^2 / alpha_r = e' S^-1 e of the block (stats[0]).

Wind-up protection: when forgetting would push trace(P) above trace_max (the data carry no information in
some direction, so P grows without bound there), the division by lambda is skipped for that sample
(bounded-trace forgetting).

With lambda = 1 and P0 = (Phi0' W Phi0)^-1, theta0 the WLS solution of an initial block, RLS reproduces
the batch WLS solution of all the data exactly (to rounding): the tests check this identity.

`RecursiveLS` holds theta and the factors (allocated once) and exposes P = U D U' (rebuilt when read) and
sigma % per parameter: cov(theta) = P s2 row_correlation, with s2 the running mean of e' S^-1 e per row,
over the samples (row_correlation: 1 for independent rows; see ident.online.SampleWindow.noise_correlation
for rows of a filtered stream). The innovation e of a sample has covariance s2 S when the weighted noise has
variance s2 (S = I + H P H' adds the prior uncertainty of theta to the noise), so E[e' S^-1 e] = s2 m' and
the mean is a unit-variance estimate from the first sample on (the squared a-priori errors alone overstate
s2 while P is large). With lambda = 1, sum_k e_k' S_k^-1 e_k is exactly the ridge (prior-weighted)
residual sum of squares of the final estimate (tested).

The loops are compiled with numba's fastmath flags for reassociation and contraction only, not its
no-NaN/no-inf assumptions. Non-finite samples are refused before them, and so are samples whose rows are
so large that h' P h could overflow (counted, stats[3]): past those checks every alpha is finite and >= 1.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ident.errors import InputError

# reassociation (vectorised sums) and fused multiply-add, but no "no NaN / no inf" assumption
FAST = {"reassoc", "contract", "nsz"}
PAD = 8                 # the sweep's loops run to multiples of PAD elements (the padding: exact no-ops)
HUGE = 1e290            # a sample whose sum_r ||h_r||^2 trace(P) exceeds this is skipped (no overflow below)


@njit(cache=True, nogil=True, fastmath=FAST)
def _dot(x, y) -> float:
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


def padded_width(p: int) -> int:
    """Row length of the stored factor: p rounded up to a multiple of PAD (the sweep's loops run to it)."""
    return PAD * ((p + PAD - 1) // PAD)


@njit(cache=True, nogil=True, fastmath=FAST)
def _column_norm2(W, j, n) -> float:
    """||U[:, j]||^2 = 1 + sum of W[j, :n]^2 (n >= j: past j the stored row is 0)."""
    s = 1.0
    for i in range(n):
        s += W[j, i] * W[j, i]
    return s


@njit(cache=True, nogil=True, fastmath=FAST)
def ud_trace(W, D) -> float:
    """trace(U D U') = sum_j D_j ||U[:, j]||^2 from W (p, q): row j holds U[:j, j] (the strictly upper part of
    U, transposed), zeros elsewhere."""
    tr = 0.0
    for j in range(D.shape[0]):
        tr += D[j] * _column_norm2(W, j, j)
    return tr


@njit(inline="always", fastmath=FAST)
def _pivot(D, j, f, a, ia):
    """A row's scalar step at column j (f = f_j, a = alpha_{j-1}, ia = 1 / a): D_j *= a / alpha_j; returns
    v = D_j f (the old D_j), c = -f / a, alpha_j and 1 / alpha_j."""
    d = D[j]
    v = d * f
    c = -f * ia
    an = a + v * f
    ian = 1.0 / an
    D[j] = d * a * ian
    return v, c, an, ian


@njit(cache=True, nogil=True, fastmath=FAST)
def _column(W, D, H, na, j, jj, b, alpha, ialpha) -> float:
    """Column j swept by the rows H[:na] in turn (Bierman's scalar updates, see _sweep); returns D_j
    ||U[:, j]||^2 after the update. jj: j rounded up to PAD (W[j, j:] and b[:na, j:] are 0)."""
    last = na - 1
    f = H[0, j]                                  # f_j = (U' h)_j, U's diagonal 1
    for i in range(jj):
        f += W[j, i] * H[0, i]
    tr = 0.0
    for r in range(na):
        v, c, alpha[r], ialpha[r] = _pivot(D, j, f, alpha[r], ialpha[r])
        if r < last:                             # update the column, and row r+1's f_j from it
            f = H[r + 1, j]
            for i in range(jj):
                t = W[j, i]
                n = t + b[r, i] * c
                W[j, i] = n
                b[r, i] += t * v
                f += n * H[r + 1, i]
        else:                                    # the last row: ||U[:, j]||^2 for the trace
            s = 1.0
            for i in range(jj):
                t = W[j, i]
                n = t + b[r, i] * c
                W[j, i] = n
                b[r, i] += t * v
                s += n * n
            tr = D[j] * s
        b[r, j] = v
    return tr


@njit(inline="always", fastmath=FAST)
def _update2(W, b, r, j, i, c0, v0, c1, v1):
    """Element i of columns j, j + 1 and of row r's gain, by the two columns' updates in turn; returns the
    columns' new elements."""
    bi = b[r, i]
    x = W[j, i]; n0 = x + bi * c0; bi += x * v0
    x = W[j + 1, i]; n1 = x + bi * c1; bi += x * v1
    W[j, i] = n0; W[j + 1, i] = n1
    b[r, i] = bi
    return n0, n1


@njit(cache=True, nogil=True, fastmath=FAST)
def _column_pair(W, D, H, na, j, jj, b, alpha, ialpha) -> float:
    """Columns j and j + 1 swept by the rows H[:na] in turn, each row's updates of both in one pass over
    their first jj elements: the same arithmetic as _column on j then on j + 1 (row r's f_{j+1} does not
    depend on its own update of column j), with one load and one store of the row's gain b[r, i] for both
    columns. U[j, j + 1], the one element of column j + 1 below the pass (it needs b_j = v_j, which row r
    sets at column j), is held in a scalar meanwhile and 0 in W, so that the pass's element j is an exact
    no-op. Returns D_j ||U[:, j]||^2 + D_{j+1} ||U[:, j+1]||^2 after the update."""
    last = na - 1
    k = j + 1
    u = W[k, j]                                  # U[j, j+1], as rows < r left it
    W[k, j] = 0.0
    f0 = H[0, j]
    f1 = H[0, k] + u * H[0, j]
    for i in range(jj):
        f0 += W[j, i] * H[0, i]
        f1 += W[k, i] * H[0, i]
    tr = 0.0
    for r in range(na):
        v0, c0, a1, i1 = _pivot(D, j, f0, alpha[r], ialpha[r])
        v1, c1, alpha[r], ialpha[r] = _pivot(D, k, f1, a1, i1)
        bj = v0 + u * v1                         # b_j after both columns (v0 after column j)
        u = u + v0 * c1
        if r < last:
            h = H[r + 1, j]
            g0 = h
            g1 = H[r + 1, k] + u * h
            for i in range(jj):
                n0, n1 = _update2(W, b, r, j, i, c0, v0, c1, v1)
                h = H[r + 1, i]
                g0 += n0 * h
                g1 += n1 * h
            f0 = g0
            f1 = g1
        else:
            s0 = 1.0
            s1 = 1.0 + u * u
            for i in range(jj):
                n0, n1 = _update2(W, b, r, j, i, c0, v0, c1, v1)
                s0 += n0 * n0
                s1 += n1 * n1
            tr = D[j] * s0 + D[k] * s1
        b[r, j] = bj
        b[r, k] = v1
    W[k, j] = u
    return tr


@njit(inline="always", fastmath=FAST)
def _update3(W, b, r, j, i, c0, v0, c1, v1, c2, v2):
    """Element i of columns j, j + 1, j + 2 and of row r's gain, by the three columns' updates in turn;
    returns the columns' new elements."""
    bi = b[r, i]
    x = W[j, i]; n0 = x + bi * c0; bi += x * v0
    x = W[j + 1, i]; n1 = x + bi * c1; bi += x * v1
    x = W[j + 2, i]; n2 = x + bi * c2; bi += x * v2
    W[j, i] = n0; W[j + 1, i] = n1; W[j + 2, i] = n2
    b[r, i] = bi
    return n0, n1, n2


@njit(cache=True, nogil=True, fastmath=FAST)
def _column_triple(W, D, H, na, j, jj, b, alpha, ialpha) -> float:
    """Columns j, j + 1 and j + 2 swept by the rows H[:na] in turn, as _column_pair does two: one pass of each
    row over their first jj elements, one load and store of its gain for the three columns (per element
    five loads and four stores where three single passes make nine and six). Their own upper triangle
    (U[j, j+1], U[j, j+2], U[j+1, j+2]) is held in scalars meanwhile, updated as _column would, and 0 in W.
    Returns the three columns' D_j ||U[:, j]||^2 after the update."""
    last = na - 1
    u01 = W[j + 1, j]; u02 = W[j + 2, j]; u12 = W[j + 2, j + 1]
    W[j + 1, j] = 0.0; W[j + 2, j] = 0.0; W[j + 2, j + 1] = 0.0
    h0 = H[0, j]; h1 = H[0, j + 1]; h2 = H[0, j + 2]
    f0 = h0
    f1 = h1 + u01 * h0
    f2 = h2 + u02 * h0 + u12 * h1
    for i in range(jj):
        h = H[0, i]
        f0 += W[j, i] * h
        f1 += W[j + 1, i] * h
        f2 += W[j + 2, i] * h
    tr = 0.0
    for r in range(na):
        v0, c0, a, ia = _pivot(D, j, f0, alpha[r], ialpha[r])
        v1, c1, a, ia = _pivot(D, j + 1, f1, a, ia)
        v2, c2, alpha[r], ialpha[r] = _pivot(D, j + 2, f2, a, ia)
        bl0 = v0                                # the gain's elements j, j + 1 (b_j = v0 after column j)
        t = u01; u01 = t + bl0 * c1; bl0 += t * v1
        bl1 = v1
        t = u02; u02 = t + bl0 * c2; bl0 += t * v2
        t = u12; u12 = t + bl1 * c2; bl1 += t * v2
        if r < last:
            h0 = H[r + 1, j]; h1 = H[r + 1, j + 1]; h2 = H[r + 1, j + 2]
            g0 = h0
            g1 = h1 + u01 * h0
            g2 = h2 + u02 * h0 + u12 * h1
            for i in range(jj):
                n0, n1, n2 = _update3(W, b, r, j, i, c0, v0, c1, v1, c2, v2)
                h = H[r + 1, i]
                g0 += n0 * h; g1 += n1 * h; g2 += n2 * h
            f0 = g0; f1 = g1; f2 = g2
        else:
            s0 = 1.0
            s1 = 1.0 + u01 * u01
            s2 = 1.0 + u02 * u02 + u12 * u12
            for i in range(jj):
                n0, n1, n2 = _update3(W, b, r, j, i, c0, v0, c1, v1, c2, v2)
                s0 += n0 * n0; s1 += n1 * n1; s2 += n2 * n2
            tr = D[j] * s0 + D[j + 1] * s1 + D[j + 2] * s2
        b[r, j] = bl0; b[r, j + 1] = bl1; b[r, j + 2] = v2
    W[j + 1, j] = u01; W[j + 2, j] = u02; W[j + 2, j + 1] = u12
    return tr


@njit(cache=True, nogil=True, fastmath=FAST)
def _sweep(W, D, H, mu, start, b, alpha, ialpha) -> float:
    """Bierman's scalar updates of P = U D U' by the rows H[:mu] (unit noise variance), in turn, fused into
    one pass over the columns. W (p, q): row j holds U[:j, j], zeros from j on (so the loops can run to j
    rounded up to PAD: the padding is an exact no-op). start[r]: row r's first non-zero column, ascending
    in r (p for a zero row). Before it the row's f_j is 0 and its update of column j an exact no-op, so
    column j is swept by the rows that have started only, a prefix of them (a base regressor's row for
    joint k is 0 in the columns of the links before k: on the generic arm that leaves 78 % of the work of
    dense rows). The columns go three at a time (_column_triple) where no row starts at the second or third,
    else two (_column_pair), else one (_column): a single column's pass is the most expensive per element. Writes the unnormalised gains b[r] (P h_r as row r found P; b (mu, q)) and the innovation
    variances alpha[r] = 1 + h_r' P h_r; returns trace(P) after the update. No division on the path from
    one row to the next (1 / alpha is kept)."""
    p = D.shape[0]
    tr = 0.0
    for r in range(mu):
        alpha[r] = 1.0
        ialpha[r] = 1.0
        for i in range(b.shape[1]):
            b[r, i] = 0.0                            # b[r, i >= j] must be 0 when column j is swept
    na = 0                                           # the rows that have started at column j
    j = 0
    while j < p:
        jj = (j + PAD - 1) & ~(PAD - 1)
        while na < mu and start[na] <= j:
            na += 1
        nxt = start[na] if na < mu else p            # the next row's first column
        if na == 0:                                  # no row yet: column j keeps its ||U[:, j]||^2
            tr += D[j] * _column_norm2(W, j, jj)
            j += 1
        elif j + 2 < p and nxt > j + 2:
            tr += _column_triple(W, D, H, na, j, jj, b, alpha, ialpha)
            j += 3
        elif j + 1 < p and nxt > j + 1:
            tr += _column_pair(W, D, H, na, j, jj, b, alpha, ialpha)
            j += 2
        else:
            tr += _column(W, D, H, na, j, jj, b, alpha, ialpha)
            j += 1
    return tr


@njit(cache=True, nogil=True)
def rls_update(theta, W, D, Phi, y, w, lam, trace_max, err_out, stats):
    """Process N samples: Phi (N, m, p), y (N, m), w (N, m) row weights (0 leaves a row out). Updates theta (p,)
    and the factors of P = U D U' in place: W (p, padded_width(p)) holds U[:j, j] in row j and zeros
    elsewhere, D (p,) > 0. Writes the a-priori prediction errors (unweighted, units of y, against the
    sample's prior theta) into err_out (N, m); stats (4,) accumulates [sum of e' S^-1 e (weighted errors),
    rows used, skipped forgettings, samples skipped because h' P h could overflow].
    Samples with a non-finite value anywhere in Phi, y or w (or so large that an error overflows) are skipped
    whole (their errors are NaN)."""
    N, m, p = Phi.shape
    q = W.shape[1]
    H = np.zeros((m, q))             # the sample's used weighted rows, by first non-zero column, zero padded
    z = np.empty(m)
    b = np.empty((m, q))
    alpha = np.empty(m)
    ialpha = np.empty(m)
    lead = np.empty(m, dtype=np.int64)     # each row's first non-zero column
    start = np.empty(m, dtype=np.int64)    # the used rows' first non-zero columns, ascending
    inv = 1.0 / lam
    tr = ud_trace(W, D)
    for k in range(N):
        finite = True
        for j in range(m):
            first = 0                                # the row's leading zeros (a NaN is not one)
            while first < p and Phi[k, j, first] == 0.0:
                first += 1
            lead[j] = first
            # not finite when anything in the row is not (inf * 0 is NaN: no fastmath flag here or in _dot
            # lets it fold to 0), or when the error overflows
            e = y[k, j] - _dot(Phi[k, j, first:], theta[first:])
            err_out[k, j] = e
            if not math.isfinite(e * w[k, j]):
                finite = False
        if not finite:
            for j in range(m):
                err_out[k, j] = math.nan
            continue
        mu = 0
        size = 0.0
        for j in range(m):
            wj = w[k, j]
            if wj != 0.0:
                first = lead[j]
                r = mu                               # rows in order of their first non-zero column
                while r > 0 and start[r - 1] > first:
                    start[r] = start[r - 1]
                    z[r] = z[r - 1]
                    for i in range(p):
                        H[r, i] = H[r - 1, i]
                    r -= 1
                start[r] = first
                for i in range(p):
                    H[r, i] = wj * Phi[k, j, i]
                z[r] = wj * y[k, j]
                size += _dot(H[r, first:p], H[r, first:p])
                mu += 1
        if mu > 0:
            if not size * tr <= HUGE:                # h' P h <= ||h||^2 trace(P): could overflow
                stats[3] += 1.0
                for j in range(m):
                    err_out[k, j] = math.nan
                continue
            tr = _sweep(W, D, H, mu, start, b, alpha, ialpha)
            q2 = 0.0
            for r in range(mu):                      # theta += b_r e_r / alpha_r, e_r against theta so far
                s = start[r]
                e = z[r] - _dot(H[r, s:p], theta[s:p])
                c = e / alpha[r]
                q2 += e * c
                for i in range(p):
                    theta[i] += b[r, i] * c
            stats[0] += q2
            stats[1] += mu
        if inv != 1.0:                               # forgetting: P /= lambda, unless trace(P) would pass the bound
            if tr * inv <= trace_max:
                for j in range(p):
                    D[j] *= inv
                tr *= inv
            else:
                stats[2] += 1.0


def ud_factor(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Factors of a symmetric positive definite P (p, p) = U D U': returns (U, D), U unit upper triangular,
    D (p,) > 0. Raises ValueError when P is not positive definite."""
    P = np.asarray(P, dtype=float)
    try:
        R = np.linalg.cholesky(P[::-1, ::-1])       # J P J = R R' (J reverses the order): P = (J R J)(J R J)'
    except np.linalg.LinAlgError:
        raise ValueError("P0: not positive definite (its Cholesky factorisation failed)") from None
    c = np.diag(R)
    U = (R / c[None, :])[::-1, ::-1]                 # unit upper triangular
    return np.ascontiguousarray(U), (c * c)[::-1].copy()


class RecursiveLS:
    """RLS state for p parameters and m rows per sample, with P = U D U' kept factored.

    forgetting: lambda in (0, 1] per sample (1: no forgetting; 0.9999 at 1 kHz remembers ~10 s).
    weights: (m,) row weights (1/sigma_j), default ones. p0: initial covariance scale (P0 = p0 I).
    trace_max: bound on trace(P) under forgetting (default 10 * trace(P0)).
    row_correlation: how many consecutive rows carry one independent row's information (1: white noise;
    rows of a low-passed stream: ident.online.SampleWindow.noise_correlation); it scales covariance().
    """

    def __init__(self, p: int, m: int, *, forgetting: float = 1.0, weights=None, p0: float = 1e6,
                 trace_max: float | None = None, theta0=None, row_correlation: float = 1.0):
        if not (0.0 < forgetting <= 1.0):
            raise InputError(f"forgetting: expected 0 < lambda <= 1, got {forgetting!r}")
        self.p, self.m = p, m
        self.forgetting = float(forgetting)
        self.weights = np.ones(m) if weights is None else np.asarray(weights, dtype=float).copy()
        if self.weights.shape != (m,) or not np.all(np.isfinite(self.weights)) or np.any(self.weights < 0):
            raise ValueError(f"weights: expected {m} finite values >= 0")
        self.p0 = float(p0)
        if not (self.p0 > 0.0 and math.isfinite(self.p0)):
            raise ValueError(f"p0: expected a finite number > 0, got {p0!r}")
        if not row_correlation >= 1.0:
            raise ValueError(f"row_correlation: expected a number >= 1, got {row_correlation!r}")
        self.row_correlation = float(row_correlation)
        self.trace_max = float(trace_max) if trace_max is not None else 10.0 * p0 * p
        self.theta = np.zeros(p) if theta0 is None else np.asarray(theta0, dtype=float).copy()
        self._W = np.zeros((p, padded_width(p)))     # row j: U[:j, j] (U unit upper triangular), zeros elsewhere
        self.D = np.full(p, self.p0)                 # P = U diag(D) U'
        self.stats = np.zeros(4)
        self._err = np.empty((0, m))

    def reset(self, theta0=None, P0=None, *, factors=None) -> None:
        """Start again from theta0 (default 0) and P0 (symmetric positive definite, default p0 I), or from P's
        factors (U, D) (see set_factors); stats cleared. ValueError when P0 or the factors are not valid."""
        if P0 is not None and factors is not None:
            raise ValueError("reset: give P0 or its factors, not both")
        if factors is not None:
            self.set_factors(*factors)
        elif P0 is not None:
            self.P = P0
        else:
            self._W[:] = 0.0
            self.D[:] = self.p0
        self.theta[:] = 0.0 if theta0 is None else theta0
        self.stats[:] = 0.0

    @property
    def U(self) -> np.ndarray:
        """The unit upper triangular factor of P = U diag(D) U' (p, p), a copy."""
        return self._W[:, :self.p].T + np.eye(self.p)

    @property
    def P(self) -> np.ndarray:
        """The covariance factor P = U diag(D) U' (p, p; cov(theta) = P s2 row_correlation), rebuilt from the
        factors (a new, exactly symmetric array) each time it is read; assigning a symmetric positive definite
        matrix factors it."""
        U = self.U
        P = (U * self.D[None, :]) @ U.T
        return 0.5 * (P + P.T)

    @P.setter
    def P(self, P0) -> None:
        P0 = np.asarray(P0, dtype=float)
        if P0.shape != (self.p, self.p) or not np.isfinite(P0).all():
            raise ValueError(f"P0: expected a finite ({self.p}, {self.p}) matrix")
        self.set_factors(*ud_factor(0.5 * (P0 + P0.T)))

    def set_factors(self, U, D) -> None:
        """Set P = U diag(D) U' from its factors: U (p, p) unit upper triangular, D (p,) > 0."""
        U, D = np.asarray(U, dtype=float), np.asarray(D, dtype=float)
        if U.shape != (self.p, self.p) or D.shape != (self.p,):
            raise ValueError(f"factors: expected U ({self.p}, {self.p}) and D ({self.p},)")
        if not (np.isfinite(U).all() and np.all(np.diag(U) == 1.0) and not np.tril(U, -1).any()):
            raise ValueError("factors: U is not a finite unit upper triangular matrix")
        if not (np.isfinite(D).all() and np.all(D > 0.0)):
            raise ValueError("factors: D is not finite and positive")
        self._W[:, :self.p] = np.tril(U.T, -1)
        self.D[:] = D

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
        rls_update(self.theta, self._W, self.D, Phi, y, w, self.forgetting, self.trace_max, err, self.stats)
        return err

    def trace(self) -> float:
        """trace(P), from the factors."""
        return float(ud_trace(self._W, self.D))

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
