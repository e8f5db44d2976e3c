"""Gravity and friction compensation in torque servo mode (CST), from the loaded model: the kernel against the
model's own dynamics and friction, the torque limits, the config key and the command's flag, and from the user's
side a driver in lockstep with the simulator (armid/lockstep.py) whose arm is off the model by a stated
amount: a client sending zero torque holds the arm within what that model error can move it, and without the
compensation the arm falls."""
from __future__ import annotations

import itertools
import logging
import time

import numpy as np
import pytest
import zmq

from armid.lockstep import Rig
from driver.collision import Watch
from driver.compensation import KINDS, Compensation, kinds_of
from driver.config import ConfigError, load_config
from driver.servo import ServoSession
from firmware_bridge import cia402, servo_wire
from firmware_bridge.runtime.errors import InputError
from ident.model import dynamics, load_model
from sim.plant import mismatched_model

MISMATCH = 0.05                 # the simulated arm's inertial parameters and friction off the model's by 5 %
HOLD_S = 0.5
TOKEN = 7
_names = itertools.count()


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _friction(model, qd, v_eps):
    fc, fv, offset = model.drive[:, 1], model.drive[:, 2], model.drive[:, 3]
    return fc * np.tanh(qd / v_eps) + fv * qd + offset


# -- the kernel ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kinds", [(), ("gravity",), ("friction",), ("gravity", "friction")])
def test_the_kernel_is_the_models_gravity_and_friction(model, kinds):
    rng = np.random.default_rng(4)
    comp = Compensation(model, kinds, friction_smoothing=0.02)
    for _ in range(5):
        q, qd = rng.uniform(-1.5, 1.5, model.n), rng.uniform(-1.0, 1.0, model.n)
        assert comp.compute(q, qd, np.zeros(model.n), model.tau_max) == -1
        want = np.zeros(model.n)
        if "gravity" in kinds:
            want += dynamics.gravity_torques(model, q)
        if "friction" in kinds:
            want += _friction(model, qd, 0.02)
        # the same RNEA as ident's, term by term: equal to rounding
        np.testing.assert_allclose(comp.torque, want, rtol=1e-12, atol=1e-12)


def test_the_kernel_names_the_first_joint_whose_setpoint_plus_compensation_breaks_its_limit(model):
    comp = Compensation(model, ("gravity",))
    q = np.array([0.0, 0.8, -0.4, 0.0, 0.3, 0.0])
    g = dynamics.gravity_torques(model, q)
    j = int(np.argmax(np.abs(g)))
    target = np.zeros(model.n)
    target[j] = np.sign(g[j]) * (model.tau_max[j] - abs(g[j]) + 0.01)    # 10 mN m beyond, with the compensation
    assert comp.compute(q, np.zeros(model.n), target, model.tau_max) == j
    target[j] -= np.sign(g[j]) * 0.02                                      # 10 mN m within
    assert comp.compute(q, np.zeros(model.n), target, model.tau_max) == -1
    target[j] = np.nan
    assert comp.compute(q, np.zeros(model.n), target, model.tau_max) == j


def test_compensation_requests_are_checked_naming_where(model):
    assert kinds_of(["friction", "gravity"], "x") == KINDS
    assert kinds_of("gravity", "x") == ("gravity",)
    for bad in (["gravity", "inertia"], 3, [None]):
        with pytest.raises(InputError, match="servo: compensate: expected a list of 'gravity', 'friction'"):
            kinds_of(bad, "servo: compensate")


def test_the_config_takes_model_compensate_and_refuses_anything_else(tmp_path):
    base = '[driver]\nmodel = "generic6"\n[transport]\nname = "sim"\n'
    path = tmp_path / "c.toml"
    path.write_text(base + '[model]\ncompensate = ["friction", "gravity"]\n')
    assert load_config(path).watch.compensate == ("gravity", "friction")
    path.write_text(base)
    assert load_config(path).watch.compensate == ()
    path.write_text(base + '[model]\ncompensate = ["gravity", "coriolis"]\n')
    with pytest.raises(ConfigError, match="model.compensate"):
        load_config(path)


# -- holding the arm --------------------------------------------------------------------------------------------
class Client:
    """A torque-servo session on the rig's cycle, fed by a real PUSH/PULL pair: one setpoint per cycle."""

    def __init__(self, rig: Rig, compensate):
        ctx = zmq.Context.instance()
        self.pull, self.push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        name = f"inproc://compensation-{next(_names)}"
        self.pull.bind(name)
        self.push.setsockopt(zmq.SNDTIMEO, 5000)
        self.push.connect(name)
        self.rig, self.seq = rig, 0
        self.session = ServoSession(servo_wire.MODE_TORQUE, self.pull, rig.driver._servo_limits(), 1.0 / rig.cycle.rate_hz,
                                    rig.cycle.hold.copy(), timeout_cycles=1000, buffer_cycles=0, token=TOKEN,
                                    compensate=compensate)
        rig.cycle.submit(lambda: rig.cycle.start_servo(self.session))

    def send(self, torque: np.ndarray) -> None:
        self.seq += 1
        self.push.send(servo_wire.encode(servo_wire.MODE_TORQUE, TOKEN, self.seq, time.time_ns(), torque))
        assert self.pull.poll(5000)                  # delivered before the cycle reads it

    def close(self) -> None:
        self.push.close(0)
        self.pull.close(0)


def _hold(model, compensate) -> tuple[np.ndarray, np.ndarray, Rig]:
    """The pose the arm was enabled at and the largest excursion from it per joint over HOLD_S of a torque-servo
    client sending zero torque with `compensate`."""
    rig = Rig(model, Watch(compensate=compensate), mismatch=MISMATCH)
    rig.enable()
    client = Client(rig, compensate)
    q0 = rig.state()["q"].copy()
    worst = np.zeros(model.n)
    try:
        for _ in range(int(HOLD_S * rig.cycle.rate_hz)):
            client.send(np.zeros(model.n))
            rig.step()
            worst = np.maximum(worst, np.abs(rig.state()["q"] - q0))
    finally:
        client.close()
    return q0, worst, rig


def _drift_bound(model, q0, counts_per_rad) -> np.ndarray:
    """How far the model's error can move the arm over HOLD_S from rest (rad per joint): the gravity torque the
    compensation misses, |g_true - g_model| at q0, as a constant torque through |M^-1| (the true arm's):
    (1/2) |M^-1| |dg| T^2, plus two counts of encoder resolution. The friction the compensation leaves is left
    out: near rest the simulated arm's Coulomb friction with its Stribeck excess (fc (1 + 0.25), FrictionConfig,
    on the same tanh width as the compensation's) exceeds the model's Coulomb term (fc off by MISMATCH) until
    the joint passes 0.06 rad/s, so what is left of friction resists the motion and only shortens the drift."""
    true = mismatched_model(model, MISMATCH, 1 + 7919)          # the rig's simulator: seed 1 (sim.simulator)
    missed = np.abs(dynamics.gravity_torques(true, q0) - dynamics.gravity_torques(model, q0))
    m_inv = np.abs(np.linalg.inv(dynamics.mass_matrix(true, q0)))
    return 0.5 * (m_inv @ missed) * HOLD_S ** 2 + 2.0 / counts_per_rad


def test_a_torque_client_sending_zero_holds_the_arm_within_what_the_model_error_can_move_it(model):
    q0, worst, rig = _hold(model, ("gravity", "friction"))
    bound = _drift_bound(model, q0, np.abs(rig.sim.plant.counts_per_rad))
    assert rig.cycle.servo is not None and rig.cycle.fault is None
    assert np.all(worst <= bound), (worst, bound)
    # the offset the drives got is the model's compensation, the target torque the client's zero
    assert rig.cycle.command.mode[0] == int(cia402.Mode.CST)
    assert not rig.cycle.command.target_torque.any()
    np.testing.assert_array_equal(rig.cycle.command.torque_offset, rig.cycle.compensation.torque)


def test_without_compensation_the_same_client_lets_the_arm_fall_beyond_that_bound(model):
    q0, worst, rig = _hold(model, ())
    bound = _drift_bound(model, q0, np.abs(rig.sim.plant.counts_per_rad))
    g = dynamics.gravity_torques(model, q0)
    loaded = np.abs(g) > 1.0                                   # the joints gravity pulls on at this pose
    assert loaded.any() and np.all(worst[loaded] > bound[loaded]), (worst, bound)


def test_a_setpoint_that_the_compensation_would_push_beyond_a_torque_limit_ends_the_session_and_holds(model, caplog):
    rig = Rig(model, Watch(compensate=("gravity",)))
    rig.enable()
    client = Client(rig, ("gravity",))
    q = rig.state()["q"]
    g = dynamics.gravity_torques(model, q)
    j = int(np.argmax(np.abs(g)))
    over = np.zeros(model.n)
    over[j] = np.sign(g[j]) * (model.tau_max[j] - abs(g[j]) + 0.05)   # within the limit alone, beyond with gravity
    assert abs(over[j]) <= model.tau_max[j]
    limit = rig.cycle.torque_limit
    try:
        with caplog.at_level(logging.WARNING, logger="driver.cycle"):
            for _ in range(5):
                client.send(np.zeros(model.n))
                rig.step()
                assert np.all(np.abs(rig.cycle.command.target_torque + rig.cycle.command.torque_offset) <= limit)
            client.send(over)
            rig.step()
            sent = rig.cycle.command
            assert np.all(np.abs(sent.target_torque + sent.torque_offset) <= limit)
    finally:
        client.close()
    assert rig.cycle.servo is None and rig.cycle.fault is None
    assert rig.cycle.servo_ended["ended"].startswith(f"compensation refused: joint {j + 1}'s setpoint")
    assert sent.mode[j] == int(cia402.Mode.CSP)                    # held where it is, in CSP
    assert any("compensation refused" in r.getMessage() for r in caplog.records)


def test_the_servo_command_takes_compensate_for_torque_sessions_only(model):
    from driver.commands import Commands

    rig = Rig(model, Watch(compensate=("friction",)))
    commands = Commands(rig.driver)
    reply = commands.handle({"cmd": "servo", "mode": "position", "compensate": ["gravity"]})
    assert reply["ok"] is False and "only a torque session" in reply["error"]
    reply = commands.handle({"cmd": "servo", "mode": "torque", "compensate": ["gravity", "inertia"]})
    assert reply["ok"] is False and "servo: compensate: expected a list" in reply["error"]
