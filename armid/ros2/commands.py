"""The commands a ROS 2 graph gives the arm through the bridge: std_srvs/srv/Trigger services `enable`, `disable`
and `quick_stop`, the servo topics of ros2_control's forward command controllers, and the trajectory action
(armid.ros2.trajectory_action). Everything goes through armid.client, so the driver checks it as any client's
command: motions against the limits before they start, servo setpoints on arrival.

Servo: std_msgs/msg/Float64MultiArray on `forward_position_controller/commands` (rad) or
`forward_effort_controller/commands` (N m), one value per joint in the driver's order, as the forward command
controllers take them. The first command starts a servo session (ArmClient.servo) in that mode; each command is a
setpoint for the time its publisher wrote it (the DDS source timestamp); `servo_idle_s` without a command ends the
session (servo_stop: the drives hold, enabled). The driver's own setpoint timeout (twice that) quick-stops the drives
should the bridge itself stop talking.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from armid.client import ClientError
from armid.ros2 import dds

log = logging.getLogger(__name__)
POLL_S = 0.005                  # s between looks at the request readers
SERVO_TOPICS = {"position": "forward_position_controller/commands", "torque": "forward_effort_controller/commands"}
TRIGGERS = ("enable", "disable", "quick_stop")


class Commands:
    """The bridge's service servers, servo readers and action server, served by run() in one thread; slow work
    (a wait for the drives, a goal's planning and execution) goes to worker threads so that a cancel or a quick
    stop is answered at once."""

    def __init__(self, bridge, servo_idle_s: float = 0.5):
        from armid.ros2.trajectory_action import TrajectoryAction

        self.bridge, self.client = bridge, bridge.client
        p, types = bridge.participant, bridge.types
        request, response = types.service("std_srvs/srv/Trigger")
        self.triggers = {name: dds.Service(p, bridge.name(name), request, response) for name in TRIGGERS}
        array = types.message("std_msgs/msg/Float64MultiArray")
        self.servo_readers = {mode: dds.Reader(p, dds.topic_name(bridge.name(topic)), array, dds.SENSOR)
                              for mode, topic in SERVO_TOPICS.items()}
        self.servo_idle_s = float(servo_idle_s)
        self.servo = None
        self.servo_refused = self.servo_sent = 0
        self.servo_last_error = ""
        self._last_servo = 0.0
        self.workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="armid-ros2-worker")
        self.action = TrajectoryAction(bridge, self.workers)
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                for name, service in self.triggers.items():
                    for request in service.take():
                        self.workers.submit(self._trigger, name, service, request)
                self._serve_servo()
                self.action.poll()
                time.sleep(POLL_S)
        finally:
            self._end_servo("the bridge stops")

    def stop(self) -> None:
        self._stop.set()
        self.action.shutdown()
        self.workers.shutdown(wait=True, cancel_futures=True)

    # -- std_srvs/Trigger ------------------------------------------------------------------------------------
    def _trigger(self, name: str, service: dds.Service, request) -> None:
        try:
            if name == "enable":
                self.client.enable(wait=True)
                message = "drives enabled"
            elif name == "disable":
                self._end_servo("disable")
                self.client.disable()
                message = "drives disabled"
            else:
                self.client.quick_stop()
                message = "quick stop requested"
            service.reply(request, success=True, message=message)
        except ClientError as exc:
            service.reply(request, success=False, message=str(exc))

    # -- servo -------------------------------------------------------------------------------------------------
    def _serve_servo(self) -> None:
        for mode, reader in self.servo_readers.items():
            for data, stamp_ns in reader.take_with_times():
                try:
                    values = np.asarray(reader.data_type.deserialize(data).data, dtype=float)
                except Exception as exc:                         # noqa: BLE001 -- a peer's bad bytes
                    self._servo_refused(f"{reader.topic.name}: undecodable message ({exc})")
                    continue
                self._servo_command(mode, values, stamp_ns)
        if self.servo is not None and time.monotonic() - self._last_servo > self.servo_idle_s:
            self._end_servo(f"no servo command for {self.servo_idle_s:g} s")

    def _servo_command(self, mode: str, values: np.ndarray, stamp_ns: int) -> None:
        n = self.bridge.model.n
        if values.shape != (n,) or not np.all(np.isfinite(values)):
            self._servo_refused(f"{SERVO_TOPICS[mode]}: expected {n} finite values in the driver's joint order "
                                f"{list(self.bridge.model.joint_names)}, got {values.tolist()[:12]}")
            return
        with self._lock:
            if self.servo is not None and self.servo.mode_name != mode:
                self._end_servo_locked(f"switching to {mode}")
            if self.servo is None:
                if self.action.busy():
                    self._servo_refused(f"{SERVO_TOPICS[mode]}: a trajectory goal is running")
                    return
                rate = float(self.client.status()["rate_hz"])
                try:
                    self.servo = self.client.servo(mode, timeout_cycles=max(1, math.ceil(2 * self.servo_idle_s * rate)))
                except ClientError as exc:
                    self._servo_refused(str(exc))
                    return
            self._last_servo = time.monotonic()
            if self.servo.send(values, t_ns=stamp_ns or None):
                self.servo_sent += 1

    def _servo_refused(self, why: str) -> None:
        self.servo_refused += 1
        self.servo_last_error = why
        log.warning("servo command refused: %s", why)

    def servo_active(self) -> bool:
        return self.servo is not None

    def _end_servo(self, why: str) -> None:
        with self._lock:
            self._end_servo_locked(why)

    def _end_servo_locked(self, why: str) -> None:
        if self.servo is None:
            return
        stream, self.servo = self.servo, None
        try:
            reply = stream.stop()
            last = (reply.get("servo") or {}).get("last_error") if isinstance(reply.get("servo"), dict) else None
            if last:
                self.servo_last_error = str(last)
        except ClientError as exc:
            self.servo_last_error = f"servo_stop ({why}): {exc}"
