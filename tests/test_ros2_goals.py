"""A FollowJointTrajectory goal checked as joint_trajectory_controller checks it, before anything is sent to the
driver: every malformed goal is rejected with a message naming what is wrong; a good one becomes run_trajectory's
samples in the driver's joint order. The goals are built with the structs generated from the ROS 2 definitions
(tests/ros2_peer.py), as a ROS 2 client would send them."""
from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("cyclonedds")
pytest.importorskip("rosbags")

import ros2_peer  # noqa: E402
from armid.ros2.trajectory_action import GoalRejected, check_goal, samples_from  # noqa: E402

JOINTS = ["j1", "j2", "j3", "j4", "j5", "j6"]
ACTION = "control_msgs/action/FollowJointTrajectory"


@pytest.fixture(scope="module")
def make():
    store = ros2_peer.typestore()
    T = lambda name: ros2_peer.idl_class(store, name)            # noqa: E731
    Goal, Traj, Point = T(f"{ACTION}_Goal"), T("trajectory_msgs/msg/JointTrajectory"), \
        T("trajectory_msgs/msg/JointTrajectoryPoint")
    Duration, Tol = T("builtin_interfaces/msg/Duration"), T("control_msgs/msg/JointTolerance")

    def goal(names=JOINTS, points=((1.0, [0.1] * 6),), path=(), end=(), goal_time=0.0, **point_fields):
        pts = [Point(positions=list(q), time_from_start=Duration(sec=int(t), nanosec=int(round((t % 1) * 1e9))),
                     **{k: v[i] for k, v in point_fields.items()}) for i, (t, q) in enumerate(points)]
        return Goal(trajectory=Traj(joint_names=list(names), points=pts),
                    path_tolerance=[Tol(name=j, position=v) for j, v in path],
                    goal_tolerance=[Tol(name=j, position=v) for j, v in end],
                    goal_time_tolerance=Duration(sec=int(goal_time), nanosec=0))
    return goal


@pytest.mark.parametrize("kwargs, words", [
    ({"names": []}, "names no joints"),
    ({"names": JOINTS[:5] + ["elbow"]}, "'elbow' is not one of the arm's"),
    ({"names": JOINTS[:5] + ["j1"]}, "named twice"),
    ({"names": JOINTS[:5], "points": ((1.0, [0.1] * 5),)}, "['j6'] missing"),
    ({"points": ()}, "no points"),
    ({"points": ((1.0, [0.1] * 5),)}, "point 0: 5 positions for 6 joints"),
    ({"points": ((1.0, [0.1] * 6),), "velocities": [[0.0] * 3]}, "point 0: 3 velocities"),
    ({"points": ((1.0, [0.1] * 6),), "effort": [[1.0] * 6]}, "efforts are not supported"),
    ({"points": ((1.0, [0.1] * 6), (1.0, [0.2] * 6))}, "must increase"),
    ({"points": ((1.0, [0.1] * 5 + [math.nan]),)}, "positions: a value is not finite"),
    ({"points": ((0.0, [0.1] * 6),)}, "a single point needs a time_from_start after 0"),
    ({"path": (("wrist", 0.1),)}, "path_tolerance: joint 'wrist'"),
    ({"end": (("j2", math.inf),)}, "goal_tolerance: joint 'j2': position tolerance inf is not finite"),
])
def test_a_malformed_goal_is_rejected_naming_what_is_wrong(make, kwargs, words):
    with pytest.raises(GoalRejected) as info:
        check_goal(make(**kwargs), JOINTS)
    assert words in str(info.value)


def test_a_good_goal_becomes_samples_in_the_drivers_joint_order(make):
    names = JOINTS[::-1]
    q1, q2 = np.arange(6) * 0.01, np.arange(6) * 0.02
    g = make(names=names, points=((0.5, q1), (1.5, q2)), velocities=[[0.1] * 6, [0.0] * 6],
             path=(("j3", 0.2), ("j4", -1.0)), end=(("j1", 0.005),), goal_time=2)
    plan = check_goal(g, JOINTS)
    np.testing.assert_array_equal(plan.q[0], q1[::-1])                 # reordered to j1..j6
    np.testing.assert_array_equal(plan.qd[0], np.full(6, 0.1))
    assert plan.qdd is None                                            # no accelerations given: none sent
    assert plan.path_tolerance[2] == 0.2 and np.isnan(plan.path_tolerance[3]) and np.isnan(plan.path_tolerance[0])
    assert plan.goal_tolerance[0] == 0.005 and plan.goal_tolerance[1] == 0.01 and plan.goal_time_tolerance == 2.0
    here = np.full(6, -0.3)
    t, q, qd = samples_from(plan, here)                                # the first point is later than 0: from here
    np.testing.assert_array_equal(t, [0.0, 0.5, 1.5])
    np.testing.assert_array_equal(q[0], here)
    np.testing.assert_array_equal(qd[0], np.zeros(6))
