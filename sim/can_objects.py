"""SDO access to the live objects of the simulated CAN drives (sim.can_device): which object index reads
the latest sample, which carries a command, which a drive parameter, and the conversions between the wire
units of firmware_bridge.canopen_map / units (counts, uA, mN m, per mille) and the simulator's SI values.

read_object() and write_object() are called from the LocalNodes' SDO read / write callbacks; an SdoAbortedError
they raise becomes the SDO abort the host sees.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from canopen.sdo import SdoAbortedError

from firmware_bridge import canopen_map as cm
from firmware_bridge import cia402
from firmware_bridge.units import WireValueError
from firmware_bridge.runtime.errors import InputError
from sim.drive import SUPPORTED_MODES

if TYPE_CHECKING:
    from sim.can_device import CanDevice, _Drive

ABORT_VALUE_RANGE = 0x06090030      # SDO abort: value range of parameter exceeded
ABORT_NOT_AVAILABLE = 0x060A0023    # SDO abort: resource not available
MODES = frozenset(int(m) for m in SUPPORTED_MODES)


def read_object(dev: "CanDevice", d: "_Drive", index: int, subindex: int, od) -> int | None:
    """The value of a process object, command or drive parameter of drive d in wire units (None: not one of
    these; the LocalNode then answers from its stored data)."""
    j = d.joint
    if index in _SAMPLE_OBJECTS:
        s = dev.sim.read_state()
        try:
            return fit_type(od.data_type, _SAMPLE_OBJECTS[index](dev, s, j))
        except (WireValueError, ZeroDivisionError):
            raise SdoAbortedError(ABORT_NOT_AVAILABLE) from None
    if index in _COMMAND_OBJECTS:
        return fit_type(od.data_type, _COMMAND_OBJECTS[index](dev, d))
    if index in _PARAMETER_OBJECTS:
        p = dev.sim.drive_parameters(j)
        value = _PARAMETER_OBJECTS[index][0](dev, p, j, subindex)
        if value is None:
            raise SdoAbortedError(ABORT_NOT_AVAILABLE)
        return fit_type(od.data_type, value)
    return None


def write_object(dev: "CanDevice", d: "_Drive", index: int, subindex: int, value: int) -> bool:
    """Apply an SDO write of a command or drive parameter to the simulator; False when `index` is neither.
    A value the simulator refuses, or a target outside the joint's limits, is the SDO abort 0x06090030."""
    j = d.joint
    try:
        if index in _COMMAND_WRITES:
            commands = _COMMAND_WRITES[index](dev, j, value)
            if commands.get("mode", 0) not in MODES or dev.target_refusal(j, commands) is not None:
                raise SdoAbortedError(ABORT_VALUE_RANGE)
            dev.sim.set_commands(joint=j, **commands)
            d.remember(commands, dev.scaling.counts_per_rad[j])
            if "target_position" in commands:
                dev.targets.receive(j, commands["target_position"])
            return True
        if index in _PARAMETER_OBJECTS:
            dev.sim.configure_drive(j, **_PARAMETER_OBJECTS[index][1](dev, j, subindex, value))
            return True
    except InputError:
        raise SdoAbortedError(ABORT_VALUE_RANGE) from None
    return False


def fit_type(data_type: int, value: float) -> int:
    """value as an integer of the object's type (clipped to its range: a per-mille reading saturates)."""
    lo, hi = cm.type_range(data_type)
    return int(min(max(round(value), lo), hi))


def _per_mille(value: float, rated: float) -> float:
    if rated <= 0:
        raise ZeroDivisionError("no rated value")
    return 1000.0 * value / rated


# index -> f(device, sample, joint): process objects read from the latest sample, in wire units
_SAMPLE_OBJECTS: dict[int, Callable] = {
    cm.ERROR_REGISTER: lambda dev, s, j: cm.error_register(int(s.error_code[j])),
    cm.HIGH_RES_TIME_STAMP: lambda dev, s, j: cm.time_stamp(s.time),
    cia402.STATUSWORD: lambda dev, s, j: int(s.statusword[j]),
    cia402.MODES_OF_OPERATION_DISPLAY: lambda dev, s, j: int(s.mode_display[j]),
    cia402.ERROR_CODE: lambda dev, s, j: int(s.error_code[j]),
    cia402.POSITION_ACTUAL: lambda dev, s, j: dev.scaling.position_to_counts(s.position)[j],
    cia402.VELOCITY_ACTUAL: lambda dev, s, j: dev.scaling.velocity_to_counts(s.velocity)[j],
    cia402.FOLLOWING_ERROR_ACTUAL: lambda dev, s, j: dev.scaling.position_to_counts(s.following_error)[j],
    cm.CURRENT_ACTUAL_UA: lambda dev, s, j: dev.scaling.current_to_raw(s.current)[j],
    cm.TORQUE_ACTUAL_MNM: lambda dev, s, j: dev.scaling.torque_to_raw(s.torque)[j],
    cia402.TORQUE_ACTUAL: lambda dev, s, j: _per_mille(s.torque[j], dev.rated_torque[j]),
    cia402.CURRENT_ACTUAL: lambda dev, s, j: _per_mille(s.current[j], dev.rated_current[j]),
}

# index -> f(device, drive): commanded values, as last written by RPDO or SDO
_COMMAND_OBJECTS: dict[int, Callable] = {
    cia402.CONTROLWORD: lambda dev, d: d.controlword,
    cia402.MODES_OF_OPERATION: lambda dev, d: d.mode,
    cia402.TARGET_POSITION: lambda dev, d: d.target_counts,
    cm.TARGET_TORQUE_MNM: lambda dev, d: round(d.target_torque * 1e3),
    cia402.TORQUE_OFFSET: lambda dev, d: _per_mille(d.torque_offset, dev.rated_torque[d.joint])
    if dev.rated_torque[d.joint] > 0 else 0,
    cia402.TARGET_TORQUE: lambda dev, d: _per_mille(d.target_torque, dev.rated_torque[d.joint])
    if dev.rated_torque[d.joint] > 0 else 0,
}

# index -> f(device, joint, value): Simulator.set_commands arguments of an SDO write
_COMMAND_WRITES: dict[int, Callable] = {
    cia402.CONTROLWORD: lambda dev, j, v: {"controlword": v},
    cia402.MODES_OF_OPERATION: lambda dev, j, v: {"mode": v},
    cia402.TARGET_POSITION: lambda dev, j, v: {"target_position": v / dev.scaling.counts_per_rad[j]},
    cm.TARGET_TORQUE_MNM: lambda dev, j, v: {"target_torque": v * 1e-3},
    cia402.TORQUE_OFFSET: lambda dev, j, v: {"torque_offset": v * 1e-3 * dev.rated_torque[j]}
    if dev.rated_torque[j] > 0 else {"torque_offset": math.nan},
    cia402.TARGET_TORQUE: lambda dev, j, v: {"target_torque": v * 1e-3 * dev.rated_torque[j]}
    if dev.rated_torque[j] > 0 else {"target_torque": math.nan},
}


def _limits_write(dev: CanDevice, j: int, sub: int, v: int) -> dict:
    lo, hi = dev.sim.drive_parameters(j)["position_limits"]
    rad = v / dev.scaling.counts_per_rad[j]
    if sub == 1:
        return {"position_limits": (rad, hi)}
    if sub == 2:
        return {"position_limits": (lo, rad)}
    raise SdoAbortedError(ABORT_VALUE_RANGE)


def _counts_of(dev: CanDevice, j: int, rad: float) -> float:
    return rad * dev.scaling.counts_per_rad[j] if math.isfinite(rad) else None


# index -> (read f(device, params, joint, sub), write f(device, joint, sub, value) -> configure_drive kwargs)
_PARAMETER_OBJECTS: dict[int, tuple[Callable, Callable]] = {
    cia402.FOLLOWING_ERROR_WINDOW: (
        lambda dev, p, j, sub: _counts_of(dev, j, p["following_error_window"]),
        lambda dev, j, sub, v: {"following_error_window": v / dev.scaling.counts_per_rad[j]}),
    cia402.FOLLOWING_ERROR_TIMEOUT: (
        lambda dev, p, j, sub: p["following_error_timeout"] * 1e3,
        lambda dev, j, sub, v: {"following_error_timeout": v * 1e-3}),
    cia402.SOFTWARE_POSITION_LIMIT: (
        lambda dev, p, j, sub: _counts_of(dev, j, p["position_limits"][sub - 1]),
        _limits_write),
    cia402.MAX_TORQUE: (
        lambda dev, p, j, sub: _per_mille(p["max_torque"], dev.rated_torque[j]) if dev.rated_torque[j] > 0 else None,
        lambda dev, j, sub, v: {"max_torque": v * 1e-3 * dev.rated_torque[j] if dev.rated_torque[j] > 0 else math.nan}),
    cia402.QUICK_STOP_DECELERATION: (
        lambda dev, p, j, sub: _counts_of(dev, j, p["quick_stop_deceleration"]),
        lambda dev, j, sub, v: {"quick_stop_deceleration": v / dev.scaling.counts_per_rad[j]}),
    cia402.QUICK_STOP_OPTION: (
        lambda dev, p, j, sub: p["quick_stop_option"],
        lambda dev, j, sub, v: {"quick_stop_option": v}),
}
