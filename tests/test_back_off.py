"""The back-off reaction to a collision: the arm yields along the estimated external torque by the configured
distance, no faster than the configured speed, within the position limits, then holds (driver/back_off.py), on the
driver's own cycle and the simulator in lockstep (armid.lockstep)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from armid.lockstep import Rig, push_making
from driver.back_off import LIMIT_MARGIN, BackOff, back_off_goal, plan_back_off
from driver.collision import Watch
from driver.motion import MotionError
from firmware_bridge.runtime.errors import InputError
from ident.model import dynamics, load_model

RATE = 1000.0
CONTACT = (1.0, 1.2, 0.8, 0.3, 0.3, 0.2)
COLLISION = (2.0, 2.5, 1.5, 0.6, 0.6, 0.4)
DISTANCE, SPEED = 0.05, 0.2


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _rig(model):
    return Rig(model, Watch(detect=True, contact=CONTACT, collision=COLLISION, reaction="back_off",
                            back_off_distance=DISTANCE, back_off_speed=SPEED))


def _collide(rig, link=3, torque=8.0):
    """Push `link` briefly (30 ms) while the arm holds still; step until the reaction starts (at most 50 cycles).
    Returns the push's true joint torques."""
    q = rig.sim.read_truth().q.copy()
    push = push_making(rig.model, q, link, torque, duration=0.03)
    true = dynamics.wrench_torques(rig.model, q, link, push["point"], np.array(push["force"]))
    rig.sim.apply_wrench(**push)
    for _ in range(50):
        rig.step()
        if rig.cycle.monitor.collisions:
            break
    assert rig.cycle.monitor.collisions == 1
    return true


def _planned(rig, limit_s=30.0):
    """Step the holding arm until the back-off's planning (a thread beside the cycle) is taken (bounded in time)."""
    end = time.monotonic() + limit_s
    while rig.cycle._back_off_job is not None and time.monotonic() < end:
        rig.step()
    assert rig.cycle._back_off_job is None, "the back-off was not planned in time"


def test_a_collision_backs_the_arm_off_along_the_external_torque_by_the_distance_then_it_holds(model):
    rig = _rig(model)
    rig.enable()
    rig.step(300)
    true = _collide(rig)
    held = rig.cycle.hold.copy()
    assert rig.cycle.motion is None                     # holding where it collided while the back-off is planned
    _planned(rig)
    plan = rig.cycle.motion
    assert plan is not None and plan.name == "back_off" and rig.cycle.fault is None
    np.testing.assert_array_equal(plan.q[0], held)
    # the most loaded joint yields by the distance in the direction it is pushed, the others in proportion (equal
    # gains: the estimate's joints rise alike, so its direction is the push's up to the sensors' noise)
    moved = plan.q[-1] - plan.q[0]
    np.testing.assert_allclose(moved, DISTANCE * true / np.abs(true).max(), atol=0.02 * DISTANCE)
    peak = 0.0
    for _ in range(plan.samples + 500):
        rig.step()
        peak = max(peak, float(np.abs(rig.sim.read_truth().qd).max()))
    truth = rig.sim.read_truth()
    assert rig.cycle.motion is None and rig.cycle.fault is None and rig.cycle.enabled()
    np.testing.assert_allclose(truth.q, plan.q[-1], atol=1e-4)       # there, held by the drives
    assert np.abs(truth.qd).max() < 1e-2
    # the plan peaks at the speed; the drives track it within a few urad, and the push is over before it starts
    assert np.abs(plan.qd).max() <= SPEED and peak <= 1.05 * SPEED, peak
    events = [e["text"] for e in rig.driver.health(1.0, {})["events"]]
    assert any(t.startswith("collision: joint") and t.endswith("(back_off)") for t in events)
    assert any(t.startswith("back_off: 0.05 rad over") for t in events) and "back_off: done" in events[-1]


def test_the_back_off_stays_inside_the_position_limits(model):
    q = model.q_max - np.array([0.01, 0.0, 0.2, 0.2, 0.2, 0.2])
    q[1] = model.q_max[1] + 0.001                       # already past the limit: not pushed further
    tau = np.array([5.0, 1.0, -1.0, 0.0, 0.0, 0.0])
    goal = back_off_goal(model, q, tau, 0.05)
    assert goal[0] == pytest.approx(model.q_max[0] - LIMIT_MARGIN)     # 0.05 asked, 0.009 left
    assert goal[1] == q[1]
    assert goal[2] == pytest.approx(q[2] - 0.01)
    inside = q.copy()
    inside[1] = 0.0
    plan = plan_back_off(model, inside, tau, BackOff(0.05, 0.2), RATE)
    assert np.all(plan.q <= model.q_max) and np.all(plan.q >= model.q_min)
    assert np.abs(plan.qd).max() <= 0.2


def test_a_back_off_that_a_limit_refuses_leaves_the_arm_holding(model):
    rig = _rig(model)
    rig.enable()
    rig.step(300)

    def refuse(q, tau_ext):
        raise MotionError("back_off refused: joint j2: torque 999 N m over its limit")

    rig.cycle.monitor.back_off = refuse
    _collide(rig)
    held = rig.cycle.hold.copy()
    _planned(rig)
    rig.step(300)
    assert rig.cycle.motion is None and rig.cycle.fault is None and rig.cycle.enabled()
    np.testing.assert_allclose(rig.sim.read_truth().q, held, atol=1e-3)
    assert "back_off refused, holding: back_off refused" in rig.driver.health(1.0, {})["events"][-1]["text"]


def test_back_off_settings_are_checked(tmp_path):
    from driver.config import ConfigError, load_config

    for bad in ({"distance": 0.0}, {"distance": 0.5}, {"speed": float("nan")}, {"speed": 2.0}, {"distance": True}):
        with pytest.raises(InputError, match="collision.back_off_"):
            BackOff(**bad)
    path = tmp_path / "c.toml"
    path.write_text('[transport]\nname = "sim"\n[collision]\nreaction = "back_off"\nback_off_distance = 5.0\n')
    with pytest.raises(ConfigError, match=r"collision\.back_off_distance: expected a positive number at most 0.2 rad"):
        load_config(path)
    path.write_text('[transport]\nname = "sim"\n[collision]\nreaction = "back_off"\nback_off_speed = 0.05\n')
    watch = load_config(path).watch
    assert watch.reaction == "back_off" and watch.back_off_speed == 0.05 and watch.back_off_distance == 0.02


def test_a_back_off_planned_after_the_arm_stopped_holding_is_dropped(model):
    rig = _rig(model)
    rig.enable()
    rig.step(300)
    _collide(rig)
    rig.cycle.request_quick_stop("operator")           # before the back-off's plan is taken
    _planned(rig)
    rig.step(5)
    assert rig.cycle.motion is None
    texts = [e["text"] for e in rig.driver.health(1.0, {})["events"]]
    assert any("back_off dropped: the arm no longer holds where it collided" in t for t in texts)


def test_a_joint_pushed_towards_its_limit_backs_off_no_further_than_the_limit(model):
    """Joint 6 held 10 mrad from its upper limit and twisted towards it: the back-off would take it 50 mrad; it
    stops LIMIT_MARGIN inside the limit, and no joint ever passes its limits."""
    from driver import motion

    rig = _rig(model)
    rig.enable()
    goal = rig.cycle.hold.copy()
    goal[5] = model.q_max[5] - 0.01
    plan = motion.plan_move(rig.driver.planning_model, rig.cycle.hold.copy(), goal, RATE)
    rig.cycle.start_motion(plan)
    rig.step(plan.samples + 300)
    q = rig.sim.read_truth().q.copy()
    # the base-axis moment that twists joint 6 most directly, 3 N m on it
    best = max((np.array(m, dtype=float) for m in np.vstack([np.eye(3), -np.eye(3)])),
               key=lambda m: (lambda t: t[5] / np.abs(t).max())(dynamics.wrench_torques(model, q, 6, [0, 0, 0], [0, 0, 0], m)))
    tau = dynamics.wrench_torques(model, q, 6, [0, 0, 0], [0, 0, 0], best)
    assert tau[5] > 0 and tau[5] >= np.abs(tau).max() - 1e-9      # (joint 4 twists alike where their axes align)
    rig.sim.apply_wrench(6, [0.0, 0.0, 0.0], moment=(best * 3.0 / tau[5]).tolist(), duration=0.03)
    for _ in range(50):
        rig.step()
        if rig.cycle.monitor.collisions:
            break
    _planned(rig)
    back = rig.cycle.motion
    assert back is not None and back.name == "back_off"
    assert back.q[-1, 5] == pytest.approx(model.q_max[5] - LIMIT_MARGIN)
    top = np.zeros(6)
    for _ in range(back.samples + 300):
        rig.step()
        np.maximum(top, rig.sim.read_truth().q, out=top)
    assert np.all(top <= model.q_max) and rig.cycle.fault is None
    assert rig.sim.read_truth().q[5] == pytest.approx(model.q_max[5] - LIMIT_MARGIN, abs=1e-4)


def test_the_back_off_is_changed_at_run_time_shown_in_status_and_not_lengthened_while_moving(model):
    """set_collision takes back_off_distance and back_off_speed: checked like the config's, shown in the collision
    status, refused while the arm moves when they make the back-off longer or faster (shorter or slower is taken),
    and the next back-off uses them."""
    from driver.commands import Commands

    rig = _rig(model)
    cmds = Commands(rig.driver)
    status = cmds.handle({"cmd": "collision"})["collision"]
    assert status["back_off"] == {"distance": DISTANCE, "speed": SPEED}
    bad = cmds.handle({"cmd": "set_collision", "back_off_distance": 5.0})
    assert not bad["ok"] and "back_off_distance: expected a number more than 0 and at most 0.2 rad" in bad["error"]
    rig.enable()
    rig.excite()
    rig.step(50)
    longer = cmds.handle({"cmd": "set_collision", "back_off_distance": 2 * DISTANCE})
    assert not longer["ok"] and "refused while the arm moves" in longer["error"], longer
    faster = cmds.handle({"cmd": "set_collision", "back_off_speed": 2 * SPEED})
    assert not faster["ok"] and "back_off_speed" in faster["error"], faster
    shorter = cmds.handle({"cmd": "set_collision", "back_off_distance": DISTANCE / 2, "back_off_speed": SPEED / 2})
    assert shorter["ok"], shorter
    assert shorter["collision"]["back_off"] == {"distance": DISTANCE / 2, "speed": SPEED / 2}
    rig.cycle.submit(rig.cycle.disable)
    rig.step(5)
    assert cmds.handle({"cmd": "set_collision", "back_off_distance": DISTANCE / 4})["ok"]   # at rest: taken
    rig.enable()
    rig.step(300)
    true = _collide(rig)
    _planned(rig)
    plan = rig.cycle.motion
    assert plan is not None and plan.name == "back_off"
    moved = plan.q[-1] - plan.q[0]
    np.testing.assert_allclose(moved, DISTANCE / 4 * true / np.abs(true).max(), atol=0.02 * DISTANCE / 4)
    assert np.abs(plan.qd).max() <= SPEED / 2
