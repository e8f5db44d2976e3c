"""The bridge's std_srvs/srv/Trigger services (enable, disable, quick_stop) and the forward command controllers'
servo topic, called by a DDS participant with types generated from the ROS 2 definitions (tests/ros2_peer.py): the
drives follow, a servo stream moves the simulated arm through the driver's servo session, and a setpoint beyond the
velocity limit is refused by the driver's check before it moves the arm."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("cyclonedds")
pytest.importorskip("rosbags")

import ros2_peer  # noqa: E402
from armid.client import ArmClient  # noqa: E402
from ident.model import load_model  # noqa: E402
from local_driver import local_driver  # noqa: E402
from waiting import wait_until as _wait  # noqa: E402

ros2_peer.use_loopback()
from armid.ros2.bridge import Ros2Bridge  # noqa: E402
from cyclonedds.domain import DomainParticipant  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.sub import DataReader  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402


def wait_until(predicate, timeout: float, what: str) -> None:
    assert _wait(predicate, timeout, 0.01), f"waited {timeout:g} s for {what}"


class TriggerClient:
    """A std_srvs/srv/Trigger client as rmw_cyclonedds lays one out."""

    def __init__(self, dp, store, name: str):
        req, rep = (ros2_peer.idl_class(store, f"std_srvs/srv/Trigger_{p}", True) for p in ("Request", "Response"))
        qos = ros2_peer._qos(True, False, 10)
        self.writer = DataWriter(dp, Topic(dp, f"rq{name}Request", req, qos=qos), qos=qos)
        self.reader = DataReader(dp, Topic(dp, f"rr{name}Reply", rep, qos=qos), qos=qos)
        self.req, self.guid, self.seq = req, int.from_bytes(os.urandom(7), "little"), 0

    def __call__(self, timeout: float = 30.0):
        wait_until(lambda: self.writer.get_matched_subscriptions() and self.reader.get_matched_publications(), 20.0,
                   "the service to be discovered")
        self.seq += 1
        self.writer.write(self.req(guid=self.guid, seq=self.seq))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for r in self.reader.take(8):
                if (r.guid, r.seq) == (self.guid, self.seq):
                    return r
            time.sleep(0.01)
        raise AssertionError("no reply")


@pytest.fixture
def rig():
    model = load_model("generic6")
    store = ros2_peer.typestore()
    with ros2_peer.own_domain() as domain, local_driver(model, seed=6) as (d, sim):
        watcher = ArmClient(d.bound["state"], d.bound["commands"])
        bridge = Ros2Bridge(ArmClient(d.bound["state"], d.bound["commands"]), model, namespace="arm1",
                            domain_id=domain).start()
        dp = DomainParticipant(domain)
        try:
            yield model, store, dp, bridge, watcher
        finally:
            bridge.stop()
            watcher.close()
        assert bridge.errors == []


def test_trigger_services_enable_quick_stop_and_disable_the_drives(rig):
    model, store, dp, bridge, watcher = rig
    enable, quick_stop, disable = (TriggerClient(dp, store, f"/arm1/{n}") for n in ("enable", "quick_stop", "disable"))
    r = enable()
    assert r.success and watcher.status()["enabled"]
    r = quick_stop()
    assert r.success
    wait_until(lambda: not watcher.status()["enabled"], 10.0, "the quick stop")
    assert enable().success
    assert disable().success
    wait_until(lambda: not watcher.status()["enabled"], 10.0, "the drives to be disabled")


def test_a_servo_stream_moves_the_arm_and_a_jump_is_refused(rig):
    model, store, dp, bridge, watcher = rig
    watcher.enable()
    Array = ros2_peer.idl_class(store, "std_msgs/msg/Float64MultiArray")
    qos = ros2_peer._qos(True, False, 1)
    writer = DataWriter(dp, Topic(dp, "rt/arm1/forward_position_controller/commands", Array, qos=qos), qos=qos)
    wait_until(lambda: writer.get_matched_subscriptions(), 20.0, "the servo topic to be discovered")
    q0 = watcher.latest().q.copy()
    t0 = time.monotonic()
    while (s := time.monotonic() - t0) < 1.5:                 # 0.05 rad in 1 s on a smooth ramp, then hold
        x = min(s, 1.0)
        writer.write(Array(data=list(q0 + 0.05 * (10 * x**3 - 15 * x**4 + 6 * x**5))))
        time.sleep(0.005)
    np.testing.assert_allclose(watcher.latest().q, q0 + 0.05, atol=3e-3)
    assert bridge.commands.servo_sent > 100 and bridge.commands.servo_active()
    jump = q0 + 0.05
    jump[1] += 0.5                                            # 0.5 rad in one step: far over the velocity limit
    writer.write(Array(data=list(jump)))
    wait_until(lambda: "refused: joint j2" in str((watcher.status()["servo"] or {}).get("ended")), 10.0,
               "the driver to refuse the setpoint")
    time.sleep(0.3)
    assert abs(watcher.latest().q[1] - (q0[1] + 0.05)) < 3e-3
    writer.write(Array(data=[0.0, 1.0]))                      # the wrong number of values: refused by the bridge
    wait_until(lambda: "expected 6 finite values" in bridge.commands.servo_last_error, 10.0, "the refusal")
