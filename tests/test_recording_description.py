"""A recording carries what a 3D view and a diagnostics panel need: the robot description once, the links'
transforms at the /tf rate, and health as diagnostic_msgs/DiagnosticArray. Each is checked byte for byte against
mcap-ros2-support's generic encoder and decoded back by its decoder."""
from __future__ import annotations

import io

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap_ros2.writer import Writer as Ros2Writer
from scipy.spatial.transform import Rotation

from driver import diagnostics
from firmware_bridge import mcap_schema as schema
from driver.recorder import McapStateWriter
from firmware_bridge import stream
from ident.model import dynamics, frames
from ident.model import load_model
from test_recorder import decoded_by_mcap_ros2, payload

HEALTH = {"time": 1.7e9, "uptime_s": 12.5, "cycle_rate_hz": 1000.0, "sample_rate_hz": 999.0, "cycles": 12500,
          "fresh_samples": 12490, "stale_cycles": 10, "overruns": 0, "lateness": {"p50_us": 20.0, "p99_us": 80.0},
          "fault": None, "enabled": True, "moving": False, "link": {"bad_frames": 0, "frames": 25000},
          "drive_states": ["OPERATION_ENABLED"] * 6, "recording": None, "realtime": {"policy": "other"},
          "samples_lost": 0, "commands": {"requests": 5, "rejected": 2}, "servo": None,
          "events": [{"time": 1.7e9, "text": "enabled"}]}


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _write(path, model, payloads, healths=()):
    writer = McapStateWriter(path, model=model, rate_hz=1000.0, tf_rate_hz=100.0, chunk_seconds=0.01)
    for p in payloads:
        rec = stream.decode_state(p)
        writer.write_state(p, int(rec["n"]), int(rec["seq"]), int(rec["host_time_ns"]))
    for k, h in enumerate(healths):
        writer.write_health(h, 1_700_000_000_000_000_000 + k)
    writer.close()


def _raw(path_or_buf) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {}
    for _, channel, message in make_reader(path_or_buf).iter_messages(log_time_order=False):
        out.setdefault(channel.topic, []).append(message.data)
    return out


def test_the_description_and_the_transforms_are_what_mcap_ros2_writes_and_follow_the_arm(model, tmp_path):
    payloads = [payload(6, seq) for seq in range(35)]
    _write(tmp_path / "r.mcap", model, payloads)
    ours = _raw(open(tmp_path / "r.mcap", "rb"))
    assert len(ours[schema.TOPIC_ROBOT_DESCRIPTION]) == 1
    assert len(ours[schema.TOPIC_TF]) == 4                       # seq 0, 10, 20, 30: 100 Hz of a 1 kHz stream
    buf = io.BytesIO()
    ref = Ros2Writer(buf)
    text, tf = ref.register_msgdef(*schema.STRING), ref.register_msgdef(*schema.TF_MESSAGE)
    ref.write_message(schema.TOPIC_ROBOT_DESCRIPTION, text, {"data": frames.robot_description(model)})
    states = [stream.decode_state(p) for p in payloads if stream.decode_state(p)["seq"] % 10 == 0]
    for s in states:
        sec, nsec = divmod(int(s["host_time_ns"]), 10**9)
        t, r = frames.frame_transforms(model, s["q"])
        ref.write_message(schema.TOPIC_TF, tf, {"transforms": [
            {"header": {"stamp": {"sec": sec, "nanosec": nsec}, "frame_id": parent}, "child_frame_id": child,
             "transform": {"translation": dict(zip("xyz", t[k])), "rotation": dict(zip("xyzw", r[k]))}}
            for k, (parent, child) in enumerate(frames.frame_tree(model))]})
    ref.finish()
    buf.seek(0)
    theirs = _raw(buf)
    assert ours[schema.TOPIC_ROBOT_DESCRIPTION] == theirs[schema.TOPIC_ROBOT_DESCRIPTION]
    assert ours[schema.TOPIC_TF] == theirs[schema.TOPIC_TF]
    # decoded, the transforms compose to the flange pose of the recorded joint angles
    decoded = decoded_by_mcap_ros2(tmp_path / "r.mcap")
    assert decoded[schema.TOPIC_ROBOT_DESCRIPTION][0][1].data.startswith("<?xml")
    for (message, ros), s in zip(decoded[schema.TOPIC_TF], states):
        assert message.log_time == int(s["host_time_ns"])
        T = np.eye(4)
        for tr in ros.transforms:
            step = np.eye(4)
            r = tr.transform.rotation
            step[:3, :3] = Rotation.from_quat([r.x, r.y, r.z, r.w]).as_matrix()
            step[:3, 3] = [tr.transform.translation.x, tr.transform.translation.y, tr.transform.translation.z]
            T = T @ step
        assert ros.transforms[-1].child_frame_id == model.flange_frame
        np.testing.assert_allclose(T, dynamics.flange_pose(model, s["q"][None])[0], atol=1e-12)


def test_without_a_model_there_is_no_description_and_no_tf(tmp_path):
    writer = McapStateWriter(tmp_path / "r.mcap", rate_hz=1000.0)
    p = payload(6, 0)
    writer.write_state(p, 6, 0, int(stream.decode_state(p)["host_time_ns"]))
    writer.close()
    assert set(_raw(open(tmp_path / "r.mcap", "rb"))) == {schema.TOPIC_JOINT_STATES, schema.TOPIC_MOTOR_CURRENTS,
                                                          schema.TOPIC_EXTERNAL_TORQUE, schema.TOPIC_STATE}


def test_health_is_recorded_as_a_diagnostic_array_that_keeps_every_field(model, tmp_path):
    faulted = {**HEALTH, "fault": "drive 3: following error (0x8611)",
               "drive_states": ["OPERATION_ENABLED"] * 2 + ["FAULT"] + ["SWITCHED_ON"] * 3}
    _write(tmp_path / "r.mcap", model, [payload(6, 0)], [HEALTH, faulted])
    ours = _raw(open(tmp_path / "r.mcap", "rb"))[schema.TOPIC_DIAGNOSTICS]
    buf = io.BytesIO()
    ref = Ros2Writer(buf)
    arr = ref.register_msgdef(*schema.DIAGNOSTIC_ARRAY)
    for k, h in enumerate((HEALTH, faulted)):
        sec, nsec = divmod(1_700_000_000_000_000_000 + k, 10**9)
        ref.write_message(schema.TOPIC_DIAGNOSTICS, arr, {
            "header": {"stamp": {"sec": sec, "nanosec": nsec}, "frame_id": ""},
            "status": [{"level": st["level"], "name": st["name"], "message": st["message"],
                        "hardware_id": st["hardware_id"], "values": [{"key": a, "value": b} for a, b in st["values"]]}
                       for st in diagnostics.statuses(h, list(model.joint_names))]})
    ref.finish()
    buf.seek(0)
    assert ours == _raw(buf)[schema.TOPIC_DIAGNOSTICS]
    (_, calm), (_, bad) = decoded_by_mcap_ros2(tmp_path / "r.mcap")[schema.TOPIC_DIAGNOSTICS]
    levels = {s.name: s.level for s in calm.status}
    assert set(levels.values()) - {0, 1} == set()
    assert levels["armid: commands"] == diagnostics.WARN                 # 2 rejected requests were counted
    assert levels["armid: cycle"] == diagnostics.OK and levels[f"armid: drive {model.joint_names[2]}"] == 0
    bad_levels = {s.name: s.level for s in bad.status}
    assert bad_levels["armid: cycle"] == diagnostics.ERROR and bad_levels[f"armid: drive {model.joint_names[2]}"] == 2
    assert next(s for s in bad.status if s.name == "armid: cycle").message.endswith("(0x8611)")
    # keys as dotted paths of the health message: a section's keys under its name, the cycle's at the top
    values = {(kv.key if s.name == "armid: cycle" else f"{s.name[len('armid: '):]}.{kv.key}"): kv.value
              for s in calm.status if not s.name.startswith("armid: drive") for kv in s.values}
    assert values["lateness.p99_us"] == "80" and values["link.frames"] == "25000" and values["event.0"] == "enabled"
    flat = {k for k, _ in diagnostics.flatten(HEALTH)} - {"events", "drive_states", "recording", "servo", "time"}
    assert flat <= set(values), flat - set(values)          # every health field is a key somewhere


def test_fewer_fresh_samples_than_cycles_is_a_warning():
    got = diagnostics.statuses({**HEALTH, "sample_rate_hz": 800.0}, ["a"] * 6)
    assert got[0]["level"] == diagnostics.WARN and "800 fresh samples/s" in got[0]["message"]
    with pytest.raises(TypeError):
        diagnostics.statuses(["not", "a", "dict"], [])


def test_a_healthy_drivers_real_health_gives_no_warning_outside_the_cycle(model):
    """The health message of a real driver (the simulator in its process), with a servo session ended: its
    settings (timeout_cycles, an empty list of refused real-time settings) are no trouble counters."""
    import time

    from local_driver import local_driver
    from waiting import wait_until

    with local_driver(model, seed=1) as (d, _):
        d.cycle.submit(d.cycle.enable)
        assert wait_until(lambda: d.cycle.enabled(), 20)
        d.start_servo("position", 50, 2)
        d.cycle.submit(lambda: d.cycle.end_servo("servo_stop requested"))
        time.sleep(0.2)
        health = d.health(1.0, {})
    assert health["servo"]["timeout_cycles"] == 50 and health["realtime"]["refused"] == []
    got = {st["name"]: st for st in diagnostics.statuses(health, list(model.joint_names))}
    for name in ("armid: link", "armid: commands", "armid: realtime", "armid: servo"):
        assert (got[name]["level"], got[name]["message"]) == (diagnostics.OK, "ok"), got[name]
    assert all(got[f"armid: drive {j}"]["level"] == diagnostics.OK for j in model.joint_names)
    # the same sections with trouble counted: a refused real-time setting, a malformed setpoint, a link down
    health["realtime"]["refused"] = ["SCHED_FIFO: Operation not permitted"]
    health["servo"]["malformed"] = 3
    health["link"].update(connected=False, down_reason="pty closed")
    got = {st["name"]: st for st in diagnostics.statuses(health, list(model.joint_names))}
    assert (got["armid: realtime"]["level"], got["armid: realtime"]["message"]) == (diagnostics.WARN, "counted: refused")
    assert (got["armid: servo"]["level"], got["armid: servo"]["message"]) == (diagnostics.WARN, "counted: malformed")
    assert (got["armid: link"]["level"], got["armid: link"]["message"]) == (diagnostics.ERROR, "down: pty closed")


def test_a_health_message_of_odd_shape_gives_fewer_statuses_and_the_recorder_goes_on():
    odd = {**HEALTH, "drive_states": 5, "events": 3, "link": "not a dict"}
    names = [st["name"] for st in diagnostics.statuses(odd, ["a"] * 6)]
    assert names[0] == "armid: cycle" and not any(n.startswith("armid: drive") for n in names)
