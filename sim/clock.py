"""Time for the simulator: a real-time tick source with lateness statistics, or none at all (fast mode).

RealtimeClock keeps an absolute schedule t0 + k / rate on time.perf_counter. Each wait blocks until the
deadline with the driver's timer (firmware_bridge/runtime/rt_timing.py: an absolute clock_nanosleep, the thread's timer slack set
to 1 ns by start(), so the wake-up comes within the scheduler's latency) and, only when `spin` > 0, busy-waits
the last `spin` seconds (holding the GIL and a core: the simulator shares the machine with the driver in every
test and demo, so by default it does not). Lateness is the wake-up time minus the deadline.

A process that was not scheduled wakes periods late. The schedule stays absolute: each wait() after a late one
returns at once until the ticks the process missed have run (`caught_up` counts those run half a period or
more late: a missed period's tick, not only a late wake-up), so the physics loses no time. The work is bounded: one tick per wait(), and a wake-up later than
`max_behind` seconds (a suspended process, or ticks that cost more than a period and never catch up) re-bases
the schedule instead, counts as `rebased` with the ticks given up in `skipped`, and logs a warning (throttled).

`timer` replaces the host's clock (an object with now() -> s on time.perf_counter's scale and
sleep_until(deadline_s, spin_s)): a test drives the schedule with a clock of its own, a stall included.

A real device's crystal is not the host's: `drift_ppm` stretches the period on the host's clock by that many
parts per million (positive: the device runs slow), and `jitter_s` moves each wake-up by a normally
distributed offset of that standard deviation (bounded at 3 sigma, not accumulating: the schedule stays
absolute), as a device's interrupt latency does. The device's own time still advances one nominal period per
tick; only when its ticks happen on the host's clock changes.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.rt_timing import name_os_thread, reduce_timer_slack, sleep_until
from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.log_throttle import Throttle

_log = logging.getLogger(__name__)
REBASE_LOG_INTERVAL_S = 10.0    # re-based schedules: the first logged, then one line per interval with a count


@dataclass(frozen=True)
class LatenessStats:
    """Lateness of the ticks so far (seconds). Percentiles over the last `window` ticks, max over all."""

    count: int
    p50: float
    p99: float
    max: float
    mean: float
    rebased: int
    window: int
    caught_up: int = 0      # ticks run half a period or more after their deadline (missed ones, run in full)
    skipped: int = 0        # ticks given up when the schedule was re-based (later than max_behind)

    def __str__(self) -> str:
        return (f"{self.count} ticks, lateness p50 {self.p50 * 1e6:.1f} us, p99 {self.p99 * 1e6:.1f} us, "
                f"max {self.max * 1e6:.1f} us, caught up {self.caught_up}, rebased {self.rebased} "
                f"({self.skipped} ticks skipped)")


class HostTimer:
    """The host's clock for RealtimeClock: time.perf_counter and the driver's absolute sleep."""

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    @staticmethod
    def sleep_until(deadline_s: float, spin_s: float = 0.0) -> None:
        sleep_until(int(deadline_s * 1e9), int(spin_s * 1e9))


MAX_DRIFT_PPM = 10_000.0        # 1 %: beyond any crystal; larger values are typing errors
MAX_JITTER_PERIODS = 0.3        # the standard deviation of the wake-up jitter, in periods


class RealtimeClock:
    """Ticks at rate_hz. Use from one thread: start(), then wait() before every cycle."""

    def __init__(self, rate_hz: float = 1000.0, *, spin: float = 0.0, history: int = 1 << 18,
                 max_behind: float = 0.1, drift_ppm: float = 0.0, jitter_s: float = 0.0, seed: int | None = None,
                 timer=None):
        if not (isinstance(rate_hz, (int, float)) and math.isfinite(rate_hz) and rate_hz > 0):
            raise InputError(f"rate_hz: expected a positive number, got {rate_hz!r}")
        if isinstance(drift_ppm, bool) or not (isinstance(drift_ppm, (int, float)) and abs(drift_ppm) <= MAX_DRIFT_PPM):
            raise InputError(f"clock drift: expected a number of ppm within +-{MAX_DRIFT_PPM:g}, got {drift_ppm!r}")
        if isinstance(jitter_s, bool) or not (isinstance(jitter_s, (int, float)) and 0.0 <= jitter_s <= MAX_JITTER_PERIODS / rate_hz):
            raise InputError(f"clock jitter: expected 0 to {MAX_JITTER_PERIODS:g} periods ({MAX_JITTER_PERIODS / rate_hz * 1e6:g} us) "
                             f"at {rate_hz:g} Hz, got {jitter_s!r} s")
        self.drift_ppm = float(drift_ppm)
        self.jitter_s = float(jitter_s)
        self._rng = np.random.default_rng(seed)
        self.period = (1.0 + self.drift_ppm * 1e-6) / float(rate_hz)
        self.spin = float(spin)
        self.max_behind = float(max_behind)
        self._late = np.zeros(int(history))
        self._count = 0
        self._max = 0.0
        self._sum = 0.0
        self._rebased = 0
        self._caught_up = 0
        self._skipped = 0
        self._deadline = 0.0
        self.timer = HostTimer() if timer is None else timer
        self._rebase_log = Throttle(_log, logging.WARNING, REBASE_LOG_INTERVAL_S)

    def start(self) -> None:
        """Begin the schedule: the first deadline is one period from now. Call it from the ticking thread (its
        timer slack is reduced here)."""
        name_os_thread()
        reduce_timer_slack()
        self._deadline = self.timer.now() + self.period

    def wait(self) -> float:
        """Block until the next deadline; returns the lateness (s) of this wake-up. A deadline already past
        returns at once (a missed tick, run now); one past by more than max_behind re-bases the schedule."""
        deadline = self._deadline
        if self.jitter_s > 0.0:
            deadline += self.jitter_s * float(np.clip(self._rng.standard_normal(), -3.0, 3.0))
        self.timer.sleep_until(deadline, self.spin)
        now = self.timer.now()
        late = max(now - deadline, 0.0)
        self._record(late)
        if late > self.max_behind:
            skipped = int(late / self.period)
            self._rebased += 1
            self._skipped += skipped
            self._rebase_log.hit("simulator clock: woke %.1f ms late, more than %.1f ms: %d ticks skipped, not "
                                 "caught up (the process was not scheduled, or a tick costs more than a period)",
                                 late * 1e3, self.max_behind * 1e3, skipped, skipped_ticks=self._skipped)
            self._deadline = now + self.period
        else:
            if late >= 0.5 * self.period:       # a missed period's tick, not only a late wake-up
                self._caught_up += 1
            self._deadline = self._deadline + self.period
        return late

    def _record(self, late: float) -> None:
        self._late[self._count % self._late.shape[0]] = late
        self._count += 1
        self._sum += late
        if late > self._max:
            self._max = late

    def stats(self) -> LatenessStats:
        """Lateness statistics so far (p50/p99 over the last `history` ticks)."""
        k = min(self._count, self._late.shape[0])
        if k == 0:
            return LatenessStats(0, 0.0, 0.0, 0.0, 0.0, self._rebased, 0, self._caught_up, self._skipped)
        p50, p99 = np.percentile(self._late[:k], [50, 99])
        return LatenessStats(self._count, float(p50), float(p99), self._max, self._sum / self._count,
                             self._rebased, k, self._caught_up, self._skipped)


class FastClock:
    """No waiting: the simulation runs as fast as the machine allows."""

    period = 0.0

    def start(self) -> None:
        pass

    def wait(self) -> float:
        return 0.0

    def stats(self) -> LatenessStats:
        return LatenessStats(0, 0.0, 0.0, 0.0, 0.0, 0, 0)
