"""The numba kernels of the driver's hot path against what they replaced: the units' own conversions
(firmware_bridge.units.JointScaling), the cycle's target rules written out in numpy, the gateway's
fault-reset latch, and the serial link's arrival event with and without a waiter."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver import cycle_kernels as ck
from driver.hal import ArmState, copy_sample, raw_to_si
from driver.transports import serial_link as sl
from driver.transports.gateway import _command_fields, _keep_command
from firmware_bridge import serial_protocol as sp
from firmware_bridge import stream
from firmware_bridge.units import CURRENT_LSB, ENCODER_COUNTS_PER_REV, JointScaling
from ident.model import load_model

N = 6
int32s = st.lists(st.integers(-2**31, 2**31 - 1), min_size=N, max_size=N)


@settings(max_examples=30, deadline=None)
@given(pos=int32s, vel=int32s, cur=int32s, seed=st.integers(0, 2**32 - 1))
def test_raw_to_si_is_the_units_own_conversion_bit_for_bit(pos, vel, cur, seed):
    rng = np.random.default_rng(seed)
    scaling = JointScaling.from_gear(rng.uniform(-200, 200, N) + 0.5, ENCODER_COUNTS_PER_REV)
    per_amp = rng.uniform(-5, 5, N)
    sw, err = rng.integers(0, 2**16, N).astype(np.uint16), rng.integers(0, 2**16, N).astype(np.uint16)
    mode = rng.integers(-128, 128, N).astype(np.int8)
    message = stream.StateMessage(N)          # the blocks inside a message are unaligned views
    out = ArmState.inside(message)
    raw_to_si(np.array(pos, np.int32), np.array(vel, np.int32), np.array(cur, np.int32), sw, err, mode,
              scaling.counts_per_rad, CURRENT_LSB, per_amp, out.floats, out.words, out.mode)
    current = JointScaling.raw_to_current(cur)
    np.testing.assert_array_equal(out.q, scaling.counts_to_position(pos))
    np.testing.assert_array_equal(out.qd, scaling.counts_to_velocity(vel))
    np.testing.assert_array_equal(out.current, current)
    np.testing.assert_array_equal(out.torque, current * per_amp)
    np.testing.assert_array_equal(out.statusword, sw)
    np.testing.assert_array_equal(out.error_code, err)
    np.testing.assert_array_equal(out.mode, mode)
    decoded = stream.decode_state(bytes(message.buffer))
    np.testing.assert_array_equal(decoded["torque"], current * per_amp)


def test_copy_sample_copies_every_field_into_a_message():
    src = ArmState(N)
    src.floats[:] = np.arange(4 * N).reshape(4, N) * 0.5
    src.words[:] = np.arange(2 * N).reshape(2, N) + 0xFF00
    src.mode[:] = -np.arange(N)
    message = stream.StateMessage(N)
    copy_sample(src, ArmState.inside(message))
    decoded = stream.decode_state(bytes(message.buffer))
    for name in ("q", "qd", "current", "torque", "statusword", "error_code", "mode"):
        np.testing.assert_array_equal(decoded[name], getattr(src, name), err_msg=name)


def _command_in_numpy(how, plan_q, plan_tau, measured, hold):
    """The cycle's target rules as driver/cycle.py wrote them before the kernel (the oracle); the torque offset is
    the plan's as it is."""
    target_position, target_torque = plan_q.copy(), plan_tau.copy()
    if how & ck.HOLD_PLAN:
        hold[:] = target_position
    if how & ck.FOLLOW:
        if how & ck.HOLD_FOLLOWS:
            hold[:] = measured
        target_position[:] = measured
    return target_position, target_torque


@settings(max_examples=40, deadline=None)
@given(how=st.sampled_from([0, ck.HOLD_PLAN, ck.FOLLOW, ck.FOLLOW | ck.HOLD_FOLLOWS, ck.HOLD_PLAN | ck.FOLLOW,
                            ck.HOLD_PLAN | ck.FOLLOW | ck.HOLD_FOLLOWS]),
       intent=st.sampled_from([ck.RESET, ck.QUICK_STOP, ck.OFF, ck.POWER]), plan_is_hold=st.booleans(),
       statusword=st.lists(st.integers(0, 0xFFFF), min_size=N, max_size=N), seed=st.integers(0, 2**32 - 1),
       nan_at=st.one_of(st.none(), st.integers(0, N - 1)))
def test_command_kernel_sets_the_targets_and_hold_as_the_numpy_rules_and_reports_drive_logic(
        how, intent, plan_is_hold, statusword, seed, nan_at):
    rng = np.random.default_rng(seed)
    hold, measured, plan_tau, plan_off = rng.normal(size=N), rng.normal(size=N), rng.normal(size=N), rng.normal(size=N)
    limit = rng.uniform(0.5, 3.0, N)
    plan_q = hold if plan_is_hold else rng.normal(size=N)     # with no motion the cycle plans from hold itself
    if nan_at is not None:
        measured[nan_at] = np.nan
    sw = np.array(statusword, np.uint16)
    hold_ref = hold.copy()
    tp_ref, tt_ref = _command_in_numpy(how, plan_q.copy() if plan_is_hold else plan_q, plan_tau, measured, hold_ref)
    tp, tt, to, cw = np.zeros(N), np.zeros(N), np.zeros(N), np.zeros(N, np.uint16)
    bits = ck.command(sw, intent, plan_q, plan_tau, plan_off, measured, how, hold, limit, tp, tt, to, cw)
    np.testing.assert_array_equal(tp, tp_ref)
    np.testing.assert_array_equal(tt, tt_ref)
    np.testing.assert_array_equal(to, plan_off)
    np.testing.assert_array_equal(hold, hold_ref)
    cw_ref = np.zeros(N, np.uint16)
    assert bits == ck.drive_logic(sw, intent, tp_ref, tt_ref, plan_off, limit, cw_ref)
    np.testing.assert_array_equal(cw, cw_ref)
    finite = np.isfinite(tp_ref)
    assert bool(bits & ck.NON_FINITE) == (nan_at is not None and bool(how & ck.FOLLOW))
    # the sum sent, target torque + offset, against each joint's limit (where the target is finite)
    assert bool(bits & ck.OVER_TORQUE) == bool(np.any(finite & (np.abs(tt_ref + plan_off) > limit)))


def test_gateway_write_copy_copies_every_field_of_the_command():
    dst = [np.zeros(N, np.uint16), np.zeros(N, np.int8), np.zeros(N), np.zeros(N), np.zeros(N)]
    cw = np.full(N, 0x0F, np.uint16)
    cw[2] = 0x80
    src = [cw, np.full(N, 8, np.int8), np.linspace(-1, 1, N), np.linspace(2, 3, N), np.linspace(-4, 5, N)]
    _keep_command(*src, *dst)
    for a, b in zip(src, dst):
        np.testing.assert_array_equal(a, b)


def test_gateway_command_fields_send_a_latched_fault_reset_once_then_clear_it():
    """A fault reset of a dropped command (latched) goes out in the next command's controlword, then no more."""
    cw, mode = np.full(N, 0x0F, np.uint16), np.full(N, 8, np.int8)
    q, tau = np.linspace(-1, 1, N), np.linspace(-0.5, 0.5, N)
    counts_per_rad = np.full(N, 1000.0)
    latch = np.zeros(N, bool)
    latch[2] = True
    off, per_nm = np.linspace(-2.0, 3.0, N), np.full(N, 1000.0)
    sent, fields = np.zeros(N, np.uint16), np.zeros((5, N), np.int64)
    assert _command_fields(cw, mode, q, tau, off, counts_per_rad, per_nm, latch, sent, fields) == -1
    assert fields[0].tolist() == [0x0F, 0x0F, 0x80, 0x0F, 0x0F, 0x0F] and not latch.any()
    assert fields[2].tolist() == np.rint(q * 1000).astype(int).tolist()
    assert fields[3].tolist() == np.rint(tau * 1000).astype(int).tolist()       # mN m
    assert fields[4].tolist() == np.rint(off * 1000).astype(int).tolist()       # torque offset, mN m
    assert _command_fields(cw, mode, q, tau, off, counts_per_rad, per_nm, latch, sent, fields) == -1
    assert fields[0].tolist() == [0x0F] * N
    latch[4] = True                                   # a command that cannot be sent keeps the latch for the next
    q[1] = np.nan
    assert _command_fields(cw, mode, q, tau, off, counts_per_rad, per_nm, latch, sent, fields) == 1 and latch[4]
    q[1] = 0.0
    off[3] = 3e6                                      # 3e9 mN m: beyond int32
    assert _command_fields(cw, mode, q, tau, off, counts_per_rad, per_nm, latch, sent, fields) == 3 and latch[4]


@pytest.fixture()
def serial_arm():
    """A SerialArm with a session on /dev/null (written to, never read): frames are fed to it directly."""
    model = load_model("generic6")
    arm = sl.SerialArm(model, port="test")
    fd = os.open(os.devnull, os.O_WRONLY)

    class Port:
        def fileno(self):
            return fd

        def close(self):
            pass

    gear = np.asarray(model.gear_ratio, float)
    ack = sp.HelloAck(cycle_period_us=1000, watchdog_us=100_000,
                      counts_per_rev=np.full(N, ENCODER_COUNTS_PER_REV, np.uint32), gear_ratio=gear)
    session = sl._Session(Port(), ack, JointScaling.from_gear(gear), sp.StreamDecoder(), sp.FrameEncoder())
    arm._install(session)
    yield arm, session, sp.FrameEncoder()
    os.close(fd)


def _state_frame(encoder, k):
    return b"\0" + encoder.encode(sp.State(timestamp_us=1000 * k, cycle=k, statusword=np.full(N, 0x237),
                                           mode_display=np.full(N, 8), error_code=np.zeros(N),
                                           position=np.arange(N) + k, velocity=np.zeros(N), current=np.ones(N)))


def test_serial_arrival_event_wakes_a_waiter_and_is_left_alone_without_one(serial_arm):
    arm, session, enc = serial_arm
    arm._ingest(session, _state_frame(enc, 1))
    assert not arm._link.arrived.is_set()          # no one waits: the event is not touched
    assert arm.wait_new(0.0)                  # the sample is there without the event
    arm.read(ArmState(N))
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(arm.wait_new(5.0)))
    waiter.start()
    for _ in range(500):                      # until the waiter is counted (bounded: 5 s)
        if arm._link.waiters:
            break
        threading.Event().wait(0.01)
    arm._ingest(session, _state_frame(enc, 2))
    waiter.join(5.0)
    assert woke == [True] and arm._link.waiters == 0
    out = ArmState(N)
    assert arm.read(out) and out.device_time_ns == 2_000_000
