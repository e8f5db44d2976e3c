"""Load-separated dynamics (seed 003): the payload's own terms add up to the arm with the payload merged."""
import numpy as np
import pytest

from ident.model import dynamics as dyn
from ident.model import spatial
from ident.model.base_params import random_states
from ident.model.load_separated import payload_inertia_at_com, payload_terms, separated_dynamics
from ident.model import load_model

PAYLOAD = spatial.body_parameters(1.5, [0.01, -0.02, 0.06], np.array([[4e-3, 2e-4, -1e-4], [2e-4, 5e-3, 3e-4],
                                                                       [-1e-4, 3e-4, 3e-3]]))


@pytest.fixture(params=["generic6", "puma560"])
def model(request):
    return load_model(request.param)


def test_arm_plus_load_equals_rnea_with_payload_merged(model):
    q, qd, qdd = random_states(model, 40, seed=1)
    terms = separated_dynamics(model, q, qd, qdd, PAYLOAD)
    merged = dyn.rnea(dyn.merge_payload(model, PAYLOAD), q, qd, qdd)
    np.testing.assert_allclose(terms.total(), merged, atol=1e-10)
    np.testing.assert_allclose(terms.arm_torque(), dyn.rnea(model, q, qd, qdd), atol=1e-10)
    assert np.abs(terms.load_torque()).max() > 0.1  # the payload matters at these states


def test_kane_inertia_of_the_load_matches_its_regressor(model):
    """H_w from the payload's partial velocities (seed 003) against the regressor path, column by column."""
    q, _, _ = random_states(model, 10, seed=2)
    H, G = payload_terms(model, q, PAYLOAD)
    zero = np.zeros_like(q)
    for k in range(model.n):
        e = np.zeros_like(q)
        e[:, k] = 1.0
        col = dyn.load_regressor(model, q, zero, e, gravity=False) @ PAYLOAD
        np.testing.assert_allclose(H[:, :, k], col, atol=1e-12)
    np.testing.assert_allclose(G, dyn.load_regressor(model, q, zero, zero) @ PAYLOAD, atol=1e-12)
    np.testing.assert_allclose(H, np.swapaxes(H, 1, 2), atol=1e-14)
    assert (np.linalg.eigvalsh(H) > -1e-12).all()


def test_load_regressor_is_linear_in_the_payload(model):
    q, qd, qdd = random_states(model, 10, seed=3)
    Yl = dyn.load_regressor(model, q, qd, qdd)
    other = np.random.default_rng(0).normal(size=10)
    np.testing.assert_allclose(Yl @ other, dyn.rnea(dyn.merge_payload(model, other), q, qd, qdd)
                               - dyn.rnea(model, q, qd, qdd), atol=1e-10)


def test_payload_com_and_inertia_round_trip():
    m, c, I = payload_inertia_at_com(PAYLOAD)
    assert m == 1.5
    np.testing.assert_allclose(c, [0.01, -0.02, 0.06])
    np.testing.assert_allclose(I, [[4e-3, 2e-4, -1e-4], [2e-4, 5e-3, 3e-4], [-1e-4, 3e-4, 3e-3]], atol=1e-15)
