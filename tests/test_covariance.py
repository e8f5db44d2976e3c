"""The covariance of the estimates (ident.fit.hac, ident.fit.estimate): the fast Bartlett sum is the lag-by-lag
definition, the rows' noise correlation is that of the filters that made the rows, the correlated covariance is
the textbook one for white rows and matches a Monte-Carlo spread where the textbook one does not."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

from ident.errors import InputError
from ident.fit import estimate, hac
from ident.fit.preprocess import decimate_parallel


def test_the_moving_sum_bartlett_equals_the_lag_by_lag_definition_per_segment():
    rng = np.random.default_rng(0)
    S = rng.normal(size=(90, 4))
    segments = np.repeat([0, 1, 2], [40, 7, 43])
    for M in (1, 2, 5, 12):
        bounds = hac.segment_bounds(segments, 90)
        np.testing.assert_allclose(hac.bartlett_sum(S, bounds, M), hac.bartlett_direct(S, bounds, M),
                                   rtol=1e-12, atol=1e-12)
    # lags never cross a segment: the sum over three segments is the sum of the three alone
    whole = hac.bartlett_sum(S, hac.segment_bounds(segments, 90), 5)
    parts = sum(hac.bartlett_sum(S[a:b], [(0, b - a)], 5) for a, b in [(0, 40), (40, 47), (47, 90)])
    np.testing.assert_allclose(whole, parts, rtol=1e-12)


def test_the_convolved_gram_equals_the_lag_by_lag_sum_per_segment():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(60, 3, 4))
    A[10:14, 1] = 0.0                                      # left-out rows
    K = np.array([1.0, 0.4, -0.2, 0.05])
    bounds = hac.segment_bounds(np.repeat([0, 1], [35, 25]), 60)
    np.testing.assert_allclose(hac.correlated_gram(A, K, bounds), hac.correlated_gram_direct(A, K, bounds),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("factor, cutoff", [(1, 40.0), (5, 40.0), (12, 30.0)])
def test_row_noise_correlation_is_that_of_the_filter_chain_applied_to_white_noise(factor, cutoff):
    """Oracle: the chain as a matrix D (rows x samples), built by running prepare's low-pass and
    decimate_parallel on unit impulses; white noise of unit variance gives rows of covariance D D'."""
    rate, N = 1000.0, 1200
    sos = scipy.signal.butter(4, cutoff, fs=rate, output="sos")
    filtered = scipy.signal.sosfiltfilt(sos, np.eye(N), axis=0)               # column k: impulse at k
    _, D = decimate_parallel(np.zeros((N, N, 1)), filtered, factor)           # (rows, N)
    C = D @ D.T
    K = hac.row_noise_correlation(rate, cutoff, factor)
    mid = C.shape[0] // 2
    lags = min(len(K), C.shape[0] - mid)
    np.testing.assert_allclose(C[mid, mid:mid + lags] / C[mid, mid], K[:lags], atol=1e-6)


def test_with_white_rows_the_correlated_covariance_is_the_textbook_one():
    rng = np.random.default_rng(1)
    W = rng.normal(size=(300, 3, 4))
    y = W @ np.array([1.0, 2.0, -1.0, 0.5]) + rng.normal(size=(300, 3)) * [0.1, 0.2, 0.3]
    a = estimate.wls(W, y, row_correlation=np.array([1.0]))
    b = estimate.wls(W, y, covariance="textbook")
    c = estimate.wls(W, y, covariance="correlated", row_correlation=np.array([1.0, 0.0, 0.0]))
    np.testing.assert_allclose(a.covariance, b.covariance, rtol=1e-12)
    np.testing.assert_allclose(b.covariance, b.covariance_textbook)
    # K = [1, 0, 0]: white rows, each joint its own variance: (A'A)^-1 (sum_j s_j^2 A_j'A_j) (A'A)^-1, which
    # with the joints weighted to one variance is the textbook covariance to the spread of the s_j^2
    A = W * (1.0 / c.sigma_joint)[None, :, None]
    e = (y - W @ c.beta) / c.sigma_joint[None, :]
    G = np.linalg.inv(np.einsum("tja,tjb->ab", A, A))
    s2 = hac.noise_variances(G, *(2 * [np.einsum("tja,tjb->jab", A, A)]), np.full(3, 300), (e * e).sum(axis=0))
    np.testing.assert_allclose(c.covariance, G @ np.einsum("j,jab->ab", s2, np.einsum("tja,tjb->jab", A, A)) @ G,
                               rtol=1e-9)
    np.testing.assert_allclose(np.diag(c.covariance), np.diag(b.covariance), rtol=0.2)


def test_an_unknown_covariance_is_refused():
    with pytest.raises(InputError, match="covariance: expected one of correlated, hac, textbook"):
        estimate.wls(np.ones((10, 1, 1)), np.ones((10, 1)), covariance="robust")


def _filtered_rows(rng, N_raw, factor, K_sos, regressor):
    """Rows as the pipeline makes them: white noise at the raw rate, low-passed and decimated in parallel with
    a smooth regressor."""
    noise = rng.normal(size=(N_raw, 2))
    noise = scipy.signal.sosfiltfilt(K_sos, noise, axis=0)
    return decimate_parallel(regressor, noise, factor)


def test_correlated_covariance_matches_a_monte_carlo_spread_where_the_textbook_one_is_too_small():
    """Smooth regressors (two slow sines and a constant per joint), noise white at 1 kHz through a 40 Hz
    low-pass and decimation by 10: the rows' noise is correlated (its long-run variance 1.25 times its variance),
    so the textbook standard deviations are about 10 % too small. 400 draws: the mean of z^2 over 3 parameters
    has standard error below sqrt(2 * 3^2 / 3^2 / 400) = 0.071 (correlated z at most fully), so 1 +- 0.25 holds
    for a right covariance and the textbook one (expected 1.25) lies outside 1 +- 0.15."""
    rng = np.random.default_rng(2)
    rate, factor, N = 1000.0, 10, 6000
    t = np.arange(N) / rate
    base = np.stack([np.sin(2 * np.pi * 0.7 * t), np.cos(2 * np.pi * 1.3 * t), np.ones(N)], axis=1)
    X = np.stack([base, base * [1.0, -0.5, 0.3]], axis=1)                    # (N, 2, 3)
    sos = scipy.signal.butter(4, 40.0, fs=rate, output="sos")
    K = hac.row_noise_correlation(rate, 40.0, factor)
    truth = np.array([1.0, -2.0, 0.5])
    z, zt = [], []
    Wd, _ = decimate_parallel(X, np.zeros((N, 2)), factor)
    for _ in range(400):
        _, e = _filtered_rows(rng, N, factor, sos, X)
        y = Wd @ truth + 0.01 * e
        f = estimate.wls(Wd, y, row_correlation=K)
        z.append((f.beta - truth) / f.std)
        zt.append((f.beta - truth) / np.sqrt(np.diag(f.covariance_textbook)))
    z2, zt2 = float(np.mean(np.square(z))), float(np.mean(np.square(zt)))
    assert abs(z2 - 1.0) < 0.25, z2
    assert zt2 > 1.15, zt2


def test_each_joints_sigma_is_unbiased_when_its_rows_are_few_beside_the_shared_parameters():
    """3 joints of 30, 60 and 200 rows sharing 24 parameters, noise 0.1, 0.2, 0.05: over 300 draws the mean of
    sigma_j^2 is each joint's variance (standard error of the mean below 3 %), where Gautier's rss_j / (rows_j - p)
    charges each joint all 24 parameters (a 30-row joint's variance 3 times too large)."""
    rng = np.random.default_rng(4)
    rows, noise, p = [30, 60, 200], np.array([0.1, 0.2, 0.05]), 24
    W = rng.normal(size=(200, 3, p))
    mask = np.arange(200)[:, None] < np.array(rows)[None, :]
    truth = rng.normal(size=p)
    s2, gautier = [], []
    for _ in range(300):
        y = W @ truth + rng.normal(size=(200, 3)) * noise
        f = estimate.wls(W, y, mask)
        s2.append(f.sigma_joint ** 2)
        o = estimate.ols(W, y, mask)
        gautier.append(np.where(mask, y - W @ o.beta, 0.0).__pow__(2).sum(axis=0) / (np.array(rows) - p))
    np.testing.assert_allclose(np.mean(s2, axis=0), noise ** 2, rtol=0.08)
    assert np.mean(gautier, axis=0)[0] > 2.0 * noise[0] ** 2
