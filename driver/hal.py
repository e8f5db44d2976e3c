"""The hardware abstraction: one `Arm` interface over every transport, in SI units.

A transport module (driver/transports/) turns its wire format into an ArmState and an ArmCommand into its
wire format, with the firmware_bridge codecs and the model's gear ratios and torque constants. The cycle
(driver/cycle.py) only sees this interface.

Per cycle the cycle calls, in this order: begin_cycle() (CAN: send SYNC), read(state) (the newest sample,
True when it is new since the last read), write(command). None of them may block for longer than a small
fraction of a cycle; a transport with a blocking link runs it in its own thread and exchanges the newest
sample and command with the cycle through preallocated buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numba
import numpy as np

from firmware_bridge import cia402
from firmware_bridge.units import INT32_MAX, INT32_MIN, TORQUE_LSB


class LinkError(RuntimeError):
    """The link to the drives failed (port vanished, connection reset, no answer to the handshake)."""


@dataclass
class ArmState:
    """The newest sample of the drives, (n,) arrays, SI units, joint side.

    device_time_ns: the drives' timestamp; host_time_ns: time.time_ns() when the host received it.
    The arrays are views into three blocks: `floats` (4, n) q, qd, current, torque; `words` (2, n) statusword,
    error_code; `mode` (n,). `ArmState.inside(message)` puts those blocks inside a stream.StateMessage, so
    a transport reading into it fills the published message directly.
    """

    n: int
    device_time_ns: int = 0
    host_time_ns: int = 0
    q: np.ndarray = field(init=False)           # rad (m)
    qd: np.ndarray = field(init=False)          # rad/s
    current: np.ndarray = field(init=False)     # motor current, A
    torque: np.ndarray = field(init=False)      # joint torque from the current, N m
    statusword: np.ndarray = field(init=False)  # uint16, CiA 402 0x6041
    error_code: np.ndarray = field(init=False)  # uint16, CiA 402 0x603F
    mode: np.ndarray = field(init=False)        # int8, CiA 402 0x6061

    def __post_init__(self):
        n = self.n
        self._use(np.zeros((4, n)), np.zeros((2, n), np.uint16), np.zeros(n, np.int8))

    def _use(self, floats: np.ndarray, words: np.ndarray, mode: np.ndarray) -> None:
        self.floats, self.words, self.mode = floats, words, mode
        self.q, self.qd, self.current, self.torque = floats
        self.statusword, self.error_code = words

    @classmethod
    def inside(cls, message) -> "ArmState":
        """An ArmState whose arrays are the per-joint fields of a firmware_bridge.stream.StateMessage."""
        st = cls(message.n)
        st._use(message.floats, message.words, message.mode)
        return st


SAMPLE_FIELDS = ("q", "qd", "current", "torque", "statusword", "error_code", "mode")


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


@numba.njit(cache=True, nogil=True)
def command_to_wire(controlword, mode, q, tau, counts_per_rad, cw_out, mode_out, pos_out, tau_out) -> int:
    """A command's per-joint values in wire units, as JointScaling rounds them (target position rad -> counts,
    target torque N m -> mN m; controlword and mode as they are), into the out arrays (a frame's or an image's
    columns); -1, or the first joint whose target is not finite or does not fit int32 (the caller sends
    nothing of that command). One call for serial, CAN and the gateway."""
    for j in range(q.shape[0]):
        p = np.rint(q[j] * counts_per_rad[j])
        t = np.rint(tau[j] * _TORQUE_PER_RAW)
        if not (INT32_MIN <= p <= INT32_MAX and INT32_MIN <= t <= INT32_MAX):   # False for NaN too
            return j
        cw_out[j] = controlword[j]
        mode_out[j] = mode[j]
        pos_out[j] = np.int64(p)
        tau_out[j] = np.int64(t)
    return -1


def copy_sample(src, dst) -> None:
    """Copy the per-joint arrays of a sample (SAMPLE_FIELDS) from src into dst in place: between
    ArmStates, or from an ArmState into a stream message (firmware_bridge.stream.StateMessage); both keep
    them in three blocks (floats, words, mode), copied in one numba call (three numpy copies cost ~3x as
    much right after the cycle thread wakes: docs/driver.md, "Where the CPU goes")."""
    if src.floats is not dst.floats:
        _copy_blocks(src.floats, src.words, src.mode, dst.floats, dst.words, dst.mode)


@dataclass
class ArmCommand:
    """What the drives should do this cycle, (n,) arrays: controlword (0x6040), mode (0x6060), target
    position (rad, 0x607A), target torque (N m, 0x6071; in CSP the torque feed-forward)."""

    n: int
    controlword: np.ndarray = field(init=False)
    mode: np.ndarray = field(init=False)
    target_position: np.ndarray = field(init=False)
    target_torque: np.ndarray = field(init=False)

    def __post_init__(self):
        self.controlword = np.zeros(self.n, np.uint16)
        self.mode = np.zeros(self.n, np.int8)
        self.target_position = np.zeros(self.n)
        self.target_torque = np.zeros(self.n)


class Arm(Protocol):
    """What the cycle needs from a transport (see the module docstring)."""

    n: int

    def open(self) -> None:
        """Connect and handshake; raise LinkError naming the link when it fails."""

    def close(self) -> None:
        """Release the link (idempotent)."""

    def begin_cycle(self) -> None:
        """Start a cycle (CAN: transmit SYNC)."""

    def read(self, out: ArmState) -> bool:
        """Copy the newest sample into out; True when it is new since the last read."""

    def write(self, command: ArmCommand) -> None:
        """Send the command (finite values only: the cycle checks before it calls)."""

    def link_stats(self) -> dict:
        """Counters of the link (frames, dropped frames by reason, reconnects), for the health topic."""


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
