"""A free-running simulator whose process was not scheduled catches its physics up exactly: it runs every tick it
missed, each with the targets the drives held, so that after the catch-up its state is the state of a run that
was never stalled. A stall longer than the bound (sim.simulator.CATCH_UP_PERIODS) gives the ticks up, counted.

The simulator's own thread runs on a test clock (sim.clock.RealtimeClock's `timer`): time moves to each deadline
as the simulator sleeps, and a stall is one wake-up K periods late. Both runs end at the same instant of that
clock; the run stops there (the clock holds the thread), so the comparison is of the same tick, in lockstep.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode, State
from sim import Simulator
from sim.clock import RealtimeClock
from sim.simulator import CATCH_UP_PERIODS

RATE_HZ = 1000.0
PERIOD = 1.0 / RATE_HZ
TICKS = 300                 # the run ends after this many periods of the test clock
STALL_AT = 120              # the wake-up that comes late
HOLD_S = 60.0               # the longest the test waits for the simulator's thread to reach the end


class StallingTimer:
    """A test clock: sleeping until a deadline moves its time there; wake-up `stall_at` comes `stall` periods
    late; at the end of the run it holds the sleeping thread (until released) and says so."""

    def __init__(self, stall_at: int = 0, stall: int = 0, ticks: int = TICKS):
        self.t = 100.0
        self.end = self.t + (ticks + 0.5) * PERIOD     # the deadline of tick `ticks` + 1 lies beyond it
        self.stall_at, self.stall, self.wakes = stall_at, stall, 0
        self.done, self.release = threading.Event(), threading.Event()

    def now(self) -> float:
        return self.t

    def sleep_until(self, deadline: float, spin: float = 0.0) -> None:
        if deadline > self.end:
            self.done.set()
            self.release.wait(HOLD_S)
            return
        self.t = max(self.t, deadline)
        self.wakes += 1
        if self.wakes == self.stall_at:
            self.t += self.stall * PERIOD      # the process was not scheduled for `stall` periods


def _target(k: int, q0: np.ndarray) -> np.ndarray:
    """The target of cycle k: every joint moving from rest, within its limits (a host answering each sample
    with the next)."""
    return q0 + 0.05 * (1.0 - np.cos(2 * np.pi * 1.5 * k * PERIOD)) * (1.0 + 0.2 * np.arange(q0.shape[0]))


def _run(timer: StallingTimer):
    """The simulator's state, truth and clock statistics at the end of the test clock's run."""
    sim = Simulator("generic6", realtime=True, rate_hz=RATE_HZ, seed=3, clock_timer=timer)
    n = sim.n
    q0 = sim.read_state().position.copy()
    sim.set_commands(mode=np.full(n, int(Mode.CSP)), target_position=q0, controlword=np.full(n, cia402.CW_SHUTDOWN))
    sim.step(1)
    sim.set_commands(controlword=np.full(n, cia402.CW_ENABLE_OPERATION))
    sim.step(2)
    assert all(s is State.OPERATION_ENABLED for s in sim.read_state().states())
    start = sim.read_state().cycle

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


@pytest.mark.parametrize("stall", [1, 3, 10, 50])
def test_a_stalled_simulator_runs_every_missed_tick_and_ends_where_an_unstalled_one_does(stall):
    ref_state, ref_truth, ref_stats, start = _run(StallingTimer())
    state, truth, stats, _ = _run(StallingTimer(stall_at=STALL_AT, stall=stall))
    assert ref_stats.caught_up == 0 and ref_state.cycle == start + TICKS
    # every tick ran: the same cycle, the same simulated time
    assert state.cycle == ref_state.cycle and state.time == ref_state.time
    assert stats.caught_up == stall and stats.rebased == 0 and stats.skipped == 0
    # the same ticks with the same targets in the same order: the same floating-point operations, so the
    # same numbers (the sensors' noise draws too), not merely close ones
    for name in ("position", "velocity", "current", "following_error", "statusword", "error_code"):
        np.testing.assert_array_equal(getattr(state, name), getattr(ref_state, name), err_msg=name)
    np.testing.assert_array_equal(truth.q, ref_truth.q)
    np.testing.assert_array_equal(truth.qd, ref_truth.qd)
    assert not state.error_code.any()


def test_a_stall_beyond_the_bound_is_given_up_and_counted_not_run_in_a_burst():
    stall = CATCH_UP_PERIODS + 20
    state, _, stats, start = _run(StallingTimer(stall_at=STALL_AT, stall=stall))
    assert stats.rebased == 1 and stats.skipped == stall and stats.caught_up == 0
    # the ticks the stall took are lost, not run: the run ended that many cycles short
    assert state.cycle == start + TICKS - stall
    assert "skipped" in str(stats)


def test_the_clock_without_a_stall_counts_nothing_caught_up():
    timer = StallingTimer(ticks=50)
    clock = RealtimeClock(RATE_HZ, max_behind=CATCH_UP_PERIODS * PERIOD, timer=timer)
    clock.start()
    late = [clock.wait() for _ in range(50)]
    assert max(late) == 0.0 and clock.stats().caught_up == 0 and clock.stats().skipped == 0
