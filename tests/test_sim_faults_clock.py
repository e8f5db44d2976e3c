"""Fault-injection switches (frame fates with seeded probabilities, bit flips, silence, latency spikes,
refused settings) and the simulator's clocks."""
import math
import time

import numpy as np
import pytest

from firmware_bridge.cia402 import State
from firmware_bridge.runtime.errors import InputError
from sim import Simulator
from sim.clock import FastClock, RealtimeClock
from sim.faults import FaultInjection, Fate


def fates(faults: FaultInjection, n: int) -> dict:
    out = {f: 0 for f in Fate}
    for _ in range(n):
        out[faults.frame_fate()] += 1
    return out


def within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1


def test_frame_fates_follow_the_configured_probabilities_and_the_seed():
    faults = FaultInjection(6, seed=3)
    assert fates(faults, 1000) == {Fate.DELIVER: 1000, Fate.DROP: 0, Fate.CORRUPT: 0, Fate.BAD_CRC: 0}
    faults.set_frame_faults(drop=0.2, corrupt=0.1, bad_crc=0.05)
    n = 20000
    got = fates(faults, n)
    assert within(got[Fate.DROP], n, 0.2) and within(got[Fate.CORRUPT], n, 0.1)
    assert within(got[Fate.BAD_CRC], n, 0.05) and within(got[Fate.DELIVER], n, 0.65)
    assert faults.counts["dropped"] == got[Fate.DROP] and faults.counts["bad_crc"] == got[Fate.BAD_CRC]
    a, b = FaultInjection(6, seed=9), FaultInjection(6, seed=9)
    for f in (a, b):
        f.set_frame_faults(drop=0.3, corrupt=0.3)
    assert [a.frame_fate() for _ in range(200)] == [b.frame_fate() for _ in range(200)]


def test_silence_drops_everything_and_clear_restores_delivery():
    faults = FaultInjection(6)
    faults.set_frame_faults(silent=True)
    assert fates(faults, 100)[Fate.DROP] == 100
    faults.clear()
    assert fates(faults, 100)[Fate.DELIVER] == 100


def test_corruption_flips_exactly_one_bit():
    faults = FaultInjection(6, seed=1)
    frame = bytes(range(40))
    for _ in range(200):
        bad = faults.corrupt(frame)
        assert len(bad) == len(frame)
        assert sum(bin(x ^ y).count("1") for x, y in zip(frame, bad)) == 1
    assert faults.corrupt(b"") == b""


def test_latency_spikes_come_with_the_configured_probability_and_size():
    faults = FaultInjection(6, seed=5)
    assert faults.latency() == 0.0
    faults.set_frame_faults(latency_spike_probability=0.25, latency_spike_s=0.004)
    delays = [faults.latency() for _ in range(8000)]
    assert set(delays) == {0.0, 0.004}
    assert within(delays.count(0.004), 8000, 0.25)


@pytest.mark.parametrize("kwargs, match", [
    ({"drop": 1.5}, "drop: expected a probability"),
    ({"corrupt": -0.1}, "corrupt: expected a probability"),
    ({"bad_crc": True}, "bad_crc: expected a probability"),
    ({"latency_spike_s": -1.0}, "latency_spike_s"),
    ({"drop": 0.6, "corrupt": 0.6}, "exceed 1"),
])
def test_bad_fault_settings_are_refused(kwargs, match):
    with pytest.raises(InputError, match=match):
        FaultInjection(6).set_frame_faults(**kwargs)


def test_drive_fault_and_stall_switches_validate_the_joint():
    faults = FaultInjection(6)
    with pytest.raises(InputError, match=r"joint index: expected 0..5, got 6"):
        faults.drive_fault(6)
    with pytest.raises(InputError, match="error code"):
        faults.drive_fault(0, code=0x10000)
    faults.stall(2)
    assert faults.stalled().tolist() == [False, False, True, False, False, False]


def test_an_injected_fault_reaches_the_drive_at_the_next_cycle():
    sim = Simulator("generic6")
    sim.step(1)
    sim.faults.drive_fault(4, 0x7500)
    assert sim.read_state().states()[4] is State.SWITCH_ON_DISABLED
    sim.step(1)
    assert sim.read_state().states()[4] is State.FAULT_REACTION_ACTIVE
    assert sim.read_state().error_code.tolist() == [0, 0, 0, 0, 0x7500, 0]


def test_realtime_clock_ticks_are_never_early_and_its_statistics_are_ordered():
    clock = RealtimeClock(500.0, history=64)
    clock.start()
    t0 = time.perf_counter()
    late = [clock.wait() for _ in range(100)]
    elapsed = time.perf_counter() - t0
    assert elapsed >= 100 / 500.0 - 1 / 500.0       # 100 ticks take at least 99 periods (first after one)
    assert min(late) >= 0.0
    stats = clock.stats()
    assert stats.count == 100 and stats.window == 64
    assert stats.max == max(late)
    assert stats.p50 == pytest.approx(float(np.percentile(late[-64:], 50)))
    assert 0.0 <= stats.p50 <= stats.p99 <= stats.max
    assert "p99" in str(stats)


def test_fast_clock_never_waits_and_rates_are_checked():
    clock = FastClock()
    clock.start()
    assert clock.wait() == 0.0 and clock.stats().count == 0
    with pytest.raises(InputError, match="rate_hz"):
        RealtimeClock(0.0)
    with pytest.raises(InputError, match="rate_hz"):
        Simulator("generic6", rate_hz=-5)
