"""The `stop` command: the running motion slows to rest along its own path and the drives stay enabled (a trajectory
controller's cancel), checked against the limits like every motion; with no motion it does nothing."""
from __future__ import annotations

import time

import numpy as np
import pytest

from armid.client import ArmClient
from driver import motion, stopping
from ident.model import load_model
from local_driver import local_driver
from waiting import wait_until


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def test_a_planned_stop_continues_the_motion_then_rests_on_its_path(model):
    q0, q1 = np.zeros(6), np.array([0.6, -0.4, 0.5, 0.6, 0.6, 0.6])
    m = motion.plan_move(model, q0, q1, 1000.0)
    k = m.samples // 3
    stop = stopping.plan_stop(model, m, k)
    np.testing.assert_allclose(stop.q[0], m.q[k], atol=1e-12)
    np.testing.assert_allclose(stop.qd[0], m.qd[k], atol=1e-12)
    np.testing.assert_allclose(stop.qd[-1], 0.0, atol=1e-12)
    direction = (q1 - q0) / np.linalg.norm(q1 - q0)
    off_path = stop.q - np.outer((stop.q - q0) @ direction, direction)      # a straight move: the path is a line
    assert np.abs(off_path).max() < 1e-9
    assert np.all(np.diff((stop.q - q0) @ direction) >= -1e-12)             # never backwards
    assert np.abs(stop.qdd).max(axis=0).max() <= model.qdd_max.max()
    handover = stopping.HandOver(m, k - 10, k, stop)
    assert handover.samples == 10 + stop.samples
    assert handover.segments == (("hand-over", 0), ("stop", 10))
    assert handover.progress(k - 10)["segment"] == "hand-over" and handover.progress(k)["segment"] == "stop"


def test_stop_brings_a_running_motion_to_rest_with_the_drives_enabled(model):
    q1 = np.array([0.6, -0.4, 0.5, 0.6, 0.6, 0.6])
    with local_driver(model, seed=7) as (d, sim):
        with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
            assert arm.request("stop")["stopped"] is False          # nothing runs: nothing to do
            arm.enable()
            q0 = arm.latest().q.copy()
            arm.move_to(q1, speed=0.5)
            # a tenth of the way on the arm's own stream (a loaded machine may start the motion late)
            assert wait_until(lambda: ((arm.latest().q - q0) / (q1 - q0)).min() > 0.1, 10.0)
            stopped = arm.request("stop")
            assert stopped["stopped"] is True and stopped["duration"] > 0
            arm.wait_motion(10.0)
            assert wait_until(lambda: np.abs(arm.latest().qd).max() < 1e-3, 5.0)
            status = arm.status()
            assert status["enabled"] and not status["fault"] and status["motion"] is None
            q = arm.latest().q
            travelled = (q - q0) / (q1 - q0)
            assert 0.1 < travelled.min() and travelled.max() < 0.9      # stopped on the way, short of the goal
            np.testing.assert_allclose(travelled, travelled.mean(), atol=0.02)   # on the move's straight path


def test_a_preempting_trajectory_blends_in_while_the_arm_moves(model):
    """run_trajectory with preempt while a motion runs: the arm never stops; position, velocity and acceleration are
    continuous at the hand-over (the quintic matches them); the new trajectory's end is reached."""
    from driver import blending

    q0, q1 = np.zeros(6), np.array([0.6, -0.4, 0.5, 0.6, 0.6, 0.6])
    m = motion.plan_move(model, q0, q1, 1000.0)
    k = m.samples // 2
    goal = np.full(6, 0.1)
    new = motion.plan_samples(model, m.q[k], [0.0, 1.5], [m.q[k], goal], 1000.0, preempt=True)
    b = blending.plan_blend(model, m, k, new)
    np.testing.assert_allclose(b.q[0], m.q[k], atol=1e-12)
    np.testing.assert_allclose(b.qd[0], m.qd[k], atol=1e-12)
    np.testing.assert_allclose(b.qdd[0], m.qdd[k], atol=1e-9)
    kb = dict(b.segments)["run_trajectory"]
    start = dict(new.segments)["run_trajectory"]
    np.testing.assert_allclose(b.q[kb - 1], new.q[start + kb - 1], atol=1e-4)   # one cycle before joining it
    np.testing.assert_array_equal(b.q[kb:], new.q[start + kb:])
    np.testing.assert_allclose(b.q[-1], goal, atol=1e-12)
    with local_driver(model, seed=8) as (d, sim):
        with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
            arm.enable()
            reply = arm.move_to(q1)
            time.sleep(0.4 * reply["duration"])
            here = arm.latest()
            taken = arm.run_trajectory(samples=([0.0, 1.5], [here.q, goal]), preempt=True)
            assert taken["preempted"] is True
            speeds = [np.abs(s.qd).max() for s in arm.samples(count=200)]
            assert min(speeds) > 1e-3                             # it never came to rest at the hand-over
            arm.wait_motion(20.0)
            np.testing.assert_allclose(arm.latest().q, goal, atol=5e-3)
            with pytest.raises(Exception, match="preempt: expected true or false"):
                arm.request("run_trajectory", samples={"t": [0, 1], "q": [list(goal), list(goal)]}, preempt="yes")
