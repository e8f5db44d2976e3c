"""Motion planning in the driver: every plan is rest-to-rest where it must be, exact where it can be, and
checked against the limits as a whole before anything moves."""
import math

import numpy as np
import pytest

from driver import motion
from driver.motion import MotionError
from ident.model import dynamics
from ident.fit.excitation import FourierTrajectory, preset
from ident.model import load_model

RATE = 1000.0


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def test_move_is_rest_to_rest_and_reaches_the_goal_exactly(model):
    q0 = np.zeros(6)
    q1 = np.array([0.4, -0.3, 0.2, 0.5, -0.6, 0.7])
    m = motion.plan_move(model, q0, q1, RATE)
    np.testing.assert_array_equal(m.q[0], q0)
    np.testing.assert_allclose(m.q[-1], q1, rtol=0, atol=1e-15)
    for a in (m.qd, m.qdd):
        np.testing.assert_allclose(a[[0, -1]], 0.0, atol=1e-12)


def test_move_velocity_and_acceleration_are_the_derivatives_of_the_positions(model):
    m = motion.plan_move(model, np.zeros(6), np.full(6, 0.3), RATE)
    dt = 1.0 / RATE
    # central differences are exact up to dt^2/6 max|d3q| (and dt^2/6 max|d4q| for qd)
    jerk = np.abs(np.diff(m.qdd, axis=0)).max() / dt
    snap = np.abs(np.diff(m.qdd, 2, axis=0)).max() / dt ** 2
    np.testing.assert_allclose((m.q[2:] - m.q[:-2]) / (2 * dt), m.qd[1:-1], rtol=0, atol=dt ** 2 / 6 * jerk * 1.05)
    np.testing.assert_allclose((m.qd[2:] - m.qd[:-2]) / (2 * dt), m.qdd[1:-1], rtol=0, atol=dt ** 2 / 6 * snap * 1.05)


def test_move_duration_is_set_by_the_binding_limit(model):
    """The fastest move puts one joint exactly at SPEED_SCALE of its velocity or acceleration limit."""
    m = motion.plan_move(model, np.zeros(6), np.array([1.2, 0, 0, 0, 0, 0]), RATE)
    use_v = np.abs(m.qd[:, 0]).max() / model.qd_max[0]
    use_a = np.abs(m.qdd[:, 0]).max() / model.qdd_max[0]
    assert max(use_v, use_a) == pytest.approx(motion.SPEED_SCALE, rel=0.01)
    slow = motion.plan_move(model, np.zeros(6), np.array([1.2, 0, 0, 0, 0, 0]), RATE, speed=0.5)
    assert slow.duration > m.duration * 1.35


def test_feed_forward_is_the_inverse_dynamics_with_smoothed_friction_and_without_the_offset(model):
    m = motion.plan_move(model, np.zeros(6), np.full(6, -0.2), RATE)
    rigid = dynamics.rnea(motion.rigid_body_model(model), m.q, m.qd, m.qdd)
    # without friction (drives that compensate it): the rigid body with rotor inertia and gravity alone
    np.testing.assert_allclose(motion.with_feed_forward(m, model, False).tau_ff, rigid, rtol=1e-12, atol=1e-12)
    # with it: the full model's inverse dynamics (friction fc sign(qd) + fv qd + offset) less the offset, where the
    # joints move fast enough for tanh(qd / FRICTION_SMOOTHING) to be sign(qd) to rounding; continuous at rest
    full = dynamics.rnea(model, m.q, m.qd, m.qdd) - model.drive[:, 3]
    fast = np.abs(m.qd) > 20 * motion.FRICTION_SMOOTHING
    assert fast.sum() > m.samples                  # most of the move
    np.testing.assert_allclose(m.tau_ff[fast], full[fast], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(m.tau_ff[0], rigid[0], rtol=1e-12, atol=1e-12)      # at rest: no friction step
    assert np.abs(full - rigid).max() > 1e-3       # the friction is really there


def test_move_outside_the_position_limits_is_refused_naming_the_joint(model):
    goal = np.zeros(6)
    goal[2] = model.q_max[2] + 0.01
    with pytest.raises(MotionError, match=r"joint j3: goal .* outside the position limits"):
        motion.plan_move(model, np.zeros(6), goal, RATE)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_goal_is_refused(model, bad):
    goal = np.zeros(6)
    goal[4] = bad
    with pytest.raises(MotionError, match="joint j5 is not finite"):
        motion.plan_move(model, np.zeros(6), goal, RATE)


def test_move_that_breaks_a_torque_limit_at_any_speed_is_refused_with_joint_quantity_and_time(model):
    weak = load_model("generic6")
    object.__setattr__(weak, "tau_max", np.full(6, 1.0))   # gravity alone breaks it at the goal
    with pytest.raises(MotionError, match=r"move_to refused: joint j2: torque .* at t = "):
        motion.plan_move(weak, np.zeros(6), np.array([0, 0.5, 0, 0, 0, 0]), RATE)


def _at_rest_fourier(model) -> FourierTrajectory:
    """Two harmonics with sum(a_l) = 0 and sum(l b_l) = 0: at rest (qd = qdd = 0) at t = 0 and t = T."""
    a = np.tile([0.2, -0.2], (6, 1)) * np.linspace(0.5, 1.0, 6)[:, None]
    b = np.tile([0.2, -0.1], (6, 1)) * np.linspace(0.5, 1.0, 6)[:, None]
    return FourierTrajectory(0.2, np.zeros(6), a, b)


def test_fourier_trajectory_is_preceded_by_a_checked_move_to_its_start(model):
    traj = _at_rest_fourier(model)
    m = motion.plan_trajectory(model, np.full(6, 0.1), traj, RATE, periods=1)
    names = [name for name, _ in m.segments]
    assert names == ["move to start", "run_trajectory"]
    k = dict(m.segments)["run_trajectory"]
    t, q, qd, qdd = traj.sample(RATE, 1)
    np.testing.assert_allclose(m.q[k:], q, atol=1e-15)
    np.testing.assert_allclose(m.q[k - 1], q[0], atol=1e-12)     # the approach ends where it starts
    np.testing.assert_allclose(m.q[0], 0.1)


def test_trajectory_that_does_not_start_at_rest_is_refused_when_asked_not_to_blend(model):
    with pytest.raises(MotionError, match=r"does not start at rest .* \(blend_s\)"):
        motion.plan_trajectory(model, np.zeros(6), preset("seed000"), RATE, blend_s=0)


def test_a_trajectory_not_at_rest_is_blended_in_and_out_by_default_and_runs_unchanged_between(model):
    """seed000 does not start at rest: it is blended in from rest at its mean pose over BLEND_S, runs exactly
    as designed for its periods, and is blended out to rest there; the blends' velocities and accelerations
    are the derivatives of their positions (central differences, O(dt^2))."""
    traj = preset("seed000")
    m = motion.plan_trajectory(model, np.full(6, 0.05), traj, RATE, periods=0.5)
    seg = dict(m.segments)
    assert [name for name, _ in m.segments] == ["move to start", "blend in", "run_trajectory", "blend out"]
    lead = int(motion.BLEND_S * RATE)
    assert seg["run_trajectory"] - seg["blend in"] == lead and m.samples - seg["blend out"] == lead + 1
    np.testing.assert_allclose(m.q[seg["blend in"]], traj.q0, atol=1e-15)            # from rest at q0 ...
    np.testing.assert_allclose(m.q[-1], traj.q0, atol=1e-12)                         # ... back to rest there
    assert np.abs(m.qd[seg["blend in"]]).max() == 0.0 and np.abs(m.qd[-1]).max() < 1e-12
    inside = slice(seg["run_trajectory"], seg["blend out"] + 1)
    t = (np.arange(m.samples)[inside] - seg["run_trajectory"]) / RATE
    q, qd, qdd = traj.evaluate(t)
    np.testing.assert_allclose(m.q[inside], q, atol=1e-12)
    np.testing.assert_allclose(m.qd[inside], qd, atol=1e-12)
    dt = 1.0 / RATE
    blend = slice(seg["blend in"] + 1, seg["run_trajectory"] + 50)
    num_v = (m.q[2:] - m.q[:-2]) / (2 * dt)
    num_a = (m.q[2:] - 2 * m.q[1:-1] + m.q[:-2]) / dt ** 2
    np.testing.assert_allclose(m.qd[1:-1][blend], num_v[blend], atol=1e-4)
    # the difference's own error, dt^2/12 times the fourth derivative of seed000's sixth harmonic, is ~3e-3
    # rad/s^2; a blend missing its 2 w' qd term would be off by ~1
    np.testing.assert_allclose(m.qdd[1:-1][blend], num_a[blend], atol=1e-2)


def test_a_blend_too_short_for_the_limits_is_refused_naming_the_quantity(model):
    with pytest.raises(MotionError, match=r"run_trajectory refused: joint j\d: (velocity|acceleration|torque)"):
        motion.plan_trajectory(model, np.zeros(6), preset("seed000"), RATE, blend_s=0.02)
    with pytest.raises(MotionError, match="blend_s"):
        motion.plan_trajectory(model, np.zeros(6), preset("seed000"), RATE, blend_s=float("nan"))


def test_trajectory_over_a_limit_is_refused_as_a_whole(model):
    traj = _at_rest_fourier(model)
    fast = FourierTrajectory(traj.base_frequency * 6, traj.q0, traj.a * 8, traj.b * 8)
    with pytest.raises(MotionError, match=r"run_trajectory refused: joint j\d: (velocity|acceleration|torque|position)"):
        motion.plan_trajectory(model, np.zeros(6), fast, RATE)


def test_sampled_trajectory_is_splined_at_rest_and_passes_through_the_samples(model):
    t = np.linspace(0.0, 2.0, 9)
    q = 0.2 * np.sin(np.pi * t)[:, None] * np.linspace(0.2, 1.0, 6)
    m = motion.plan_samples(model, np.zeros(6), t, q, RATE)
    k = dict(m.segments)["run_trajectory"]
    body = m.q[k:]
    np.testing.assert_allclose(body[::250], q, atol=1e-12)           # samples every 0.25 s = 250 cycles
    np.testing.assert_allclose(m.qd[[k, -1]], 0.0, atol=1e-12)


def test_sampled_trajectory_with_time_going_back_is_refused(model):
    t = np.array([0.0, 0.5, 0.4, 1.0])
    with pytest.raises(MotionError, match="not strictly increasing at sample 2"):
        motion.plan_samples(model, np.zeros(6), t, np.zeros((4, 6)), RATE)


def test_a_feed_forward_outside_the_torque_limit_is_refused_even_when_the_whole_torque_is_within(model):
    """A joint whose torque offset cancels its gravity load: the model's whole torque is small, but the rigid-body
    torque the drives would get as feed-forward is over the limit; nothing goes out."""
    import dataclasses

    q0 = np.array([0.0, -0.6, 0.8, 0.0, 0.3, 0.0])
    g = dynamics.gravity_torques(model, q0)
    chi = model.standard_parameters().reshape(6, 14).copy()
    chi[1, 11:14] = [0.0, 0.0, -g[1]]                  # no friction, an offset that holds joint 2's gravity
    tau_max = model.tau_max.copy()
    tau_max[1] = 0.6 * abs(g[1])
    odd = dataclasses.replace(model.with_parameters(chi.reshape(-1)), tau_max=tau_max)
    with pytest.raises(motion.MotionError, match=r"joint 2's torque feed-forward .* outside its torque limit"):
        motion.plan_move(odd, q0, q0 + 0.002, 1000.0)
