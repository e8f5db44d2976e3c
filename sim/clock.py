"""Time for the simulator: a real-time tick source with lateness statistics, or none at all (fast mode).

RealtimeClock keeps an absolute schedule t0 + k / rate on time.perf_counter. Each wait blocks until the
deadline with the driver's timer (firmware_bridge/runtime/rt_timing.py: an absolute clock_nanosleep, the thread's timer slack set
to 1 ns by start(), so the wake-up comes within the scheduler's latency) and, only when `spin` > 0, busy-waits
the last `spin` seconds (holding the GIL and a core: the simulator shares the machine with the driver in every
test and demo, so by default it does not). Lateness is the wake-up time minus the deadline. A tick missed
by more than `max_behind` seconds (e.g. the process was suspended) re-bases the schedule instead of running a
burst of catch-up ticks, and counts as `rebased`: the ticks in between are lost, not run late.

A real device's crystal is not the host's: `drift_ppm` stretches the period on the host's clock by that many
parts per million (positive: the device runs slow), and `jitter_s` moves each wake-up by a normally
distributed offset of that standard deviation (bounded at 3 sigma, not accumulating: the schedule stays
absolute), as a device's interrupt latency does. The device's own time still advances one nominal period per
tick; only when its ticks happen on the host's clock changes.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.rt_timing import name_os_thread, reduce_timer_slack, sleep_until
from firmware_bridge.runtime.errors import InputError


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

    def __str__(self) -> str:
        return (f"{self.count} ticks, lateness p50 {self.p50 * 1e6:.1f} us, p99 {self.p99 * 1e6:.1f} us, "
                f"max {self.max * 1e6:.1f} us, rebased {self.rebased}")


MAX_DRIFT_PPM = 10_000.0        # 1 %: beyond any crystal; larger values are typing errors
MAX_JITTER_PERIODS = 0.3        # the standard deviation of the wake-up jitter, in periods


class RealtimeClock:
    """Ticks at rate_hz. Use from one thread: start(), then wait() before every cycle."""

    def __init__(self, rate_hz: float = 1000.0, *, spin: float = 0.0, history: int = 1 << 18,
                 max_behind: float = 0.1, drift_ppm: float = 0.0, jitter_s: float = 0.0, seed: int | None = None):
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
        self._deadline = 0.0

    def start(self) -> None:
        """Begin the schedule: the first deadline is one period from now. Call it from the ticking thread (its
        timer slack is reduced here)."""
        name_os_thread()
        reduce_timer_slack()
        self._deadline = time.perf_counter() + self.period

    def wait(self) -> float:
        """Block until the next deadline; returns the lateness (s) of this wake-up."""
        deadline = self._deadline
        if self.jitter_s > 0.0:
            deadline += self.jitter_s * float(np.clip(self._rng.standard_normal(), -3.0, 3.0))
        sleep_until(int(deadline * 1e9), int(self.spin * 1e9))
        now = time.perf_counter()
        late = max(now - deadline, 0.0)
        self._record(late)
        if late > self.max_behind:
            self._rebased += 1
            self._deadline = now + self.period
        else:
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
            return LatenessStats(0, 0.0, 0.0, 0.0, 0.0, self._rebased, 0)
        p50, p99 = np.percentile(self._late[:k], [50, 99])
        return LatenessStats(self._count, float(p50), float(p99), self._max, self._sum / self._count,
                             self._rebased, k)


class FastClock:
    """No waiting: the simulation runs as fast as the machine allows."""

    period = 0.0

    def start(self) -> None:
        pass

    def wait(self) -> float:
        return 0.0

    def stats(self) -> LatenessStats:
        return LatenessStats(0, 0.0, 0.0, 0.0, 0.0, 0, 0)
