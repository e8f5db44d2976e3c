"""The driver's live stream in Foxglove: a Foxglove WebSocket server (the `foxglove-sdk` package) fed from the
state and health topics (docs/reference/stream.md).

Channels (Foxglove's own message types where one fits, else JSON with a JSON schema):
  /joint_states   foxglove.JointStates: name, position (rad), velocity (rad/s), effort (N m) per joint
  /tf             foxglove.FrameTransforms: base -> link 1 -> ... -> link n -> flange, from the model's joint
                  placements and the measured angles, so the 3D panel shows the arm's frames moving
  /armid/state    JSON: the whole state message (flags decoded, currents, statuswords, error codes, seq, times)
  /armid/health   JSON: the health message as the driver publishes it once a second
  /armid/model    JSON: the model's joints, limits and frame names, published on connect and every 10 s

The stream comes at the cycle rate (1 kHz); the bridge publishes every `decimate`-th message (default: about
100 Hz) so that a browser keeps up; the state channel and health carry every field.
"""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import zmq
from scipy.spatial.transform import Rotation

from firmware_bridge import stream

STATE_SCHEMA = {
    "type": "object", "title": "armid.State",
    "properties": {"seq": {"type": "integer"}, "device_time_ns": {"type": "integer"},
                   "host_time_ns": {"type": "integer"}, "enabled": {"type": "boolean"},
                   "moving": {"type": "boolean"}, "fault": {"type": "boolean"}, "stale": {"type": "boolean"},
                   "lost_samples": {"type": "integer"},
                   **{k: {"type": "array", "items": {"type": "number"}}
                      for k in ("q", "qd", "current", "torque", "statusword", "error_code", "mode")}}}
HEALTH_SCHEMA = {"type": "object", "title": "armid.Health"}
MODEL_SCHEMA = {"type": "object", "title": "armid.Model"}
MODEL_PERIOD_S = 10.0


def link_transforms(model, q: np.ndarray) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(parent, child, translation (3,), quaternion xyzw (4,)) of each joint and of the flange: frame j's
    placement in frame j-1, turned (revolute) or moved (prismatic) by q_j about its axis."""
    names = ["base", *model.joint_names]
    out = []
    for j in range(model.n):
        R, p = model.placement_R[j], model.placement_p[j]
        if model.joint_type[j] == 0:
            R = R @ Rotation.from_rotvec(model.axis[j] * q[j]).as_matrix()
        else:
            p = p + R @ (model.axis[j] * q[j])
        out.append((names[j], names[j + 1], p, Rotation.from_matrix(R).as_quat()))
    out.append((names[-1], model.flange_frame, model.flange_p, Rotation.from_matrix(model.flange_R).as_quat()))
    return out


def state_json(r, n: int) -> dict:
    flags = int(r["flags"])
    return {"seq": int(r["seq"]), "device_time_ns": int(r["device_time_ns"]), "host_time_ns": int(r["host_time_ns"]),
            "enabled": bool(flags & stream.FLAG_ENABLED), "moving": bool(flags & stream.FLAG_MOVING),
            "fault": bool(flags & stream.FLAG_FAULT), "stale": bool(flags & stream.FLAG_STALE),
            "lost_samples": stream.lost_samples(flags),
            **{k: np.asarray(r[k]).tolist() for k in ("q", "qd", "current", "torque", "statusword", "error_code", "mode")}}


class Bridge:
    """Subscribe to a driver's stream and serve it to Foxglove (start(), stop()); counts of what it did."""

    def __init__(self, model, state_endpoint: str, *, host: str = "127.0.0.1", port: int = 8765, decimate: int = 10,
                 context: zmq.Context | None = None):
        import foxglove
        from foxglove.channels import FrameTransformsChannel, JointStatesChannel

        self.model, self.decimate = model, max(1, int(decimate))
        self.ctx = context or zmq.Context.instance()
        self.state_endpoint = state_endpoint
        self.server = foxglove.start_server(name="armid", host=host, port=port)
        self.port = self.server.port
        self._fg = foxglove
        self.joints = JointStatesChannel("/joint_states")
        self.tf = FrameTransformsChannel("/tf")
        self.state = foxglove.Channel("/armid/state", schema=STATE_SCHEMA, message_encoding="json")
        self.health = foxglove.Channel("/armid/health", schema=HEALTH_SCHEMA, message_encoding="json")
        self.model_channel = foxglove.Channel("/armid/model", schema=MODEL_SCHEMA, message_encoding="json")
        self.published = self.received = self.bad_messages = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="armid-foxglove", daemon=True)

    def start(self) -> "Bridge":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.server.stop()

    def _model_message(self) -> dict:
        m = self.model
        return {"name": m.name, "joints": list(m.joint_names), "flange_frame": m.flange_frame,
                "q_min": m.q_min.tolist(), "q_max": m.q_max.tolist(), "qd_max": m.qd_max.tolist(),
                "tau_max": m.tau_max.tolist()}

    def _run(self) -> None:
        from foxglove.messages import (FrameTransform, FrameTransforms, JointState, JointStates, Quaternion,
                                       Timestamp, Vector3)

        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 10_000)
        sub.connect(self.state_endpoint)
        for topic in (stream.TOPIC_STATE, stream.TOPIC_HEALTH):
            sub.setsockopt(zmq.SUBSCRIBE, topic)
        next_model = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_model:
                    self.model_channel.log(self._model_message())
                    next_model = time.monotonic() + MODEL_PERIOD_S
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 2:
                    self.bad_messages += 1
                    continue
                topic, payload = frames
                if topic == stream.TOPIC_HEALTH:
                    try:
                        self.health.log(json.loads(payload))
                    except ValueError:
                        self.bad_messages += 1
                    continue
                try:
                    r = stream.decode_state(payload)
                except stream.StreamDecodeError:
                    self.bad_messages += 1
                    continue
                self.received += 1
                if self.received % self.decimate:
                    continue
                ns = int(r["host_time_ns"])
                stamp = Timestamp(sec=ns // 1_000_000_000, nsec=ns % 1_000_000_000)
                q, qd, tau = (np.asarray(r[k], dtype=float) for k in ("q", "qd", "torque"))
                self.joints.log(JointStates(timestamp=stamp, joints=[
                    JointState(name=name, position=float(q[j]), velocity=float(qd[j]), effort=float(tau[j]))
                    for j, name in enumerate(self.model.joint_names)]), log_time=ns)
                self.tf.log(FrameTransforms(transforms=[
                    FrameTransform(timestamp=stamp, parent_frame_id=parent, child_frame_id=child,
                                   translation=Vector3(x=float(p[0]), y=float(p[1]), z=float(p[2])),
                                   rotation=Quaternion(x=float(x[0]), y=float(x[1]), z=float(x[2]), w=float(x[3])))
                    for parent, child, p, x in link_transforms(self.model, q)]), log_time=ns)
                self.state.log(state_json(r, self.model.n), log_time=ns)
                self.published += 1
        finally:
            sub.close(0)
