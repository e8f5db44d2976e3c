"""Devices on their own clocks: the simulator's drifting, jittering clock, the drives' setpoint buffer, and the
driver's one target per device sample on the device's clock.

The demo chain's free-running runs (tests/test_e2e.py, `--clocking free`) check the end result, the 3-sigma
identification; these check each piece on its own, exactly.
"""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import zmq

from driver.daemon import Driver, Endpoints
from driver.transports.serial_link import SerialArm
from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode, State
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from sim import Simulator, clock
from sim.drive_targets import DeviceTargets
from sim.gateway_device import GatewayDevice
from sim.serial_device import SerialDevice
from firmware_bridge.runtime.setpoint_buffer import TargetBuffer
from waiting import wait_until

LOCAL = Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


# -- the setpoint buffer --------------------------------------------------------------------------------------
def _target(k: int) -> tuple[np.ndarray, np.ndarray]:
    return np.full(2, float(k)), np.full(2, -float(k))


def test_the_buffer_primes_to_its_depth_then_gives_one_target_per_cycle_in_order():
    buf = TargetBuffer(2)
    buf.push(*_target(1))
    assert buf.take() is None                      # priming: one of two queued
    buf.push(*_target(2))
    got = buf.take()
    assert got[0][0] == 1.0 and got[1][0] == -1.0
    buf.push(*_target(3))
    assert buf.take()[0][0] == 2.0 and buf.take()[0][0] == 3.0
    assert buf.take() is None and buf.counts.underruns == 1       # running dry is counted, nothing invented
    assert (buf.counts.received, buf.counts.consumed, buf.counts.skipped) == (3, 3, 0)


def test_arrival_jitter_within_the_depth_costs_nothing_and_a_burst_keeps_the_latency_at_the_depth():
    """Late targets (a gap, then two at once) are each consumed once, in order. A burst from a host that was
    late 5 cycles does not become lasting latency: the oldest of it are dropped (counted), and right after it
    the buffer holds `depth` targets again, each consumed `depth` cycles after it came, as a drive's
    interpolation buffer of fixed size does."""
    buf = TargetBuffer(2)
    arrivals = [1, 1, 0, 2, 1, 0, 2, 1, 1, 0, 2, 1]   # targets arriving in each cycle: late by up to depth - 1
    k, taken = 0, []
    for count in arrivals:
        for _ in range(count):
            k += 1
            buf.push(*_target(k))
        got = buf.take()
        taken.append(None if got is None else int(got[0][0]))
    consumed = [x for x in taken if x is not None]
    assert consumed == list(range(1, len(consumed) + 1))     # late ones are not dropped: in order, each once
    assert buf.counts.skipped == 0 and buf.counts.underruns == taken[1:].count(None)
    for _ in range(5):                              # the host was 5 cycles late: its backlog comes at once
        k += 1
        buf.push(*_target(k))
    assert len(buf) == buf.depth and buf.counts.skipped == 5 + 1 - buf.depth   # the oldest went, counted
    levels, lags = [], []
    for cycle in range(20):                         # then one target per cycle
        k += 1
        buf.push(*_target(k))
        got = buf.take()
        levels.append(len(buf))
        lags.append(k - int(got[0][0]))
    assert set(levels) == {buf.depth - 1}           # the standing level of a buffer that just primed ...
    assert set(lags) == {buf.depth - 1}             # ... so each target is used depth - 1 pushes after it came
    buf.reset()
    buf.push(*_target(99))
    assert buf.take() is None                       # a reset primes again


def test_a_burst_in_motion_is_carried_out_in_full_and_its_excess_drops_once_at_rest():
    """With `still` (the simulated drives'): a 5-target burst while the targets move is consumed one per cycle,
    none skipped (dropping would step the target by the backlog); once they stand still the excess drops and
    the latency is back at the depth."""
    buf = TargetBuffer(2, still=np.full(2, 1e-6))
    k, taken = 0, []

    def cycle(arrivals: int, moving: bool) -> None:
        nonlocal k
        for _ in range(arrivals):
            k += 1 if moving else 0
            buf.push(*_target(k))
        got = buf.take()
        taken.append(None if got is None else int(got[0][0]))

    for arrivals in [1, 1, 1, 0, 0, 0, 0, 0, 6, 1, 1, 1]:      # moving: a late burst
        cycle(arrivals, True)
    consumed = [x for x in taken if x is not None]
    assert consumed == list(range(1, len(consumed) + 1)) and buf.counts.skipped == 0    # no target skipped
    assert len(buf) > buf.depth                                 # the latency is still the burst's
    for _ in range(6):                                          # at rest: the same target again and again
        cycle(1, False)
    assert len(buf) == buf.depth - 1 and buf.counts.skipped > 0


def test_late_targets_of_cycles_the_drive_extrapolated_over_go_and_the_latency_stays_at_the_depth():
    """A host late by 2 cycles in the middle of a motion: the buffer runs dry for 2 cycles (the drive continues
    its stream over them) and the 2 targets of those cycles come late, with the next ones. They go (counted),
    so the drive goes on with the target of the cycle it is in, the depth behind the host, as before; a stall
    longer than the drive extrapolates over drops only that many and carries the rest out in full."""
    def run(extrapolated: int, arrivals: list[int]) -> tuple[list, TargetBuffer]:
        buf = TargetBuffer(2, still=np.full(2, 1e-6), extrapolated=extrapolated)
        k, taken = 0, []
        for count in arrivals:
            for _ in range(count):
                k += 1
                buf.push(*_target(k))
            got = buf.take()
            taken.append(None if got is None else int(got[0][0]))
        return taken, buf

    taken, buf = run(4, [1, 1, 1, 1, 0, 0, 0, 4, 1, 1, 1, 1])
    assert taken == [None, 1, 2, 3, 4, None, None, 7, 8, 9, 10, 11]    # 5 and 6 were for the dry cycles
    assert buf.counts.skipped == 2 and len(buf) == buf.depth - 1       # the standing level of before
    taken, buf = run(1, [1, 1, 1, 1, 0, 0, 0, 4, 1, 1, 1, 1])
    assert taken == [None, 1, 2, 3, 4, None, None, 6, 7, 8, 9, 10]     # one cycle's worth went, the rest runs
    assert buf.counts.skipped == 1 and len(buf) == buf.depth


def test_a_latency_bound_below_the_depth_is_refused():
    with pytest.raises(InputError, match="max_queued"):
        TargetBuffer(3, max_queued=2)


@pytest.mark.parametrize("depth", [0, -1, 17, 2.0, True, "2"])
def test_a_buffer_depth_outside_its_range_is_refused_naming_it(depth):
    with pytest.raises(InputError, match="target_buffer"):
        TargetBuffer(depth)


def _csp_sim(model, depth: int) -> tuple[Simulator, DeviceTargets]:
    """A simulator with its drives in CSP, enabled, and a device side's targets (sim.drive_targets.DeviceTargets,
    what the serial and gateway devices use) with a setpoint buffer of `depth` cycles (0: none)."""
    sim = Simulator(model, seed=3)
    targets = DeviceTargets(sim, TargetBuffer(depth) if depth else None)
    q0 = sim.read_state().position.copy()
    csp = np.full(model.n, int(Mode.CSP))
    for cw in (cia402.CW_SHUTDOWN, cia402.CW_ENABLE_OPERATION, cia402.CW_ENABLE_OPERATION, cia402.CW_ENABLE_OPERATION):
        targets.arrived(np.full(model.n, cw), csp, q0, np.zeros(model.n), np.zeros(model.n))
        targets.after_cycle()
        sim.step(1)
    assert sim.read_state().states() == [State.OPERATION_ENABLED] * model.n
    return sim, targets


def _run(rig, targets: np.ndarray, arrivals: list[int]) -> np.ndarray:
    """Hand the targets to the device side in order, arrivals[k] of them before cycle k; the true joint angles
    of every cycle."""
    sim, device = rig
    cw, csp, zero = np.full(sim.n, cia402.CW_ENABLE_OPERATION), np.full(sim.n, int(Mode.CSP)), np.zeros(sim.n)
    q, i = [], 0
    for count in arrivals:
        for _ in range(count):
            device.arrived(cw, csp, targets[i], zero, zero)
            i += 1
        device.after_cycle()
        sim.step(1)
        q.append(sim.read_truth().q.copy())
    return np.array(q)


def test_with_a_setpoint_buffer_jittered_arrival_moves_the_arm_exactly_as_regular_arrival(model):
    """The same targets, one per cycle or in bursts and gaps within the buffer's depth: the arm's motion is
    identical (to the bit). Without the buffer (each target acts as it comes, the drives continuing the
    received ones over a gap) it is not: the test can tell the difference."""
    K = 400
    q0 = _csp_sim(model, 0)[0].read_state().position
    s = np.sin(np.linspace(0.0, np.pi, K))[:, None]
    targets = q0 + 0.2 * s * np.array([1.0, -0.5, 0.8, 0.3, -0.6, 0.4])
    regular = [1] * K
    rng = np.random.default_rng(7)
    jittered = []
    while sum(jittered) < K - 2:                    # a late target, then two at once
        jittered += [0, 2] if rng.random() < 0.2 else [1]
    jittered += [K - sum(jittered)] + [0] * (len(regular) - len(jittered) - 1)
    assert sum(jittered) == K and len(jittered) == K
    smooth = _run(_csp_sim(model, 2), targets, regular)
    buffered = _run(_csp_sim(model, 2), targets, jittered)
    np.testing.assert_array_equal(buffered, smooth)
    unbuffered = _run(_csp_sim(model, 0), targets, jittered)
    assert np.abs(unbuffered - smooth).max() > 1e-7


# -- the simulator's own clock ----------------------------------------------------------------------------------
def test_the_device_clock_drifts_by_its_ppm_and_jitters_within_3_sigma_without_accumulating(monkeypatch):
    """The deadlines the clock sleeps to (no wall clock is read for the check): each tick is one drifted period
    after the last on the schedule, and each wake-up moves by at most 3 sigma of jitter around it."""
    asked = []
    monkeypatch.setattr(clock, "sleep_until", lambda deadline_ns, spin_ns: asked.append(deadline_ns * 1e-9))
    c = clock.RealtimeClock(1000.0, drift_ppm=200.0, jitter_s=20e-6, seed=4, max_behind=1e9)
    c.start()
    start = c._deadline
    for _ in range(2000):
        c.wait()
    asked = np.array(asked)
    schedule = start + np.arange(2000) * c.period
    assert c.period == pytest.approx(1e-3 * (1 + 200e-6), rel=1e-12)
    offsets = asked - schedule
    assert np.abs(offsets).max() <= 3 * 20e-6 + 1e-8          # + the nanosecond rounding of the deadline
    assert np.std(offsets) == pytest.approx(20e-6, rel=0.1)
    assert abs(np.mean(offsets)) < 3e-6                       # jitter around the schedule, not drifting it


@pytest.mark.parametrize("kwargs, error", [({"drift_ppm": 2e4}, "clock drift"), ({"drift_ppm": float("nan")}, "clock drift"),
                                           ({"jitter_s": 1e-3}, "clock jitter"), ({"jitter_s": -1e-6}, "clock jitter")])
def test_impossible_clock_settings_are_refused_naming_them(kwargs, error):
    with pytest.raises(InputError, match=error):
        clock.RealtimeClock(1000.0, **kwargs)


def test_free_running_device_sides_buffer_their_targets_and_host_clocked_ones_do_not():
    assert SerialDevice().setpoints.depth == GatewayDevice().setpoints.depth == 3
    assert SerialDevice(step_on_command=True).setpoints is None
    assert GatewayDevice(step_on_exchange=True).setpoints is None
    assert SerialDevice(target_buffer=0).setpoints is None and GatewayDevice(target_buffer=5).setpoints.depth == 5
    with pytest.raises(InputError, match="gateway device: option 'target_buffer'"):
        GatewayDevice(target_buffer=-1)


# -- the driver on the device's clock ---------------------------------------------------------------------------
def _call(sock, **request) -> dict:
    sock.send(json.dumps(request).encode())
    assert sock.poll(10000), f"no reply to {request}"
    return json.loads(sock.recv())


def test_on_the_devices_clock_the_driver_sends_one_target_per_device_sample(model):
    """A free-running simulated arm with drift and jitter behind a pty; the driver on its clock ("device") runs
    a move. Every sample the driver read (caught-up ones included) got exactly one target in return, so the
    drives' setpoint buffer is fed one target per device cycle (here the simulator shares this process's
    interpreter with the driver, so targets come late often; the chain of processes in tests/test_e2e.py shows
    what that gives when they do not)."""
    dev = SerialDevice(watchdog_s=2.0)
    sim = Simulator(model, transport=dev, realtime=True, seed=5, clock_drift_ppm=100.0, clock_jitter_us=20.0)
    sim.start()
    driver = Driver(model, SerialArm(model, dev.path, device_watchdog_ms=2000), endpoints=LOCAL, watchdog_s=2.0,
                    clock="device")
    driver.start()
    cmd = zmq.Context.instance().socket(zmq.REQ)
    cmd.setsockopt(zmq.LINGER, 0)
    try:
        cmd.connect(driver.bound["commands"])
        assert wait_until(lambda: driver.cycle.fresh > 10, 20)
        assert _call(cmd, cmd="enable") == {"ok": True}
        assert wait_until(driver.cycle.enabled, 10)
        reply = _call(cmd, cmd="move_to", q=[0.2, -0.1, 0.15, 0.1, -0.2, 0.25], speed=0.5)
        assert reply["ok"], reply
        assert wait_until(lambda: driver.cycle.motion is None, 30)
        goal = np.array([0.2, -0.1, 0.15, 0.1, -0.2, 0.25])   # the buffered targets still reach the drives
        assert wait_until(lambda: np.abs(sim.read_truth().q - goal).max() < 2e-3, 5), sim.read_truth().q
    finally:
        cmd.close(0)
        driver.stop()
        time.sleep(0.05)                            # the last command crosses the pty
        sim.stop()
    counts = dev.setpoints.counts
    assert counts.received == driver.cycle.fresh, (counts, driver.cycle.fresh, driver.cycle.caught_up)
