"""The transports behind driver.hal.Arm, by name (as python-can names its interfaces).

  sim       the simulator in this process (sim.local_transport.LocalSimArm), no wire: tests of the cycle and
            the demo's quick path
  serial    joint boards behind one microcontroller (firmware_bridge serial protocol, pyserial)
  can       CiA 402 drives over CANopen (python-canopen on any python-can interface)
  gateway   EtherCAT drives behind a Modbus TCP gateway (pymodbus)

Each transport registers itself as an entry point of the group "armid.transports" (pyproject.toml:
name = "module:class"), as python-can's interfaces register under "can.interface": the driver finds them by
name and never imports a transport that lives elsewhere (the simulator's). `open_arm(name, model, **options)`
builds one; options are the transport's keyword arguments.
"""
from __future__ import annotations

from importlib.metadata import entry_points

from firmware_bridge.runtime.errors import InputError

GROUP = "armid.transports"


def registered() -> dict[str, str]:
    """The registered transports: name -> "module:class" (the entry points of GROUP)."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


TRANSPORTS: dict[str, str] = registered()


def transport_class(name: str) -> type:
    """The Arm class registered as `name`; InputError naming the registered ones otherwise."""
    if name not in TRANSPORTS:
        available = ", ".join(sorted(TRANSPORTS)) or f"none: no entry points in {GROUP!r}; is armid installed?"
        raise InputError(f"transport: unknown {name!r} (available: {available})")
    (ep,) = entry_points(group=GROUP, name=name)
    return ep.load()


def transport_options(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(known, required): the option names a config file may give transport `name` (its class's OPTIONS)
    and those it must give (REQUIRED_OPTIONS)."""
    cls = transport_class(name)
    return tuple(cls.OPTIONS), tuple(cls.REQUIRED_OPTIONS)


def options_table(name: str) -> str:
    """Transport `name`'s options as the Markdown table of docs/reference/driver-config.md (from its declaration)."""
    return transport_class(name).OPTION_SPEC.markdown()


def open_arm(name: str, model, **options):
    """The Arm of transport `name` for the model (not yet opened). Each transport refuses an option it does
    not know, or a required one missing, with an InputError naming it."""
    return transport_class(name)(model, **options)
