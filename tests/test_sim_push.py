"""The simulator pushes back: an external wrench on a link makes exactly J(q)^T [f; m] at the joints (Pinocchio's
frame Jacobian as the oracle), the plant accelerates by it, it ends after its duration, the control socket
carries it, and the mismatch option puts the mechanics off the model by the stated fraction."""
from __future__ import annotations

import json

import numpy as np
import pytest
import zmq

from ident.errors import InputError
from ident.model import dynamics, load_model
from sim import Simulator
from sim.control import ControlServer
from sim.plant import FrictionConfig, NoiseConfig, Plant, mismatched_model

pin = pytest.importorskip("pinocchio")
from sim_helpers import pinocchio_twin  # noqa: E402  (tests/ is on sys.path)


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.mark.parametrize("link", [1, 2, 3, 4, 5, 6])
def test_wrench_torques_are_the_transposed_frame_jacobian_of_pinocchio(model, link):
    pm, pd = pinocchio_twin(model)
    rng = np.random.default_rng(link)
    point = rng.uniform(-0.2, 0.2, 3)
    fid = pm.addFrame(pin.Frame("contact", link, 0, pin.SE3(np.eye(3), point), pin.FrameType.OP_FRAME))
    pd = pm.createData()
    q = rng.uniform(-2.5, 2.5, (20, model.n))
    f, m = rng.normal(0, 30, 3), rng.normal(0, 3, 3)
    tau = dynamics.wrench_torques(model, q, link, point, f, m)
    for s in range(len(q)):
        J = pin.computeFrameJacobian(pm, pd, q[s], fid, pin.LOCAL_WORLD_ALIGNED)
        np.testing.assert_allclose(tau[s], J.T @ np.r_[f, m], rtol=0, atol=1e-12 * (1 + np.abs(J.T @ np.r_[f, m]).max()))
    assert np.all(tau[:, link:] == 0.0)


def test_wrench_torques_refuse_a_link_or_vector_that_is_wrong(model):
    with pytest.raises(ValueError, match="link: expected an integer 1..6"):
        dynamics.wrench_torques(model, np.zeros(6), 0, [0, 0, 0], [1, 0, 0])
    with pytest.raises(ValueError, match="force: expected 3 finite numbers"):
        dynamics.wrench_torques(model, np.zeros(6), 2, [0, 0, 0], [1, np.nan, 0])


def test_the_plant_accelerates_by_the_pushs_torque(model):
    """qdd at the start of the period is forward dynamics under the motor torque plus J^T w (friction off)."""
    q = np.array([0.3, -0.7, 1.1, 0.4, -0.9, 0.2])
    plant = Plant(model, friction=FrictionConfig(enabled=False), noise=NoiseConfig.off(), q0=q)
    hold = dynamics.gravity_torques(model, q)
    plant.set_wrench(4, [0.05, 0.02, -0.03], [20.0, -15.0, 40.0], [1.0, 0.0, -2.0])
    plant.advance(hold)
    ext = dynamics.wrench_torques(model, q, 4, [0.05, 0.02, -0.03], [20.0, -15.0, 40.0], [1.0, 0.0, -2.0])
    np.testing.assert_allclose(plant.tau_ext, ext, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(plant.qdd, _fd(model, q, hold + ext), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(plant.tau, hold)      # the motors' torque (what the current sensors see) is apart


def _fd(model, q, tau):
    M = dynamics.mass_matrix(model, q)
    return np.linalg.solve(M, tau - dynamics.gravity_torques(model, q))


def test_a_push_on_a_braked_arm_lasts_its_duration_and_is_reported_as_truth(model):
    sim = Simulator(model, noise=NoiseConfig.off(), q0=[0.2, -0.5, 0.8, 0.0, 0.6, 0.0])
    sim.step(2)
    q = sim.read_truth().q
    sim.apply_wrench(3, [0.0, 0.0, -50.0], point=[0.1, 0.05, 0.0], duration=0.005)
    seen = []
    for _ in range(8):
        sim.step(1)
        seen.append(sim.read_truth().tau_ext)
    expected = dynamics.wrench_torques(model, q, 3, [0.1, 0.05, 0.0], [0.0, 0.0, -50.0])
    assert np.abs(expected).max() > 1.0
    for k in range(5):
        np.testing.assert_allclose(seen[k], expected, rtol=1e-12, atol=1e-12)
    for k in range(5, 8):
        assert not seen[k].any()
    with pytest.raises(InputError, match="link: expected an integer 1..6"):
        sim.apply_wrench(7, [1.0, 0.0, 0.0])
    with pytest.raises(InputError, match="duration"):
        sim.apply_wrench(2, [1.0, 0.0, 0.0], duration=-1.0)


def test_the_control_socket_pushes_and_releases(model):
    sim = Simulator(model, noise=NoiseConfig.off())
    server = ControlServer(sim, "tcp://127.0.0.1:*")
    server.start()
    ctx = zmq.Context.instance()
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.RCVTIMEO, 5000)
    try:
        req.connect(server.bound)

        def ask(obj):
            req.send(json.dumps(obj).encode())
            return json.loads(req.recv())

        r = ask({"cmd": "push", "link": 5, "force": [0.0, 30.0, 0.0], "point": [0.0, 0.0, 0.05]})
        assert r["ok"], r
        sim.step(1)
        np.testing.assert_allclose(sim.read_truth().tau_ext,
                                   dynamics.wrench_torques(model, sim.read_truth().q, 5, [0, 0, 0.05], [0, 30, 0]),
                                   atol=1e-9)
        assert ask({"cmd": "status"})["push"]["link"] == 5
        bad = ask({"cmd": "push", "link": 9, "force": [1, 0, 0]})
        assert not bad["ok"] and "link: expected an integer 1..6" in bad["error"]
        bad = ask({"cmd": "push", "link": 2, "force": [1e5, 0, 0]})
        assert not bad["ok"] and "force" in bad["error"]
        assert ask({"cmd": "release"}) == {"ok": True, "push": None}
        sim.step(1)
        assert not sim.read_truth().tau_ext.any()
        assert ask({"cmd": "status"})["push"] is None
    finally:
        req.close(0)
        server.stop()


def test_mismatch_puts_every_dynamic_parameter_off_by_the_fraction(model):
    off = mismatched_model(model, 0.2, seed=3)
    ratio = off.standard_parameters().reshape(6, 14)[:, :13] / model.standard_parameters().reshape(6, 14)[:, :13]
    nonzero = model.standard_parameters().reshape(6, 14)[:, :13] != 0
    np.testing.assert_allclose(np.abs(ratio[nonzero] - 1.0), 0.2, rtol=1e-12)
    np.testing.assert_array_equal(off.gear_ratio, model.gear_ratio)
    sim = Simulator(model, mismatch=0.2)
    assert not np.array_equal(sim.plant.model.inertial, model.inertial)
    assert sim.model is model
    with pytest.raises(InputError, match="mismatch: expected a fraction"):
        Simulator(model, mismatch=1.5)
