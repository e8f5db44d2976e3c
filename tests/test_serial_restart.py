"""A serial device that reboots behind a port that stays open (sim.serial_device.SerialDevice.restart on a pty):
the transport sees it (the device's cycle counter or frame numbers go back, or it announces itself with a
HELLO), the cycle reports it as a link fault (quick stop, event), the transport handshakes again on the same
port, and fault_reset + enable resume."""
from __future__ import annotations


import numpy as np
import pytest

from driver.cycle import Cycle
from driver.transports.serial_link import SerialArm
from ident.model import dynamics
from ident.model import load_model
from sim import Simulator
from sim.serial_device import SerialDevice
from waiting import wait_until


@pytest.fixture(scope="module")
def model():
    m = load_model("generic6")
    dynamics.gravity_torques(m, np.zeros((1, m.n)))
    return m


@pytest.mark.parametrize("announce", [False, True])
def test_a_device_restart_is_reported_handshaken_again_on_the_open_port_and_recovers(model, announce):
    dev = SerialDevice(watchdog_s=0.5)
    sim = Simulator(model, transport=dev, realtime=True, seed=5)
    sim.start()
    arm = SerialArm(model, dev.path, handshake_timeout_s=5.0)
    events: list[str] = []
    cycle = None
    try:
        arm.open()
        cycle = Cycle(arm, rate_hz=1000.0, watchdog_s=0.5, clock="device", on_event=events.append)
        cycle.start()
        assert wait_until(lambda: cycle.fresh > 20)
        cycle.submit(cycle.enable, timeout=10.0)
        assert wait_until(cycle.enabled)
        assert dev.counters.hellos == 1

        dev.restart(announce=announce)
        assert wait_until(lambda: cycle.fault is not None)
        assert cycle.fault.startswith(f"link: serial port {dev.path}: the device restarted (")
        assert any(e.startswith("fault: link: serial port") and "the device restarted" in e for e in events)
        assert wait_until(lambda: dev.counters.hellos == 2 and arm.link_stats()["connected"])
        stats = arm.link_stats()
        assert stats["device_restarts"] == 1 and stats["link_losses"] == 0 and stats["reconnects"] == 0
        assert wait_until(lambda: not cycle.enabled())                # stopped: quick stop, then off

        fresh = cycle.fresh
        assert wait_until(lambda: cycle.fresh > fresh + 20)           # the stream flows again
        cycle.submit(cycle.fault_reset, timeout=10.0)
        assert wait_until(lambda: cycle._reset_grace == 0 and cycle.fault is None)
        cycle.submit(cycle.enable, timeout=10.0)
        assert wait_until(cycle.enabled)
        assert arm.link_stats()["device_restarts"] == 1
    finally:
        if cycle is not None:
            cycle.stop()
        arm.close()
        sim.stop()
