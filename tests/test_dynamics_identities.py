"""Exact identities of the numba dynamics: linearity in the parameters, CRBA vs RNEA, forward vs inverse
dynamics, power balance (skew symmetry of M' - 2C), Jacobian vs finite differences of the pose."""
import numpy as np
import pytest

from chains import mdh_chain
from ident.model import dynamics as dyn
from ident.model.base_params import random_states
from ident.model import load_model

MODELS = [load_model("generic6"), load_model("puma560"), mdh_chain("stanford_RRPRRR"), mdh_chain("cartesian_PPPRRR"),
          mdh_chain("scara_RRPR")]
IDS = [m.name for m in MODELS]


@pytest.fixture(params=MODELS, ids=IDS)
def model(request):
    return request.param


def scale(x):
    return max(1.0, float(np.abs(x).max()))


def test_regressor_times_parameters_is_rnea_for_random_parameters(model):
    q, qd, qdd = random_states(model, 64, seed=3)
    Y = dyn.regressor(model, q, qd, qdd)
    assert Y.shape == (64, model.n, 14 * model.n)
    rng = np.random.default_rng(4)
    for chi in (model.standard_parameters(), rng.normal(size=14 * model.n)):
        tau = dyn.rnea(model, q, qd, qdd, chi)
        np.testing.assert_allclose(Y @ chi, tau, rtol=0, atol=1e-11 * scale(tau))


def test_regressor_drive_columns_and_structure(model):
    q, qd, qdd = random_states(model, 16, seed=5)
    qd[0, 0] = 0.0
    Y = dyn.regressor(model, q, qd, qdd)
    n = model.n
    for j in range(n):
        cols = Y[:, :, 14 * j + 10: 14 * j + 14]
        np.testing.assert_array_equal(cols[:, j, :], np.stack([qdd[:, j], np.sign(qd[:, j]), qd[:, j], np.ones(16)], 1))
        np.testing.assert_array_equal(np.delete(cols, j, axis=1), 0.0)
        # a link moves no joint after it
        np.testing.assert_array_equal(Y[:, j + 1:, 14 * j: 14 * j + 10], 0.0)
    assert Y[0, 0, 11] == 0.0  # sign(0) = 0: no Coulomb torque at rest


def test_regressor_writes_every_entry_of_out(model):
    q, qd, qdd = random_states(model, 300, seed=6)
    out = np.full((300, model.n, 14 * model.n), np.nan)
    dyn.regressor(model, q, qd, qdd, out=out)
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out, dyn.regressor(model, q, qd, qdd))


def test_mass_matrix_is_symmetric_positive_and_matches_rnea(model):
    q, qd, qdd = random_states(model, 32, seed=7)
    M = dyn.mass_matrix(model, q)
    np.testing.assert_allclose(M, np.swapaxes(M, 1, 2), atol=1e-13)
    assert (np.linalg.eigvalsh(M) > 0).all()
    tau = dyn.rnea(model, q, qd, qdd)
    bias = dyn.rnea(model, q, qd, np.zeros_like(qdd))
    np.testing.assert_allclose(np.einsum("nij,nj->ni", M, qdd) + bias, tau, atol=1e-11 * scale(tau))


def test_forward_dynamics_inverts_rnea(model):
    q, qd, qdd = random_states(model, 32, seed=8)
    for drive in (True, False):
        tau = dyn.rnea(model, q, qd, qdd, drive=drive)
        np.testing.assert_allclose(dyn.forward_dynamics(model, q, qd, tau, drive=drive), qdd, atol=1e-9)


def test_power_balance_skew_symmetry(model):
    """qd . (C(q,qd) qd) = 1/2 qd^T M'(q) qd: the Coriolis terms are consistent with M."""
    q, qd, _ = random_states(model, 16, seed=9)
    h = 1e-6
    Mdot = (dyn.mass_matrix(model, q + h * qd, drive=False) - dyn.mass_matrix(model, q - h * qd, drive=False)) / (2 * h)
    lhs = np.einsum("ni,ni->n", qd, dyn.coriolis_torques(model, q, qd))
    rhs = 0.5 * np.einsum("ni,nij,nj->n", qd, Mdot, qd)
    np.testing.assert_allclose(lhs, rhs, atol=1e-6 * scale(rhs))


def test_gravity_torques_are_a_gradient_field(model):
    """G(q) = dU/dq, so its Jacobian (the Hessian of U) is symmetric: dG/dq[qd] . v == dG/dq[v] . qd."""
    q, qd, _ = random_states(model, 8, seed=10)
    h = 1e-6
    G = dyn.gravity_torques(model, q)
    Gp, Gm = dyn.gravity_torques(model, q + h * qd), dyn.gravity_torques(model, q - h * qd)
    v = np.random.default_rng(11).normal(size=q.shape)
    Gvp, Gvm = dyn.gravity_torques(model, q + h * v), dyn.gravity_torques(model, q - h * v)
    a = np.einsum("ni,ni->n", (Gp - Gm) / (2 * h), v)
    b = np.einsum("ni,ni->n", (Gvp - Gvm) / (2 * h), qd)
    np.testing.assert_allclose(a, b, atol=1e-6 * scale(G))


def test_jacobian_matches_finite_differences_of_the_flange_pose(model):
    q, qd, _ = random_states(model, 8, seed=12)
    h = 1e-7
    pose, J = dyn.flange_kinematics(model, q)
    Tp, Tm = dyn.flange_pose(model, q + h * qd), dyn.flange_pose(model, q - h * qd)
    v = (Tp[:, :3, 3] - Tm[:, :3, 3]) / (2 * h)
    Rdot = (Tp[:, :3, :3] - Tm[:, :3, :3]) / (2 * h)
    W = np.einsum("nij,nkj->nik", Rdot, pose[:, :3, :3])  # skew(ω)
    w = np.stack([W[:, 2, 1], W[:, 0, 2], W[:, 1, 0]], axis=1)
    np.testing.assert_allclose(np.einsum("nij,nj->ni", J[:, :3], qd), v, atol=1e-7)
    np.testing.assert_allclose(np.einsum("nij,nj->ni", J[:, 3:], qd), w, atol=1e-7)


def test_generic6_flange_pose_at_zero():
    """At q = 0 the upper arm points up (theta2 = -90 deg), the forearm runs 0.25 m along +x, and the
    flange (alpha5 = alpha6 = -90 deg as printed) faces back along -x: flange at (0.25 - 0.08, 0, 0.25)."""
    m = load_model("generic6")
    T = dyn.flange_pose(m, np.zeros(6))
    from ident.model import spatial

    A = np.eye(4)
    for alpha, d, theta, r in m.dh:
        R, p = spatial.mdh_placement(alpha, d, theta, r)
        step = np.eye(4)
        step[:3, :3], step[:3, 3] = R, p
        A = A @ step
    A[:3, 3] += A[:3, :3] @ m.flange_p
    np.testing.assert_allclose(T, A, atol=1e-15)
    np.testing.assert_allclose(T[:3, 3], [0.25 - 0.08, 0.0, 0.25], atol=1e-12)
    np.testing.assert_allclose(T[:3, 2], [-1.0, 0.0, 0.0], atol=1e-12)


def test_single_sample_and_bad_input():
    m = load_model("generic6")
    q = np.full(6, 0.3)
    assert dyn.rnea(m, q, q, q).shape == (6,)
    assert dyn.regressor(m, q, q, q).shape == (6, 84)
    with pytest.raises(ValueError, match=r"q: expected shape \(N, 6\)"):
        dyn.rnea(m, np.zeros((3, 5)), np.zeros((3, 5)), np.zeros((3, 5)))
    bad = np.zeros((4, 6))
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="qd: non-finite value at sample 2, joint 4"):
        dyn.regressor(m, np.zeros((4, 6)), bad, np.zeros((4, 6)))
    with pytest.raises(ValueError, match="same shape"):
        dyn.rnea(m, np.zeros((4, 6)), np.zeros((3, 6)), np.zeros((4, 6)))
    with pytest.raises(ValueError, match="not positive definite"):
        chi = m.standard_parameters()
        chi[9::14] = -1.0
        chi[0::14] = chi[3::14] = chi[5::14] = -1.0
        dyn.forward_dynamics(m, np.zeros((1, 6)), np.zeros((1, 6)), np.zeros((1, 6)), chi)
