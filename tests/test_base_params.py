"""Base parameters: the numerical (QR) and closed-form (Gautier-Khalil) sets agree, are minimal and exact,
and the PUMA 560 reproduces seed 004."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chains import CHAINS, mdh_chain
from ident.model import dynamics as dyn
from ident.model import spatial
from ident.model.base_params import base_parameters, random_states
from ident.model.gautier_khalil import ClosedFormError
from ident.model import REVOLUTE, JointSpec, build_model, load_model

# Seed 004, PUMA 560: the 36 minimum inertial parameters
PUMA_NAMES = ["ZZR1",
              "XXR2", "XY2", "XZR2", "YZ2", "ZZR2", "mXR2", "mY2",
              "XXR3", "XYR3", "XZ3", "YZ3", "ZZR3", "mXR3", "mYR3",
              "XXR4", "XY4", "XZ4", "YZ4", "ZZR4", "mX4", "mYR4",
              "XXR5", "XY5", "XZ5", "YZ5", "ZZR5", "mX5", "mYR5",
              "XXR6", "XY6", "XZ6", "YZ6", "ZZ6", "mX6", "mY6"]
DRIVE = ("Ia", "fc", "fv", "offset")
CLOSED_FORM_CHAINS = ["stanford_RRPRRR", "track_PRRRRRR", "cartesian_PPPRRR", "skew_RRR"]


def models():
    return [load_model("generic6"), load_model("puma560")] + [mdh_chain(c) for c in CLOSED_FORM_CHAINS]


def inertial_names(base):
    return [nm for nm in base.names if not nm.startswith(DRIVE)]


def test_puma560_names_are_exactly_seed_004():
    for method in ("qr", "closed-form"):
        base = base_parameters(load_model("puma560"), method=method)
        assert inertial_names(base) == PUMA_NAMES
        assert base.count == 36 + 22  # 24 drive parameters, Ia1 and Ia2 regrouped into ZZR1 and ZZR2


def test_puma560_regrouping_coefficients_are_the_papers():
    m = load_model("puma560")
    D3, R3, D4 = m.dh[2, 1], m.dh[2, 3], m.dh[3, 1]
    base = base_parameters(m, method="qr")
    row = dict(zip(base.names, base.P))
    names = m.parameter_names()
    coef = {nm: dict((names[k], row[nm][k]) for k in np.flatnonzero(row[nm])) for nm in ("XXR2", "ZZR1")}
    assert coef["XXR2"] == pytest.approx({"XX2": 1, "YY2": -1, **{f"m{j}": -D3**2 for j in (3, 4, 5, 6)}}, abs=1e-12)
    M4 = R3**2 + D3**2 + D4**2
    assert coef["ZZR1"] == pytest.approx({"ZZ1": 1, "Ia1": 1, "YY2": 1, "YY3": 1, "mZ3": 2 * R3, "m3": R3**2 + D3**2,
                                          "m4": M4, "m5": M4, "m6": M4}, abs=1e-12)
    assert "ZZR1 = ZZ1 + Ia1 + YY2 + YY3 + 0.3001*mZ3" in base.expressions[0]


def test_seed_004_no_effect_and_regrouped_lists():
    base = base_parameters(load_model("puma560"), method="closed-form")
    eliminated = set(base.eliminated) - {"Ia1", "Ia2"}
    assert eliminated == {"XX1", "XY1", "XZ1", "YY1", "YZ1", "mX1", "mY1", "mZ1", "m1", "mZ2", "m2",
                          "YY2", "YY3", "mZ3", "m3", "YY4", "mZ4", "m4", "YY5", "mZ5", "m5", "YY6", "mZ6", "m6"}


@pytest.mark.parametrize("model", models(), ids=lambda m: m.name)
def test_closed_form_equals_qr(model):
    qr = base_parameters(model, method="qr")
    cf = base_parameters(model, method="closed-form")
    assert qr.count == cf.count
    np.testing.assert_array_equal(qr.indices, cf.indices)
    np.testing.assert_allclose(qr.P, cf.P, atol=1e-9)
    assert qr.names == cf.names


@pytest.mark.parametrize("model", models() + [mdh_chain("scara_RRPR"), mdh_chain("cylindrical_RPPR")],
                         ids=lambda m: m.name)
def test_base_regressor_is_full_rank_and_exact(model):
    base = base_parameters(model)
    q, qd, qdd = random_states(model, 150, seed=42)  # other samples than those that chose the base
    Y = dyn.regressor(model, q, qd, qdd)
    W = Y.reshape(-1, 14 * model.n)
    Wb = base.regressor(W)
    assert np.linalg.matrix_rank(W) == base.count == np.linalg.matrix_rank(Wb)
    rng = np.random.default_rng(1)
    for chi in (model.standard_parameters(), rng.normal(size=14 * model.n)):
        tau = W @ chi
        np.testing.assert_allclose(Wb @ base.from_standard(chi), tau, atol=1e-9 * max(1, np.abs(tau).max()))


def test_ia1_regroups_with_zzr1_when_joint_1_is_vertical():
    base = base_parameters(load_model("generic6"))
    assert "Ia1" in base.eliminated
    assert base.expressions[0].startswith("ZZR1 = ZZ1 + Ia1 + ")


def test_closed_form_refuses_what_it_does_not_cover():
    for chain in ("scara_RRPR", "cylindrical_RPPR"):
        with pytest.raises(ClosedFormError, match="use method='qr'"):
            base_parameters(mdh_chain(chain), method="closed-form")
    m = load_model("generic6")
    from dataclasses import replace
    with pytest.raises(ClosedFormError, match="modified-DH"):
        base_parameters(replace(m, dh=None), method="closed-form")


# special angles exactly, or angles clearly away from them (near-special geometry is ambiguous by nature)
angles = st.sampled_from([0.0, np.pi / 2, -np.pi / 2, np.pi]) | st.floats(-3.0, 3.0).filter(
    lambda a: np.abs(np.sin(2 * a)) > 0.05)
lengths = st.sampled_from([0.0]) | st.floats(0.02, 0.5) | st.floats(-0.5, -0.02)  # zero, or clearly not


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(angles, lengths, angles, lengths), min_size=2, max_size=6),
       st.sampled_from([(0.0, 0.0, -9.81), (0.0, -9.81, 0.0), (3.0, -4.0, -8.0)]))
def test_closed_form_equals_qr_on_random_revolute_chains(rows, gravity):
    rng = np.random.default_rng(len(rows))
    specs = []
    for j, (alpha, d, theta, r) in enumerate(rows):
        R, p = spatial.mdh_placement(alpha, d, theta, r)
        A = rng.normal(size=(3, 3))
        chi = spatial.body_parameters(rng.uniform(0.5, 3), rng.normal(0, 0.1, 3), A @ A.T * 0.01 + 0.001 * np.eye(3))
        specs.append(JointSpec(f"j{j}", REVOLUTE, R, p, np.array([0.0, 0.0, 1.0]), chi,
                               drive=np.array([0.1, 1.0, 1.0, 0.1]), dh=(alpha, d, theta, r)))
    model = build_model("random", "<hypothesis>", specs, gravity, np.eye(3), np.zeros(3))
    qr = base_parameters(model, method="qr")
    cf = base_parameters(model, method="closed-form")
    assert qr.count == cf.count
    # same space: stacking both sets of combinations adds no rank
    assert np.linalg.matrix_rank(np.vstack([qr.P, cf.P]), tol=1e-8) == qr.count
