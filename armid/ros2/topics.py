"""What the bridge publishes, encoded once per message in ROS 2's CDR: /joint_states, /tf, /tf_static,
/robot_description and /diagnostics, from the driver's samples, model and health.

The layouts are the recordings' (firmware_bridge.mcap_schema), so a message on DDS and one in an MCAP recording are
the same bytes; the frames and the URDF are ident.model.frames', the statuses driver.diagnostics'. Stamps are the
sample's host_time_ns: UNIX time on the driver's host when it read the sample.
"""
from __future__ import annotations

import numpy as np

from driver import diagnostics
from firmware_bridge import mcap_schema
from ident.model import frames

JOINT_STATES = ("joint_states", "sensor_msgs/msg/JointState")
TF = ("/tf", "tf2_msgs/msg/TFMessage")
TF_STATIC = ("/tf_static", "tf2_msgs/msg/TFMessage")
ROBOT_DESCRIPTION = ("robot_description", "std_msgs/msg/String")
DIAGNOSTICS = ("/diagnostics", "diagnostic_msgs/msg/DiagnosticArray")


class Encoders:
    """The messages of one model: joint states and moving transforms per sample, the static transform (the flange
    on the last link), the robot description and the diagnostics of a health message."""

    def __init__(self, model, joint_names: list[str] | None = None):
        self.model = model
        self.joint_names = list(joint_names or model.joint_names)
        self.tree = frames.frame_tree(model)
        self.n = model.n
        self._joints = mcap_schema.joint_state_layout(self.joint_names)
        self._tf = mcap_schema.tf_layout(self.tree[:self.n])
        self._tf_static = mcap_schema.tf_layout(self.tree[self.n:])

    def joint_state(self, time_ns: int, q, qd, effort) -> bytes:
        rec = self._joints.record()
        rec["sec"], rec["nanosec"] = mcap_schema.split_stamp(time_ns)
        rec["position"], rec["velocity"], rec["effort"] = q, qd, effort
        return rec.tobytes()

    def tf(self, time_ns: int, q) -> bytes:
        t, r = frames.frame_transforms(self.model, np.asarray(q, dtype=float))
        return mcap_schema.encode_tf(self._tf, time_ns, t[:self.n], r[:self.n])

    def tf_static(self, time_ns: int) -> bytes:
        t, r = frames.frame_transforms(self.model, np.zeros(self.n))
        return mcap_schema.encode_tf(self._tf_static, time_ns, t[self.n:], r[self.n:])

    def robot_description(self) -> bytes:
        return mcap_schema.encode_string(frames.robot_description(self.model))

    def diagnostics(self, health: dict, time_ns: int, extra: list[dict] = ()) -> bytes:
        statuses = diagnostics.statuses(health, self.joint_names) + list(extra)
        return mcap_schema.encode_diagnostics(statuses, time_ns)
