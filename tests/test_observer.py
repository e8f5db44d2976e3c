"""The generalized-momentum observer (driver/observer.py): its momentum terms against Pinocchio, silence on an
exact model during fast excitation without contact, and a push on the simulated arm recovered with the
first-order response each joint's gain predicts."""
from __future__ import annotations

import numpy as np
import pytest

from driver.observer import MomentumObserver
from firmware_bridge import cia402
from ident.errors import InputError
from ident.fit import excitation
from ident.model import load_model
from sim import Simulator
from sim.plant import FrictionConfig
from sim.recording import LEAD_IN, reference

from sim_helpers import enable  # noqa: E402  (tests/ is on sys.path)

RATE = 1000.0
PUSH_AT = 3000          # cycles into the excitation
EXACT_FRICTION = FrictionConfig(stribeck_ratio=0.0)   # the observer's friction curve exactly (tanh of 0.01 rad/s)


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def excite(model, cycles, observer, push=None, friction=EXACT_FRICTION, mismatch=0.0):
    """seed000's excitation at full speed in CSP on the simulator (its default sensor noise), the observer fed the
    measured q, qd and current * gear * torque constant; push: Simulator.apply_wrench arguments at PUSH_AT.
    Returns the estimates and the true external torques (cycles, n) from the excitation's start."""
    traj = excitation.preset("seed000")
    lead = int(round(LEAD_IN * RATE))
    q_ref = reference(traj, (np.arange(-lead, cycles) + 1) / RATE)
    sim = Simulator(model, friction=friction, seed=0, q0=q_ref[0], rate_hz=RATE, mismatch=mismatch)
    enable(sim, cia402.Mode.CSP)
    per_amp = model.joint_torque_per_amp()
    out, tau_m = np.zeros(model.n), np.zeros(model.n)
    est, truth = np.zeros((len(q_ref), model.n)), np.zeros((len(q_ref), model.n))
    for k, target in enumerate(q_ref):
        if push is not None and k == lead + PUSH_AT:
            sim.apply_wrench(**push)
        sim.set_commands(target_position=target)
        s = sim.step(1)
        np.multiply(s.current, per_amp, out=tau_m)
        observer.update(s.position, s.velocity, tau_m, out)
        est[k], truth[k] = out, sim.read_truth().tau_ext
    return est[lead:], truth[lead:]


def first_order(truth, gains, dt):
    """The discrete first-order response r_k = r_{k-1} + K dt (tau_k - r_{k-1}) of each joint to truth."""
    r = np.zeros_like(truth)
    for k in range(1, len(truth)):
        r[k] = r[k - 1] + gains * dt * (truth[k] - r[k - 1])
    return r


def test_momentum_and_beta_match_pinocchio(model):
    pin = pytest.importorskip("pinocchio")
    from sim_helpers import pinocchio_twin

    pm, pd = pinocchio_twin(model)
    obs = MomentumObserver(model, RATE)
    rng = np.random.default_rng(4)
    for _ in range(20):
        q, qd = rng.uniform(-2.5, 2.5, 6), rng.uniform(-3, 3, 6)
        p, beta = obs.momentum(q, qd)
        M = pin.crba(pm, pd, q)
        M = np.triu(M) + np.triu(M, 1).T + np.diag(model.drive[:, 0])      # + rotor inertia
        C = pin.computeCoriolisMatrix(pm, pd, q, qd)
        g = pin.computeGeneralizedGravity(pm, pd, q)
        np.testing.assert_allclose(p, M @ qd, rtol=0, atol=1e-12)
        # beta = g - C^T qd; M's derivative by central differences of step 1e-6 s: rounding ~1e-16 |M| / 1e-6
        np.testing.assert_allclose(beta, g - C.T @ qd, rtol=0, atol=1e-7)


def test_no_contact_on_an_exact_model_stays_within_the_noise(model):
    """Four seconds of full-speed excitation: no joint's estimate leaves 2 % of its torque limit (the sensor noise
    and the half-period lag of the averaged current; a model 20 % off leaves it)."""
    est, truth = excite(model, 4000, MomentumObserver(model, RATE))
    assert not truth.any()
    bound = 0.02 * model.tau_max
    assert np.all(np.abs(est).max(axis=0) < bound), (np.abs(est).max(axis=0), bound)
    off, _ = excite(model, 4000, MomentumObserver(model, RATE), mismatch=0.2)
    assert np.any(np.abs(off).max(axis=0) > bound)


def test_a_push_is_recovered_with_each_joints_first_order_response(model):
    gains = np.array([100.0, 100.0, 40.0, 100.0, 100.0, 100.0])
    push = {"link": 3, "force": [0.0, 0.0, -150.0], "point": [0.15, 0.05, 0.0], "duration": 0.3}
    est, truth = excite(model, PUSH_AT + 500, MomentumObserver(model, RATE, gains=gains), push=push)
    span = slice(PUSH_AT, PUSH_AT + 500)
    expected = first_order(truth, gains, 1.0 / RATE)
    peak = np.abs(truth[span]).max(axis=0)
    assert peak[1] > 20.0 and peak[2] > 5.0 and peak[3:].max() == 0.0
    err = np.abs(est[span] - expected[span]).max(axis=0)
    assert np.all(err < 0.05 * peak + 0.02 * model.tau_max), (err, peak)
    # the time constants: 63 % of the push's torque after 1/K (10 ms on joint 2, 25 ms on joint 3), not sooner
    k2, k3 = PUSH_AT + 10, PUSH_AT + 25
    assert est[k2, 1] == pytest.approx(expected[k2, 1], abs=0.05 * peak[1])
    assert est[k3, 2] == pytest.approx(expected[k3, 2], abs=0.05 * peak[2])
    assert abs(est[PUSH_AT + 10, 2]) < 0.5 * abs(truth[PUSH_AT + 10, 2])


def test_gains_and_friction_smoothing_are_checked(model):
    with pytest.raises(InputError, match="observer gains: expected one number or 6 numbers"):
        MomentumObserver(model, RATE, gains=[100.0] * 5)
    with pytest.raises(InputError, match="at most 500 1/s"):
        MomentumObserver(model, RATE, gains=800.0)
    with pytest.raises(InputError, match="friction_smoothing"):
        MomentumObserver(model, RATE, friction_smoothing=0.0)


def test_the_friction_near_rest_removes_the_bursts_at_velocity_reversals(model):
    """On an arm with a Stribeck excess (the simulator's 0.25 fc over 0.05 rad/s; the model exact otherwise), the
    observer without it passes a burst at each reversal; given the excess (as the identification finds it on the
    samples its fit leaves out), the estimate stays as near zero as on an arm without it."""
    stribeck = FrictionConfig(stribeck_ratio=0.25, stribeck_velocity=0.05)
    fc = model.drive[:, 1]
    plain, _ = excite(model, 4000, MomentumObserver(model, RATE), friction=stribeck)
    given, _ = excite(model, 4000, MomentumObserver(model, RATE, near_rest=(0.25 * fc, np.full(6, 0.05))),
                      friction=stribeck)
    exact, _ = excite(model, 4000, MomentumObserver(model, RATE))
    plain, given, exact = (np.abs(x).max(axis=0) for x in (plain, given, exact))
    # the burst: a good part of the excess on the joints that reverse in these 4 s; given the excess, what is
    # left is the sensors' noise (the exact-friction run's floor) plus a little of the excess, not the burst
    assert np.any(plain > exact + 0.1 * 0.25 * fc), (plain, exact)
    assert np.all(given < exact + 0.05 * 0.25 * fc), (given, exact)


def test_the_friction_near_rest_is_checked(model):
    with pytest.raises(InputError, match="near_rest friction: expected"):
        MomentumObserver(model, RATE, near_rest=([0.1] * 6, [0.05] * 5))
    with pytest.raises(InputError, match="excess >= 0 N m"):
        MomentumObserver(model, RATE, near_rest=([-0.1] * 6, [0.05] * 6))
    with pytest.raises(InputError, match="velocity > 0 rad/s"):
        MomentumObserver(model, RATE, near_rest=([0.1] * 6, [0.0] * 6))
