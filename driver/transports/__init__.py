"""The transports behind driver.hal.Arm, by name (as python-can names its interfaces).

  sim       the simulator in this process (sim.Simulator), no wire: tests of the cycle and the demo's
            quick path
  serial    joint boards behind one microcontroller (firmware_bridge serial protocol, pyserial)
  can       CiA 402 drives over CANopen (python-canopen on any python-can interface)
  gateway   EtherCAT drives behind a Modbus TCP gateway (pymodbus)

`open_arm(name, model, **options)` builds one; options are the transport's keyword arguments.
"""
from __future__ import annotations

import importlib

TRANSPORTS: dict[str, str] = {
    "sim": "driver.transports.local_sim:LocalSimArm",
    "gateway": "driver.transports.gateway:GatewayArm",
    "can": "driver.transports.can:CanArm",
    "serial": "driver.transports.serial_link:SerialArm",
}


def _factory(name: str):
    from ident.errors import InputError

    if name not in TRANSPORTS:
        raise InputError(f"transport: unknown {name!r} (available: {', '.join(sorted(TRANSPORTS))})")
    module, factory = TRANSPORTS[name].split(":")
    return getattr(importlib.import_module(module), factory)


def transport_options(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(known, required): the option names a config file may give transport `name` (its class's OPTIONS)
    and those it must give (REQUIRED_OPTIONS)."""
    cls = _factory(name)
    return tuple(cls.OPTIONS), tuple(getattr(cls, "REQUIRED_OPTIONS", ()))


def open_arm(name: str, model, **options):
    """The Arm of transport `name` for the model (not yet opened). Each transport refuses an option it does
    not know, or a required one missing, with an InputError naming it."""
    return _factory(name)(model, **options)
