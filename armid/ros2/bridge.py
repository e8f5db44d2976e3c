"""`armid ros2`: a running driver as a ROS 2 node would show it, on plain DDS (Cyclone DDS), without ROS installed.

    from armid.client import ArmClient
    from armid.ros2.bridge import Ros2Bridge

    bridge = Ros2Bridge(ArmClient(state, commands), model, namespace="arm1", domain_id=0, rate_hz=100).start()
    ...
    bridge.stop()                                       # stops its threads, leaves the domain, closes the client

Published (docs/guides/ros2.md), names under the namespace unless absolute:
  joint_states        sensor_msgs/msg/JointState      reliable, volatile, keep last 10; every k-th sample
  /tf                 tf2_msgs/msg/TFMessage          reliable, volatile, keep last 100; with each joint state
  /tf_static          tf2_msgs/msg/TFMessage          reliable, transient local, keep last 1; the flange, once
  robot_description   std_msgs/msg/String             reliable, transient local, keep last 1; the model's URDF
  /diagnostics        diagnostic_msgs/msg/DiagnosticArray  reliable, volatile, keep last 10; each health message

The bridge reads the stream in one thread (ArmClient.on_sample) and the health in another; the commands
(armid.ros2.commands) run in a third, so a goal being planned never delays /joint_states.
"""
from __future__ import annotations

import logging
import threading
import time

from cyclonedds.domain import DomainParticipant

from armid.client import ArmClient, ClientError, Sample
from armid.ros2 import dds
from armid.ros2 import topics
from armid.ros2.idl_types import Registry
from driver import diagnostics
from firmware_bridge.runtime.errors import InputError

log = logging.getLogger(__name__)
MAX_RATE_HZ = 10_000.0
HEALTH_WAIT_S = 2.0


class Ros2Bridge:
    """The driver's stream and commands as ROS 2 topics, services and an action (start(), stop()).

    Parameters
    ----------
    client : ArmClient
        Connected to the driver; the bridge owns it from start() and closes it in stop().
    model : ident.model.Model
        The model the driver runs (its joint names must be the driver's).
    namespace : str
        The node's namespace ('' or e.g. 'arm1'); relative names go under it.
    domain_id : int
        The DDS domain (ROS_DOMAIN_ID), 0..232.
    rate_hz : float
        /joint_states and /tf rate, at most the stream's: every round(stream rate / rate_hz)-th sample.
    controller : str
        The trajectory action is `<namespace>/<controller>/follow_joint_trajectory`.
    """

    def __init__(self, client: ArmClient, model, *, namespace: str = "", domain_id: int = 0, rate_hz: float = 100.0,
                 controller: str = "armid_controller", feedback_hz: float = 20.0):
        if not (isinstance(rate_hz, (int, float)) and 0 < rate_hz <= MAX_RATE_HZ):
            raise InputError(f"rate {rate_hz!r}: expected 0 < Hz <= {MAX_RATE_HZ:g}")
        if not (isinstance(feedback_hz, (int, float)) and 0 < feedback_hz <= 1000):
            raise InputError(f"feedback rate {feedback_hz!r}: expected 0 < Hz <= 1000")
        self.client, self.model = client, model
        self.namespace = dds.normalize_namespace(namespace)
        self.controller = dds.normalize_namespace(controller).lstrip("/")
        if not self.controller:
            raise InputError("controller: expected a name such as armid_controller")
        self.domain_id = dds.check_domain_id(domain_id)
        self.rate_hz, self.feedback_hz = float(rate_hz), float(feedback_hz)
        self.types = Registry()
        self.encoders = topics.Encoders(model)
        self.published = self.diagnostics_published = 0
        self.decimate = 1
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.participant: DomainParticipant | None = None
        self.writers: dict[str, dds.Writer] = {}
        self.commands = None

    def name(self, ros_name: str) -> str:
        """The fully qualified ROS name of a topic, service or action of this bridge."""
        return dds.qualify(ros_name, self.namespace)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> "Ros2Bridge":
        status = self.client.status()
        joints = list(status.get("joints", []))
        if joints != list(self.model.joint_names):
            raise InputError(f"model {self.model.name}: joints {list(self.model.joint_names)} differ from the "
                             f"driver's {joints} (give the model file the driver runs)")
        stream_hz = float(status["rate_hz"])
        self.decimate = max(1, round(stream_hz / self.rate_hz))
        self.participant = DomainParticipant(self.domain_id)
        self._writer("joint_states", *topics.JOINT_STATES, dds.DEFAULT)
        self._writer("tf", *topics.TF, dds.TF)
        self._writer("tf_static", *topics.TF_STATIC, dds.LATCHED)
        self._writer("robot_description", *topics.ROBOT_DESCRIPTION, dds.LATCHED)
        self._writer("diagnostics", *topics.DIAGNOSTICS, dds.DEFAULT)
        now = time.time_ns()
        self.writers["robot_description"].write(self.encoders.robot_description(), now)
        self.writers["tf_static"].write(self.encoders.tf_static(now), now)
        from armid.ros2.commands import Commands

        self.commands = Commands(self)
        self._threads.append(self.client.on_sample(self._on_sample))
        for target, name in ((self._health_loop, "armid-ros2-health"), (self.commands.run, "armid-ros2-commands")):
            thread = threading.Thread(target=lambda f=target: self._guard(f), name=name, daemon=True)
            thread.error = None
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop the threads (within a few hundred ms), end a servo session, leave the domain, close the client."""
        self._stop.set()
        if self.commands is not None:
            self.commands.stop()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(5.0)
        self.client.close()
        if self.participant is not None:
            self.participant = None                     # its entities are deleted with it (garbage collected)
            self.writers.clear()

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions that ended one of the bridge's threads (none while it runs well)."""
        return [t.error for t in self._threads if getattr(t, "error", None) is not None]

    def _guard(self, target) -> None:
        try:
            target()
        except Exception as exc:                                            # noqa: BLE001 -- kept, logged
            threading.current_thread().error = exc
            log.exception("armid ros2: %s stopped", threading.current_thread().name)

    def _writer(self, key: str, ros_name: str, type_name: str, profile: dds.Profile) -> dds.Writer:
        self.writers[key] = dds.Writer(self.participant, dds.topic_name(self.name(ros_name)),
                                       self.types.message(type_name), profile)
        return self.writers[key]

    # -- the stream ---------------------------------------------------------------------------------------------
    def _on_sample(self, s: Sample) -> None:
        if s.seq % self.decimate:
            return
        t = s.host_time_ns
        self.writers["joint_states"].write(self.encoders.joint_state(t, s.q, s.qd, s.torque), t)
        self.writers["tf"].write(self.encoders.tf(t, s.q), t)
        self.published += 1

    def _health_loop(self) -> None:
        while not self._stop.is_set():
            try:
                health = self.client.health(timeout_s=HEALTH_WAIT_S)
            except ClientError:
                health = {"fault": "driver not answering: no health message within "
                                   f"{HEALTH_WAIT_S:g} s"}
            stamp = int(float(health.get("time", time.time())) * 1e9)
            self.writers["diagnostics"].write(self.encoders.diagnostics(health, stamp, [self.bridge_status()]), stamp)
            self.diagnostics_published += 1

    def bridge_status(self) -> dict:
        """The bridge's own diagnostic status: what it lost or could not decode (WARN when the stream lost
        messages on the way to it)."""
        c = self.client
        level = diagnostics.WARN if c.seq_gaps or c.bad_messages else diagnostics.OK
        return {"level": level, "name": "armid: ros2 bridge", "hardware_id": "armid",
                "message": "messages lost between the driver and the bridge" if c.seq_gaps else "OK",
                "values": [("seq_gaps", str(c.seq_gaps)), ("lost_samples", str(c.lost_samples)),
                           ("bad_messages", str(c.bad_messages)), ("published", str(self.published)),
                           ("decimate", str(self.decimate)), ("domain_id", str(self.domain_id)),
                           ("namespace", self.namespace or "/")]}
