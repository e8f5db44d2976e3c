"""Recursive least squares: an exact identity with batch WLS, forgetting, wind-up protection, bad samples."""
import numpy as np
import pytest

from ident.rls import RecursiveLS


def _data(rng, N=400, m=6, p=12, noise=0.01):
    Phi = rng.normal(size=(N, m, p))
    theta = rng.normal(size=p)
    sigma = np.linspace(0.5, 2.0, m) * noise
    y = Phi @ theta + rng.normal(size=(N, m)) * sigma
    return Phi, y, theta, sigma


def _wls(Phi, y, w):
    A = (Phi * w[None, :, None]).reshape(-1, Phi.shape[2])
    b = (y * w[None, :]).reshape(-1)
    return np.linalg.lstsq(A, b, rcond=None)[0], np.linalg.inv(A.T @ A)


def test_rls_without_forgetting_started_from_a_batch_block_equals_batch_wls_on_all_data():
    rng = np.random.default_rng(0)
    Phi, y, _, sigma = _data(rng)
    w = 1.0 / sigma
    theta0, P0 = _wls(Phi[:40], y[:40], w)
    rls = RecursiveLS(Phi.shape[2], Phi.shape[1], weights=w)
    rls.reset(theta0, P0)
    rls.update(Phi[40:], y[40:])
    theta_all, P_all = _wls(Phi, y, w)
    np.testing.assert_allclose(rls.theta, theta_all, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rls.P, P_all, rtol=1e-8, atol=1e-14)


def test_weighted_residual_variance_is_one_when_weights_are_the_noise_sigmas():
    rng = np.random.default_rng(1)
    Phi, y, theta, sigma = _data(rng, N=3000)
    rls = RecursiveLS(Phi.shape[2], Phi.shape[1], weights=1.0 / sigma, p0=1e4)
    rls.update(Phi[:300], y[:300])
    rls.stats[:] = 0.0                       # count the errors after convergence only
    rls.update(Phi[300:], y[300:])
    assert rls.residual_variance == pytest.approx(1.0, rel=0.05)
    # and the sigma % predicts the actual error of the estimate (|z| < 4 for every parameter)
    sd = np.sqrt(np.diag(rls.covariance()))
    assert np.all(np.abs(rls.theta - theta) < 4 * sd)


def test_forgetting_tracks_a_parameter_change_that_plain_rls_averages_away():
    rng = np.random.default_rng(2)
    Phi, _, theta, _ = _data(rng, N=4000, noise=0.0)
    theta2 = theta.copy()
    theta2[3] += 1.0
    y = np.concatenate([Phi[:2000] @ theta, Phi[2000:] @ theta2])
    forget = RecursiveLS(12, 6, forgetting=0.99, p0=1e3)
    plain = RecursiveLS(12, 6, forgetting=1.0, p0=1e3)
    for r in (forget, plain):
        r.update(Phi, y)
    assert abs(forget.theta[3] - theta2[3]) < 1e-6
    assert abs(plain.theta[3] - theta2[3]) > 0.1


def test_bounded_trace_stops_covariance_wind_up_without_excitation():
    rng = np.random.default_rng(3)
    Phi = rng.normal(size=(2000, 6, 12))
    Phi[:, :, 5:] = 0.0                      # 7 directions never excited
    y = Phi @ rng.normal(size=12)
    rls = RecursiveLS(12, 6, forgetting=0.99, p0=1.0, trace_max=100.0)
    rls.update(Phi, y)
    assert np.trace(rls.P) <= 100.0
    assert rls.stats[2] > 0                  # forgetting was skipped to keep the bound
    unbounded = RecursiveLS(12, 6, forgetting=0.99, p0=1.0, trace_max=np.inf)
    unbounded.update(Phi, y)
    assert np.trace(unbounded.P) > 1e6       # what the bound prevents


def test_non_finite_samples_are_skipped_and_never_reach_the_estimate():
    rng = np.random.default_rng(4)
    Phi, y, _, sigma = _data(rng, N=200)
    ref = RecursiveLS(12, 6, weights=1 / sigma)
    ref.update(Phi[::2], y[::2])             # the good samples only
    bad_Phi, bad_y = Phi.copy(), y.copy()
    bad_y[1::4, 2] = np.nan
    bad_Phi[3::4, 1, 7] = np.inf
    rls = RecursiveLS(12, 6, weights=1 / sigma)
    err = rls.update(bad_Phi, bad_y)
    assert np.isnan(err[1::2]).all() and np.isfinite(err[::2]).all()
    np.testing.assert_allclose(rls.theta, ref.theta, rtol=1e-12)
    assert np.isfinite(rls.P).all()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="forgetting"):
        RecursiveLS(3, 2, forgetting=1.5)
    with pytest.raises(ValueError, match="weights"):
        RecursiveLS(3, 2, weights=[1.0, np.nan])
    with pytest.raises(ValueError, match=r"expected Phi \(N, 2, 3\)"):
        RecursiveLS(3, 2).update(np.zeros((4, 3, 2)), np.zeros((4, 2)))


def _sequential_rows(theta, P, Phi, y, w, lam):
    """Independent oracle: the textbook scalar RLS, one weighted row at a time (numpy), then P / lambda."""
    for k in range(Phi.shape[0]):
        for j in range(Phi.shape[1]):
            if w[k, j] == 0.0:
                continue
            r = w[k, j] * Phi[k, j]
            Pr = P @ r
            g = Pr / (1.0 + r @ Pr)
            theta += g * (w[k, j] * y[k, j] - r @ theta)
            P -= np.outer(g, Pr)
        P /= lam


def test_block_update_ends_where_the_scalar_row_updates_end_with_forgetting_and_rows_left_out():
    """One block update per sample (S = I + H P H') equals m scalar row updates in turn (the same theta
    and P), with forgetting and with rows of weight 0; its a-priori errors are all against the sample's
    prior theta."""
    rng = np.random.default_rng(5)
    Phi, y, _, sigma = _data(rng, N=300)
    use = rng.random(size=y.shape) > 0.2
    rls = RecursiveLS(12, 6, forgetting=0.995, weights=1 / sigma, p0=10.0, trace_max=np.inf)
    theta_prior = rls.theta.copy()
    err = rls.update(Phi[:1], y[:1], use=use[:1]).copy()
    np.testing.assert_allclose(err, y[:1] - Phi[:1] @ theta_prior, rtol=1e-15)
    rls.update(Phi[1:], y[1:], use=use[1:])
    theta, P = np.zeros(12), np.eye(12) * 10.0
    _sequential_rows(theta, P, Phi, y, np.where(use, 1 / sigma, 0.0), 0.995)
    np.testing.assert_allclose(rls.theta, theta, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rls.P, P, rtol=1e-8, atol=1e-14)


def test_covariance_stays_exactly_symmetric_and_positive_definite_under_forgetting():
    rng = np.random.default_rng(6)
    Phi, y, _, sigma = _data(rng, N=3000, p=58)
    rls = RecursiveLS(58, 6, forgetting=0.999, weights=1 / sigma, p0=1e4)
    rls.update(Phi, y)
    assert np.array_equal(rls.P, rls.P.T)             # bit for bit: no symmetrising pass needed
    assert np.linalg.eigvalsh(rls.P).min() > 0
    assert rls.stats[3] == 0                         # no sample skipped for an indefinite S


def test_sum_of_normalised_innovations_is_the_prior_weighted_residual_sum_of_squares():
    """With lambda = 1, sum_k e_k' S_k^-1 e_k = (theta - theta0)' P0^-1 (theta - theta0) + sum ||W (y - Phi
    theta)||^2 at the final theta: the identity that makes s2 (its mean per row) a unit-variance estimate."""
    rng = np.random.default_rng(7)
    Phi, y, _, sigma = _data(rng, N=500)
    theta0 = rng.normal(size=12)
    rls = RecursiveLS(12, 6, weights=1 / sigma, p0=3.0, theta0=theta0)
    rls.update(Phi, y)
    d = rls.theta - theta0
    rss = np.sum(((y - Phi @ rls.theta) / sigma) ** 2)
    assert rls.stats[0] == pytest.approx(d @ d / 3.0 + rss, rel=1e-8)
    assert rls.stats[1] == Phi.shape[0] * Phi.shape[1]


def test_residual_variance_is_one_from_the_first_sample_on_with_the_noise_sigmas_as_weights():
    """No start-up bias: the early a-priori errors are large, but so is S, and e' S^-1 e stays ~1 per row."""
    rng = np.random.default_rng(8)
    Phi, y, theta, sigma = _data(rng, N=3000)
    rls = RecursiveLS(12, 6, weights=1.0 / sigma, p0=1e4)        # from theta = 0: large early errors
    rls.update(Phi, y)
    assert rls.residual_variance == pytest.approx(1.0, rel=0.05)    # their plain mean square: ~70 here
