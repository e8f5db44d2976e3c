"""The lane-parallel (SIMD across samples) regressor kernel: every lane, the padding of a partial block,
the chunk boundaries and both store paths (streaming into a 16-byte aligned output, plain stores into an
unaligned one) give Y with Y @ chi equal to the per-sample RNEA, and nothing is written outside out."""
import numpy as np
import pytest

from chains import mdh_chain
from ident.model import dynamics as dyn
from ident.model import kernels
from ident.model.base_params import random_states
from ident.model import load_model

MODELS = [load_model("generic6"), mdh_chain("stanford_RRPRRR"), mdh_chain("scara_RRPR")]

# one partial block, exactly one block, one block plus one sample, several chunks with a partial tail
SIZES = [1, kernels.LANES - 1, kernels.LANES, kernels.LANES + 1, 2 * kernels.CHUNK + 3]


def scale(x):
    return max(1.0, float(np.abs(x).max()))


@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
@pytest.mark.parametrize("N", SIZES)
def test_every_lane_and_partial_block_matches_rnea(model, N):
    q, qd, qdd = random_states(model, N, seed=N)
    Y = dyn.regressor(model, q, qd, qdd)
    rng = np.random.default_rng(N)
    for chi in (model.standard_parameters(), rng.normal(size=14 * model.n)):
        tau = dyn.rnea(model, q, qd, qdd, chi)  # the per-sample scalar path, no lanes
        np.testing.assert_allclose(Y @ chi, tau, rtol=0, atol=1e-11 * scale(tau))


@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
def test_a_sample_does_not_depend_on_its_lane_or_block(model):
    q, qd, qdd = random_states(model, 2 * kernels.LANES + 5, seed=7)
    Y = dyn.regressor(model, q, qd, qdd)
    for s in (0, kernels.LANES - 1, kernels.LANES + 3, len(q) - 1):
        np.testing.assert_array_equal(dyn.regressor(model, q[s], qd[s], qdd[s]), Y[s])
    # the same samples shifted by 3 lanes
    np.testing.assert_array_equal(dyn.regressor(model, q[3:], qd[3:], qdd[3:]), Y[3:])


def test_unaligned_out_uses_plain_stores_and_gets_the_same_values():
    model = load_model("generic6")
    N = kernels.LANES + 7
    q, qd, qdd = random_states(model, N, seed=11)
    aligned = dyn.regressor(model, q, qd, qdd)
    assert aligned.ctypes.data % 16 == 0  # numpy's allocation: the streaming path
    size = N * model.n * 14 * model.n
    raw = np.full(size + 1, np.nan)
    start = 1 if raw.ctypes.data % 16 == 0 else 0  # offset by one double: 8 mod 16
    out = raw[start:start + size].reshape(N, model.n, 14 * model.n)
    assert out.ctypes.data % 16 == 8
    dyn.regressor(model, q, qd, qdd, out=out)
    np.testing.assert_array_equal(out, aligned)


@pytest.mark.parametrize("N", [kernels.LANES + 1, 2 * kernels.CHUNK + 3])
def test_nothing_is_written_past_the_last_sample(N):
    model = load_model("generic6")
    q, qd, qdd = random_states(model, N, seed=13)
    big = np.full((N + 2, model.n, 14 * model.n), np.nan)
    dyn.regressor(model, q, qd, qdd, out=big[:N])
    assert np.isfinite(big[:N]).all()
    assert np.isnan(big[N:]).all()


def test_vectorised_sincos_is_within_two_ulp_of_libm():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-10, 10, 20000), rng.uniform(-1e5, 1e5, 20000),
                        np.arange(-64, 65) * np.pi / 4,  # quadrant edges
                        [0.0, -0.0, 1e-300, kernels.SINCOS_RANGE * 0.999, -kernels.SINCOS_RANGE * 0.999,
                         kernels.SINCOS_RANGE, 1e6, -3e12]])  # the last three take the libm fallback
    s, c = np.empty_like(x), np.empty_like(x)
    kernels.sincos(x, s, c)
    assert np.abs(s - np.sin(x)).max() <= 2.3e-16
    assert np.abs(c - np.cos(x)).max() <= 2.3e-16


@pytest.mark.parametrize("magnitude", [1e3, 1e7])
def test_large_joint_angles_match_rnea(magnitude):
    """Angles beyond SINCOS_RANGE (1e7) take libm in both paths; 1e3 takes the polynomial."""
    model = load_model("generic6")
    q, qd, qdd = random_states(model, kernels.LANES + 3, seed=17)
    q = q + magnitude
    Y = dyn.regressor(model, q, qd, qdd)
    tau = dyn.rnea(model, q, qd, qdd)
    np.testing.assert_allclose(Y @ model.standard_parameters(), tau, rtol=0, atol=1e-11 * scale(tau))
