"""The transport contract: what a transport of the arm gives the driver's cycle and takes from it, in SI units.

It sits in the bottom layer so that transports outside the driver (the in-process simulator's,
sim.local_transport) implement it without importing the driver; driver.hal re-exports it.

Per cycle the cycle calls, in this order: begin_cycle() (CAN: send SYNC), read(state) (the newest sample,
True when it is new since the last read), write(command). None of them may block for longer than a small
fraction of a cycle; a transport with a blocking link runs it in its own thread and exchanges the newest
sample and command with the cycle through preallocated buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


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
