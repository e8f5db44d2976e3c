"""The hardware abstraction: one `Arm` interface over every transport, in SI units.

A transport module (driver/transports/) turns its wire format into an ArmState and an ArmCommand into its
wire format, with the firmware_bridge codecs and the model's gear ratios and torque constants. The cycle
(driver/cycle.py) only sees this interface. The contract itself (Arm, ArmState, ArmCommand, LinkError) is
defined in firmware_bridge.runtime.transport_contract, below the driver and the simulator, and re-exported here; this module
adds the conversion kernels the driver's transports share.
"""
from __future__ import annotations

import numba
import numpy as np

from firmware_bridge.runtime.transport_contract import SAMPLE_FIELDS, Arm, ArmCommand, ArmState, LinkError
from firmware_bridge import cia402
from firmware_bridge.units import INT32_MAX, INT32_MIN, TORQUE_LSB, JointScaling, WireValueError

__all__ = ["Arm", "ArmCommand", "ArmState", "LinkError", "SAMPLE_FIELDS", "command_to_wire", "copy_sample",
           "raw_to_si", "unsendable"]


@numba.njit(cache=True, nogil=True)
def _copy_blocks(src_floats, src_words, src_mode, dst_floats, dst_words, dst_mode):
    for i in range(src_floats.shape[0]):
        for j in range(src_floats.shape[1]):
            dst_floats[i, j] = src_floats[i, j]
    for i in range(src_words.shape[0]):
        for j in range(src_words.shape[1]):
            dst_words[i, j] = src_words[i, j]
    for j in range(src_mode.shape[0]):
        dst_mode[j] = src_mode[j]


@numba.njit(cache=True, nogil=True)
def raw_to_si(position, velocity, current, statusword, error_code, mode, counts_per_rad, amp_per_raw, torque_per_amp,
              floats_out, words_out, mode_out):
    """Per-joint wire values (encoder counts, counts/s, raw current; statusword, error code, mode) into a
    sample's blocks (ArmState.floats (4, n): q rad, qd rad/s, current A, torque N m; words (2, n); mode (n,)) in
    one call, as firmware_bridge.units.JointScaling converts them: counts / counts_per_rad, raw * amp_per_raw,
    then current * torque_per_amp (the model's gear ratio * torque constant)."""
    for j in range(position.shape[0]):
        floats_out[0, j] = position[j] / counts_per_rad[j]
        floats_out[1, j] = velocity[j] / counts_per_rad[j]
        amps = current[j] * amp_per_raw
        floats_out[2, j] = amps
        floats_out[3, j] = amps * torque_per_amp[j]
        words_out[0, j] = statusword[j]
        words_out[1, j] = error_code[j]
        mode_out[j] = mode[j]


_TORQUE_PER_RAW = 1.0 / TORQUE_LSB      # as JointScaling.torque_to_raw scales
OFFSET_MNM = _TORQUE_PER_RAW            # torque offset units per N m on serial and the gateway (mN m, int32)


@numba.njit(cache=True, nogil=True)
def command_to_wire(controlword, mode, q, tau, offset, counts_per_rad, offset_per_nm, offset_max, cw_out, mode_out,
                    pos_out, tau_out, off_out) -> int:
    """A command's per-joint values in wire units, as JointScaling rounds them (target position rad -> counts,
    target torque N m -> mN m, torque offset N m -> its units: offset_per_nm (n,) units per N m, an integer in
    [-offset_max - 1, offset_max]; controlword and mode as they are), into the out arrays (a frame's or an
    image's columns); -1, or the first joint whose target or offset is not finite or does not fit (the caller
    sends nothing of that command). One call for serial, CAN and the gateway."""
    for j in range(q.shape[0]):
        p = np.rint(q[j] * counts_per_rad[j])
        t = np.rint(tau[j] * _TORQUE_PER_RAW)
        o = np.rint(offset[j] * offset_per_nm[j])
        if not (INT32_MIN <= p <= INT32_MAX and INT32_MIN <= t <= INT32_MAX
                and -offset_max - 1 <= o <= offset_max):   # False for NaN too
            return j
        cw_out[j] = controlword[j]
        mode_out[j] = mode[j]
        pos_out[j] = np.int64(p)
        tau_out[j] = np.int64(t)
        off_out[j] = np.int64(o)
    return -1


def unsendable(command: ArmCommand, counts_per_rad: np.ndarray, offset_per_nm: np.ndarray, offset_max: int,
               offset_unit: str = "mN m") -> str:
    """Why command_to_wire refused a command, in words: JointScaling's message for a target (it names the field,
    the joint and the value), else the torque offset's."""
    try:
        JointScaling(counts_per_rad).position_to_counts(command.target_position)
        JointScaling.torque_to_raw(command.target_torque)
    except WireValueError as exc:
        return str(exc)
    with np.errstate(invalid="ignore", over="ignore"):
        raw = np.rint(command.torque_offset * offset_per_nm)
        bad = ~((raw >= -offset_max - 1) & (raw <= offset_max))
    j = int(np.flatnonzero(bad)[0]) if bad.any() else 0
    return (f"torque_offset: joint {j + 1}: {float(command.torque_offset[j])!r} N m cannot be sent (an integer in "
            f"[{-offset_max - 1}, {offset_max}] {offset_unit})")


def copy_sample(src, dst) -> None:
    """Copy the per-joint arrays of a sample (SAMPLE_FIELDS) from src into dst in place: between
    ArmStates, or from an ArmState into a stream message (firmware_bridge.stream.StateMessage); both keep
    them in three blocks (floats, words, mode), copied in one numba call (three numpy copies cost ~3x as
    much right after the cycle thread wakes: docs/design/decisions.md, "Where a Python driver's CPU goes")."""
    if src.floats is not dst.floats:
        _copy_blocks(src.floats, src.words, src.mode, dst.floats, dst.words, dst.mode)


# what a drive's statusword and mode display may be: a CiA 402 state (statusword & mask == value) and a mode
_STATE_MASKS = np.array([m for m, _ in cia402.STATE_PATTERNS.values()], dtype=np.int64)
_STATE_VALUES = np.array([v for _, v in cia402.STATE_PATTERNS.values()], dtype=np.int64)
_MODE_VALUES = np.array(sorted(int(m) for m in cia402.Mode), dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _first_bad_drive(statusword, mode_display, masks, values, modes):
    n = statusword.shape[0]
    for k in range(n):
        state = False
        for s in range(masks.shape[0]):
            if statusword[k] & masks[s] == values[s]:
                state = True
                break
        if not state:
            return k
        mode = False
        for m in range(modes.shape[0]):
            if mode_display[k] == modes[m]:
                mode = True
                break
        if not mode:
            return n + k
    return -1


def first_bad_drive(statusword: np.ndarray, mode_display: np.ndarray) -> int:
    """The first drive (0-based k) whose statusword is no CiA 402 state, or n + k for the first whose mode
    display is no mode of operation; -1 when all are good. A sample with one is counted and dropped, never
    turned into numbers (the check CAN's transport makes per TPDO1)."""
    return _first_bad_drive(statusword, mode_display, _STATE_MASKS, _STATE_VALUES, _MODE_VALUES)


def bad_drive_text(bad: int, statusword: np.ndarray, mode_display: np.ndarray) -> str:
    """first_bad_drive's answer in words: which drive, which word."""
    n = statusword.shape[0]
    k = bad % n
    if bad < n:
        return f"drive {k + 1} statusword {int(statusword[k]):#06x} is no CiA 402 state"
    return f"drive {k + 1} mode display {int(mode_display[k])} is no mode"
