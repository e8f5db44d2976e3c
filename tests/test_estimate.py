"""OLS/WLS, uncertainty, validation and drive gains on exact synthetic data (q, qd, qdd from Fourier
trajectories, torques from ident.model.dynamics.rnea): the estimates must reproduce the truth, the noise floor
and the Monte-Carlo spread, or these tests fail."""
from __future__ import annotations

import numpy as np
import pytest

from ident.model import dynamics
from ident.fit import estimate, excitation
from ident.model.base_params import base_parameters
from ident.fit.drive_gains import gains_with_payload
from ident.fit.excitation import FourierTrajectory
from ident.model import load_model
from rounding import EPS, assert_equal_up_to_rounding, least_squares_bound
from sim.plant import payload_parameters

RATE = 50.0


@pytest.fixture(scope="module")
def arm():
    model = load_model("generic6")
    return model, base_parameters(model)


def other_trajectory() -> FourierTrajectory:
    """A second excitation (seed 000's coefficients shuffled and scaled), for validation."""
    t = excitation.preset("seed000")
    return FourierTrajectory(t.base_frequency, t.q0 + 0.2, 0.8 * np.roll(t.a, 1, axis=1), 0.8 * np.roll(t.b, 2, axis=1))


def synthetic(model, base, traj, periods=1.0, rate=RATE):
    t, q, qd, qdd = traj.sample(rate, periods)
    return base.regressor(dynamics.regressor(model, q, qd, qdd)), dynamics.rnea(model, q, qd, qdd), (q, qd, qdd)


def test_noise_free_data_recover_the_base_parameters_to_1e_6(arm):
    model, base = arm
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"))
    truth = base.from_standard(model.standard_parameters())
    for fit in (estimate.ols(W, tau), estimate.wls(W, tau)):
        assert np.all(np.abs(fit.beta - truth) <= 1e-6 * np.abs(truth) + 1e-12), fit.method
        assert fit.residual_rms.max() < 1e-9


def _joint_sigma_oracle(A, y, beta, weights):
    """Each joint's noise sigma from the residuals of the fit weighted by `weights`, by the explicit hat matrix:
    with M = I - A_w G A_w' (G = (A_w'A_w)^-1) in blocks of joints' rows, E||e_j||^2 = sum_k ||M_jk||_F^2 s_k^2
    for white rows of variance s_k^2, solved for s^2 (weighted units), back to y's units."""
    N, n, p = A.shape
    Aw = A * weights[None, :, None]
    G = np.linalg.inv(np.einsum("tja,tjb->ab", Aw, Aw))
    T = np.empty((n, n))
    for j in range(n):
        for k in range(n):
            M = (np.eye(N) if j == k else 0.0) - Aw[:, j] @ G @ Aw[:, k].T
            T[j, k] = np.sum(M * M)
    rss = (((y - A @ beta) * weights[None, :]) ** 2).sum(axis=0)
    return np.sqrt(np.linalg.solve(T, rss)) / weights


def test_triangle_factors_give_the_same_estimate_as_a_weighted_lstsq_on_all_rows(arm):
    model, base = arm
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"))
    rng = np.random.default_rng(1)
    sig = np.array([0.3, 0.2, 0.1, 0.02, 0.03, 0.01])
    y = tau + rng.normal(0, 1, tau.shape) * sig
    fit = estimate.wls(W, y)
    # independent oracle: numpy lstsq on the stacked rows, each joint's sigma by the explicit hat matrix (OLS,
    # then once more from the fit weighted by those), then weighted rows
    A, b = W.reshape(-1, base.count), y.ravel()
    beta_ols = np.linalg.lstsq(A, b, rcond=None)[0]
    s_j = _joint_sigma_oracle(W, y, beta_ols, np.ones(6))
    w = 1 / s_j
    Aw = A * np.tile(w, len(y))[:, None]
    s_j = _joint_sigma_oracle(W, y, np.linalg.lstsq(Aw, b * np.tile(w, len(y)), rcond=None)[0], w)
    w = np.tile(1 / s_j, len(y))
    Aw = A * w[:, None]
    beta_wls = np.linalg.lstsq(Aw, b * w, rcond=None)[0]
    # to rounding, from the conditioning (tests/rounding.py): the residuals' sigma moves with the OLS solution's
    # error times ||A|| ||beta|| / ||r||; the covariance, an inverse of A'A, with kappa(Aw)^2
    ols_bound = least_squares_bound(A, beta_ols, b - A @ beta_ols)
    assert_equal_up_to_rounding(fit.sigma_joint, s_j, 2 * ols_bound * np.linalg.norm(A, 2) * np.linalg.norm(beta_ols)
                                / np.linalg.norm(b - A @ beta_ols))
    assert_equal_up_to_rounding(fit.beta, beta_wls, least_squares_bound(Aw, beta_wls, b * w - Aw @ beta_wls))
    rw = (b - A @ beta_wls) * w
    cov = rw @ rw / (len(b) - base.count) * np.linalg.inv(Aw.T @ Aw)
    assert_equal_up_to_rounding(fit.covariance, cov, 2 * np.linalg.cond(Aw) ** 2 * np.sqrt(Aw.size) * EPS)
    assert fit.cond == pytest.approx(np.linalg.cond(A * w[:, None]), rel=1e-6)


def test_validation_rms_is_within_10_percent_of_the_injected_noise_floor(arm):
    model, base = arm
    sig = np.array([0.3, 0.2, 0.1, 0.02, 0.03, 0.01])   # N m per joint
    rng = np.random.default_rng(2)
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"), periods=3.0)
    fit = estimate.wls(W, tau + rng.normal(0, 1, tau.shape) * sig)
    Wv, tau_v, _ = synthetic(model, base, other_trajectory(), periods=2.0)
    rms, rel = estimate.prediction_errors(Wv, tau_v + rng.normal(0, 1, tau_v.shape) * sig, fit.beta)
    np.testing.assert_allclose(rms, sig, rtol=0.10)
    np.testing.assert_allclose(fit.sigma_joint, sig, rtol=0.10)
    assert np.all(rel < 1)


def test_wls_standard_deviations_agree_with_a_monte_carlo_spread(arm):
    model, base = arm
    sig = np.array([0.3, 0.2, 0.1, 0.02, 0.03, 0.01])
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"))
    rng = np.random.default_rng(3)
    draws, predicted = [], []
    for _ in range(50):
        fit = estimate.wls(W, tau + rng.normal(0, 1, tau.shape) * sig)
        draws.append(fit.beta)
        predicted.append(fit.std)
    ratio = np.std(draws, axis=0, ddof=1) / np.mean(predicted, axis=0)
    assert 0.9 < np.median(ratio) < 1.1
    assert np.all((ratio > 0.6) & (ratio < 1.5)), ratio


def test_heteroscedastic_noise_wls_beats_ols_in_spread(arm):
    model, base = arm
    sig = np.array([0.5, 0.5, 0.5, 0.005, 0.005, 0.005])
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"))
    rng = np.random.default_rng(4)
    noise = [rng.normal(0, 1, tau.shape) * sig for _ in range(30)]
    spread = {m: np.std([getattr(estimate, m)(W, tau + e).beta for e in noise], axis=0) for m in ("ols", "wls")}
    assert np.median(spread["wls"] / spread["ols"]) < 0.7


def test_a_trajectory_that_does_not_excite_a_parameter_is_refused_with_its_name(arm):
    model, base = arm
    t = excitation.preset("seed000")
    still = FourierTrajectory(t.base_frequency, t.q0, t.a.copy(), t.b.copy())
    still.a[0] = still.b[0] = 0.0                      # joint 1 never moves: its inertia is not excited
    W, tau, _ = synthetic(model, base, still)
    with pytest.raises(estimate.EstimationError, match="condition number .*least excited: ") as err:
        estimate.wls(W, tau, names=base.names)
    assert "1" in str(err.value).split("least excited:")[1]


def test_too_few_rows_are_refused(arm):
    model, base = arm
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"), periods=0.1, rate=8)
    with pytest.raises(estimate.EstimationError, match="rows for 58 parameters"):
        estimate.wls(W, tau)


def test_mask_leaves_rows_out(arm):
    model, base = arm
    W, tau, _ = synthetic(model, base, excitation.preset("seed000"))
    y = tau.copy()
    y[::7, 2] += 50.0                                  # outliers in the rows left out
    mask = np.ones_like(y, dtype=bool)
    mask[::7, 2] = False
    fit = estimate.wls(W, y, mask)
    truth = base.from_standard(model.standard_parameters())
    assert np.all(np.abs(fit.beta - truth) <= 1e-6 * np.abs(truth) + 1e-10)
    assert fit.rows[2] == len(y) - len(y[::7]) and fit.rows[0] == len(y)


def test_currents_with_a_known_payload_recover_the_drive_gains(arm):
    model, base = arm
    true_gains = model.joint_torque_per_amp() * np.array([1.1, 0.9, 1.05, 0.95, 1.2, 0.8])
    traj = excitation.preset("seed000")
    W, tau, _ = synthetic(model, base, traj)
    payload = payload_parameters(2.0, [0.01, -0.02, 0.06], [0.004, 0.0, 0.0, 0.005, 0.0, 0.003])
    loaded = dynamics.merge_payload(model, payload)
    t, q, qd, qdd = other_trajectory().sample(RATE)
    Wl = base.regressor(dynamics.regressor(model, q, qd, qdd))
    tau_l = dynamics.rnea(loaded, q, qd, qdd)
    Yl = dynamics.load_regressor(model, q, qd, qdd)
    g = gains_with_payload(W, tau / true_gains, None, Wl, tau_l / true_gains, Yl, None, 2.0, names=base.names)
    np.testing.assert_allclose(g.gains, true_gains, rtol=1e-6)
    truth = base.from_standard(model.standard_parameters())
    assert np.all(np.abs(g.beta - truth) <= 1e-6 * np.abs(truth) + 1e-10)
    # the payload's first moments are separable: mX, mY, mZ = m * com
    for name, value in zip(("mX", "mY", "mZ"), 2.0 * np.array([0.01, -0.02, 0.06])):
        assert g.payload[g.payload_names.index(name)] == pytest.approx(value, rel=1e-6)
    # a wrong mass scales the gains by the same factor: the mass is what fixes the scale
    g2 = gains_with_payload(W, tau / true_gains, None, Wl, tau_l / true_gains, Yl, None, 4.0)
    np.testing.assert_allclose(g2.gains, 2 * true_gains, rtol=1e-6)
