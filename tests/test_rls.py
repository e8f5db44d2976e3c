"""Recursive least squares: an exact identity with batch WLS, forgetting, wind-up protection, bad samples."""
import numpy as np
import pytest

from ident.online.rls import RecursiveLS
from rounding import assert_equal_up_to_rounding, factorization_bound, recursion_bound, relative_difference


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
    bound = recursion_bound(P0, P_all, 6 * (len(Phi) - 40))
    assert_equal_up_to_rounding(rls.theta, theta_all, bound)
    assert_equal_up_to_rounding(rls.P, P_all, bound)
    P_fewer = _wls(Phi[:-1], y[:-1], w)[1]
    assert relative_difference(P_fewer, P_all) > 100 * bound


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


def _assert_ends_where_the_scalar_rows_end(rls, Phi, y, use, sigma, lam=0.995, p0=10.0):
    """rls's theta and P equal those of the textbook scalar row updates to rounding (tests/rounding.py), and
    that bound stays far below what one lost update moves P by (the last row that counts, left out)."""
    p = Phi.shape[2]
    w = np.where(use, 1 / sigma, 0.0)
    theta, P = np.zeros(p), np.eye(p) * p0
    _sequential_rows(theta, P, Phi, y, w, lam)
    bound = recursion_bound(np.eye(p) * p0, P, use.sum())
    assert_equal_up_to_rounding(rls.theta, theta, bound)
    assert_equal_up_to_rounding(rls.P, P, bound)
    w[-1, np.nonzero(w[-1] * np.abs(Phi[-1]).sum(axis=1))[0][-1]] = 0.0
    fewer = np.eye(p) * p0
    _sequential_rows(np.zeros(p), fewer, Phi, y, w, lam)
    assert relative_difference(fewer, P) > 100 * bound


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
    _assert_ends_where_the_scalar_rows_end(rls, Phi, y, use, sigma)


def test_rows_with_leading_zeros_in_any_order_end_where_the_scalar_row_updates_end():
    """The sweep skips each row's columns before its first non-zero one (there its update is an exact
    no-op) and takes the rows in order of that column. Rows whose leading zeros run 5, 0, 9, 3, all 12 (a
    zero row) and 1 columns, in that order, some left out, with forgetting: the same theta and P as the
    textbook scalar row updates in the given order, and a-priori errors against the prior theta."""
    rng = np.random.default_rng(15)
    Phi, y, _, sigma = _data(rng, N=300)
    for j, lead in enumerate((5, 0, 9, 3, 12, 1)):
        Phi[:, j, :lead] = 0.0
    use = rng.random(size=y.shape) > 0.2
    rls = RecursiveLS(12, 6, forgetting=0.995, weights=1 / sigma, p0=10.0, trace_max=np.inf)
    err = rls.update(Phi, y, use=use).copy()
    _assert_ends_where_the_scalar_rows_end(rls, Phi, y, use, sigma)
    np.testing.assert_array_equal(err[:, 4], y[:, 4])           # the zero row: its error is its value
    assert rls.rows == use.sum()


def test_factors_keep_their_form_under_forgetting_and_the_kernels_trace_is_the_trace_of_p():
    """P = U diag(D) U' with U unit upper triangular and D > 0 after 3000 samples with forgetting at 58
    parameters; the trace the kernel keeps for the wind-up bound (from the same pass) is trace(U D U')."""
    rng = np.random.default_rng(6)
    Phi, y, _, sigma = _data(rng, N=3000, p=58)
    rls = RecursiveLS(58, 6, forgetting=0.999, weights=1 / sigma, p0=1e4)
    rls.update(Phi, y)
    U = rls.U
    assert np.array_equal(np.diag(U), np.ones(58)) and not np.tril(U, -1).any()
    assert np.all(rls.D > 0)
    P = rls.P
    np.testing.assert_allclose(P, (U * rls.D) @ U.T, rtol=1e-12, atol=1e-14 * np.abs(P).max())
    assert np.linalg.eigvalsh(P).min() > 0
    assert rls.trace() == pytest.approx(np.trace(P), rel=1e-12)
    assert rls.stats[3] == 0


def _ridge_wls(A, b, p0):
    """Independent oracle: min ||A x - b||^2 + ||x||^2 / p0 and its covariance (A'A + I/p0)^-1, by a QR
    of the stacked system (no normal equations, no recursion)."""
    p = A.shape[1]
    Q, R = np.linalg.qr(np.vstack([A, np.eye(p) / np.sqrt(p0)]))
    x = np.linalg.solve(R, Q.T @ np.r_[b, np.zeros(p)])
    Rinv = np.linalg.inv(R)
    return x, Rinv @ Rinv.T


def test_at_a_huge_prior_with_gautiers_weights_p_stays_positive_definite_and_equals_the_ridge_wls_one():
    """p0 = 1e8 and weights 1/sigma_j (sigma 0.01..0.05 N m): the prior is ~1e12 times a row's information,
    ~1e20 in the worst directions. 4 s of an exciting motion of the generic arm at 1 kHz (58 base
    parameters): U D U' stays positive definite and ends at the ridge-WLS covariance (A'A + I/p0)^-1 and
    estimate, computed by a QR. (The covariance-form block kernel this replaced ended with a negative
    eigenvalue, -8.5e-11 where the true smallest is +1.7e-10, its diagonal 9 % off and theta 0.06 sd off.)"""
    from ident.model import dynamics
    from ident.model.base_params import base_parameters
    from ident.fit.excitation import FourierTrajectory
    from ident.model import load_model
    model = load_model("generic6")
    base = base_parameters(model)
    rng = np.random.default_rng(7)
    traj = FourierTrajectory(0.25, rng.uniform(-0.3, 0.3, 6), rng.uniform(-0.6, 0.6, (6, 4)), rng.uniform(-0.6, 0.6, (6, 4)))
    q, qd, qdd = traj.evaluate(np.arange(4000) / 1000.0)
    Y = base.regressor(dynamics.regressor(model, q, qd, qdd))
    sigma = np.linspace(0.01, 0.05, 6)
    tau = Y @ base.from_standard(model.standard_parameters()) + rng.normal(size=(4000, 6)) * sigma
    p = Y.shape[2]
    rls = RecursiveLS(p, 6, weights=1 / sigma, p0=1e8)
    for k in range(0, 4000, 100):                      # in blocks, as the service feeds it
        rls.update(Y[k:k + 100], tau[k:k + 100])
    theta, P_ref = _ridge_wls((Y / sigma[None, :, None]).reshape(-1, p), (tau / sigma).reshape(-1), 1e8)
    P = rls.P
    assert np.all(rls.D > 0)
    assert np.linalg.eigvalsh(P).min() > 0.5 * np.linalg.eigvalsh(P_ref).min()
    np.testing.assert_allclose(np.diag(P), np.diag(P_ref), rtol=1e-6)
    sd = np.sqrt(np.diag(P_ref))
    assert np.max(np.abs(rls.theta - theta) / sd) < 1e-5
    assert np.isfinite(rls.sigma_percent()).all() and rls.stats[3] == 0


def test_reset_factors_a_given_covariance_and_refuses_one_that_is_not_positive_definite():
    rng = np.random.default_rng(9)
    A = rng.normal(size=(40, 12))
    P0 = np.linalg.inv(A.T @ A)
    rls = RecursiveLS(12, 6)
    rls.reset(np.ones(12), P0)
    assert_equal_up_to_rounding(rls.P, P0, factorization_bound(12))        # factored and multiplied back
    assert np.all(rls.D > 0) and np.array_equal(rls.theta, np.ones(12))
    again = RecursiveLS(12, 6)
    again.reset(factors=(rls.U, rls.D))                # the factors themselves: the same state, bit for bit
    assert np.array_equal(again.P, rls.P)
    bad = P0.copy()
    bad[0, 0] = -1.0
    with pytest.raises(ValueError, match="not positive definite"):
        rls.reset(P0=bad)
    with pytest.raises(ValueError, match="unit upper triangular"):
        rls.set_factors(np.tril(np.ones((12, 12))), np.ones(12))
    with pytest.raises(ValueError, match="D is not finite and positive"):
        rls.set_factors(np.eye(12), np.r_[np.ones(11), 0.0])


def test_a_sample_so_large_that_its_update_could_overflow_is_skipped_and_counted():
    rng = np.random.default_rng(10)
    Phi, y, _, _ = _data(rng, N=50)
    Phi[7] *= 1e150                                  # finite, but h' P h ~ 1e300 p0
    rls = RecursiveLS(12, 6, p0=1e6)
    err = rls.update(Phi, y)
    assert rls.stats[3] == 1 and np.isnan(err[7]).all() and np.isfinite(np.delete(err, 7, axis=0)).all()
    ref = RecursiveLS(12, 6, p0=1e6)
    ref.update(np.delete(Phi, 7, axis=0), np.delete(y, 7, axis=0))
    np.testing.assert_array_equal(rls.theta, ref.theta)
    assert np.isfinite(rls.P).all()


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
