"""Identification: the per-axis SVD fit (no nominal values), Levenberg-Marquardt on the irreducible model,
uncertainty (cov = sigma^2 (J^T J)^-1 against Monte Carlo) and the errors for unusable measurements."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from ident.calibration.fit import (IdentificationError, axis_fit_model, fit_axis, identify, position_error,
                                   predicted_accuracy)
from ident.calibration.model import from_model, tool_pose
from ident.calibration.synthesis import random_configurations, synthesize
from test_calibration_arms import arm

TOOL = (0.12, 0.0, 0.0)     # a 12 cm tool offset, off the last axis


def perturbed(cm, seed=0, only=None, size=(1e-3, 2e-3)):
    """True term values: nominal plus 1 mm / 2 mrad errors on every term (or only on the mask `only`)."""
    rng = np.random.default_rng(seed)
    err = np.where(cm.is_rotation, rng.normal(0, size[1], cm.m), rng.normal(0, size[0], cm.m))
    if only is not None:
        err = np.where(only, err, 0.0)
    return cm.nominal + err


@pytest.fixture(scope="module")
def six():
    cm = from_model(arm("generic6"), TOOL)
    return cm, synthesize(cm, "position")


def test_axis_fit_recovers_a_circle_with_a_proper_rotation():
    rng = np.random.default_rng(1)
    R = Rotation.random(random_state=2).as_matrix()
    t, r = np.array([0.3, -0.2, 0.5]), 0.37
    q = np.radians([-120, -90, 0, 90, 120])
    g = r * np.column_stack([np.cos(q), np.sin(q), np.zeros(5)]) @ R.T + t
    fit = fit_axis(q, g)
    assert np.linalg.det(fit.R) == pytest.approx(1.0)
    np.testing.assert_allclose(fit.R, R, atol=1e-12)
    np.testing.assert_allclose(fit.t, t, atol=1e-12)
    assert fit.mu == pytest.approx(r, abs=1e-12) and fit.rms < 1e-12
    line = fit_axis([0.0, 0.1, 0.3], np.array([[1.0, 2, 3], [1, 2.1, 3], [1, 2.3, 3]]), prismatic=True)
    np.testing.assert_allclose(line.axis, [0, 1, 0], atol=1e-12)
    np.testing.assert_allclose(line.t, [1, 2, 3], atol=1e-12)
    noisy = fit_axis(q, g + rng.normal(0, 1e-4, g.shape))
    assert abs(noisy.axis @ R[:, 2]) > 1 - 1e-5


def test_axis_fit_model_needs_no_nominal_values_and_reproduces_the_true_arm(six):
    cm, _ = six
    true = perturbed(cm, seed=3)
    angles = np.radians([-120, -60, 0, 60, 120])
    rows = [np.zeros(cm.n)]
    for j in range(cm.n):
        for a in angles:
            if a != 0.0:
                row = np.zeros(cm.n)
                row[j] = a
                rows.append(row)
    q = np.array(rows)
    fitted, fits = axis_fit_model(q, tool_pose(cm, q, true)[:, :3, 3], cm.joint_type)
    assert all(f.rms < 1e-12 for f in fits)
    q_test = random_configurations(cm, 50, seed=4)
    err = position_error(fitted, fitted.nominal, q_test, tool_pose(cm, q_test, true)[:, :3, 3])
    assert err.max() < 1e-12


def test_identification_starting_from_the_axis_fit_alone_reaches_the_noise_level(six):
    """No nominal values: noisy per-axis circles give the chain, its own irreducible model is then fitted
    to random poses."""
    cm, _ = six
    true = perturbed(cm, seed=30)
    rng = np.random.default_rng(31)
    rows = [np.zeros(cm.n)]
    for j in range(cm.n):
        for a in np.radians([-120, 120]):
            row = np.zeros(cm.n)
            row[j] = a
            rows.append(row)
    q_axes = np.array(rows)
    sigma = 5e-5
    fitted, _ = axis_fit_model(q_axes, tool_pose(cm, q_axes, true)[:, :3, 3] + rng.normal(0, sigma, (len(q_axes), 3)),
                               cm.joint_type)
    irr = synthesize(fitted, "position")
    assert irr.count == 27
    q = random_configurations(cm, 60, seed=32)
    res = identify(irr, q, tool_pose(cm, q, true)[:, :3, 3] + rng.normal(0, sigma, (60, 3)))
    assert 2 * sigma < res.rms_before < 20 * sigma        # the axis fit alone is already close
    assert res.noise == pytest.approx(sigma, rel=0.2)
    q_test = random_configurations(cm, 100, seed=33)
    err = position_error(fitted, res.values, q_test, tool_pose(cm, q_test, true)[:, :3, 3])
    assert np.sqrt(np.mean(err ** 2)) < 2 * sigma


def test_a_bad_measurement_is_reported_as_an_outlier(six):
    cm, irr = six
    true = perturbed(cm, seed=34)
    q = random_configurations(cm, 60, seed=35)
    P = tool_pose(cm, q, true)[:, :3, 3] + np.random.default_rng(36).normal(0, 5e-5, (60, 3))
    P[17] += [0.0, 1.5e-3, 0.0]
    res = identify(irr, q, P)
    assert res.outliers.tolist() == [17]


def test_noise_free_data_flag_no_outlier_and_a_planted_one_is_still_found(six):
    """The 3-sigma test has a floor, the stated measurement noise (round-off when none is stated). On
    noise-free data the residual sigma s is round-off, so against 3 s alone a pose 1 um off, far inside
    a 0.05 mm sensor's noise, was an outlier."""
    cm, irr = six
    true = perturbed(cm, seed=5)
    q = random_configurations(cm, 60, seed=6)
    P = tool_pose(cm, q, true)[:, :3, 3]
    for noise in (None, 5e-5):
        assert identify(irr, q, P, noise=noise).outliers.size == 0, noise
    nudged = P.copy()
    nudged[23] += [0.0, 0.0, 1e-6]
    res = identify(irr, q, nudged, noise=5e-5)
    per_pose = np.sqrt(np.mean(res.residual_after ** 2, axis=1))
    assert per_pose[23] > 3 * res.noise          # what the test without a floor called an outlier
    assert res.outliers.size == 0 and res.threshold == pytest.approx(3 * 5e-5)
    bad = P.copy()
    bad[17] += [0.0, 1.5e-3, 0.0]
    assert identify(irr, q, bad, noise=5e-5).outliers.tolist() == [17]
    assert identify(irr, q, bad).outliers.tolist() == [17]
    # a stated noise above the planted error hides it, as it must: 1.5 mm is within 3 x 1 mm
    assert identify(irr, q, bad, noise=1e-3).outliers.size == 0
    with pytest.raises(IdentificationError, match="noise"):
        identify(irr, q, P, noise=-1.0)


def test_noise_free_identification_leaves_no_residual_with_a_12cm_tool(six):
    cm, irr = six
    assert irr.count == 27
    true = perturbed(cm, seed=5)              # errors on all 48 terms, deleted ones included
    q = random_configurations(cm, 60, seed=6)
    res = identify(irr, q, tool_pose(cm, q, true)[:, :3, 3])
    assert res.rms_before > 1e-3
    assert res.rms_after < 1e-9               # 1e-6 mm
    q_test = random_configurations(cm, 100, seed=7)
    assert position_error(cm, res.values, q_test, tool_pose(cm, q_test, true)[:, :3, 3]).max() < 1e-9


def test_noise_free_identification_recovers_the_true_errors(six):
    cm, irr = six
    true = perturbed(cm, seed=8, only=irr.identified)
    q = random_configurations(cm, 60, seed=9)
    res = identify(irr, q, tool_pose(cm, q, true)[:, :3, 3])
    np.testing.assert_allclose(res.errors, true - cm.nominal, atol=1e-11)


def test_full_pose_and_relative_measurements_fit_exactly():
    cm = from_model(arm("puma560"), (0.05, 0.0, 0.1))
    true = perturbed(cm, seed=10)
    q = random_configurations(cm, 40, seed=11)
    T = tool_pose(cm, q, true)
    res = identify(synthesize(cm, "pose"), q, T[:, :3, 3], T[:, :3, :3])
    assert res.irreducible.count == 30
    assert res.rms_after < 1e-9 and np.abs(res.orientation_after).max() < 1e-9
    # relative: positions seen in an unknown sensor frame S
    S = Rotation.from_rotvec([0.3, -0.2, 1.0]).as_matrix()
    s = np.array([2.0, -1.0, 0.3])
    rel = synthesize(cm, "position", relative=True)
    assert rel.count == 21
    res = identify(rel, q, T[:, :3, 3] @ S.T + s)
    assert res.rms_after < 1e-9


def test_with_noise_the_residual_matches_the_noise_and_the_predicted_accuracy_sums_to_p(six):
    cm, irr = six
    sigma = 5e-5
    true = perturbed(cm, seed=12)
    q = random_configurations(cm, 300, seed=13)
    P = tool_pose(cm, q, true)[:, :3, 3] + np.random.default_rng(14).normal(0, sigma, (300, 3))
    res = identify(irr, q, P)
    assert res.noise == pytest.approx(sigma, rel=0.08)
    dof = (900 - irr.count) / 900
    assert res.rms_after == pytest.approx(sigma * np.sqrt(3 * dof), rel=0.08)
    # exact identity: sum over the poses of trace(J cov J^T) = noise^2 * p
    assert np.sum(predicted_accuracy(res, q) ** 2) == pytest.approx(res.noise ** 2 * irr.count, rel=1e-9)


def test_monte_carlo_sigmas_agree_with_the_predicted_ones_within_15_percent(six):
    cm, irr = six
    sigma, runs = 5e-5, 300
    true = perturbed(cm, seed=15)
    q = random_configurations(cm, 60, seed=16)
    P0 = tool_pose(cm, q, true)[:, :3, 3]
    rng = np.random.default_rng(17)
    free = np.flatnonzero(irr.identified)
    est = np.empty((runs, len(free)))
    for i in range(runs):
        est[i] = identify(irr, q, P0 + rng.normal(0, sigma, P0.shape), initial=true).values[free]
    ref = identify(irr, q, P0 + rng.normal(0, sigma, P0.shape), initial=true)
    predicted = ref.sigma[free] * sigma / ref.noise
    ratio = est.std(axis=0, ddof=1) / predicted
    assert np.all(np.abs(ratio - 1.0) < 0.15), dict(zip(irr.names(), np.round(ratio, 3)))
    assert np.all(np.abs(est.mean(axis=0) - true[free]) < 4 * predicted / np.sqrt(runs))


def test_unusable_measurements_get_one_clear_error(six):
    cm, irr = six
    q = random_configurations(cm, 30, seed=18)
    P = tool_pose(cm, q)[:, :3, 3]
    with pytest.raises(IdentificationError, match="9 poses give 27 equations for 27 parameters"):
        identify(irr, q[:9], P[:9])
    bad = P.copy()
    bad[4, 1] = np.nan
    with pytest.raises(IdentificationError, match="measured positions: pose 4 is not finite"):
        identify(irr, q, bad)
    with pytest.raises(IdentificationError, match=r"measured positions: expected \(30, 3\)"):
        identify(irr, q, P[:, :2])
    with pytest.raises(IdentificationError, match="orientations"):
        identify(irr, q, P, np.tile(np.eye(3), (30, 1, 1)))
    with pytest.raises(IdentificationError, match="did not converge in 2 evaluations"):
        identify(irr, q, P * 1000.0, max_evaluations=2)          # millimetres given as metres
    # a plan that never moves the wrist: its offsets and the tool cannot be told apart
    still = q.copy()
    still[:, 3:] = 0.2
    with pytest.raises(IdentificationError, match=r"not identifiable from them: .*Rz\(q4\)"):
        identify(irr, still, tool_pose(cm, still)[:, :3, 3])


def test_axis_fit_covariance_matches_monte_carlo_and_the_seed_angles_minimise_it():
    from ident.calibration.fit import axis_fit_covariance
    from ident.calibration.planning import axis_angles

    R = Rotation.from_rotvec([0.4, -0.3, 0.9]).as_matrix()
    t, r, sigma = np.array([0.1, 0.2, 0.3]), 0.3, 1e-4
    q = axis_angles(5, -np.pi, np.pi)
    exact = r * np.column_stack([np.cos(q), np.sin(q), np.zeros(5)]) @ R.T + t
    rng = np.random.default_rng(40)
    dw, dt = [], []
    for _ in range(2000):
        fit = fit_axis(q, exact + rng.normal(0, sigma, exact.shape))
        dw.append(Rotation.from_matrix(fit.R @ R.T).as_rotvec())
        dt.append(fit.t - t)
    cov_w, cov_t = axis_fit_covariance(fit_axis(q, exact), q, sigma)
    np.testing.assert_allclose(np.cov(np.array(dw).T), cov_w, atol=0.1 * np.abs(cov_w).max())
    # the centre: sigma^2 / m in the plane of the circle (the scale fit takes nothing from it there)
    P = R[:, :2]
    np.testing.assert_allclose(P.T @ np.cov(np.array(dt).T) @ P, P.T @ cov_t @ P, rtol=0.1, atol=0.02 * sigma ** 2)
    # seed 002: angles whose unit vectors sum to zero give the smallest axis error for m measurements
    best = np.trace(cov_w)
    for _ in range(200):
        other = rng.uniform(-np.pi, np.pi, 5)
        assert np.trace(axis_fit_covariance(fit_axis(other, r * np.column_stack(
            [np.cos(other), np.sin(other), np.zeros(5)]) @ R.T + t), other, sigma)[0]) >= best * (1 - 1e-9)
    uniform = np.radians([0, 30, 60, 90, 120])
    worse = axis_fit_covariance(fit_axis(uniform, r * np.column_stack([np.cos(uniform), np.sin(uniform),
                                                                         np.zeros(5)]) @ R.T + t), uniform, sigma)[0]
    assert np.trace(worse) > 2 * best
