"""Servo mode: setpoints streamed by a client, checked on arrival, held when missing, quick-stopped after the
timeout. The wire message, the session's checks on their own (a real PUSH/PULL pair), then a driver on the
in-process simulator and, through the armid_hil fixture, on every transport."""
from __future__ import annotations

import itertools
import re
import time

import numpy as np
import pytest
import zmq

from armid.client import ArmClient, CommandRefused
from driver.servo import END, HOLD, STOP, TRACK, ServoLimits, ServoSession
from firmware_bridge import servo_wire
from firmware_bridge.servo_wire import MODE_POSITION, MODE_TORQUE, ServoDecodeError
from ident import dynamics
from ident.model import load_model
from local_driver import local_driver
from waiting import wait_until

N = 6
DT = 1e-3
_NAMES = itertools.count()


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


# -- the message -----------------------------------------------------------------------------------------------
def test_a_setpoint_round_trips_and_its_doubles_start_on_an_8_byte_boundary():
    values = np.array([0.1, -0.2, 0.3, 0.0, 1e-9, -3.0])
    raw = servo_wire.encode(MODE_POSITION, 7, 123456789, values)
    assert len(raw) == servo_wire.message_size(N) == 80 and servo_wire.HEADER_SIZE % 8 == 0
    mode, seq, sent, got = servo_wire.decode(raw, N)
    assert (mode, seq, sent) == (MODE_POSITION, 7, 123456789) and np.array_equal(got, values)


@pytest.mark.parametrize("mangle, error", [
    (lambda b: b[:10], "shorter than the 32-byte header"),
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:4] + (9).to_bytes(2, "little") + b[6:], "version 9"),
    (lambda b: b[:6] + (5).to_bytes(2, "little") + b[8:], "5 joints"),
    (lambda b: b + b"\0" * 8, "the arm has 6"),
    (lambda b: b[:8] + bytes([3]) + b[9:], "mode 3"),
    (lambda b: b[:32] + np.array([np.nan]).tobytes() + b[40:], "value 0 is nan"),
])
def test_a_malformed_setpoint_is_refused_naming_what_is_wrong(mangle, error):
    raw = servo_wire.encode(MODE_POSITION, 1, 0, np.zeros(N))
    with pytest.raises(ServoDecodeError, match=error):
        servo_wire.decode(mangle(raw), N)


# -- the session's checks -----------------------------------------------------------------------------------------
@pytest.fixture
def pair():
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    name = f"inproc://servo-{next(_NAMES)}"
    pull.bind(name)
    push.setsockopt(zmq.SNDTIMEO, 5000)     # a send the reader never takes fails (zmq.Again) instead of waiting
    push.connect(name)
    yield push, pull
    push.close(0)
    pull.close(0)


def _limits(model) -> ServoLimits:
    return ServoLimits(model.q_min, model.q_max, model.qd_max, model.qdd_max, model.tau_max, tuple(model.joint_names))


def _settle():
    time.sleep(0.01)          # inproc delivery is immediate, but let the pipe settle


def test_setpoints_within_the_limits_are_tracked_and_a_missing_one_holds_then_times_out(model, pair):
    push, pull = pair
    s = ServoSession(MODE_POSITION, pull, _limits(model), DT, np.zeros(N), timeout_cycles=3, buffer_cycles=0)
    q = np.zeros(N)
    for k in range(1, 6):
        q = np.full(N, 1e-6 * k * k)                     # accelerating at 2 rad/s^2
        push.send(servo_wire.encode(MODE_POSITION, k, time.time_ns(), q))
        _settle()
        step = s.next(np.zeros(N), np.zeros(N))
        assert step.kind == TRACK and np.array_equal(step.values, q)
    kinds = [s.next(np.zeros(N), np.zeros(N)).kind for _ in range(4)]
    assert kinds == [HOLD, HOLD, HOLD, STOP]
    assert s.stats()["accepted"] == 5 and s.stats()["missed_cycles"] == 4


@pytest.mark.parametrize("make, reason", [
    (lambda m: np.where(np.arange(N) == 2, m.q_max[2] + 0.01, 0.0), "joint j3: position"),
    (lambda m: np.where(np.arange(N) == 1, m.qd_max[1] * DT * 1.5, 0.0), "joint j2: velocity"),
    (lambda m: np.where(np.arange(N) == 4, m.qdd_max[4] * DT * DT * 1.5, 0.0), "joint j5: acceleration"),
])
def test_a_setpoint_beyond_a_limit_ends_servo_naming_joint_and_quantity(model, pair, make, reason):
    push, pull = pair
    s = ServoSession(MODE_POSITION, pull, _limits(model), DT, np.zeros(N), buffer_cycles=0)
    push.send(servo_wire.encode(MODE_POSITION, 1, time.time_ns(), make(model)))
    _settle()
    step = s.next(np.zeros(N), np.zeros(N))
    assert step.kind == END and reason in step.reason and "seq 1 refused" in step.reason


def test_a_client_is_judged_by_its_own_clock_and_cannot_make_the_drives_jump(model, pair):
    """Constant velocity near the limit on the client's clock: a setpoint that arrives a cycle late, and then
    two in one cycle, are the same motion and accepted. A client whose clock claims a slow motion while each
    setpoint jumps further than the velocity limit allows per cycle is refused."""
    push, pull = pair
    v = 0.9 * model.qd_max * DT
    s = ServoSession(MODE_POSITION, pull, _limits(model), DT, np.zeros(N), buffer_cycles=0)
    s.velocity = v / DT                                  # already moving at that velocity
    ms = 1_000_000
    push.send(servo_wire.encode(MODE_POSITION, 1, 1 * ms, v))
    _settle()
    assert s.next(np.zeros(N), np.zeros(N)).kind == TRACK
    assert s.next(np.zeros(N), np.zeros(N)).kind == HOLD                 # late
    push.send(servo_wire.encode(MODE_POSITION, 2, 2 * ms, 2 * v))
    push.send(servo_wire.encode(MODE_POSITION, 3, 3 * ms, 3 * v))
    _settle()
    step = s.next(np.zeros(N), np.zeros(N))
    assert step.kind == TRACK and np.array_equal(step.values, 3 * v)
    push.send(servo_wire.encode(MODE_POSITION, 4, 3 * ms, 4 * v))
    _settle()
    assert "sent_ns does not increase" in s.next(np.zeros(N), np.zeros(N)).reason
    s2 = ServoSession(MODE_POSITION, pull, _limits(model), DT, np.zeros(N), buffer_cycles=0)
    push.send(servo_wire.encode(MODE_POSITION, 5, 10 * ms, np.zeros(N)))
    _settle()
    assert s2.next(np.zeros(N), np.zeros(N)).kind == TRACK
    push.send(servo_wire.encode(MODE_POSITION, 6, 10_000 * ms, 4 * v))    # "ten seconds later", one cycle later
    _settle()
    step = s2.next(np.zeros(N), np.zeros(N))
    assert step.kind == END and "more than 3 times its velocity limit" in step.reason


def test_torque_setpoints_are_checked_and_a_runaway_arm_is_stopped(model, pair):
    push, pull = pair
    s = ServoSession(MODE_TORQUE, pull, _limits(model), DT, np.zeros(N), buffer_cycles=0)
    push.send(servo_wire.encode(MODE_TORQUE, 1, 0, np.zeros(N)))
    push.send(servo_wire.encode(MODE_POSITION, 2, 0, np.zeros(N)))          # the wrong mode: counted, not used
    push.send(b"garbage")
    _settle()
    assert s.next(np.zeros(N), np.zeros(N)).kind == TRACK
    assert s.stats()["malformed"] == 2 and "shorter than the 32-byte header" in s.stats()["last_error"]
    fast = np.where(np.arange(N) == 0, model.qd_max[0] * 1.1, 0.0)
    step = s.next(np.zeros(N), fast)
    assert step.kind == STOP and "joint j1: velocity" in step.reason and "torque control" in step.reason
    over = np.where(np.arange(N) == 5, model.tau_max[5] * 1.01, 0.0)
    push.send(servo_wire.encode(MODE_TORQUE, 3, 0, over))
    _settle()
    step = s.next(np.zeros(N), np.zeros(N))
    assert step.kind == END and "joint j6: torque" in step.reason


def test_with_its_buffer_every_setpoint_of_a_jittery_client_is_carried_out_in_order(model, pair):
    """Setpoints in bursts and gaps within the buffer's depth: one is taken per cycle, each once, in order
    (without the buffer, the newest of a burst is taken and the one before it never reaches the drives)."""
    push, pull = pair
    s = ServoSession(MODE_POSITION, pull, _limits(model), DT, np.zeros(N), buffer_cycles=2)
    arrivals = [1, 1, 2, 0, 1, 2, 0, 1, 1, 1, 0, 0]
    k, taken = 0, []
    for count in arrivals:
        for _ in range(count):
            k += 1
            push.send(servo_wire.encode(MODE_POSITION, k, k * 1_000_000, np.full(N, 1e-6 * k)))
        _settle()
        step = s.next(np.zeros(N), np.zeros(N))
        if step.kind == TRACK:
            taken.append(int(round(step.values[0] * 1e6)))
    assert taken == list(range(1, len(taken) + 1)) and len(taken) >= k - 2
    assert s.stats()["buffer"]["depth"] == 2 and s.stats()["buffer"]["skipped"] == 0


# -- a driver on the in-process simulator ---------------------------------------------------------------------------
@pytest.fixture
def driver(model):
    with local_driver(model) as running:
        yield running


def _stream(servo, q0: np.ndarray, seconds: float, amplitude: float = 0.1, rate: float = 1000.0) -> np.ndarray:
    """Stream q0 + amplitude (1 - cos(2 pi t / seconds)) / 2 on joint 1 at about `rate`; the last setpoint."""
    start = time.time_ns()
    k, q = 0, q0
    while (t := ((now := time.time_ns()) - start) * 1e-9) < seconds:
        q = q0.copy()
        q[0] += amplitude * (1 - np.cos(2 * np.pi * t / seconds)) / 2
        servo.send(q, now)                               # stamped with the time it was computed for
        k += 1
        time.sleep(max(0.0, k / rate - (time.time_ns() - start) * 1e-9))
    return q


def test_position_servo_moves_the_arm_and_servo_stop_holds_it(driver, model):
    d, sim = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        with arm.servo("position", timeout_cycles=200) as servo:
            with pytest.raises(CommandRefused, match="servo mode is on"):
                arm.move_to(q0)
            last = _stream(servo, q0, 1.0, amplitude=0.1)
            peak = arm.status()["servo"]
        assert peak["accepted"] > 300 and peak["mode"] == "position" and peak["latency_us"]["p50"] > 0
        ended = arm.status()["servo"]
        assert ended["ended"] == "servo_stop requested"
        time.sleep(0.3)
        np.testing.assert_allclose(sim.read_truth().q, last, atol=3e-3)      # held where the last setpoint put it
        assert arm.status()["enabled"] and arm.status()["fault"] is None


def test_a_setpoint_that_jumps_ends_servo_and_the_arm_holds_the_last_good_one(driver):
    d, sim = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        servo = arm.servo(timeout_cycles=1000)
        servo.send(q0)
        jump = q0.copy()
        jump[1] += 0.5                                   # 500 rad/s in one cycle
        time.sleep(0.05)
        servo.send(jump)
        assert wait_until(lambda: arm.status()["servo"].get("ended"), 5)
        assert re.search(r"joint j2: (velocity|moves 0.5 rad)", arm.status()["servo"]["ended"])
        time.sleep(0.2)
        np.testing.assert_allclose(sim.read_truth().q, q0, atol=2e-3)
        assert arm.status()["enabled"]
        servo._push.close(0)


def test_setpoints_that_stop_coming_hold_then_quick_stop_after_the_timeout(driver):
    d, _ = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        servo = arm.servo(timeout_cycles=100)
        servo.send(np.array(arm.status()["q"]))
        assert wait_until(lambda: not arm.status()["enabled"], 5)            # quick stop
        assert "no setpoint for 100 cycles" in arm.status()["servo"]["ended"]
        servo._push.close(0)


def test_torque_servo_holding_gravity_keeps_the_arm_still_and_an_excess_torque_ends_it(driver, model):
    d, sim = driver
    with ArmClient(d.bound["state"], d.bound["commands"]) as arm:
        arm.enable()
        q0 = np.array(arm.status()["q"])
        gravity = dynamics.gravity_torques(model, q0[None])[0]
        with arm.servo("torque", timeout_cycles=200) as servo:
            for _ in range(300):
                servo.send(gravity)
                time.sleep(0.001)
            assert arm.status()["servo"]["accepted"] > 100
            assert np.abs(sim.read_truth().q - q0).max() < 0.05           # friction and gravity: it stays near
            over = gravity.copy()
            over[0] = model.tau_max[0] * 2
            servo.send(over)
            assert wait_until(lambda: arm.status()["servo"].get("ended"), 5)
        assert "joint j1: torque" in arm.status()["servo"]["ended"]
        assert arm.status()["enabled"]


# -- every transport ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("transport", ["serial", "can", "gateway"])
def test_position_servo_tracks_on_every_transport(armid_hil, transport):
    rig = armid_hil(transport)
    arm = rig.client
    arm.enable()
    rate = rig.chain.plan.rate_hz
    q0 = np.array(arm.status()["q"])
    with arm.servo(timeout_cycles=int(rate)) as servo:
        last = _stream(servo, q0, 1.5, amplitude=0.1, rate=rate)
        stats = arm.status()["servo"]
        time.sleep(0.3)
        np.testing.assert_allclose(arm.latest().q, last, atol=3e-3)
    assert stats["accepted"] > 0.5 * 1.5 * rate and stats["malformed"] == 0, (stats, servo.sent, servo.dropped)
    assert arm.status()["fault"] is None
