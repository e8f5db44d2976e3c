"""Fault injection: switches that the simulator and the device side of its transports consult.

Drive-side faults act on the simulated arm at the next cycle:
  drive_fault(j, code)   drive j enters FAULT with that error code (sticky: fault reset fails until cleared);
  stall(j)               joint j is mechanically stuck (qd = 0 whatever the torque) until released.
Frame-side faults are decided here and carried out by a transport's device side, per frame it sends:
  frame_fate()           DELIVER, DROP, CORRUPT (flip a bit, e.g. with corrupt()) or BAD_CRC (send with a
                         wrong checksum), drawn with the configured probabilities;
  silent                 the device side sends nothing at all while set (a silent bus / dead link);
  latency()              extra delay (s) before this frame: latency_spike_s with latency_spike_probability.
Every method is thread-safe; the draws come from one seeded generator, so a run is reproducible when one
thread draws.
"""
from __future__ import annotations

import enum
import math
import threading

import numpy as np

from firmware_bridge.runtime.errors import InputError
from sim.drive import ERR_INJECTED, joint_index


_NO_EVENTS: tuple[tuple, tuple] = ((), ())


class Fate(enum.Enum):
    """What a transport does with the frame it is about to send."""
    DELIVER = "deliver"
    DROP = "drop"
    CORRUPT = "corrupt"
    BAD_CRC = "bad_crc"


def _probability(name: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise InputError(f"fault injection: {name}: expected a probability in [0, 1], got {p!r}")
    return float(p)


class FaultInjection:
    """The fault switches of one simulated arm of n joints."""

    def __init__(self, n: int, seed: int | None = 0):
        self.n = n
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)
        self.drop_probability = 0.0
        self.corrupt_probability = 0.0
        self.bad_crc_probability = 0.0
        self.latency_spike_probability = 0.0
        self.latency_spike_s = 0.0
        self.silent = False
        self._stalled = np.zeros(n, dtype=bool)
        self._pending: list[tuple[int, int, bool]] = []
        self._cleared: list[int] = []
        self.counts = {"dropped": 0, "corrupted": 0, "bad_crc": 0, "delayed": 0, "drive_faults": 0}

    # -- frame level (for the transports) ----------------------------------------------------------
    def set_frame_faults(self, *, drop: float | None = None, corrupt: float | None = None,
                         bad_crc: float | None = None, silent: bool | None = None,
                         latency_spike_probability: float | None = None,
                         latency_spike_s: float | None = None) -> None:
        """Set the frame-level switches (probabilities per frame; latency in seconds)."""
        with self._lock:
            if drop is not None:
                self.drop_probability = _probability("drop", drop)
            if corrupt is not None:
                self.corrupt_probability = _probability("corrupt", corrupt)
            if bad_crc is not None:
                self.bad_crc_probability = _probability("bad_crc", bad_crc)
            if latency_spike_probability is not None:
                self.latency_spike_probability = _probability("latency_spike_probability", latency_spike_probability)
            if latency_spike_s is not None:
                if isinstance(latency_spike_s, bool) or not isinstance(latency_spike_s, (int, float)) \
                        or not math.isfinite(latency_spike_s) or latency_spike_s < 0:
                    raise InputError(f"fault injection: latency_spike_s: expected seconds >= 0, got {latency_spike_s!r}")
                self.latency_spike_s = float(latency_spike_s)
            if silent is not None:
                self.silent = bool(silent)
            if self.drop_probability + self.corrupt_probability + self.bad_crc_probability > 1.0:
                raise InputError("fault injection: drop + corrupt + bad_crc probabilities exceed 1")

    def frame_fate(self) -> Fate:
        """Draw the fate of one outgoing frame (DROP while silent)."""
        with self._lock:
            if self.silent:
                self.counts["dropped"] += 1
                return Fate.DROP
            total = self.drop_probability + self.corrupt_probability + self.bad_crc_probability
            if total == 0.0:
                return Fate.DELIVER
            u = self._rng.random()
            if u < self.drop_probability:
                self.counts["dropped"] += 1
                return Fate.DROP
            u -= self.drop_probability
            if u < self.corrupt_probability:
                self.counts["corrupted"] += 1
                return Fate.CORRUPT
            u -= self.corrupt_probability
            if u < self.bad_crc_probability:
                self.counts["bad_crc"] += 1
                return Fate.BAD_CRC
            return Fate.DELIVER

    def corrupt(self, data: bytes) -> bytes:
        """The frame with one random bit flipped (data unchanged when empty)."""
        if not data:
            return data
        with self._lock:
            bit = int(self._rng.integers(0, 8 * len(data)))
        out = bytearray(data)
        out[bit // 8] ^= 1 << (bit % 8)
        return bytes(out)

    def latency(self) -> float:
        """Extra delay (s) to apply before sending this frame: 0, or the spike."""
        with self._lock:
            if self.latency_spike_probability == 0.0 or self.latency_spike_s == 0.0:
                return 0.0
            if self._rng.random() < self.latency_spike_probability:
                self.counts["delayed"] += 1
                return self.latency_spike_s
            return 0.0

    # -- drive level (the simulator applies these every cycle) -------------------------------------
    def _joint(self, joint: int) -> int:
        return joint_index(joint, self.n, "fault injection")

    def drive_fault(self, joint: int, code: int = ERR_INJECTED, *, sticky: bool = False) -> None:
        """Make drive `joint` (0-based) fault with `code` at the next cycle; sticky: reset fails until
        clear_drive_fault()."""
        j = self._joint(joint)
        if isinstance(code, bool) or not isinstance(code, int) or not 0 < code <= 0xFFFF:
            raise InputError(f"fault injection: error code: expected 1..0xFFFF, got {code!r}")
        with self._lock:
            self._pending.append((j, code, sticky))
            self.counts["drive_faults"] += 1

    def clear_drive_fault(self, joint: int) -> None:
        """The injected cause on `joint` is gone: a fault reset clears the drive again."""
        j = self._joint(joint)
        with self._lock:
            self._cleared.append(j)

    def stall(self, joint: int, stalled: bool = True) -> None:
        """Stick (or free) joint `joint` mechanically."""
        j = self._joint(joint)
        with self._lock:
            self._stalled[j] = bool(stalled)

    def stalled(self) -> np.ndarray:
        """(n,) bool copy: which joints are stuck."""
        with self._lock:
            return self._stalled.copy()

    def take_drive_events(self, stalled_out: np.ndarray) -> tuple[list[tuple[int, int, bool]] | tuple, list[int] | tuple]:
        """For the simulator, once per cycle: the stall mask into stalled_out, and the drive faults
        raised and cleared since the last call."""
        with self._lock:
            stalled_out[:] = self._stalled
            if not self._pending and not self._cleared:
                return _NO_EVENTS
            pending, cleared = self._pending, self._cleared
            self._pending, self._cleared = [], []
            return pending, cleared

    def clear(self) -> None:
        """Every switch off: frames delivered, no stall (faults already raised stay until reset)."""
        with self._lock:
            self.drop_probability = self.corrupt_probability = self.bad_crc_probability = 0.0
            self.latency_spike_probability = self.latency_spike_s = 0.0
            self.silent = False
            self._stalled[:] = False
