"""A free-running simulator whose process was not scheduled comes back as if it had run, as real drives (hardware,
never late) would have: it runs every tick it missed, each with the targets the drives would have had then, so
that after the catch-up its state is the state of a run that was never stalled, whether the stall lasted 1 or 400
periods. A catch-up is given up only when it does not converge (ticks that cost more than a period), counted.

The simulator's own thread runs on a test clock (sim.clock.RealtimeClock's `timer`): time moves to each deadline
as the simulator sleeps, and a stall is one wake-up K periods late. Both runs end at the same instant of that
clock; the run stops there (the clock holds the thread), so the comparison is of the same tick, in lockstep.

Two hosts: one that sets each cycle's target in the cycle itself (no link), and one at the other end of a link
(LinkedHost), as the driver on a free-running device's clock is: it answers each sample with the next target of
its motion, which reaches the drives' setpoint buffer LATENCY later on the test clock.
"""
from __future__ import annotations

import dataclasses
import threading
from collections import deque

import numpy as np
import pytest

from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode, State
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from sim import Simulator
from sim.clock import CATCH_UP_WINDOW_PERIODS, RealtimeClock
from sim.device_contract import DeviceSide
from sim.drive_targets import DeviceTargets, setpoints_for_device

RATE_HZ = 1000.0
PERIOD = 1.0 / RATE_HZ
TICKS = 300                 # the run ends after this many periods of the test clock
STALL_AT = 120              # the wake-up that comes late
HOLD_S = 60.0               # the longest the test waits for the simulator's thread to reach the end


class StallingTimer:
    """A test clock: sleeping until a deadline moves its time there; the first sleep that reaches `stall_at`
    periods after the start comes back `stall` periods late; at the end of the run it holds the sleeping thread
    (until released) and says so. `on_time(t)` runs whenever its time moved (a link's arrivals)."""

    def __init__(self, stall_at: int = 0, stall: int = 0, ticks: int = TICKS):
        self.t = self.t0 = 100.0
        self.end = self.t + (ticks + 0.5) * PERIOD     # the deadline of tick `ticks` + 1 lies beyond it
        self.stall_at, self.stall, self.stalled = stall_at, stall, stall == 0
        self.done, self.release = threading.Event(), threading.Event()
        self.on_time = lambda t: None
        self.tick_cost = 0.0                            # s of the test clock each cycle takes (cost_of_ticks)

    def now(self) -> float:
        return self.t

    def sleep_until(self, deadline: float, spin: float = 0.0) -> None:
        if deadline > self.end:
            self.done.set()
            self.release.wait(HOLD_S)
            self.t = max(self.t, deadline)
            return
        self.t = max(self.t, deadline)
        if not self.stalled and self.t >= self.t0 + (self.stall_at - 0.5) * PERIOD:
            self.stalled = True
            self.t += self.stall * PERIOD      # the process was not scheduled for `stall` periods
        self.on_time(self.t)


def _target(k: int, q0: np.ndarray) -> np.ndarray:
    """The target of cycle k: every joint moving from rest, within its limits (a host answering each sample
    with the next)."""
    return q0 + 0.05 * (1.0 - np.cos(2 * np.pi * 1.5 * k * PERIOD)) * (1.0 + 0.2 * np.arange(q0.shape[0]))


def _enabled(sim: Simulator) -> int:
    q0 = sim.read_state().position.copy()
    n = sim.n
    sim.set_commands(mode=np.full(n, int(Mode.CSP)), target_position=q0, controlword=np.full(n, cia402.CW_SHUTDOWN))
    sim.step(1)
    sim.set_commands(controlword=np.full(n, cia402.CW_ENABLE_OPERATION))
    sim.step(2)
    assert all(s is State.OPERATION_ENABLED for s in sim.read_state().states())
    return sim.read_state().cycle


def _run(timer: StallingTimer):
    """The simulator's state, truth and clock statistics at the end of the test clock's run."""
    sim = Simulator("generic6", realtime=True, rate_hz=RATE_HZ, seed=3, clock_timer=timer)
    q0 = sim.read_state().position.copy()
    start = _enabled(sim)

    def host(s):
        sim.set_commands(target_position=_target(s.cycle - start + 1, q0))
    sim.add_cycle_callback(host)
    sim.set_commands(target_position=_target(1, q0))
    sim.start()
    try:
        assert timer.done.wait(HOLD_S), "the simulator's thread did not reach the end of the run"
        state, truth, stats = sim.read_state(), sim.read_truth(), sim.lateness()
    finally:
        timer.release.set()
        sim.stop()
    assert sim.error is None
    return state, truth, stats, start


def _assert_same_sample(state, ref_state, truth=None, ref_truth=None) -> None:
    # the same ticks with the same targets in the same order: the same floating-point operations, so the
    # same numbers (the sensors' noise draws too), not merely close ones
    for name in ("position", "velocity", "current", "following_error", "statusword", "error_code"):
        np.testing.assert_array_equal(getattr(state, name), getattr(ref_state, name), err_msg=name)
    if truth is not None:
        np.testing.assert_array_equal(truth.q, ref_truth.q)
        np.testing.assert_array_equal(truth.qd, ref_truth.qd)


@pytest.mark.parametrize("stall", [1, 3, 10, 50, 150, 400])
def test_a_stalled_simulator_runs_every_missed_tick_and_ends_where_an_unstalled_one_does(stall):
    ticks = TICKS + stall
    ref_state, ref_truth, ref_stats, start = _run(StallingTimer(ticks=ticks))
    state, truth, stats, _ = _run(StallingTimer(stall_at=STALL_AT, stall=stall, ticks=ticks))
    assert ref_stats.caught_up == 0 and ref_state.cycle == start + ticks
    # every tick ran: the same cycle, the same simulated time
    assert state.cycle == ref_state.cycle and state.time == ref_state.time
    assert stats.caught_up == stall and stats.rebased == 0 and stats.skipped == 0
    _assert_same_sample(state, ref_state, truth, ref_truth)
    assert not state.error_code.any()


# -- a host at the other end of a link, as the driver on a free-running device's clock ---------------------------
LATENCY = 0.3 * PERIOD      # a sample's way to the host, its answer and the way back (test clock)
LINK_TICKS = 1000           # the linked runs end after this many periods
LINK_STALL_AT = 250         # a quarter of the motion's period: the joints at their fastest
OMEGA = 2 * np.pi * 1.0     # rad/s: the motion's frequency
FAST = 0.9                  # each joint's peak velocity, a fraction of its maximum (generic6: 2.7 to 5.4 rad/s)


def _amplitude(n: int) -> np.ndarray:
    """Each joint's amplitude (rad): its peak velocity FAST times its maximum."""
    return FAST * np.asarray(load_model("generic6").qd_max, dtype=float)[:n] / OMEGA


def _fast(m: int, q0: np.ndarray) -> np.ndarray:
    """The target the host sends in answer to its m-th sample: a fast motion from rest, within the limits."""
    return q0 + _amplitude(q0.shape[0]) * (1.0 - np.cos(OMEGA * m * PERIOD))


def _fast_peak_step(n: int) -> np.ndarray:
    """The most each joint's target moves in a cycle (rad): its peak velocity over one period."""
    return _amplitude(n) * OMEGA * PERIOD


class LinkedHost(DeviceSide):
    """A free-running device side with its host: each sample leaves at the test clock's time, the host answers
    it with the next target of its motion (_fast), and the answer reaches the drives' setpoint buffer LATENCY
    later (sim.drive_targets.DeviceTargets, as on the serial and gateway devices), delivered as the test clock
    moves. `answering` False: the host is silent (its answers never come)."""

    OPTION_SPEC = None

    def __init__(self, timer: StallingTimer):
        self.timer, self.answering = timer, True
        self.wire: deque = deque()          # (arrival time, target) of the answers on their way
        self.answered = 0

    def attach(self, sim) -> None:
        self.sim = sim
        self.targets = DeviceTargets(sim, setpoints_for_device(None, False, "test"))
        self.q0 = sim.read_state().position.copy()
        self.timer.on_time = self._arrive
        self.samples: list[tuple[np.ndarray, int, int]] = []   # every sample: position, error codes, cycle

    def start(self) -> None:
        self.sim.add_cycle_callback(self._on_cycle)

    def stop(self) -> None:
        self.sim.remove_cycle_callback(self._on_cycle)

    def connection(self) -> dict:
        return {}

    def ready_for_tick(self) -> bool:
        return self.targets.ready()

    def enable(self) -> None:
        """Enable the drives in CSP at their position, synchronously (before start), priming the buffer."""
        n, zero = self.sim.n, np.zeros(self.sim.n)
        for cw in (cia402.CW_SHUTDOWN,) + (cia402.CW_ENABLE_OPERATION,) * 5:
            self.targets.arrived(np.full(n, cw), np.full(n, int(Mode.CSP)), self.q0, zero, zero)
            self.sim.step(1)
            self.targets.after_cycle()
        assert all(s is State.OPERATION_ENABLED for s in self.sim.read_state().states())

    def _on_cycle(self, s) -> None:
        self.targets.after_cycle()
        self.samples.append((s.position.copy(), int(s.error_code.max()), s.cycle))
        if self.answering:
            self.answered += 1
            self.wire.append((self.timer.now() + LATENCY, _fast(self.answered, self.q0)))

    def _arrive(self, t: float) -> None:
        n, zero = self.sim.n, np.zeros(self.sim.n)
        while self.wire and self.wire[0][0] <= t:
            _, target = self.wire.popleft()
            self.targets.arrived(np.full(n, cia402.CW_ENABLE_OPERATION), np.full(n, int(Mode.CSP)), target, zero, zero)


def _linked_run(timer: StallingTimer, silent_from: int | None = None):
    """The linked host's run on the test clock, taken at its end (the simulator's thread held there): (what the
    run saw, the clock's statistics, the final sample)."""
    link = LinkedHost(timer)
    sim = Simulator("generic6", link, realtime=True, rate_hz=RATE_HZ, seed=3, clock_timer=timer)
    link.enable()
    if silent_from is not None:
        def fall_silent(s, start=sim.read_state().cycle):
            if s.cycle - start >= silent_from:
                link.answering = False
        sim.add_cycle_callback(fall_silent)
    sim.start()
    try:
        assert timer.done.wait(HOLD_S), "the simulator's thread did not reach the end of the run"
        state, stats = sim.read_state(), sim.lateness()
        seen = Seen(link.samples[:], dataclasses.replace(link.targets.setpoints.counts),
                    dataclasses.replace(link.targets.streams.counts))
    finally:
        timer.release.set()
        sim.stop()
    assert sim.error is None
    return seen, stats, state


@dataclasses.dataclass
class Seen:
    samples: list        # (position, largest error code, cycle) of every sample
    buffer: object       # the setpoint buffer's counts (firmware_bridge.runtime.setpoint_buffer.BufferCounts)
    streams: object      # the drives' target streams' counts (sim.drive_targets.TargetCounts)


@pytest.fixture(scope="module")
def linked_reference():
    return _linked_run(StallingTimer(ticks=LINK_TICKS))


@pytest.mark.parametrize("stall", [50, 150, 400])
def test_a_simulator_stalled_in_a_fast_motion_catches_up_with_the_hosts_answers_without_a_jump_or_fault(
        stall, linked_reference):
    """Stopped for `stall` periods while every joint moves at 90 % of its maximum velocity: each missed tick waits
    for the host's answer to the missed samples before it runs, as a drive that was never late had it. Every tick
    runs, none is given up, no drive faults, the position moves no more in a cycle than the motion's velocity
    allows, and the whole run is the unstalled one, sample for sample. (Run back to back before the answers, 50
    missed ticks held the drives in mid-motion: 64-66 mrad of following error, fault 0x8611; 150 and 400 were
    given up.)"""
    ref, ref_stats, ref_state = linked_reference
    link, stats, state = _linked_run(StallingTimer(stall_at=LINK_STALL_AT, stall=stall, ticks=LINK_TICKS))
    assert ref_stats.caught_up == 0 and ref.buffer.underruns == 0
    codes = np.array([c for _, c, _ in link.samples])
    assert not codes.any(), f"a drive faulted: 0x{int(codes.max()):04X}"
    q = np.array([p for p, _, _ in link.samples])
    assert np.array_equal([c for _, _, c in link.samples], np.arange(len(q)) + link.samples[0][2])
    # the arm tracks the motion: a cycle moves it at most by the target's peak step, plus the drive's
    # overshoot of a reference that accelerates at amplitude * OMEGA^2 (a few percent at most)
    assert (np.abs(np.diff(q, axis=0)) <= 1.1 * _fast_peak_step(q.shape[1])).all()
    assert len(link.samples) == len(ref.samples)
    np.testing.assert_array_equal(q, np.array([p for p, _, _ in ref.samples]))
    _assert_same_sample(state, ref_state)
    assert link.buffer == ref.buffer and link.streams == ref.streams    # no target missed, none more held
    # every missed tick ran, and the periods that passed while it waited for the host ran late as well
    assert stats.caught_up >= stall and stats.rebased == 0 and stats.skipped == 0
    assert stats.waited > 0                              # the catch-up went at the pace of the host's answers


def test_a_catch_up_whose_host_does_not_answer_is_given_up_and_counted_not_run_without_targets():
    """The host falls silent just before the stall: the first missed tick waits for its answer until the catch-up's
    window (the stall's own length) ends without progress, and the catch-up is given up, counted: the arm's time
    pauses where it stood rather than running the drives in the middle of a motion without their targets."""
    stall = 150
    link, stats, _ = _linked_run(StallingTimer(stall_at=LINK_STALL_AT, stall=stall, ticks=LINK_TICKS),
                                 silent_from=LINK_STALL_AT - 10)
    assert stats.rebased == 1 and stats.waited == 1
    assert stats.skipped >= 2 * stall - 1                # the stall, and the window it waited through
    # nothing ran without its target during the catch-up: the drives missed only the on-time cycles before the
    # stall and after the re-based schedule, never a caught-up one
    assert stats.caught_up == 0


def test_a_catch_up_that_does_not_converge_is_given_up_and_counted():
    """Ticks that cost more than a period (here 1.5, on the test clock) never catch up: after one window without
    progress the schedule is re-based, the ticks it was behind counted as skipped, and the simulator runs on."""
    timer = StallingTimer(stall_at=STALL_AT, stall=20, ticks=STALL_AT + 200)
    sim = Simulator("generic6", realtime=True, rate_hz=RATE_HZ, seed=3, clock_timer=timer)
    start = _enabled(sim)

    def costly(s):
        if s.cycle - start > STALL_AT - 5:
            timer.t += 1.5 * PERIOD
    sim.add_cycle_callback(costly)
    sim.start()
    try:
        assert timer.done.wait(HOLD_S), "the simulator's thread did not reach the end of the run"
        stats = sim.lateness()
    finally:
        timer.release.set()
        sim.stop()
    assert sim.error is None
    assert stats.rebased >= 1 and stats.skipped >= 20
    # given up within a window (and one tick) of the last time it made progress, each time
    assert stats.skipped <= stats.rebased * (20 + 2 * CATCH_UP_WINDOW_PERIODS)
    assert "skipped" in str(stats)


def test_the_clock_without_a_stall_counts_nothing_caught_up_and_waits_for_nothing():
    timer = StallingTimer(ticks=50)
    clock = RealtimeClock(RATE_HZ, timer=timer)
    clock.start()
    late = [clock.wait(lambda: False) for _ in range(50)]      # on time, nothing waits for the link
    stats = clock.stats()
    assert max(late) == 0.0 and stats.caught_up == 0 and stats.skipped == 0 and stats.waited == 0


@pytest.mark.parametrize("kwargs", [{"window": -1.0}, {"window": float("nan")}, {"window": "3"}, {"window": True}])
def test_impossible_catch_up_settings_are_refused_naming_them(kwargs):
    (name,) = kwargs
    with pytest.raises(InputError, match=name):
        RealtimeClock(RATE_HZ, **kwargs)
