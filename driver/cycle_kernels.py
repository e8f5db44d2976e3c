"""The cycle's per-joint work in one numba call: controlwords from the statuswords, drive states, and the
finiteness of the setpoints (driver/cycle.py calls `drive_logic` once per cycle; ~1 us, where the same in
Python over numpy scalars costs ~15 us).

Tables, built once from firmware_bridge.cia402 (the one definition of the state patterns): a statusword's
state is fixed by its bits 0-6, so every table is indexed by `statusword & 0x7F`.
  CONTROLWORD[intent, sw & 0x7F]  the controlword that walks a drive in that state towards the intent;
  FAULTED[sw & 0x7F]              the state is FAULT or FAULT REACTION ACTIVE.
"""
from __future__ import annotations

import numba
import numpy as np

from firmware_bridge import cia402
from firmware_bridge.cia402 import State

# what the driver wants, the row of CONTROLWORD
RESET, QUICK_STOP, OFF, POWER = 0, 1, 2, 3
# bits of drive_logic's result
ALL_ENABLED = 1 << 0        # every drive is OPERATION ENABLED
NON_FINITE = 1 << 1         # a target position, torque or torque offset is NaN or infinite
OVER_TORQUE = 1 << 2        # a joint's target torque + torque offset is beyond its torque limit
FAULTED_SHIFT = 8           # (first faulted joint + 1) << FAULTED_SHIFT, 0 when none
# how `command` takes its targets (bits)
HOLD_PLAN = 1 << 0          # the plan is a motion's sample: the hold position follows it
FOLLOW = 1 << 1             # not holding actively: the target position is the measured one
HOLD_FOLLOWS = 1 << 2       # with FOLLOW: the hold position too (so that enabling never jumps)


def _controlword(intent: int, s: State | None) -> int:
    if intent == RESET:
        return cia402.CW_DISABLE_VOLTAGE          # the low phase of the reset pulse (the cycle adds bit 7)
    if intent == QUICK_STOP:                      # powered drives ramp down; the others stay off
        return cia402.CW_QUICK_STOP if s in (State.OPERATION_ENABLED, State.QUICK_STOP_ACTIVE) \
            else cia402.CW_DISABLE_VOLTAGE
    if intent == OFF:
        return cia402.CW_SHUTDOWN                 # READY TO SWITCH ON: no torque, brakes hold
    if s is State.SWITCH_ON_DISABLED:
        return cia402.CW_SHUTDOWN
    if s is State.READY_TO_SWITCH_ON:
        return cia402.CW_SWITCH_ON
    if s in (State.SWITCHED_ON, State.OPERATION_ENABLED):
        return cia402.CW_ENABLE_OPERATION
    return cia402.CW_DISABLE_VOLTAGE


def _tables() -> tuple[np.ndarray, np.ndarray]:
    states = [cia402.state_of(i) for i in range(128)]
    cw = np.array([[_controlword(intent, s) for s in states] for intent in (RESET, QUICK_STOP, OFF, POWER)],
                  dtype=np.uint16)
    faulted = np.array([s in (State.FAULT, State.FAULT_REACTION_ACTIVE) for s in states], dtype=np.bool_)
    return cw, faulted


CONTROLWORD, FAULTED = _tables()
_OE_MASK, _OE_VALUE = cia402.STATE_PATTERNS[State.OPERATION_ENABLED]


@numba.njit(cache=True, nogil=True)
def _drive_logic(statusword, intent, table, faulted, target_position, target_torque, torque_offset, torque_limit,
                 controlword_out):
    result = ALL_ENABLED
    first = 0
    for j in range(statusword.shape[0]):
        w = statusword[j]
        i = w & 0x7F
        controlword_out[j] = table[intent, i]
        if (w & _OE_MASK) != _OE_VALUE:
            result &= ~ALL_ENABLED
        if first == 0 and faulted[i]:
            first = j + 1
        if not (np.isfinite(target_position[j]) and np.isfinite(target_torque[j]) and np.isfinite(torque_offset[j])):
            result |= NON_FINITE
        elif abs(target_torque[j] + torque_offset[j]) > torque_limit[j]:
            result |= OVER_TORQUE
    return result | (first << FAULTED_SHIFT)


def drive_logic(statusword: np.ndarray, intent: int, target_position: np.ndarray, target_torque: np.ndarray,
                torque_offset: np.ndarray, torque_limit: np.ndarray, controlword_out: np.ndarray) -> int:
    """Fill controlword_out (n,) for `intent` (RESET, QUICK_STOP, OFF, POWER) from the drives' statuswords;
    return ALL_ENABLED | NON_FINITE | OVER_TORQUE (target torque + offset beyond torque_limit (n,) N m) |
    (first faulted joint + 1) << FAULTED_SHIFT, as bits."""
    return _drive_logic(statusword, intent, CONTROLWORD, FAULTED, target_position, target_torque, torque_offset,
                        torque_limit, controlword_out)


@numba.njit(cache=True, nogil=True)
def _command(statusword, intent, table, faulted, plan_q, plan_tau, plan_offset, measured, how, hold, torque_limit,
             target_position, target_torque, torque_offset, controlword_out):
    for j in range(target_position.shape[0]):
        p = plan_q[j]
        target_position[j] = p
        target_torque[j] = plan_tau[j]
        torque_offset[j] = plan_offset[j]
        if how & HOLD_PLAN:
            hold[j] = p
        if how & FOLLOW:
            if how & HOLD_FOLLOWS:
                hold[j] = measured[j]
            target_position[j] = measured[j]
    return _drive_logic(statusword, intent, table, faulted, target_position, target_torque, torque_offset,
                        torque_limit, controlword_out)


def command(statusword: np.ndarray, intent: int, plan_q: np.ndarray, plan_tau: np.ndarray, plan_offset: np.ndarray,
            measured: np.ndarray, how: int, hold: np.ndarray, torque_limit: np.ndarray, target_position: np.ndarray,
            target_torque: np.ndarray, torque_offset: np.ndarray, controlword_out: np.ndarray) -> int:
    """The cycle's command in one call: target position (rad), target torque and torque offset (N m) from the plan
    (a motion's sample or the hold position with their feed-forward as the offset; a torque servo setpoint as the
    target torque with its compensation as the offset), the hold position (HOLD_PLAN, HOLD_FOLLOWS) and the
    measured position (FOLLOW) as `how` says, element by element (plan_q may be `hold` itself); then drive_logic
    over the result, the torques against torque_limit (n,) N m (its bits are returned)."""
    return _command(statusword, intent, CONTROLWORD, FAULTED, plan_q, plan_tau, plan_offset, measured, how, hold,
                    torque_limit, target_position, target_torque, torque_offset, controlword_out)
