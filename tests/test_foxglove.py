"""The live view: `armid foxglove`'s bridge serves a running driver's stream over the Foxglove WebSocket protocol.
A client written from the protocol (subprotocol foxglove.sdk.v1: advertise, subscribe, binary message data) connects
on loopback, subscribes to every channel and decodes what comes: the JSON state equals the driver's stream,
the frame transforms follow the model, the robot description is the model's URDF and health comes as typed
diagnostics (ROS 2 CDR, decoded by mcap-ros2-support's decoder)."""
from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect

from mcap_ros2._dynamic import generate_dynamic

from armid.foxglove_bridge import Bridge, SampleClock, link_transforms
from firmware_bridge import stream
from firmware_bridge import mcap_schema
from ident.model import frames
from ident.model import load_model
from local_driver import local_driver
from scipy.spatial.transform import Rotation

PROTOCOL = "foxglove.sdk.v1"


@pytest.fixture
def live(tmp_path):
    model = load_model("generic6")
    with local_driver(model, seed=2) as (d, _):
        bridge = Bridge(model, d.bound["state"], port=0, decimate=5).start()
        try:
            yield model, d, bridge
        finally:
            bridge.stop()


def _messages(ws, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            yield ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            return


TOPICS = {"/joint_states", "/tf", "/armid/state", "/armid/health", "/armid/model", "/robot_description",
          "/diagnostics"}


def test_a_foxglove_client_receives_the_joint_states_tf_state_and_health(live):
    model, driver, bridge = live
    with connect(f"ws://127.0.0.1:{bridge.port}", subprotocols=[PROTOCOL], open_timeout=10) as ws:
        channels = {}
        for raw in _messages(ws, 3.0):
            msg = json.loads(raw)
            if msg["op"] == "advertise":
                channels.update({c["topic"]: c for c in msg["channels"]})
            if TOPICS <= set(channels):
                break
        assert TOPICS <= set(channels)
        assert channels["/joint_states"]["schemaName"] == "foxglove.JointStates"
        assert channels["/tf"]["schemaName"] == "foxglove.FrameTransforms"
        for topic, (name, _) in (("/robot_description", mcap_schema.STRING),
                                 ("/diagnostics", mcap_schema.DIAGNOSTIC_ARRAY)):
            assert (channels[topic]["schemaName"], channels[topic]["schemaEncoding"], channels[topic]["encoding"]) \
                == (name, "ros2msg", "cdr")
        ids = {c["id"]: topic for topic, c in channels.items()}
        ws.send(json.dumps({"op": "subscribe", "subscriptions": [{"id": k, "channelId": c} for k, c in enumerate(ids)]}))
        by_sub = dict(enumerate(ids.values()))
        got: dict[str, list[bytes]] = {}
        for raw in _messages(ws, 4.0):
            if isinstance(raw, bytes) and raw[0] == 0x01:
                sub, log_time = struct.unpack_from("<IQ", raw, 1)
                got.setdefault(by_sub[sub], []).append(raw[13:])
            if all(len(got.get(t, ())) >= 3 for t in ("/joint_states", "/tf", "/armid/state")) and all(
                    got.get(t) for t in ("/armid/health", "/diagnostics", "/robot_description")):
                break
    for topic in ("/joint_states", "/tf", "/armid/state", "/armid/health", "/diagnostics", "/robot_description"):
        assert got.get(topic), f"nothing on {topic}"
    decode = {**generate_dynamic(*mcap_schema.STRING), **generate_dynamic(*mcap_schema.DIAGNOSTIC_ARRAY)}
    assert decode[mcap_schema.STRING[0]](got["/robot_description"][0]).data == frames.robot_description(model)
    diag = decode[mcap_schema.DIAGNOSTIC_ARRAY[0]](got["/diagnostics"][-1])
    names = [st.name for st in diag.status]
    assert names[0] == "armid: cycle" and [f"armid: drive {j}" for j in model.joint_names] == names[1:1 + model.n]
    cycles = {kv.key: kv.value for kv in diag.status[0].values}["cycles"]
    assert int(cycles) > 0
    states = [json.loads(p) for p in got["/armid/state"]]
    assert all(b["seq"] > a["seq"] for a, b in zip(states, states[1:]))       # in order, decimated
    truth = driver.cycle.state.q
    np.testing.assert_allclose(states[-1]["q"], truth, atol=0.01)              # the arm at rest
    assert len(states[-1]["statusword"]) == model.n and "enabled" in states[-1]
    health = json.loads(got["/armid/health"][-1])
    assert health["cycles"] > 0 and "lateness" in health
    assert bridge.bad_messages == 0 and bridge.published >= 3


def test_the_frame_transforms_chain_to_the_flange_as_the_models_kinematics_do():
    """Composing the published transforms base -> ... -> flange gives the flange pose of ident's kinematics."""
    from ident.model import dynamics

    model = load_model("generic6")
    q = np.array([0.3, -0.5, 0.8, 0.1, -0.4, 0.9])
    R, p = np.eye(3), np.zeros(3)
    chain = link_transforms(model, q)
    assert [c[:2] for c in chain][:2] == [("base_link", "link1"), ("link1", "link2")]
    assert chain[-1][1] == model.flange_frame
    for _, _, t, quat in chain:
        p = p + R @ t
        R = R @ Rotation.from_quat(quat).as_matrix()
    pose = dynamics.flange_pose(model, q[None])[0]
    np.testing.assert_allclose(p, pose[:3, 3], atol=1e-12)
    np.testing.assert_allclose(R, pose[:3, :3], atol=1e-12)


def test_catch_up_samples_read_together_keep_unique_increasing_stamps_on_the_host_clock():
    clock = SampleClock()
    device0, host0 = 5_000_000_000, 1_700_000_000_000_000_000
    msg = stream.StateMessage(6)
    stamps, hosts = [], []
    for k in range(4000):                              # 1 kHz; 6 samples in every 100 read late, together
        read = (k // 100) * 100 + 55 if 50 <= k % 100 < 56 else k
        host = host0 + read * 1_000_000 + 300_000
        msg.set_header(k, 0, device0 + k * 1_000_000, host)
        r = stream.decode_state(bytes(msg.buffer))
        stamps.append(clock.stamp(int(r["device_time_ns"]), int(r["host_time_ns"])))
        hosts.append(int(r["host_time_ns"]))
    assert len(set(hosts)) < len(hosts)                # the driver's read times repeat
    assert all(b - a == 1_000_000 for a, b in zip(stamps, stamps[1:]))   # the device's own spacing
    assert all(0 <= h - s <= 5_000_000 for s, h in zip(stamps, hosts))     # on the host clock, before the read


def test_the_docs_name_the_subprotocol_the_server_speaks_and_the_one_it_refuses(live):
    from websockets.exceptions import InvalidStatus

    _, _, bridge = live
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "stream.md").read_text()
    with connect(f"ws://127.0.0.1:{bridge.port}", subprotocols=["foxglove.websocket.v1", PROTOCOL],
                 open_timeout=10) as ws:
        assert ws.subprotocol == PROTOCOL and f"`{PROTOCOL}`" in doc
    with pytest.raises(InvalidStatus, match="400"):
        connect(f"ws://127.0.0.1:{bridge.port}", subprotocols=["foxglove.websocket.v1"], open_timeout=10)
    assert "`foxglove.websocket.v1`" in doc and "HTTP 400" in doc
    for encoding in ("protobuf", "cdr", "json"):
        assert f"| `{encoding}` |" in doc
