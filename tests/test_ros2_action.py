"""The bridge's FollowJointTrajectory action, driven by a second process that speaks only DDS with types generated
from the ROS 2 definitions (tests/ros2_action_client.py): goals run on the simulated arm, feedback comes, results and
cancel replies decode with rosbags' codec to joint_trajectory_controller's codes: success, rejection of an unknown
joint, a goal beyond the limits aborted with INVALID_GOAL and the driver's words, a cancel, a preemption."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cyclonedds")
pytest.importorskip("rosbags")

import ros2_peer  # noqa: E402
from armid.client import ArmClient  # noqa: E402
from ident.model import load_model  # noqa: E402
from local_driver import local_driver  # noqa: E402

ros2_peer.use_loopback()
from armid.ros2.bridge import Ros2Bridge  # noqa: E402

HERE = Path(__file__).parent
ACTION = "control_msgs/action/FollowJointTrajectory"
SUCCEEDED, CANCELED, ABORTED = 4, 5, 6


def _result(store, raw: bytes):
    """A get_result reply (rmw_cyclonedds's 16-byte request header after the encapsulation) decoded by rosbags."""
    return store.deserialize_cdr(raw[:4] + raw[20:], f"{ACTION}_GetResult_Response")


@pytest.mark.timeout(420)
def test_a_dds_action_client_runs_rejects_aborts_cancels_and_preempts_goals(tmp_path):
    model = load_model("generic6")
    joints = list(model.joint_names)
    store = ros2_peer.typestore()
    with ros2_peer.own_domain() as domain, local_driver(model, seed=5) as (d, sim):
        watcher = ArmClient(d.bound["state"], d.bound["commands"])
        trace = []
        thread = watcher.on_sample(lambda s: trace.append(s.q.copy()))
        watcher.enable()
        q0 = watcher.latest().q.copy()
        rev = joints[::-1]                                        # the goal names the joints in another order

        def point(t, q, qd=None):
            return (t, list(np.asarray(q)[::-1]), None if qd is None else list(np.asarray(qd)[::-1]))
        ok_end = q0 + 0.1
        beyond = q0.copy()
        beyond[0] = model.q_max[0] + 0.2
        far = q0 + np.array([0.4, -0.3, 0.3, 0.4, 0.4, 0.4])
        script = [
            {"send": "ok", "joints": rev, "points": [point(0.6, q0 + 0.05, np.full(6, 0.08)), point(1.2, ok_end, np.zeros(6))]},
            {"wait_result": "ok", "timeout": 90},
            {"cancel": "ok"},                                     # it has ended: ERROR_GOAL_TERMINATED
            {"send": "tight", "joints": rev, "points": [point(2.0, q0)], "tolerance": {"path": {"j2": 1e-7}}},
            {"wait_result": "tight", "timeout": 90},
            {"send": "unknown", "joints": rev[:-1] + ["elbow"], "points": [point(1.0, q0)]},
            {"send": "beyond", "joints": rev, "points": [point(2.0, beyond)]},
            {"wait_result": "beyond", "timeout": 90},
            {"send": "cancelled", "joints": rev, "points": [point(6.0, far)]},
            {"cancel": "cancelled", "after": 2.5},
            {"wait_result": "cancelled", "timeout": 60},
            {"send": "first", "joints": rev, "points": [point(6.0, far)]},
            {"sleep": 2.5},
            {"send": "second", "joints": rev, "points": [point(0.0, q0 + 0.02), point(2.0, q0)]},
            {"wait_result": "first", "timeout": 60},
            {"wait_result": "second", "timeout": 90},
        ]
        (tmp_path / "script.pkl").write_bytes(pickle.dumps(script))
        bridge = Ros2Bridge(ArmClient(d.bound["state"], d.bound["commands"]), model, namespace="arm1",
                            domain_id=domain, rate_hz=50.0).start()
        peer = subprocess.Popen([sys.executable, str(HERE / "ros2_peer.py"), "action", str(domain),
                                 "/arm1/armid_controller/follow_joint_trajectory", str(tmp_path / "script.pkl"),
                                 str(tmp_path / "seen.pkl")], cwd=HERE)
        try:
            peer.wait(360)
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait(10)
            bridge.stop()
            final_status = watcher.status()
            watcher.close()
            thread.join(5)
        assert bridge.errors == []
        seen = pickle.loads((tmp_path / "seen.pkl").read_bytes())
    assert seen["server_found"]
    goals = seen["goals"]
    trace = np.array(trace)
    # success: feedback came, in the goal's joint order; the arm reached the goal
    ok = goals["ok"]
    assert ok["accepted"] is True and ok["result"] is not None
    res = _result(store, ok["result"])
    assert (res.status, res.result.error_code) == (SUCCEEDED, 0)
    assert len(ok["feedback"]) >= 5
    fb = store.deserialize_cdr(ok["feedback"][-1], f"{ACTION}_FeedbackMessage").feedback
    assert list(fb.joint_names) == rev
    np.testing.assert_allclose(np.array(fb.error.positions), np.array(fb.desired.positions) - np.array(fb.actual.positions),
                               atol=1e-12)
    assert np.min(np.max(np.abs(trace - ok_end), axis=1)) < 0.01
    # a path tolerance no real tracking keeps: aborted, stopped along the path with the drives enabled
    tight = _result(store, goals["tight"]["result"])
    assert (tight.status, tight.result.error_code) == (ABORTED, -4)
    assert "path tolerance" in tight.result.error_string and "j2" in tight.result.error_string
    # an unknown joint: rejected, as joint_trajectory_controller rejects it
    assert goals["unknown"]["accepted"] is False and goals["unknown"]["result"] is None
    # beyond the limits: accepted, then aborted with INVALID_GOAL and the driver's refusal; the arm never went there
    res = _result(store, goals["beyond"]["result"])
    assert (res.status, res.result.error_code) == (ABORTED, -1)
    assert "refused" in res.result.error_string and "j1" in res.result.error_string
    assert trace[:, 0].max() < model.q_max[0]
    # cancel: the cancel reply lists the goal, the result is CANCELED, the arm stopped short of the goal
    cancel = store.deserialize_cdr(seen["cancels"]["cancelled"][:4] + seen["cancels"]["cancelled"][20:],
                                   "action_msgs/srv/CancelGoal_Response")
    assert cancel.return_code == 0
    assert [bytes(g.goal_id.uuid) for g in cancel.goals_canceling] == [seen["ids"]["cancelled"]]
    assert _result(store, goals["cancelled"]["result"]).status == CANCELED
    late = seen["cancels"]["ok"]
    assert store.deserialize_cdr(late[:4] + late[20:], "action_msgs/srv/CancelGoal_Response").return_code == 3
    # preemption: the first goal aborted with INVALID_GOAL ("preempted"), the second ran to its end
    first = _result(store, goals["first"]["result"])
    assert (first.status, first.result.error_code) == (ABORTED, -1) and "preempted" in first.result.error_string
    second = _result(store, goals["second"]["result"])
    assert (second.status, second.result.error_code) == (SUCCEEDED, 0)
    np.testing.assert_allclose(trace[-1], q0, atol=0.01)
    assert final_status["enabled"] and not final_status["fault"]
    # the status topic carried the goals' states
    assert any(st == SUCCEEDED for snapshot in seen["status"] for _, st in snapshot)
