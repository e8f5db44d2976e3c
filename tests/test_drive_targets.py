"""The drives' target model (sim.drive_targets), on its own and behind the serial and gateway device sides (the
CAN side: tests/test_can_device.py): continuation from received targets only, bounded, then the last received
target held; repeated frames are not new targets; a target that comes early is the next cycle's; the one
rule for targets outside the joint's limits. Oracle for the continuation: numpy's polyfit through the
received targets."""
from __future__ import annotations

import math

import numpy as np
import pytest

from firmware_bridge import cia402
from firmware_bridge import gateway as gw
from firmware_bridge import serial_protocol as sp
from firmware_bridge.cia402 import Mode, State
from sim import Simulator
from sim.drive import DriveConfig
from sim.drive_control import extrapolate
from sim.drive_targets import TargetStreams, target_refusal
from sim.gateway_device import GatewayDevice
from sim.serial_device import SerialDevice

LIMIT = DriveConfig().extrapolated_targets


def cubic_at(stamps, values, at) -> float:
    return float(np.polyval(np.polyfit(np.asarray(stamps, float), np.asarray(values, float), len(stamps) - 1), at))


def moving(k: int) -> float:
    return 0.3 * (1.0 - math.cos(0.05 * k))


def test_extrapolate_is_the_polynomial_through_the_points_at_their_own_cycles():
    stamps, values = [3, 4, 6, 7], [0.1, -0.4, 0.25, 0.3]
    for at in (8, 9, 12):
        assert extrapolate(stamps, values, at) == pytest.approx(cubic_at(stamps, values, at), abs=1e-12)
    assert extrapolate([5], [1.5], 9) == 1.5
    with pytest.raises(ValueError, match="stamps"):
        extrapolate([1, 2, 3, 4, 5], [0.0] * 5, 6)


@pytest.mark.parametrize("gap", ["nothing", "repeated"])
def test_a_stream_without_new_targets_is_continued_from_received_ones_only_a_bounded_time_then_held(gap):
    """After a stream of received targets, LIMIT cycles follow the cubic through the last four received (the
    continuation is never fed back: each is the same cubic, the oracle's), then the last received target is
    held; a repeated frame is no new target and counts as such."""
    ts = TargetStreams(1, max_extrapolated=LIMIT)
    streaming = np.array([True])
    for k in range(20):
        ts.receive(0, moving(k))
        assert ts.cycle(streaming)[0] == moving(k)
    got = []
    for _ in range(LIMIT + 3):
        if gap == "repeated":
            ts.receive(0, moving(19))
        got.append(float(ts.cycle(streaming)[0]))
    want = [cubic_at(range(16, 20), [moving(k) for k in range(16, 20)], 19 + m) for m in range(1, LIMIT + 1)]
    np.testing.assert_allclose(got[:LIMIT], want, rtol=0, atol=1e-12)
    assert got[LIMIT:] == [moving(19)] * 3
    c = ts.counts.as_dict()
    assert c["missed_targets" if gap == "nothing" else "repeated_targets"] == LIMIT + 3
    assert c["extrapolated_targets"] == LIMIT and c["held_targets"] == 3
    ts.receive(0, 1.0)                                                    # a new target ends the run
    assert ts.cycle(streaming)[0] == 1.0


def test_misses_between_new_targets_never_feed_the_continuation_with_its_own_values():
    """Every other cycle lost: each continuation is the line through the last two received targets at their own
    cycles (a cubic through targets that did not come one per cycle amplifies their timing errors), never
    through the drive's own continuations, so on a straight stream it is exact however long it goes on
    (feeding continuations back made jitter compound)."""
    ts = TargetStreams(1, max_extrapolated=LIMIT)
    streaming = np.array([True])
    line = np.array([1e-3, 0.2])
    received = {}
    for k in range(1, 61):
        if k < 10 or k % 2:
            received[k] = np.polyval(line, k) + (2e-4 * k * k if k >= 40 else 0.0)     # bends from k = 40
            ts.receive(0, received[k])
        got = ts.cycle(streaming)[0]
        if k in received:
            assert got == received[k]
        else:
            last = sorted(received)[-2:]
            assert got == pytest.approx(cubic_at(last, [received[i] for i in last], k), rel=0, abs=1e-12)
    assert ts.counts.missed == 26 and ts.counts.extrapolated == 26


def test_two_targets_before_one_cycle_the_later_is_the_next_cycles_and_late_ones_fill_missed_cycles():
    ts = TargetStreams(1)
    streaming = np.array([True])
    for k in range(10):
        ts.receive(0, moving(k))
        ts.cycle(streaming)
    ts.receive(0, moving(10))
    ts.receive(0, moving(11))                                 # the host is one ahead
    assert ts.cycle(streaming)[0] == moving(11)               # the latest replaces the earlier (CiA 301)
    assert ts.cycle(streaming)[0] == moving(11)               # cycle 11: its own target, which came early
    assert ts.counts.early == 1 and ts.counts.missed == 0
    assert ts.cycle(streaming)[0] == pytest.approx(cubic_at(range(8, 12), [moving(k) for k in range(8, 12)], 12))
    ts.receive(0, moving(12))
    ts.receive(0, moving(13))                                 # late: 12 belongs to the missed cycle before
    assert ts.cycle(streaming)[0] == moving(13)
    assert ts.cycle(streaming)[0] == pytest.approx(cubic_at(range(10, 14), [moving(k) for k in range(10, 14)], 14))


def test_a_step_is_held_not_continued_and_a_drive_leaving_csp_forgets_its_stream():
    """A continuation faster than the joint's maximum velocity (a host that stepped its target) is not followed;
    a drive that stops streaming starts afresh: its first target after is held, not continued from old ones."""
    ts = TargetStreams(1, max_step=np.array([3.0 * 0.001]))
    on, off = np.array([True]), np.array([False])
    ts.receive(0, 0.0)
    ts.cycle(on)
    ts.receive(0, 0.05)                                       # 50 rad/s: a step
    ts.cycle(on)
    assert ts.cycle(on)[0] == 0.05 and ts.counts.held == 1
    ts.cycle(off)
    assert not ts.following[0]
    ts.receive(0, 0.001)
    ts.cycle(on)
    assert ts.cycle(on)[0] == 0.001


def test_target_refusal_names_the_first_joint_outside_and_takes_nan_as_outside():
    lo, hi, tmax = np.full(3, -1.0), np.full(3, 1.0), np.full(3, 5.0)
    names = ("a", "b", "c")
    assert target_refusal(np.array([0.0, 1.0, -1.0]), np.array([5.0, -5.0, 0.0]), lo, hi, tmax, names) is None
    assert "target_position: drive 2 (b): 1.5" in target_refusal(np.array([0.0, 1.5, 2.0]), None, lo, hi, tmax, names)
    assert "target_torque: drive 3 (c)" in target_refusal(None, np.array([0.0, 0.0, -5.1]), lo, hi, tmax, names)
    assert "drive 1" in target_refusal(np.array([np.nan, 0.0, 0.0]), None, lo, hi, tmax, names)
    assert "drive 3 (c)" in target_refusal(np.array([3.0]), None, lo, hi, tmax, names, first_joint=2)


# -- the same model behind the serial and the gateway device sides ------------------------------------------
class SerialSide:
    """A SerialDevice whose COMMANDs go through its own handler (no pty traffic needed), simulator stepped here."""

    def __init__(self):
        self.dev = SerialDevice(watchdog_s=10.0, target_buffer=0)   # the continuation alone (the buffer in
                                                                    # front of it: tests/test_free_running.py)
        self.sim = Simulator("generic6", transport=self.dev, seed=1)
        self.dev.start()                 # its cycle callback; the simulator is stepped by the test
        self.cpr = self.dev.scaling.counts_per_rad

    def command(self, cw: int, q: np.ndarray) -> None:
        n = self.sim.n
        self.dev._handle(sp.Command(controlword=np.full(n, cw), mode=np.full(n, int(Mode.CSP)),
                                    target_position=np.round(q * self.cpr).astype(np.int64),
                                    target_torque=np.zeros(n, np.int64)))

    def refused(self) -> int:
        return self.dev.counters.out_of_limits

    def close(self) -> None:
        self.dev.stop()


class GatewaySide:
    """A GatewayDevice whose writes go through its own check-and-apply (as a Modbus write does), stepped here."""

    def __init__(self):
        self.dev = GatewayDevice(watchdog_s=None, target_buffer=0)
        self.sim = Simulator("generic6", transport=self.dev, seed=1)
        self.dev.start()
        self.cpr = self.dev._scaling.counts_per_rad

    def command(self, cw: int, q: np.ndarray) -> None:
        n = self.sim.n
        image = gw.OutputImage(1, 65535, np.full(n, cw), np.full(n, int(Mode.CSP)),
                               np.round(q * self.cpr).astype(np.int64), np.zeros(n, np.int64))
        with self.dev._lock:
            self.dev._write(0, gw.encode_outputs(image).tolist())

    def refused(self) -> int:
        return self.dev.refused_writes

    def close(self) -> None:
        self.dev.stop()


@pytest.fixture(params=[SerialSide, GatewaySide], ids=["serial", "gateway"])
def side(request):
    s = request.param()
    yield s
    s.close()


def reference(sim: Simulator, previous_position: np.ndarray) -> np.ndarray:
    """The reference the drives followed in the last cycle (at 1 kHz the latched target): the position they
    measured before it plus their following error."""
    return previous_position + sim.read_state().following_error


def test_the_serial_and_gateway_drives_continue_received_targets_a_bounded_time_then_hold_the_last(side):
    sim = side.sim
    q0 = sim.read_state().position.copy()
    for cw in (cia402.CW_SHUTDOWN, cia402.CW_ENABLE_OPERATION, cia402.CW_ENABLE_OPERATION):
        side.command(cw, q0)
        sim.step(1)
    assert all(s is State.OPERATION_ENABLED for s in sim.read_state().states())
    sent = [np.round((q0 + 0.01 * (1.0 - math.cos(math.pi * k / 60))) * side.cpr) / side.cpr for k in range(40)]
    for q in sent:
        side.command(cia402.CW_ENABLE_OPERATION, q)
        sim.step(1)
    refs = []
    for _ in range(LIMIT + 4):                                  # the host sends nothing
        before = sim.read_state().position.copy()
        sim.step(1)
        refs.append(reference(sim, before))
    # these devices run on their own clock: a command acts at the next cycle, and so does what the drives
    # decide after a cycle without one
    k = np.arange(36, 40)
    for j in range(sim.n):
        want = ([sent[-1][j]] + [cubic_at(k, [sent[i][j] for i in k], 39 + m) for m in range(1, LIMIT + 1)]
                + [sent[-1][j]] * 3)
        np.testing.assert_allclose([r[j] for r in refs], want, rtol=0, atol=1e-9)
    c = side.dev.target_counts
    assert c["missed_targets"] == sim.n * (LIMIT + 4) and c["extrapolated_targets"] == sim.n * LIMIT


def test_a_target_outside_the_limits_is_refused_whole_counted_and_nothing_moves(side):
    """The one rule of every transport (CAN: tests/test_can_device.py): 2^31 - 1 counts on joint 3 is refused
    with the whole frame; the drives keep their targets, stay enabled and do not move."""
    sim = side.sim
    q0 = sim.read_state().position.copy()
    for cw in (cia402.CW_SHUTDOWN, cia402.CW_ENABLE_OPERATION, cia402.CW_ENABLE_OPERATION):
        side.command(cw, q0)
        sim.step(1)
    far = q0.copy()
    far[2] = (2 ** 31 - 1) / side.cpr[2]
    side.command(cia402.CW_ENABLE_OPERATION, far)
    side.command(cia402.CW_ENABLE_OPERATION, np.where(np.arange(sim.n) == 0, sim.model.q_max[0] + 0.01, q0))
    sim.step(300)
    s = sim.read_state()
    assert side.refused() == 2
    assert np.abs(s.position - q0).max() < 1e-3
    assert all(st is State.OPERATION_ENABLED for st in s.states())
