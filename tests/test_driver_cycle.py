"""The driver's cycle against the real simulator, stepped in lockstep by the `sim` transport (one
simulator cycle per driver cycle): the CiA 402 walk, motions, supervision (drive faults, watchdog, link
errors) and the stream."""
import time

import numpy as np
import pytest

from driver import motion
from driver.cycle import Cycle, DriverFault
from driver.hal import LinkError
from sim.local_transport import LocalSimArm
from ident.model import dynamics
from firmware_bridge import cia402, stream
from firmware_bridge.cia402 import State
from ident.model import load_model
from sim import Simulator


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


class Rig:
    def __init__(self, model, watchdog_s=5.0):
        self.model = model
        self.sim = Simulator(model, seed=1)
        self.arm = LocalSimArm(model, simulator=self.sim)
        self.sent = []
        gravity = lambda q: dynamics.gravity_torques(model, q[None])[0]  # noqa: E731
        self.cycle = Cycle(self.arm, watchdog_s=watchdog_s, gravity=gravity,
                           publish=lambda topic, p: self.sent.append((topic, bytes(p))))

    def tick(self, k=1):
        for _ in range(k):
            self.cycle.step()            # begin_cycle steps the simulator

    def states(self):
        return self.sim.read_state().states()

    def enable(self):
        self.cycle.submit(self.cycle.enable)
        self.tick(6)
        assert self.states() == [State.OPERATION_ENABLED] * 6


@pytest.fixture
def rig(model):
    r = Rig(model)
    r.tick(3)
    return r


def test_enable_walks_the_state_machine_without_moving_the_arm(rig):
    q_before = rig.sim.read_truth().q.copy()
    seen = []
    rig.cycle.submit(rig.cycle.enable)
    for _ in range(6):
        rig.tick()
        seen.append(rig.states()[0])
    assert seen[:3] == [State.READY_TO_SWITCH_ON, State.SWITCHED_ON, State.OPERATION_ENABLED]
    rig.tick(50)
    assert np.abs(rig.sim.read_truth().q - q_before).max() < 1e-4


def test_a_move_runs_to_its_goal_and_the_stream_shows_it(rig, model):
    rig.enable()
    goal = np.array([0.3, -0.2, 0.25, 0.1, 0.4, -0.3])
    plan = motion.plan_move(model, rig.cycle.hold.copy(), goal, rig.cycle.rate_hz)
    rig.cycle.submit(lambda: rig.cycle.start_motion(plan))
    rig.tick(plan.samples // 2)
    states = [stream.decode_state(p) for t, p in rig.sent if t == stream.TOPIC_STATE]
    assert states[-1]["flags"] & stream.FLAG_MOVING
    rig.tick(plan.samples // 2 + 300)
    truth = rig.sim.read_truth().q
    np.testing.assert_allclose(truth, goal, atol=2e-4)
    states = [stream.decode_state(p) for t, p in rig.sent if t == stream.TOPIC_STATE]
    assert not states[-1]["flags"] & stream.FLAG_MOVING
    assert states[-1]["flags"] & stream.FLAG_ENABLED
    seqs = np.array([s["seq"] for s in states])
    np.testing.assert_array_equal(np.diff(seqs), 1)
    np.testing.assert_allclose(states[-1]["q"], rig.sim.read_state().position, atol=0)


def test_motion_is_refused_when_disabled_or_not_where_the_arm_is(rig, model):
    plan = motion.plan_move(model, rig.cycle.hold.copy(), np.full(6, 0.1), rig.cycle.rate_hz)
    with pytest.raises(DriverFault, match="not enabled"):
        rig.cycle.start_motion(plan)
    rig.enable()
    elsewhere = motion.plan_move(model, np.full(6, 0.5), np.full(6, 0.6), rig.cycle.rate_hz)
    with pytest.raises(DriverFault, match="away from joint 1"):
        rig.cycle.start_motion(elsewhere)


def test_a_drive_fault_stops_everything_and_fault_reset_recovers(rig, model):
    rig.enable()
    plan = motion.plan_move(model, rig.cycle.hold.copy(), np.full(6, 0.4), rig.cycle.rate_hz)
    rig.cycle.start_motion(plan)
    rig.tick(100)
    rig.sim.faults.drive_fault(2, 0x2310)
    rig.tick(3)
    assert rig.cycle.fault == "drive 3 faulted (error code 0x2310)"
    assert rig.cycle.motion is None
    states = rig.states()
    assert states[2] is State.FAULT
    assert all(s in (State.QUICK_STOP_ACTIVE, State.SWITCH_ON_DISABLED) for i, s in enumerate(states) if i != 2)
    assert stream.decode_state(rig.sent[-1][1])["flags"] & stream.FLAG_FAULT
    with pytest.raises(DriverFault, match="fault_reset first"):
        rig.cycle.enable()
    rig.tick(500)                                  # the quick stops ramp down
    rig.cycle.fault_reset()
    rig.tick(120)
    assert rig.cycle.fault is None
    assert State.FAULT not in rig.states()
    rig.enable()


def test_a_fault_reset_that_does_not_clear_the_drive_faults_again(rig):
    rig.enable()
    rig.sim.faults.drive_fault(0, 0x5555, sticky=True)
    rig.tick(3)
    rig.cycle.fault_reset()
    rig.tick(550)
    assert rig.cycle.fault.startswith("fault reset failed: drive 1 still in FAULT")


def test_the_watchdog_trips_when_the_device_data_stops(model):
    r = Rig(model, watchdog_s=0.02)
    r.tick(3)
    r.cycle.submit(r.cycle.enable)
    r.tick(6)
    r.arm.lockstep = False                 # the simulator is not stepped any more: no new data
    deadline = time.monotonic() + 5.0
    while r.cycle.fault is None and time.monotonic() < deadline:
        r.cycle.step()
        time.sleep(0.005)
    assert r.cycle.fault is not None and r.cycle.fault.startswith("watchdog: no new data from the drives")
    assert set(r.cycle.command.controlword.tolist()) == {cia402.CW_QUICK_STOP}
    assert stream.decode_state(r.sent[-1][1])["flags"] & stream.FLAG_STALE


class _LateArm(LocalSimArm):
    """An arm whose first sample comes only at its `late`-th cycle (a link still starting)."""
    late = 4

    def read(self, out):
        self.late -= 1
        return super().read(out) if self.late < 0 else False


def test_no_state_is_published_before_the_first_sample_and_the_first_one_is_seq_0(model):
    """Stale cycles repeat the last sample; before the first there is none, and a message of zeros (q = 0,
    times 0) would be read as a state by anyone ignoring the flag (it made the demo's stream rate 0 msg/s)."""
    sent = []
    cycle = Cycle(_LateArm(model, simulator=Simulator(model, seed=3)), watchdog_s=5.0,
                  publish=lambda topic, p: sent.append((topic, bytes(p))))
    for _ in range(4):
        cycle.step()
    assert cycle.stale == 4 and not [p for t, p in sent if t == stream.TOPIC_STATE]
    cycle.step()
    states = [stream.decode_state(p) for t, p in sent if t == stream.TOPIC_STATE]
    assert len(states) == 1 and states[0]["seq"] == 0 and not states[0]["flags"] & stream.FLAG_STALE
    assert states[0]["host_time_ns"] > 0 and states[0]["device_time_ns"] > 0


class _BrokenArm(LocalSimArm):
    broken = False

    def read(self, out):
        if self.broken:
            raise LinkError("serial port /dev/ttyX vanished")
        return super().read(out)


def test_a_link_error_becomes_a_driver_fault_not_a_crash(model):
    sim = Simulator(model, seed=2)
    arm = _BrokenArm(model, simulator=sim)
    cycle = Cycle(arm, watchdog_s=5.0)
    for _ in range(3):
        cycle.step()
    arm.broken = True
    cycle.step()
    assert cycle.fault == "link: serial port /dev/ttyX vanished"
    cycle.step()                           # and it keeps cycling
    assert cycle.cycles == 5


def test_a_non_finite_setpoint_is_never_written(rig, model):
    rig.enable()
    plan = motion.plan_move(model, rig.cycle.hold.copy(), rig.cycle.hold + 0.05, rig.cycle.rate_hz)
    q = plan.q.copy()
    q[5, 1] = np.nan
    poisoned = motion.PlannedMotion("poisoned", plan.rate_hz, q, plan.qd, plan.qdd, plan.tau_ff, plan.segments)
    rig.cycle.start_motion(poisoned)
    rig.tick(10)
    assert rig.cycle.fault == "non-finite setpoint refused"
    assert np.isfinite(rig.cycle.command.target_position).all()


@pytest.mark.parametrize("lead", [0, 1, 37])
def test_a_hand_over_runs_the_motion_to_its_setpoint_then_the_successor_without_copying(rig, model, lead):
    """replace_motion (a stop or a preempting blend) only notes the hand-over: the motion object keeps running up to
    the planned setpoint, then the successor object runs from its first setpoint; the written targets are exactly
    the old motion's up to the hand-over and then the successor's, and progress counts as one joined motion."""
    from driver import stopping

    rig.enable()
    goal = np.array([0.3, -0.2, 0.25, 0.1, 0.4, -0.3])
    m = motion.plan_move(model, rig.cycle.hold.copy(), goal, rig.cycle.rate_hz)
    rig.cycle.submit(lambda: rig.cycle.start_motion(m))
    rig.tick(200)
    k0 = rig.cycle._k
    stop = stopping.plan_stop(model, m, k0 + lead)
    assert rig.cycle.submit(lambda: rig.cycle.replace_motion(m, k0 + lead, stop)) is True
    expected = np.vstack([m.q[k0:k0 + lead], stop.q[:20]])
    progress = rig.cycle.motion_progress()
    assert progress["name"] == "stop" and progress["elapsed_s"] == 0.0
    assert progress["segment"] == ("hand-over" if lead else "stop")
    assert progress["duration_s"] == pytest.approx((lead + stop.samples - 1) / rig.cycle.rate_hz)
    written = []
    for k in range(lead + 20):
        assert rig.cycle.motion is (m if k < lead else stop)
        rig.tick()
        written.append(rig.cycle.command.target_position.copy())
    np.testing.assert_array_equal(np.array(written), expected)
    assert rig.cycle.motion_progress()["segment"] == "stop"
    with pytest.raises(DriverFault, match="planned from setpoint"):      # the cycle is past the planned start
        rig.cycle.replace_motion(stop, 3, stop)
