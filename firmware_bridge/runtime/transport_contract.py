"""The transport contract: what a transport of the arm gives the driver's cycle and takes from it, in SI units.

Every transport subclasses the abstract Arm below (as python-can's interfaces subclass BusABC) and registers
itself by name as an entry point of the group "armid.transports" (driver.transports finds it there). This module
sits in the bottom layer so that a transport outside the driver (the in-process simulator's, sim.local_transport)
implements it without importing the driver; driver.hal re-exports it.

Per cycle the cycle calls, in this order: begin_cycle() (CAN: send SYNC), read(state) (the newest sample,
True when it is new since the last read), write(command). None of them may block for longer than a small
fraction of a cycle; a transport with a blocking link runs it in its own thread and exchanges the newest
sample and command with the cycle through preallocated buffers.
"""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from firmware_bridge.runtime.options import OptionSet


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
    position (rad, 0x607A), target torque (N m, 0x6071: CST), torque offset (N m, 0x60B2: added to the position
    loop's torque in CSP, to the target torque in CST; the model's feed-forward or compensation)."""

    n: int
    controlword: np.ndarray = field(init=False)
    mode: np.ndarray = field(init=False)
    target_position: np.ndarray = field(init=False)
    target_torque: np.ndarray = field(init=False)
    torque_offset: np.ndarray = field(init=False)

    def __post_init__(self):
        self.controlword = np.zeros(self.n, np.uint16)
        self.mode = np.zeros(self.n, np.int8)
        self.target_position = np.zeros(self.n)
        self.target_torque = np.zeros(self.n)
        self.torque_offset = np.zeros(self.n)


class Arm(abc.ABC):
    """The abstract transport (as python-can's BusABC): everything the driver's cycle may call, and nothing else.

    A transport implements the six abstract methods. The waits below have safe defaults and are called only as
    the transport's capability flags say:

      streams_on_own_clock  the device sends samples on its own clock and wait_new(timeout_s) blocks until the
                            next one: the cycle may run on the device's clock ("device"), and on the host's it
                            waits for the answer to each command (serial joint boards)
      cycle_reads_link      pump_new / pump_for read the link in the calling thread, so the cycle reads it while
                            it waits (one wake-up per burst) and the transport's own thread stands by (serial, can)
      keeps_every_sample    read() returns each sample once and in order, and backlog() says how many wait
                            unread: the cycle publishes the older ones first (serial, can, gateway)
    """

    n: int
    CAPABILITIES: ClassVar[dict[str, tuple[str, ...]]] = {   # flag -> the methods a transport with it overrides
        "streams_on_own_clock": ("wait_new",),
        "cycle_reads_link": ("pump_new", "pump_for"),
        "keeps_every_sample": ("backlog",),
    }
    streams_on_own_clock: ClassVar[bool] = False
    cycle_reads_link: ClassVar[bool] = False
    keeps_every_sample: ClassVar[bool] = False
    OPTION_SPEC: ClassVar[OptionSet | None] = None     # the transport's options, declared once (runtime.options)
    OPTIONS: ClassVar[tuple[str, ...]] = ()            # the options a driver config's [transport] table may give
    REQUIRED_OPTIONS: ClassVar[tuple[str, ...]] = ()   # of them, those it must give

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.OPTION_SPEC is not None:        # the names come from the declaration, never written twice
            cls.OPTIONS, cls.REQUIRED_OPTIONS = cls.OPTION_SPEC.in_config, cls.OPTION_SPEC.required

    @abc.abstractmethod
    def open(self) -> None:
        """Connect and handshake; raise LinkError naming the link when it fails."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the link (idempotent)."""

    def check_reachable(self) -> None:
        """Raise LinkError naming the link when its far end is plainly not there (no such port, a refused
        connection), without a handshake: nothing here starts a device's watchdog. The driver calls it first, so
        a wrong address fails at once, and opens the link only when its cycle is ready to keep it. Default:
        nothing to check before open()."""

    @abc.abstractmethod
    def begin_cycle(self) -> None:
        """Start a cycle (CAN: transmit SYNC)."""

    @abc.abstractmethod
    def read(self, out: ArmState) -> bool:
        """Copy the newest sample into out; True when it is new since the last read."""

    @abc.abstractmethod
    def write(self, command: ArmCommand) -> None:
        """Send the command (finite values only: the cycle checks before it calls)."""

    @abc.abstractmethod
    def link_stats(self) -> dict:
        """Counters of the link (frames, dropped frames by reason, reconnects), for the health topic."""

    def wait_new(self, timeout_s: float) -> bool:
        """Block until a sample not read yet is there (True) or timeout_s (s) passes (False). Default: this
        transport cannot tell, so it waits the whole timeout and says False."""
        if timeout_s > 0:
            time.sleep(timeout_s)
        return False

    def pump_new(self, timeout_s: float) -> bool:
        """Read the link in the calling thread until a sample not read yet is there (True) or timeout_s passes
        (False). Default: nothing to read here, so this is wait_new."""
        return self.wait_new(timeout_s)

    def pump_for(self, timeout_s: float) -> bool:
        """Read the link in the calling thread for timeout_s, whatever arrives; False at once when this thread
        cannot read it (the caller then sleeps instead). Default: False."""
        return False

    def backlog(self) -> int:
        """Samples that arrived and have not been read. Default: 0 (only the newest sample is kept)."""
        return 0

    def lost_samples(self) -> int:
        """Device samples lost so far (overwritten unread, or never complete), for the stream's lost flags.
        Default: 0 (this transport cannot tell)."""
        return 0

    @property
    def link_thread_id(self) -> int | None:
        """The native (kernel) id of the transport's link thread while it runs, for its scheduling ([realtime]);
        None when it has none."""
        return None


def lying_flags(cls: type, base: type) -> list[str]:
    """The capability flags of cls (declared in base.CAPABILITIES as flag -> methods) that do not say what cls
    does: a flag is True exactly when cls overrides each of its methods (and none of them when False)."""
    wrong = []
    for flag, methods in base.CAPABILITIES.items():
        overridden = [getattr(cls, m) is not getattr(base, m) for m in methods]
        if getattr(cls, flag) is not all(overridden) or any(overridden) is not all(overridden):
            wrong.append(f"{cls.__name__}.{flag} = {getattr(cls, flag)}, overrides "
                         f"{', '.join(m for m, o in zip(methods, overridden) if o) or 'none'} of {', '.join(methods)}")
    return wrong
