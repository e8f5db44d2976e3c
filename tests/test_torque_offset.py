"""The drives' torque offset (CiA 402 0x60B2 on CAN, its mN m equivalent on the serial link and the gateway), from
the driver's command to the simulated drive's torque: it crosses each transport (python-can virtual bus with
python-canopen, a pty with pyserial, pymodbus on loopback) to the value its wire unit gives, bit for bit; the
simulated drives add it in CSP and in CST; the driver sends the plan's feed-forward in it, and that lowers the
following error on the same trajectory."""
from __future__ import annotations

import contextlib
import itertools
import time

import can
import numpy as np
import pytest

from armid.lockstep import Rig
from driver.hal import ArmCommand, ArmState
from driver.transports.can import CanArm, CanOptionError
from driver.transports.gateway import GatewayArm
from driver.transports.serial_link import SerialArm
from firmware_bridge import canopen_map as cm
from firmware_bridge import cia402
from ident.model import dynamics, load_model
from sim import Simulator
from sim.can_device import CanDevice
from sim.gateway_device import GatewayDevice
from sim.serial_device import SerialDevice
from sim_helpers import enable
from waiting import wait_until

# N m per joint: signs, a value that is not a whole number of the wire unit, a value far from a half unit (so the
# rounding to mN m or per mille is not a tie), all within generic6's torque limits
OFFSET = np.array([1.2341, -4.8003, 0.0113, -0.0517, 2.5004, -0.7512])
WAIT_S = 20.0
_channels = itertools.count()


@pytest.fixture(scope="module")
def model():
    m = load_model("generic6")
    dynamics.gravity_torques(m, np.zeros((1, m.n)))
    return m


@contextlib.contextmanager
def _can_simulator(model):
    """A running simulator whose drives sit on a fresh python-can virtual channel: (channel, device, simulator)."""
    channel = f"armid-test-torque-offset-{next(_channels)}-{time.monotonic_ns()}"
    bus = can.Bus(interface="virtual", channel=channel)
    dev = CanDevice(bus=bus, heartbeat_ms=50)
    sim = Simulator(model, transport=dev, seed=4)
    sim.start()
    try:
        yield channel, dev, sim
    finally:
        sim.stop()
        bus.shutdown()


def _send_until_applied(arm, sim, expected: np.ndarray) -> np.ndarray:
    """Open the arm, command the drives to stay switched off (CSP, at the measured pose) with OFFSET as the torque
    offset, again every few ms (the free-running devices take one target per cycle) until the simulator's
    commanded offset is no longer zero; returns it."""
    arm.open()
    try:
        st, cmd = ArmState(arm.n), ArmCommand(arm.n)
        cmd.controlword[:] = cia402.CW_SHUTDOWN
        cmd.mode[:] = int(cia402.Mode.CSP)
        cmd.torque_offset[:] = OFFSET
        seen = [False]

        def arrived() -> bool:                     # one cycle as the driver's: begin, read, then command
            arm.begin_cycle()
            if arm.read(st) and not seen[0]:
                cmd.target_position[:] = st.q      # hold where the arm is (a target outside the limits is refused)
                seen[0] = True
            if seen[0]:
                arm.write(cmd)
            return bool(np.any(sim.commanded()["torque_offset"] != 0.0))

        assert wait_until(arrived, WAIT_S, 0.003), "the offset never reached the simulated drives"
        return sim.commanded()["torque_offset"]
    finally:
        arm.close()


def test_the_offset_crosses_the_serial_link_in_mn_m(model):
    dev = SerialDevice(watchdog_s=0.5)
    sim = Simulator(model, transport=dev, realtime=True, seed=5)
    sim.start()
    try:
        got = _send_until_applied(SerialArm(model, dev.path), sim, OFFSET)
    finally:
        sim.stop()
    np.testing.assert_array_equal(got, np.rint(OFFSET * 1e3) * 1e-3)      # int32 mN m, as the device converts


def test_the_offset_crosses_the_gateway_in_mn_m(model):
    sim = Simulator(model, transport=GatewayDevice(host="127.0.0.1", port=0, watchdog_s=0.5), realtime=True, seed=5)
    sim.start()
    try:
        got = _send_until_applied(GatewayArm(model, host="127.0.0.1", port=sim.transport.port, watchdog_ms=500), sim,
                                  OFFSET)
    finally:
        sim.stop()
    np.testing.assert_array_equal(got, np.rint(OFFSET * 1e3) * 1e-3)


def test_the_offset_crosses_can_as_0x60b2_in_per_mille_of_each_drives_rated_torque(model):
    with _can_simulator(model) as (channel, dev, sim):
        got = _send_until_applied(CanArm(model, interface="virtual", channel=channel, sdo_timeout_s=2.0,
                                         boot_timeout_s=10.0), sim, OFFSET)
    # the drive's 0x6076 is its rated torque in mN m (the model's torque limit); the host sends per mille of it
    rated_mnm = np.round(model.tau_max * 1e3)
    per_mille = np.rint(OFFSET * 1e6 / rated_mnm)
    np.testing.assert_array_equal(got, per_mille * 1e-3 * model.tau_max)
    assert np.all(np.abs(got - OFFSET) <= 0.5e-3 * model.tau_max + 1e-12)     # half a per mille at most


def test_a_can_drive_of_the_previous_dictionary_is_refused_at_open_naming_rpdo2(model):
    """A drive whose RPDO2 maps the target torque alone (the dictionary before 0x60B2) cannot take the offset: the
    driver reads the map at open and refuses it, naming the map, so it never sends that drive a 6-byte RPDO2."""
    with _can_simulator(model) as (channel, dev, sim):
        node = dev.drives[2].node                      # joint 3: mapping 0x1601 with one entry, as revision 1 had
        node.set_data(cm.RPDO2.mapping_index, 0, bytes([1]), check_writable=False)
        arm = CanArm(model, interface="virtual", channel=channel, sdo_timeout_s=2.0, boot_timeout_s=10.0)
        with pytest.raises(CanOptionError, match=r"joint 3 \(node 3\): RPDO2: maps \['0x2002:00'\], expected "
                                                 r"\['0x2002:00', '0x60B2:00'\]"):
            arm.open()
        assert arm.network is None                     # closed again: nothing left running


# -- the simulated drives apply it -------------------------------------------------------------------------------
def test_in_cst_the_drive_applies_target_torque_plus_offset(model):
    sim = Simulator(model, seed=3)
    enable(sim, cia402.Mode.CST)
    target = np.array([0.5, -1.0, 0.25, 0.0, 0.1, -0.05])
    offset = np.array([1.0, 2.0, -0.75, 0.3, -0.1, 0.02])
    sim.set_commands(target_torque=target, torque_offset=offset)
    sim.step(1)
    np.testing.assert_allclose(sim.read_truth().tau, target + offset, rtol=0, atol=1e-12)


def test_in_cst_a_target_plus_offset_beyond_the_limit_is_saturated_there(model):
    sim = Simulator(model, seed=3)
    enable(sim, cia402.Mode.CST)
    sim.set_commands(target_torque=0.6 * model.tau_max, torque_offset=0.6 * model.tau_max)
    sim.step(1)
    np.testing.assert_allclose(sim.read_truth().tau, model.tau_max, rtol=1e-12)


def test_in_csp_the_offset_adds_to_the_position_loops_torque(model):
    """Two simulators in the same state holding the same target: the one given an offset makes that much more
    torque in the first cycle (the position loop has not reacted yet: the loops' state is the same)."""
    torques = []
    for offset in (np.zeros(model.n), OFFSET):
        sim = Simulator(model, seed=3)
        enable(sim, cia402.Mode.CSP)
        sim.set_commands(torque_offset=offset)
        sim.step(1)
        torques.append(sim.read_truth().tau.copy())
    np.testing.assert_allclose(torques[1] - torques[0], OFFSET, rtol=0, atol=1e-9)


# -- the driver sends the plan's feed-forward in it --------------------------------------------------------------
def test_the_driver_sends_the_plans_feed_forward_as_the_offset_and_it_lowers_the_following_error(model):
    """seed000 at full speed in lockstep, the same plan with and without its torque feed-forward: during the motion
    every command carries the planned torque as the offset and none in the target torque; the RMS of (planned -
    measured position) falls (the simulated drives' cascaded loops already feed their acceleration forward, so by
    about a quarter: benchmarks/bench_collision.py prints the figures)."""
    rms = []
    for ff in (False, True):
        rig = Rig(model)
        rig.enable()
        plan, start = rig.excite(feed_forward=ff)
        cmd, err, wrong = rig.cycle.command, [], []
        for k in range(plan.samples):
            used = rig.cycle._k                         # the plan's sample this cycle commands
            rig.step()
            if not np.array_equal(cmd.torque_offset, plan.tau_ff[used]) or cmd.target_torque.any():
                wrong.append(k)
            if k >= start:
                err.append(plan.q[k] - rig.state()["q"])
        assert not wrong, f"cycles {wrong[:5]}: the offset is not the plan's torque, or a target torque was sent"
        rms.append(np.sqrt(np.mean(np.square(err))))
    assert rms[1] < 0.8 * rms[0], rms
