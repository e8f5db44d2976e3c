"""The device side of a transport: what a Simulator needs from the part that speaks a transport's bytes as the
arm's firmware would (sim.serial_device, sim.can_device, sim.gateway_device), as the driver's transports share
firmware_bridge.runtime.transport_contract.Arm.

Each device side subclasses DeviceSide, declares its options once (OPTION_SPEC, firmware_bridge.runtime.options)
and registers itself by name as an entry point of the group "armid.sim_devices" (pyproject.toml), where
`Simulator(model, "serial", **options)` and `armid sim --transport serial` find it.

attach(sim) is called once from Simulator.__init__; start() / stop() from Simulator.start() / stop(). A device
that may step the simulator itself (CAN: on each SYNC; serial and gateway when host-clocked) says so with its
capability flags; otherwise the simulator runs on its own clock and the device sends its state from a cycle
callback (sim.add_cycle_callback), calling sim.set_commands() whenever a command arrives.
"""
from __future__ import annotations

import abc
from importlib.metadata import entry_points
from typing import ClassVar

from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.options import OptionSet
from firmware_bridge.runtime.setpoint_buffer import TargetBuffer

GROUP = "armid.sim_devices"


class DeviceSide(abc.ABC):
    """The abstract device side of a transport. It implements the four abstract methods; the others have safe
    defaults and are overridden as the capability flags say:

      may_clock_simulator  clocks_simulator() says whether this device, as configured, steps the simulator
                           itself (CAN on SYNC; serial and gateway when host-clocked)
      buffers_setpoints    setpoint_buffer() gives the buffer of streamed targets that absorbs the host's
                           arrival jitter on a free-running device (serial, gateway)
    """

    CAPABILITIES: ClassVar[dict[str, tuple[str, ...]]] = {
        "may_clock_simulator": ("clocks_simulator",),
        "buffers_setpoints": ("setpoint_buffer",),
    }
    may_clock_simulator: ClassVar[bool] = False
    buffers_setpoints: ClassVar[bool] = False
    OPTION_SPEC: ClassVar[OptionSet]          # the options `armid sim --option` and Simulator(..., **options) give

    @abc.abstractmethod
    def attach(self, sim) -> None:
        """Bind to the sim.Simulator (called once by its __init__)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Open the link and begin serving the host (idempotent)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop serving and release the link, with bounded waits (idempotent)."""

    @abc.abstractmethod
    def connection(self) -> dict:
        """How a host reaches the device side once started, as the driver's [transport] options (e.g.
        {"host": "127.0.0.1", "port": 5020}); `armid sim` prints it."""

    def clocks_simulator(self) -> bool:
        """True when this device steps the simulator itself. Default: False (the simulator's own clock)."""
        return False

    def setpoint_buffer(self) -> TargetBuffer | None:
        """The buffer of streamed targets in front of the drives, None without one. Default: None."""
        return None


def registered() -> dict[str, str]:
    """The registered device sides: name -> "module:class" (the entry points of GROUP)."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def device_class(name: str) -> type[DeviceSide]:
    """The DeviceSide class registered as `name`; InputError naming the registered ones otherwise."""
    found = entry_points(group=GROUP, name=name)
    if not found:
        available = ", ".join(sorted(registered())) or f"none: no entry points in {GROUP!r}; reinstall armid"
        raise InputError(f"transport: unknown {name!r} (available: {available})")
    (ep,) = found
    return ep.load()


class StepOrFreeRun(DeviceSide):
    """A device side that runs on the simulator's clock or, as configured, steps it once per command of the host
    (serial: step_on_command, gateway: step_on_exchange), with a setpoint buffer while it runs free. It sets
    `host_clocked` and `setpoints` (sim.drive_targets.setpoints_for_device) in its __init__."""

    may_clock_simulator = True
    buffers_setpoints = True
    host_clocked: bool = False
    setpoints: TargetBuffer | None = None

    def clocks_simulator(self) -> bool:
        """True when host-clocked."""
        return self.host_clocked

    def setpoint_buffer(self) -> TargetBuffer | None:
        """The setpoint buffer in front of the drives (free-running), None without one."""
        return self.setpoints
