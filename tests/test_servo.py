"""Servo mode: setpoints streamed by a client, checked on arrival, held when missing, quick-stopped after the
timeout. The wire message, the session's checks on their own (a real PUSH/PULL pair), then a driver on the
in-process simulator and, through the armid_hil fixture, on every transport."""
from __future__ import annotations

import itertools
import re
import struct
import time

import numpy as np
import pytest
import zmq

from armid.client import ArmClient, CommandRefused
from driver.servo import CLOCK_LEAD_S, LAG_S, WINDOW_S, END, HOLD, STOP, TRACK, ServoLimits, ServoSession
from firmware_bridge import servo_wire
from firmware_bridge.servo_wire import MODE_POSITION, MODE_TORQUE, ServoDecodeError, ServoVersionError
from ident.model import dynamics
from waiting import wait_until

N = 6
DT = 1e-3
_NAMES = itertools.count()


# -- the message -----------------------------------------------------------------------------------------------
TOKEN = 0x0123_4567_89AB_CDEF


def _msg(mode: int, seq: int, sent_ns: int, values, token: int = TOKEN) -> bytes:
    return servo_wire.encode(mode, token, seq, sent_ns, values)


def test_a_setpoint_round_trips_and_its_doubles_start_on_an_8_byte_boundary():
    values = np.array([0.1, -0.2, 0.3, 0.0, 1e-9, -3.0])
    raw = _msg(MODE_POSITION, 7, 123456789, values)
    assert len(raw) == servo_wire.message_size(N) == 88 and servo_wire.HEADER_SIZE % 8 == 0
    got = servo_wire.decode(raw, N)
    assert (got.mode, got.token, got.seq, got.sent_ns) == (MODE_POSITION, TOKEN, 7, 123456789)
    assert np.array_equal(got.values, values)
    assert raw[16:24] == TOKEN.to_bytes(8, "little")                     # where the docs and the C header put it


@pytest.mark.parametrize("mangle, error", [
    (lambda b: b[:10], "shorter than the 40-byte header"),
    (lambda b: b"XXXX" + b[4:], "magic"),
    (lambda b: b[:4] + (9).to_bytes(2, "little") + b[6:], "version 9"),
    (lambda b: b[:6] + (5).to_bytes(2, "little") + b[8:], "5 joints"),
    (lambda b: b + b"\0" * 8, "the arm has 6"),
    (lambda b: b[:8] + bytes([3]) + b[9:], "mode 3"),
    (lambda b: b[:40] + np.array([np.nan]).tobytes() + b[48:], "value 0 is nan"),
])
def test_a_malformed_setpoint_is_refused_naming_what_is_wrong(mangle, error):
    raw = _msg(MODE_POSITION, 1, 0, np.zeros(N))
    with pytest.raises(ServoDecodeError, match=error):
        servo_wire.decode(mangle(raw), N)


def _version_1(seq: int, sent_ns: int, values) -> bytes:
    """A setpoint of the first version of the format (a 32-byte header without the token), as older clients send."""
    return struct.pack("<4sHHB7xqQ", b"ARSP", 1, N, MODE_POSITION, sent_ns, seq) + np.asarray(values, "<f8").tobytes()


def test_a_version_1_setpoint_is_refused_as_an_refused_version():
    with pytest.raises(ServoVersionError, match="version 1, this driver reads 2 only .*session token"):
        servo_wire.decode(_version_1(1, 0, np.zeros(N)), N)


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


def _session(model, pull, mode=MODE_POSITION, **kw) -> ServoSession:
    return ServoSession(mode, pull, _limits(model), DT, np.zeros(N), token=TOKEN, **kw)


def _settle():
    time.sleep(0.01)          # inproc delivery is immediate, but let the pipe settle


def _idle():
    return np.zeros(N), np.zeros(N)


def test_setpoints_within_the_limits_are_tracked_and_a_missing_one_holds_then_times_out(model, pair):
    push, pull = pair
    s = _session(model, pull, timeout_cycles=3, buffer_cycles=0)
    q = np.zeros(N)
    for k in range(1, 6):
        q = np.full(N, 1e-6 * k * k)                     # accelerating at 2 rad/s^2
        push.send(_msg(MODE_POSITION, k, time.time_ns(), q))
        _settle()
        step = s.next(*_idle())
        assert step.kind == TRACK and np.array_equal(step.values, q)
    kinds = [s.next(*_idle()).kind for _ in range(4)]
    assert kinds == [HOLD, HOLD, HOLD, STOP]
    assert s.stats()["accepted"] == 5 and s.stats()["missed_cycles"] == 4


@pytest.mark.parametrize("make, reason", [
    (lambda m: np.where(np.arange(N) == 2, m.q_max[2] + 0.01, 0.0), "joint j3: position"),
    (lambda m: np.where(np.arange(N) == 1, m.qd_max[1] * WINDOW_S * 1.5, 0.0), "joint j2: velocity"),
    (lambda m: np.where(np.arange(N) == 4, m.qdd_max[4] * WINDOW_S ** 2 * 1.5, 0.0), "joint j5: acceleration"),
])
def test_a_setpoint_beyond_a_limit_ends_servo_naming_joint_and_quantity(model, pair, make, reason):
    push, pull = pair
    s = _session(model, pull, buffer_cycles=0)
    t0 = time.time_ns()
    push.send(_msg(MODE_POSITION, 1, t0, np.zeros(N)))
    _settle()
    assert s.next(*_idle()).kind == TRACK
    push.send(_msg(MODE_POSITION, 2, t0 + int(WINDOW_S * 1e9), make(model)))      # a window later on its clock
    _settle()
    step = s.next(*_idle())
    assert step.kind == END and reason in step.reason and "seq 2 refused" in step.reason


def test_the_first_setpoint_starts_where_the_drives_hold(model, pair):
    push, pull = pair
    s = _session(model, pull, buffer_cycles=0)
    push.send(_msg(MODE_POSITION, 1, time.time_ns(), np.where(np.arange(N) == 3, 0.01, 0.0)))
    _settle()
    step = s.next(*_idle())
    assert step.kind == END
    assert "joint j4: the first setpoint (seq 1) is 0.01 rad from where the drives hold" in step.reason


def test_when_the_buffer_drops_the_first_setpoints_the_stream_starts_from_the_first_that_arrived(model, pair):
    """30 setpoints of a start from rest (10 rad/s^2 on every joint) arrive before the cycle takes one: the
    buffer keeps the newest and drops the first, so the first one used is 3.1 mrad from where the drives hold.
    The stream started there (its first setpoint did), so it is judged from that one and the drives cross the
    gap within the velocity limit, instead of servo ending."""
    push, pull = pair
    s = _session(model, pull, buffer_cycles=2)
    t0 = time.time_ns()
    for k in range(1, 31):
        t = (k - 1) * 1e-3
        push.send(_msg(MODE_POSITION, k, t0 + int(t * 1e9), np.full(N, 5.0 * t * t)))
    _settle()
    targets = [np.zeros(N)]
    for _ in range(8):
        step = s.next(*_idle())
        assert step.kind in (TRACK, HOLD), step.reason
        targets.append(step.values)
    assert s.stats()["buffer"]["skipped"] > 0 and s.stats()["accepted"] >= 5
    assert (np.abs(np.diff(np.array(targets), axis=0)) <= model.qd_max * DT * (1 + 1e-12)).all()


def test_a_client_clock_that_runs_ahead_of_the_drivers_is_refused(model, pair):
    """Setpoints 1 ms apart on the driver's clock stamped 10 ms apart: each is slow on the client's clock, but
    the client's clock runs ahead of the driver's; the session ends before it is CLOCK_LEAD_S ahead (plus the
    time the session's own pace adds)."""
    push, pull = pair
    s = _session(model, pull, buffer_cycles=0)
    step, k, t0 = None, 0, time.time_ns()
    start = time.perf_counter()
    while k < 200:
        k += 1
        push.send(_msg(MODE_POSITION, k, t0 + k * 10_000_000, np.full(N, 1e-6 * k)))
        time.sleep(0.001)
        step = s.next(*_idle())
        if step.kind != TRACK:
            break
    elapsed = time.perf_counter() - start
    assert step.kind == END and "sent_ns runs" in step.reason and "ahead of the driver's clock" in step.reason
    assert k * 9e-3 - elapsed < CLOCK_LEAD_S + 0.02                  # refused within the allowance, not later


def test_the_drives_cross_a_gap_within_the_velocity_and_acceleration_limits(model, pair):
    """A steady 0.03 rad/s on every joint, stamped with the time each setpoint is for, and then 0.3 s of
    setpoints lost on the way (a seq gap): the next one is 9 mrad away, three cycles' worth at the velocity
    limit. The drives' target crosses the gap cycle by cycle within the velocity and acceleration limits, comes
    to rest exactly on the last setpoint, and the gap is counted."""
    push, pull = pair
    s = _session(model, pull, buffer_cycles=0)
    v, t0 = 0.03, time.time_ns()
    targets = []
    for seq, pause in ((1, 0.0), (2, 0.0), (302, 0.3), (303, 0.0)):
        time.sleep(pause)
        now = time.time_ns()
        push.send(_msg(MODE_POSITION, seq, now, np.full(N, v * (now - t0) * 1e-9)))
        _settle()
        step = s.next(*_idle())
        assert step.kind == TRACK, step.reason
        targets.append(step.values)
    while not np.array_equal(s.last, s.target):
        targets.append(s.next(*_idle()).values)
    while s.velocity.any():
        targets.append(s.next(*_idle()).values)
    targets = np.array(targets)
    moves = np.abs(np.diff(targets, axis=0))
    assert (moves <= model.qd_max * DT * (1 + 1e-12)).all()
    rounding = 4 * np.spacing(np.abs(targets).max())                # of the positions the differences come from
    kicks = np.abs(np.diff(targets, 2, axis=0))
    assert (kicks <= model.qdd_max * DT ** 2 + rounding).all()
    assert np.allclose(kicks.max(axis=0), model.qdd_max * DT ** 2)  # it did go at the limit while crossing
    assert np.array_equal(targets[-1], s.target)
    stats = s.stats()
    assert stats["lost"] == 299 and stats["bridged_cycles"] >= 2 and stats["accepted"] == 4


def test_a_setpoint_further_than_the_drives_may_trail_ends_servo(model, pair):
    """0.3 s after the first setpoint, one 0.2 rad away on joint 1: slow on the client's clock (0.67 rad/s, within
    every limit), but the drives would trail it by more than the velocity limit covers in LAG_S: servo ends
    rather than crossing 0.2 rad at full speed."""
    push, pull = pair
    s = _session(model, pull, buffer_cycles=0)
    t0 = time.time_ns()
    push.send(_msg(MODE_POSITION, 1, t0, np.zeros(N)))
    _settle()
    assert s.next(*_idle()).kind == TRACK
    time.sleep(0.3)
    push.send(_msg(MODE_POSITION, 2, t0 + 300_000_000, np.where(np.arange(N) == 0, 0.2, 0.0)))
    _settle()
    step = s.next(*_idle())
    assert step.kind == END and "joint j1: the drives trail the setpoints by 0.2 rad" in step.reason
    assert f"covers in {LAG_S * 1e3:g} ms" in step.reason and np.array_equal(s.last, np.zeros(N))


def test_setpoints_of_another_session_and_of_version_1_are_counted_and_never_used(model, pair):
    push, pull = pair
    s = _session(model, pull, buffer_cycles=0)
    t0 = time.time_ns()
    push.send(_msg(MODE_POSITION, 1, t0, np.zeros(N)))
    _settle()
    assert s.next(*_idle()).kind == TRACK
    push.send(_msg(MODE_POSITION, 2, t0 + 1_000_000, np.full(N, 1e-6), token=TOKEN + 1))
    push.send(_msg(MODE_POSITION, 3, t0 + 1_000_000, np.full(N, 1e-6), token=0))
    push.send(_version_1(4, t0 + 1_000_000, np.full(N, 1e-6)))
    _settle()
    step = s.next(*_idle())
    assert step.kind == HOLD and np.array_equal(step.values, np.zeros(N))
    stats = s.stats()
    assert (stats["refused_token"], stats["refused_version"], stats["malformed"], stats["accepted"]) == (2, 1, 0, 1)
    assert "version 1" in stats["last_error"]
    assert "token" not in stats                                    # status and health never show it


def test_torque_setpoints_are_checked_and_a_runaway_arm_is_stopped(model, pair):
    push, pull = pair
    s = _session(model, pull, MODE_TORQUE, buffer_cycles=0)
    push.send(_msg(MODE_TORQUE, 1, 0, np.zeros(N)))
    push.send(_msg(MODE_POSITION, 2, 0, np.zeros(N)))          # the wrong mode: counted, not used
    push.send(b"garbage")
    _settle()
    assert s.next(*_idle()).kind == TRACK
    assert s.stats()["malformed"] == 2 and "shorter than the 40-byte header" in s.stats()["last_error"]
    fast = np.where(np.arange(N) == 0, model.qd_max[0] * 1.1, 0.0)
    step = s.next(np.zeros(N), fast)
    assert step.kind == STOP and "joint j1: velocity" in step.reason and "torque control" in step.reason
    over = np.where(np.arange(N) == 5, model.tau_max[5] * 1.01, 0.0)
    push.send(_msg(MODE_TORQUE, 3, 0, over))
    _settle()
    step = s.next(*_idle())
    assert step.kind == END and "joint j6: torque" in step.reason


def test_with_its_buffer_every_setpoint_of_a_jittery_client_is_carried_out_in_order(model, pair):
    """Setpoints in bursts and gaps within the buffer's depth: one is taken per cycle, each once, in order
    (without the buffer, the newest of a burst is taken and the one before it never reaches the drives)."""
    push, pull = pair
    s = _session(model, pull, buffer_cycles=2)
    arrivals = [1, 1, 2, 0, 1, 2, 0, 1, 1, 1, 0, 0]
    k, taken = 0, []
    t0 = time.time_ns()
    for count in arrivals:
        for _ in range(count):
            k += 1
            push.send(_msg(MODE_POSITION, k, t0 + k * 1_000_000, np.full(N, 1e-6 * k)))
        _settle()
        step = s.next(*_idle())
        if step.kind == TRACK:
            taken.append(int(round(step.values[0] * 1e6)))
    assert taken == list(range(1, len(taken) + 1)) and len(taken) >= k - 2
    assert s.stats()["buffer"]["depth"] == 2 and s.stats()["buffer"]["skipped"] == 0


# -- a driver on the in-process simulator ---------------------------------------------------------------------------
def _stream(servo, q0: np.ndarray, seconds: float, amplitude: float = 0.1, rate: float = 1000.0) -> np.ndarray:
    """Stream q0 + amplitude (1 - cos(2 pi t / seconds)) / 2 on joint 1 at about `rate`, seconds * rate setpoints
    (however long a client short of CPU time takes to send them); the last setpoint."""
    start = time.time_ns()
    k, q = 0, q0
    while k < round(seconds * rate):
        t = ((now := time.time_ns()) - start) * 1e-9
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
