"""The driver's live stream in Foxglove: a Foxglove WebSocket server (the `foxglove-sdk` package) fed from the
state and health topics (docs/reference/stream.md).

Channels (Foxglove's own message types where one fits, else JSON with a JSON schema):
  /joint_states   foxglove.JointStates: name, position (rad), velocity (rad/s), effort (N m) per joint
  /tf             foxglove.FrameTransforms: base_link -> link1 -> ... -> linkn -> flange (ident.model.frames), from the
                  model's joint placements and the measured angles
  /robot_description  std_msgs/msg/String (ROS 2 CDR): the model's URDF with a stick figure, the same link names;
                  with /tf, the 3D panel draws the arm moving. Sent when a client subscribes and every 10 s
  /diagnostics    diagnostic_msgs/msg/DiagnosticArray (ROS 2 CDR): the health message as typed statuses
                  (driver.diagnostics), for the Diagnostics panel
  /armid/state    JSON: the whole state message (flags decoded, currents, statuswords, error codes, seq, times)
  /armid/health   JSON: the health message as the driver publishes it once a second
  /armid/model    JSON: the model's joints, limits and frame names, sent like /robot_description

The stream comes at the cycle rate (1 kHz); the bridge publishes every `decimate`-th message (default: about
100 Hz) so that a browser keeps up; the state channel and health carry every field. Stamps and log times are
each sample's own time (SampleClock: its device_time_ns on the host's clock), unique per sample even when the
driver publishes several samples in one cycle to catch up.

The server is the SDK's: WebSocket subprotocol `foxglove.sdk.v1`; clients that offer only the older
`foxglove.websocket.v1` are refused (HTTP 400) by the SDK.
"""
from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np
import zmq

from driver import diagnostics
from firmware_bridge import mcap_schema
from firmware_bridge import stream
from firmware_bridge.runtime.log_throttle import Throttle
from ident.model import frames

STATE_SCHEMA = {
    "type": "object", "title": "armid.State",
    "properties": {"seq": {"type": "integer"}, "device_time_ns": {"type": "integer"},
                   "host_time_ns": {"type": "integer"}, "enabled": {"type": "boolean"},
                   "moving": {"type": "boolean"}, "fault": {"type": "boolean"}, "stale": {"type": "boolean"},
                   "lost_samples": {"type": "integer"}, "contact": {"type": "boolean"},
                   "collision": {"type": "boolean"},
                   **{k: {"type": "array", "items": {"type": "number"}}
                      for k in ("q", "qd", "current", "torque", "statusword", "error_code", "mode", "tau_ext")}}}
HEALTH_SCHEMA = {"type": "object", "title": "armid.Health"}
MODEL_SCHEMA = {"type": "object", "title": "armid.Model"}
MODEL_PERIOD_S = 10.0


def link_transforms(model, q: np.ndarray) -> list[tuple[str, str, np.ndarray, np.ndarray]]:
    """(parent, child, translation (3,), quaternion xyzw (4,)) of each link and of the flange (ident.model.frames)."""
    t, r = frames.frame_transforms(model, np.asarray(q, dtype=float))
    return [(parent, child, t[k], r[k]) for k, (parent, child) in enumerate(frames.frame_tree(model))]


def _ros2_channel(foxglove, topic: str, message: tuple[str, str]):
    """A channel of ROS 2 CDR messages (firmware_bridge.mcap_schema's definitions), which Foxglove decodes itself."""
    schema = foxglove.Schema(name=message[0], encoding=mcap_schema.SCHEMA_ENCODING, data=message[1].encode())
    return foxglove.Channel(topic, schema=schema, message_encoding=mcap_schema.MESSAGE_ENCODING)


class SampleClock:
    """Per-sample stamps on the host's UNIX clock (ns): the sample's device_time_ns plus the smallest
    host_time_ns - device_time_ns seen (the sample read with the least delay), taken again every window_ns so that
    it follows a device clock that drifts, and at once when the device clock jumps (a restart). Stamps strictly
    increase: samples read together (host_time_ns shared) keep their own times and order."""

    def __init__(self, window_ns: int = 10_000_000_000, jump_ns: int = 1_000_000_000):
        self.window_ns, self.jump_ns = int(window_ns), int(jump_ns)
        self._offset: int | None = None
        self._window_min = self._window_start = self._last = 0

    def stamp(self, device_ns: int, host_ns: int) -> int:
        offset = host_ns - device_ns
        if self._offset is None or abs(offset - self._offset) > self.jump_ns:
            self._offset, self._window_min, self._window_start = offset, offset, host_ns
        self._offset = min(self._offset, offset)
        self._window_min = min(self._window_min, offset)
        if host_ns - self._window_start >= self.window_ns:
            self._offset, self._window_min, self._window_start = self._window_min, offset, host_ns
        t = max(device_ns + self._offset, self._last + 1)
        self._last = t
        return t


class _Subscriptions:
    """Notes that a client subscribed (foxglove.ServerListener), so that the description goes out at once."""

    def __init__(self):
        self.new = threading.Event()

    def on_subscribe(self, client, channel) -> None:
        self.new.set()


def state_json(r, n: int) -> dict:
    flags = int(r["flags"])
    return {"seq": int(r["seq"]), "device_time_ns": int(r["device_time_ns"]), "host_time_ns": int(r["host_time_ns"]),
            "enabled": bool(flags & stream.FLAG_ENABLED), "moving": bool(flags & stream.FLAG_MOVING),
            "fault": bool(flags & stream.FLAG_FAULT), "stale": bool(flags & stream.FLAG_STALE),
            "lost_samples": stream.lost_samples(flags), "contact": bool(flags & stream.FLAG_CONTACT),
            "collision": bool(flags & stream.FLAG_COLLISION),
            **{k: np.asarray(r[k]).tolist()
               for k in ("q", "qd", "current", "torque", "statusword", "error_code", "mode", "tau_ext")}}


class Bridge:
    """Subscribe to a driver's stream and serve it to Foxglove (start(), stop()); counts of what it did."""

    def __init__(self, model, state_endpoint: str, *, host: str = "127.0.0.1", port: int = 8765, decimate: int = 10,
                 context: zmq.Context | None = None):
        import foxglove
        from foxglove.channels import FrameTransformsChannel, JointStatesChannel

        self.model, self.decimate = model, max(1, int(decimate))
        self.ctx = context or zmq.Context.instance()
        self.state_endpoint = state_endpoint
        self._subscriptions = _Subscriptions()
        self.server = foxglove.start_server(name="armid", host=host, port=port, server_listener=self._subscriptions)
        self.port = self.server.port
        self._fg = foxglove
        self.joints = JointStatesChannel("/joint_states")
        self.tf = FrameTransformsChannel("/tf")
        self.state = foxglove.Channel("/armid/state", schema=STATE_SCHEMA, message_encoding="json")
        self.health = foxglove.Channel("/armid/health", schema=HEALTH_SCHEMA, message_encoding="json")
        self.model_channel = foxglove.Channel("/armid/model", schema=MODEL_SCHEMA, message_encoding="json")
        self.description = _ros2_channel(foxglove, mcap_schema.TOPIC_ROBOT_DESCRIPTION, mcap_schema.STRING)
        self.description_cdr = mcap_schema.encode_string(frames.robot_description(model))
        self.diagnostics = _ros2_channel(foxglove, mcap_schema.TOPIC_DIAGNOSTICS, mcap_schema.DIAGNOSTIC_ARRAY)
        self.clock = SampleClock()
        self.published = self.received = self.bad_messages = 0
        self._bad_log = Throttle(logging.getLogger(__name__), logging.WARNING, 10.0)
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

    def _bad(self, why: str) -> None:
        """An undecodable message: counted, logged rate-limited, dropped."""
        self.bad_messages += 1
        self._bad_log.hit("message dropped: %s", why)

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
                if time.monotonic() >= next_model or self._subscriptions.new.is_set():
                    self._subscriptions.new.clear()
                    self.model_channel.log(self._model_message())
                    self.description.log(self.description_cdr)
                    next_model = time.monotonic() + MODEL_PERIOD_S
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 2:
                    self._bad(f"{len(frames)} frames, expected 2")
                    continue
                topic, payload = frames
                if topic == stream.TOPIC_HEALTH:
                    try:
                        health = json.loads(payload)
                        statuses = diagnostics.statuses(health, list(self.model.joint_names))
                    except (ValueError, TypeError) as exc:
                        self._bad(f"health message: {exc}")
                        continue
                    self.health.log(health)
                    self.diagnostics.log(mcap_schema.encode_diagnostics(statuses, time.time_ns()))
                    continue
                try:
                    r = stream.decode_state(payload)
                except stream.StreamDecodeError as exc:
                    self._bad(str(exc))
                    continue
                self.received += 1
                if self.received % self.decimate:
                    continue
                ns = self.clock.stamp(int(r["device_time_ns"]), int(r["host_time_ns"]))
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
