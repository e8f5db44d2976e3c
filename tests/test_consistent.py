"""The physically consistent fit: its constraints hold, it reproduces WLS when the truth is consistent,
and it enforces the bounds when the data alone would break them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ident.fit import consistent, estimate, excitation
from ident.model import dynamics, spatial
from ident.model.base_params import base_parameters
from ident.model import load_model

RATE = 50.0


@pytest.fixture(scope="module")
def arm():
    model = load_model("generic6")
    base = base_parameters(model)
    t, q, qd, qdd = excitation.preset("seed000").sample(RATE)
    W = base.regressor(dynamics.regressor(model, q, qd, qdd))
    return model, base, W, (q, qd, qdd)


def perturbed_nominal(model) -> np.ndarray:
    """A different but consistent prior: every link's 10 parameters scaled by its own factor."""
    P = model.standard_parameters().reshape(model.n, 14).copy()
    P[:, :10] *= np.array([1.3, 0.8, 1.2, 0.7, 1.4, 0.9])[:, None]
    P[:, 10:13] *= 1.5
    return P.ravel()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=16, max_size=16))
def test_link_map_inverts_the_pseudo_inertia(values):
    A = np.array(values).reshape(4, 4)
    J = A + A.T
    chi10 = consistent._link_map() @ J.ravel(order="F")
    np.testing.assert_allclose(consistent.pseudo_inertia(chi10), J, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 5), st.lists(st.floats(-0.3, 0.3), min_size=3, max_size=3),
       st.lists(st.floats(-1, 1), min_size=9, max_size=9))
def test_psd_pseudo_inertia_is_the_models_physical_consistency(mass, com, raw):
    """Oracle: ident.model.spatial.is_physically_consistent (mass, inertia at the CoM, triangle inequalities)."""
    A = np.array(raw).reshape(3, 3) * 0.1
    second_moments = A @ A.T + np.diag([1e-4, 2e-4, 3e-4])        # of a real mass distribution
    I_c = np.trace(second_moments) * np.eye(3) - second_moments
    chi10 = spatial.body_parameters(mass, com, I_c)
    assert np.linalg.eigvalsh(consistent.pseudo_inertia(chi10)).min() > 0
    assert spatial.is_physically_consistent(chi10)[0]
    # break the triangle inequality: one principal moment larger than the sum of the others
    w, V = np.linalg.eigh(I_c)
    bad = spatial.body_parameters(mass, com, (V * np.array([w[0], w[1], w[0] + w[1] + 0.01])) @ V.T)
    assert np.linalg.eigvalsh(consistent.pseudo_inertia(bad)).min() < 0
    assert not spatial.is_physically_consistent(bad)[0]


def test_consistent_fit_satisfies_its_constraints_on_noisy_data(arm):
    model, base, W, (q, qd, qdd) = arm
    rng = np.random.default_rng(0)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(0, 0.2, q.shape)
    fit = estimate.wls(W, tau)
    c = consistent.consistent_fit(model, base, fit, chi_nominal=perturbed_nominal(model))
    assert consistent.min_eigenvalues(c.chi, model.n).min() >= -1e-9
    drive = c.chi.reshape(model.n, 14)[:, 10:13]
    assert drive.min() >= 0.0
    for j in range(model.n):
        assert spatial.is_physically_consistent(c.chi.reshape(model.n, 14)[j, :10], tol=1e-9)[0]
    # the model loader accepts it: every body can exist
    model.with_parameters(c.chi)
    assert -1e-6 <= c.chi2_increase < 10            # a few sigma-units at most: the truth is consistent
    # the unidentifiable directions come from the prior: link 1's mass is invisible to the data
    assert "then optimal" in c.status
    prior = perturbed_nominal(model).reshape(model.n, 14)
    assert c.chi.reshape(model.n, 14)[0, 9] == pytest.approx(prior[0, 9], rel=1e-3)


def test_base_projection_matches_wls_when_the_truth_is_consistent(arm):
    model, base, W, (q, qd, qdd) = arm
    tau = dynamics.rnea(model, q, qd, qdd)
    fit = estimate.wls(W, tau)
    c = consistent.consistent_fit(model, base, fit, chi_nominal=perturbed_nominal(model))
    pred_wls, pred_cons = W @ fit.beta, W @ c.beta
    rel = np.sqrt(np.mean((pred_cons - pred_wls) ** 2, axis=0)) / np.sqrt(np.mean(tau ** 2, axis=0))
    assert rel.max() < 1e-6, rel
    truth = base.from_standard(model.standard_parameters())
    scale = np.abs(base.P) @ consistent.parameter_scale(model)
    assert np.all(np.abs(c.beta - truth) <= 1e-3 * scale), np.max(np.abs(c.beta - truth) / scale)


def test_unidentifiable_directions_come_from_the_nominal_model(arm):
    """With exact data and the truth as prior, the consistent fit returns the truth itself (not merely the
    same base projection)."""
    model, base, W, (q, qd, qdd) = arm
    fit = estimate.wls(W, dynamics.rnea(model, q, qd, qdd))
    c = consistent.consistent_fit(model, base, fit)
    chi = model.standard_parameters()
    assert np.all(np.abs(c.chi - chi) <= 1e-3 * consistent.parameter_scale(model))


def test_bounds_hold_where_the_data_say_otherwise(arm):
    """Data from an arm with negative viscous friction on joint 1 (impossible): WLS finds it, the
    consistent fit clamps it at zero and pays for it in chi^2."""
    model, base, W, (q, qd, qdd) = arm
    chi = model.standard_parameters()
    chi[12] = -0.5                                    # fv1
    tau = dynamics.rnea(model, q, qd, qdd, params=chi) + np.random.default_rng(1).normal(0, 0.05, q.shape)
    fit = estimate.wls(W, tau)
    k = base.names.index("fv1")
    assert fit.beta[k] < -0.4
    c = consistent.consistent_fit(model, base, fit)
    assert -1e-12 <= c.chi[12] < 1e-6
    assert c.chi2_increase > 100
