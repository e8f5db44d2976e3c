"""CiA 402 (IEC 61800-7-201) drive profile: object indices, controlword commands, statusword states and
modes of operation. The one definition shared by the CAN drives, the Modbus gateway's process image, the
serial joint boards' status field, the simulator's drive model and the driver.

Values are the standard's; names follow it.
"""
from __future__ import annotations

import enum

# Object dictionary indices (CiA 402 part 2)
CONTROLWORD = 0x6040
STATUSWORD = 0x6041
QUICK_STOP_OPTION = 0x605A
MODES_OF_OPERATION = 0x6060
MODES_OF_OPERATION_DISPLAY = 0x6061
POSITION_ACTUAL = 0x6064
FOLLOWING_ERROR_WINDOW = 0x6065
FOLLOWING_ERROR_TIMEOUT = 0x6066
VELOCITY_ACTUAL = 0x606C
TARGET_TORQUE = 0x6071
TORQUE_OFFSET = 0x60B2                # INTEGER16, per mille of 0x6076: CSP adds it to the loop's torque, CST to the target
MAX_TORQUE = 0x6072
RATED_CURRENT = 0x6075
RATED_TORQUE = 0x6076
CURRENT_ACTUAL = 0x6078
TARGET_POSITION = 0x607A
SOFTWARE_POSITION_LIMIT = 0x607D  # sub 1 min, sub 2 max
TORQUE_ACTUAL = 0x6077
QUICK_STOP_DECELERATION = 0x6085
POSITION_ENCODER_RESOLUTION = 0x608F  # sub 1 encoder increments, sub 2 motor revolutions
GEAR_RATIO = 0x6091                   # sub 1 motor revolutions, sub 2 shaft revolutions
FOLLOWING_ERROR_ACTUAL = 0x60F4
ERROR_CODE = 0x603F
SUPPORTED_DRIVE_MODES = 0x6502

# 0x6502 bits (CiA 402: bit 7 CSP, bit 8 CSV, bit 9 CST)
SUPPORTED_MODE_BITS = {8: 1 << 7, 9: 1 << 8, 10: 1 << 9}


class Mode(enum.IntEnum):
    """Modes of operation (0x6060 / 0x6061) used here."""
    NONE = 0
    PROFILE_POSITION = 1
    CSP = 8   # cyclic synchronous position
    CSV = 9   # cyclic synchronous velocity
    CST = 10  # cyclic synchronous torque


class State(enum.Enum):
    """Power drive system states (CiA 402 fig. 'state machine')."""
    NOT_READY_TO_SWITCH_ON = "NOT READY TO SWITCH ON"
    SWITCH_ON_DISABLED = "SWITCH ON DISABLED"
    READY_TO_SWITCH_ON = "READY TO SWITCH ON"
    SWITCHED_ON = "SWITCHED ON"
    OPERATION_ENABLED = "OPERATION ENABLED"
    QUICK_STOP_ACTIVE = "QUICK STOP ACTIVE"
    FAULT_REACTION_ACTIVE = "FAULT REACTION ACTIVE"
    FAULT = "FAULT"


# Statusword bits
SW_READY_TO_SWITCH_ON = 1 << 0
SW_SWITCHED_ON = 1 << 1
SW_OPERATION_ENABLED = 1 << 2
SW_FAULT = 1 << 3
SW_VOLTAGE_ENABLED = 1 << 4
SW_QUICK_STOP = 1 << 5           # set = quick stop NOT active
SW_SWITCH_ON_DISABLED = 1 << 6
SW_WARNING = 1 << 7
SW_REMOTE = 1 << 9
SW_TARGET_REACHED = 1 << 10
SW_INTERNAL_LIMIT = 1 << 11
SW_FOLLOWING_ERROR = 1 << 13     # CSP: following error

# (mask, value) per state: statusword & mask == value
STATE_PATTERNS: dict[State, tuple[int, int]] = {
    State.NOT_READY_TO_SWITCH_ON: (0x4F, 0x00),
    State.SWITCH_ON_DISABLED: (0x4F, 0x40),
    State.READY_TO_SWITCH_ON: (0x6F, 0x21),
    State.SWITCHED_ON: (0x6F, 0x23),
    State.OPERATION_ENABLED: (0x6F, 0x27),
    State.QUICK_STOP_ACTIVE: (0x6F, 0x07),
    State.FAULT_REACTION_ACTIVE: (0x4F, 0x0F),
    State.FAULT: (0x4F, 0x08),
}

# Controlword commands (bits 0-3 and 7)
CW_SHUTDOWN = 0x06
CW_SWITCH_ON = 0x07
CW_DISABLE_VOLTAGE = 0x00
CW_QUICK_STOP = 0x02
CW_DISABLE_OPERATION = 0x07
CW_ENABLE_OPERATION = 0x0F
CW_FAULT_RESET = 0x80


def state_of(statusword: int) -> State | None:
    """The drive state a statusword reports, or None when it matches no state (a corrupted word)."""
    for state, (mask, value) in STATE_PATTERNS.items():
        if statusword & mask == value:
            return state
    return None


def statusword_for(state: State) -> int:
    """The statusword bits 0-6 of a state (voltage-enabled set where the state implies it)."""
    value = STATE_PATTERNS[state][1]
    if state in (State.READY_TO_SWITCH_ON, State.SWITCHED_ON, State.OPERATION_ENABLED, State.QUICK_STOP_ACTIVE):
        value |= SW_VOLTAGE_ENABLED
    return value


def c_constants() -> list[tuple[str, int, str]]:
    """(name, value, comment) for the generated C header: indices, modes, statusword bits, state patterns,
    controlword commands."""
    g = globals()
    out = [(f"CIA402_{k}", g[k], f"object index 0x{g[k]:04X}") for k in (
        "CONTROLWORD", "STATUSWORD", "QUICK_STOP_OPTION", "MODES_OF_OPERATION", "MODES_OF_OPERATION_DISPLAY",
        "POSITION_ACTUAL", "FOLLOWING_ERROR_WINDOW", "VELOCITY_ACTUAL", "TARGET_TORQUE", "MAX_TORQUE",
        "CURRENT_ACTUAL", "TARGET_POSITION", "SOFTWARE_POSITION_LIMIT", "TORQUE_ACTUAL",
        "FOLLOWING_ERROR_ACTUAL", "ERROR_CODE", "SUPPORTED_DRIVE_MODES", "FOLLOWING_ERROR_TIMEOUT", "RATED_CURRENT",
        "RATED_TORQUE", "QUICK_STOP_DECELERATION", "POSITION_ENCODER_RESOLUTION", "GEAR_RATIO")]
    out += [(f"CIA402_MODE_{m.name}", int(m), "modes of operation (0x6060 / 0x6061)") for m in Mode]
    out += [(f"CIA402_{k}", v, "statusword bit") for k, v in g.items() if k.startswith("SW_")]
    out += [(f"CIA402_{k}", v, "controlword command") for k, v in g.items() if k.startswith("CW_")]
    for state, (mask, value) in STATE_PATTERNS.items():
        name = state.name
        out += [(f"CIA402_STATE_{name}_MASK", mask, f"statusword & mask == value: {state.value}"),
                (f"CIA402_STATE_{name}_VALUE", value, f"statusword & mask == value: {state.value}")]
    return out
