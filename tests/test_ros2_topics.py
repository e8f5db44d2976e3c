"""`armid ros2` publishes as a ROS 2 node would, checked by parts the project did not write: a second process speaking
only DDS (tests/ros2_peer.py, types generated from rosbags' ROS 2 definitions) subscribes on loopback, and rosbags'
CDR codec decodes every message it received to the driver's stream, model and health. Discovery shows ROS 2's
mangled topic and type names and the QoS ROS 2 tools subscribe with."""
from __future__ import annotations

import pickle
import time
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cyclonedds")
pytest.importorskip("rosbags")

import ros2_peer  # noqa: E402
from armid.client import ArmClient  # noqa: E402
from ident.model import frames, load_model  # noqa: E402
from local_driver import local_driver  # noqa: E402

ros2_peer.use_loopback()
from armid.ros2.bridge import Ros2Bridge  # noqa: E402
from armid.ros2 import dds  # noqa: E402

HERE = Path(__file__).parent
ACTION = ros2_peer.ACTION_BASE
PEER_S = 40.0


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _peer(domain: int, namespace: str, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / "ros2_peer.py"), "listen", str(domain), namespace,
                             str(PEER_S), str(out)], cwd=HERE)


def test_a_dds_peer_decodes_every_topic_to_the_streams_values(model, tmp_path):
    store = ros2_peer.typestore()
    with ros2_peer.own_domain() as domain, local_driver(model, seed=4) as (d, sim):
        watcher = ArmClient(d.bound["state"], d.bound["commands"])
        seen: dict[int, list] = {}
        thread = watcher.on_sample(lambda s: seen.setdefault(s.host_time_ns, []).append(s))
        bridge = Ros2Bridge(ArmClient(d.bound["state"], d.bound["commands"]), model, namespace="arm1",
                            domain_id=domain, rate_hz=100.0).start()
        peer = _peer(domain, "/arm1", tmp_path / "seen.pkl")
        try:
            peer.wait(PEER_S + 30)
        finally:
            if peer.poll() is None:
                peer.kill()
                peer.wait(10)
            bridge.stop()
            watcher.close()
            thread.join(5)
        assert bridge.errors == []
        got = pickle.loads((tmp_path / "seen.pkl").read_bytes())
    samples = got["samples"]
    # /joint_states: each one a sample of the stream, bit for bit, stamped with its host_time_ns
    states = [store.deserialize_cdr(raw, "sensor_msgs/msg/JointState") for raw, _ in samples["joint_states"]]
    assert len(states) >= 3
    for (raw, source_ns), js in zip(samples["joint_states"], states):
        assert raw[:4] == b"\x00\x01\x00\x00"                                 # plain CDR, little-endian
        stamp = js.header.stamp.sec * 1_000_000_000 + js.header.stamp.nanosec
        assert source_ns == stamp
        assert list(js.name) == list(model.joint_names)
        match = [s for s in seen.get(stamp, []) if np.array_equal(s.q, js.position)]
        assert match, f"no stream sample at {stamp} with q = {js.position}"
        np.testing.assert_array_equal(js.velocity, match[0].qd)
        np.testing.assert_array_equal(js.effort, match[0].torque)
        assert match[0].seq % bridge.decimate == 0
    # /tf: the links' placements for the sample's q (ident.model.frames), same stamp as its joint state
    tree = frames.frame_tree(model)
    stamps = {js.header.stamp.sec * 1_000_000_000 + js.header.stamp.nanosec: js for js in states}
    checked = 0
    for raw, _ in samples["/tf"]:
        tf = store.deserialize_cdr(raw, "tf2_msgs/msg/TFMessage")
        assert [(x.header.frame_id, x.child_frame_id) for x in tf.transforms] == tree[:model.n]
        stamp = tf.transforms[0].header.stamp.sec * 1_000_000_000 + tf.transforms[0].header.stamp.nanosec
        if stamp in stamps:
            t, r = frames.frame_transforms(model, stamps[stamp].position)
            got_t = np.array([[x.transform.translation.x, x.transform.translation.y, x.transform.translation.z]
                              for x in tf.transforms])
            got_r = np.array([[x.transform.rotation.x, x.transform.rotation.y, x.transform.rotation.z,
                               x.transform.rotation.w] for x in tf.transforms])
            np.testing.assert_array_equal(got_t, t[:model.n])
            np.testing.assert_array_equal(got_r, r[:model.n])
            checked += 1
    assert checked >= 1
    (static_raw, _), = samples["/tf_static"][:1]
    static = store.deserialize_cdr(static_raw, "tf2_msgs/msg/TFMessage")
    assert [(x.header.frame_id, x.child_frame_id) for x in static.transforms] == tree[model.n:]
    desc = store.deserialize_cdr(samples["robot_description"][0][0], "std_msgs/msg/String")
    assert desc.data == frames.robot_description(model)
    diag = store.deserialize_cdr(samples["/diagnostics"][-1][0], "diagnostic_msgs/msg/DiagnosticArray")
    names = [s.name for s in diag.status]
    assert "armid: cycle" in names and "armid: ros2 bridge" in names
    assert all(f"armid: drive {j}" in names for j in model.joint_names)
    # discovery: ROS 2's names and QoS
    pubs = got["publications"]
    expect = {"rt/arm1/joint_states": ("sensor_msgs::msg::dds_::JointState_", "Reliable", "Volatile", 10),
              "rt/tf": ("tf2_msgs::msg::dds_::TFMessage_", "Reliable", "Volatile", 100),
              "rt/tf_static": ("tf2_msgs::msg::dds_::TFMessage_", "Reliable", "TransientLocal", 1),
              "rt/arm1/robot_description": ("std_msgs::msg::dds_::String_", "Reliable", "TransientLocal", 1),
              "rt/diagnostics": ("diagnostic_msgs::msg::dds_::DiagnosticArray_", "Reliable", "Volatile", 10),
              # the services' reply writers and the action's topics (rcl_action's layout)
              "rr/arm1/enableReply": ("std_srvs::srv::dds_::Trigger_Response_", "Reliable", "Volatile", 10),
              "rr/arm1/quick_stopReply": ("std_srvs::srv::dds_::Trigger_Response_", "Reliable", "Volatile", 10),
              f"rt/arm1/{ACTION}status": ("action_msgs::msg::dds_::GoalStatusArray_", "Reliable", "TransientLocal", 1),
              f"rt/arm1/{ACTION}feedback": ("control_msgs::action::dds_::FollowJointTrajectory_FeedbackMessage_",
                                             "Reliable", "Volatile", 10),
              f"rr/arm1/{ACTION}send_goalReply": ("control_msgs::action::dds_::FollowJointTrajectory_SendGoal_Response_",
                                                   "Reliable", "Volatile", 10),
              f"rr/arm1/{ACTION}get_resultReply": (
                  "control_msgs::action::dds_::FollowJointTrajectory_GetResult_Response_", "Reliable", "Volatile", 10),
              f"rr/arm1/{ACTION}cancel_goalReply": ("action_msgs::srv::dds_::CancelGoal_Response_", "Reliable",
                                                     "Volatile", 10)}
    for topic, (type_name, reliability, durability, depth) in expect.items():
        assert topic in pubs, f"{topic} not discovered (found {sorted(pubs)})"
        p = pubs[topic]
        assert p["type"] == type_name
        assert p["reliability"].endswith(reliability)
        assert p["durability"].endswith(durability)
        assert p["history"] == f"Policy.History.KeepLast(depth={depth})"


@pytest.mark.parametrize("bad, why", [("a b", "namespace"), ("/1arm", "namespace"), ("x__y", "namespace")])
def test_a_bad_namespace_is_refused_by_name(bad, why):
    with pytest.raises(dds.NameError_, match=why):
        dds.normalize_namespace(bad)


@pytest.mark.parametrize("domain", [-1, 233, "7", True])
def test_a_domain_id_out_of_range_is_refused(domain):
    with pytest.raises(Exception, match="domain id"):
        dds.check_domain_id(domain)


def test_ros_names_are_mangled_as_ros2_does():
    assert dds.topic_name(dds.qualify("joint_states", "arm1")) == "rt/arm1/joint_states"
    assert dds.topic_name(dds.qualify("/tf", "arm1")) == "rt/tf"
    assert dds.service_topics(dds.qualify("enable", "")) == ("rq/enableRequest", "rr/enableReply")
    from armid.ros2.idl_types import dds_type_name
    assert dds_type_name("control_msgs/action/FollowJointTrajectory_SendGoal_Request") == \
        "control_msgs::action::dds_::FollowJointTrajectory_SendGoal_Request_"


def test_armid_ros2_runs_as_a_process_and_stops_on_sigterm(model, tmp_path):
    import os
    import signal

    from cyclonedds.domain import DomainParticipant
    from armid.ros2.idl_types import Registry

    with ros2_peer.own_domain() as domain, local_driver(model, seed=9) as (d, sim):
        env = dict(os.environ, PYTHONPATH=str(HERE.parent))
        proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "ros2", "--state", d.bound["state"], "--commands",
                                 d.bound["commands"], "--domain-id", str(domain), "--namespace", "cell/arm"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()
            assert first.startswith(f"armid ros2: domain {domain}, namespace '/cell/arm'"), first
            dp = DomainParticipant(domain)
            reader = dds.Reader(dp, "rt/cell/arm/joint_states", Registry().message("sensor_msgs/msg/JointState"),
                                dds.DEFAULT)
            got = []
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got = reader.take_samples()
                time.sleep(0.02)
            assert got and list(got[0].name) == list(model.joint_names)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "joint states published" in err


def test_armid_ros2_refuses_a_domain_id_out_of_range_by_name(tmp_path):
    import os

    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    proc = subprocess.run([sys.executable, "-m", "armid.cli", "ros2", "--domain-id", "300", "--state",
                           "tcp://127.0.0.1:1", "--commands", "tcp://127.0.0.1:1"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert "domain id 300" in proc.stderr
