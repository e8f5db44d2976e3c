"""The cycle's hot path: the per-joint drive logic kernel against cia402.state_of, the stream message filled in
place (views and header) against decode_state, and the device clock (a cycle per new device sample, stale
cycles and the watchdog while the device is silent)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver import cycle_kernels as ck
from driver.cycle import Cycle
from driver.hal import Arm, ArmState, copy_sample
from firmware_bridge.runtime.rt_timing import reduce_timer_slack, sleep_until
from firmware_bridge import cia402, stream
from firmware_bridge.cia402 import State
from waiting import wait_until

# what each intent asks of a drive in each state (CiA 402 state machine, written out from the standard)
EXPECTED = {
    ck.POWER: {State.SWITCH_ON_DISABLED: cia402.CW_SHUTDOWN, State.READY_TO_SWITCH_ON: cia402.CW_SWITCH_ON,
               State.SWITCHED_ON: cia402.CW_ENABLE_OPERATION, State.OPERATION_ENABLED: cia402.CW_ENABLE_OPERATION},
    ck.QUICK_STOP: {State.OPERATION_ENABLED: cia402.CW_QUICK_STOP, State.QUICK_STOP_ACTIVE: cia402.CW_QUICK_STOP},
    ck.OFF: {s: cia402.CW_SHUTDOWN for s in State} | {None: cia402.CW_SHUTDOWN},
    ck.RESET: {},
}


def _expected_controlword(intent: int, s: State | None) -> int:
    return EXPECTED[intent].get(s, cia402.CW_DISABLE_VOLTAGE)


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.integers(0, 0xFFFF), min_size=1, max_size=9), intent=st.sampled_from(
    [ck.RESET, ck.QUICK_STOP, ck.OFF, ck.POWER]), bad=st.sampled_from([None, np.nan, np.inf, -np.inf]))
def test_drive_logic_matches_the_state_machine_for_any_statusword(words, intent, bad):
    sw = np.array(words, np.uint16)
    n = sw.shape[0]
    tp, tt = np.zeros(n), np.zeros(n)
    if bad is not None:
        tt[n - 1] = bad
    out = np.zeros(n, np.uint16)
    bits = ck.drive_logic(sw, intent, tp, tt, np.zeros(n), np.full(n, np.inf), out)
    states = [cia402.state_of(int(w)) for w in words]
    assert out.tolist() == [_expected_controlword(intent, s) for s in states]
    assert bool(bits & ck.ALL_ENABLED) == all(s is State.OPERATION_ENABLED for s in states)
    assert bool(bits & ck.NON_FINITE) == (bad is not None)
    faulted = [j + 1 for j, s in enumerate(states) if s in (State.FAULT, State.FAULT_REACTION_ACTIVE)]
    assert bits >> ck.FAULTED_SHIFT == (faulted[0] if faulted else 0)


def test_an_arm_state_inside_the_message_is_the_message_and_the_header_is_packed_in_place():
    msg = stream.StateMessage(4)
    st_ = ArmState.inside(msg)
    src = ArmState(4)
    src.q[:] = [0.1, -0.2, 0.3, 4.0]
    src.qd[:] = 1.5
    src.current[:] = [1, 2, 3, 4]
    src.torque[:] = -7.25
    src.statusword[:] = [0x237, 0x208, 0x250, 0x221]
    src.error_code[:] = [0, 0x2310, 0, 0xFFFF]
    src.mode[:] = [8, 8, -1, 10]
    copy_sample(src, st_)
    msg.set_header(2**40 + 3, stream.FLAG_STALE | stream.FLAG_FAULT, -123456789, 1_700_000_000_123_456_789)
    rec = stream.decode_state(bytes(msg.buffer))
    assert (rec["seq"], rec["flags"], rec["device_time_ns"], rec["host_time_ns"]) == (
        2**40 + 3, stream.FLAG_STALE | stream.FLAG_FAULT, -123456789, 1_700_000_000_123_456_789)
    for name in ("q", "qd", "current", "torque", "statusword", "error_code", "mode"):
        np.testing.assert_array_equal(rec[name], getattr(src, name))
    assert bytes(rec["magic"]) == stream.MAGIC and rec["n"] == 4


def test_sleep_until_never_returns_early():
    reduce_timer_slack()
    for _ in range(20):
        deadline = time.perf_counter_ns() + 300_000
        sleep_until(deadline, 50_000)
        assert time.perf_counter_ns() >= deadline


class PushedArm(Arm):
    """An arm whose samples the test hands over one at a time (the device's clock is the test's)."""

    n = 2
    streams_on_own_clock = True

    def __init__(self):
        self.cond = threading.Condition()
        self.pushed = 0
        self.taken = 0
        self.device_ns = 0

    def push(self, device_ns: int) -> None:
        with self.cond:
            self.device_ns = device_ns
            self.pushed += 1
            self.cond.notify_all()

    def wait_new(self, timeout_s: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.pushed != self.taken, timeout_s)

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass

    def begin_cycle(self) -> None:
        pass

    def read(self, out: ArmState) -> bool:
        with self.cond:
            fresh = self.pushed != self.taken
            self.taken = self.pushed
            out.device_time_ns, out.host_time_ns = self.device_ns, time.time_ns()
            out.statusword[:] = cia402.statusword_for(State.SWITCH_ON_DISABLED)
        return fresh

    def write(self, command) -> None:
        pass

    def link_stats(self) -> dict:
        return {}


def _collector():
    """(sent, lock, publish): publish(topic, payload) appends each decoded state message to sent under lock."""
    sent: list[dict] = []
    lock = threading.Lock()

    def publish(topic, payload):
        if topic == stream.TOPIC_STATE:
            with lock:
                sent.append(stream.decode_state(bytes(payload)))
    return sent, lock, publish


def test_on_the_device_clock_every_sample_gets_its_own_cycle_and_silence_gives_stale_cycles():
    arm = PushedArm()
    sent, lock, publish = _collector()

    cycle = Cycle(arm, rate_hz=200.0, watchdog_s=0.2, clock="device", publish=publish)
    cycle.start()
    try:
        for k in range(1, 31):
            arm.push(k * 1000)
            assert wait_until(lambda: any(m["device_time_ns"] == k * 1000 and not m["flags"] & stream.FLAG_STALE
                                      for m in sent[-5:]))
        fresh = [int(m["device_time_ns"]) for m in sent if not m["flags"] & stream.FLAG_STALE]
        assert fresh == [k * 1000 for k in range(1, 31)]            # each sample once, in order
        assert wait_until(lambda: cycle.fault is not None)             # silence: stale cycles go on, the watchdog trips
        assert cycle.fault.startswith("watchdog: no new data")
        with lock:
            seqs = [int(m["seq"]) for m in sent]
            assert sent[-1]["flags"] & stream.FLAG_STALE
        assert seqs == list(range(len(seqs)))
    finally:
        cycle.stop()
    assert not cycle.running


def test_the_device_clock_needs_an_arm_that_streams():
    class HostArm(PushedArm):
        streams_on_own_clock = False

    with pytest.raises(ValueError, match="clock: 'device' needs a transport"):
        Cycle(HostArm(), clock="device")
    with pytest.raises(ValueError, match="clock: expected one of host, device"):
        Cycle(PushedArm(), clock="sometimes")


def test_the_cycle_takes_only_a_transport_that_declares_the_contract():
    class Duck:                   # every method the cycle calls, but not the base that declares them
        n = 2
        streams_on_own_clock = True
        wait_new = PushedArm.wait_new

    with pytest.raises(TypeError, match="subclass of driver.hal.Arm"):
        Cycle(Duck())

    class Partial(Arm):           # the base, without its abstract methods
        n = 2

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_sleep_until_without_spin_never_returns_early():
    reduce_timer_slack()
    for _ in range(20):
        deadline = time.perf_counter_ns() + 300_000
        sleep_until(deadline)
        assert time.perf_counter_ns() >= deadline
    sleep_until(time.perf_counter_ns() - 1_000_000)     # a deadline in the past returns at once


class AnsweringArm(PushedArm):
    """Answers every written command with `burst` samples (a device stepping on each COMMAND, whose answers
    may come in bursts), keeping each one (backlog) as the serial transport does."""

    keeps_every_sample = True

    def __init__(self, burst: int):
        super().__init__()
        self.burst = burst
        self.queue = [0]                          # the first sample (the answer to the handshake)
        self.pushed = 1
        self.written = 0

    def write(self, command) -> None:
        with self.cond:
            self.written += 1
            for _ in range(self.burst):
                self.queue.append(self.pushed * 1000)
                self.pushed += 1
            self.cond.notify_all()

    def backlog(self) -> int:
        with self.cond:
            return self.pushed - self.taken

    def read(self, out: ArmState) -> bool:
        with self.cond:
            fresh = self.pushed != self.taken
            if fresh:
                self.taken += 1
                self.device_ns = self.queue[self.taken - 1]
            out.device_time_ns, out.host_time_ns = self.device_ns, time.time_ns()
            out.statusword[:] = cia402.statusword_for(State.SWITCH_ON_DISABLED)
        return fresh


@pytest.mark.parametrize("burst", [1, 3])
def test_on_the_host_clock_an_answering_arm_gets_each_sample_published_once_in_order(burst):
    arm = AnsweringArm(burst)
    sent, lock, publish = _collector()

    cycle = Cycle(arm, rate_hz=200.0, watchdog_s=1.0, clock="host", publish=publish)
    cycle.start()
    try:
        assert wait_until(lambda: arm.written >= 20)
        assert cycle.error is None
    finally:
        cycle.stop()
    with lock:
        fresh = [int(m["device_time_ns"]) for m in sent if not m["flags"] & stream.FLAG_STALE]
        seqs = [int(m["seq"]) for m in sent]
    assert seqs == list(range(len(seqs)))
    # every sample the arm produced and the cycle read, once and in order (the last burst may be unread)
    assert fresh == [k * 1000 for k in range(len(fresh))]
    assert len(fresh) >= 1 + burst * (arm.written - 1)
    if burst == 1:     # only the first sample (before any command) is published without its own work
        assert cycle.caught_up <= 1
        assert cycle.stale <= 2
    else:
        assert cycle.caught_up >= (burst - 1) * (arm.written - 1)
