"""Integer units on the wire, the same on every transport (CAN, serial joint boards, Modbus gateway).

    position   int32  motor encoder counts (counts_per_rev per motor revolution; 0 at q = 0)
    velocity   int32  motor encoder counts per second
    current    int32  motor current in microamperes (uA)
    torque     int32  joint torque in millinewton-metres (mN m; mN for a prismatic joint)

Joint side <-> counts goes through the gear: counts_per_rad = counts_per_rev * gear_ratio / (2 pi), with
gear_ratio in motor revolutions per joint revolution (motor rad per m for a prismatic joint, as in the
model file). `JointScaling` converts arrays of n joints both ways; a value that does not fit in int32, or
is not finite, raises WireValueError naming the field and the joint, and is never clipped into data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

ENCODER_COUNTS_PER_REV = 2 ** 17   # default motor encoder resolution (counts per motor revolution)
CURRENT_LSB = 1e-6                 # A per current unit
TORQUE_LSB = 1e-3                  # N m per torque unit
TORQUE_CONSTANT_LSB = 1e-6         # N m/A per torque-constant unit (uN m/A; the gateway's scaling registers)
GEAR_DENOMINATOR_MAX = 100_000     # the largest denominator of a gear ratio sent as a fraction
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


class WireValueError(ValueError):
    """A value cannot be represented on the wire (not finite, or outside int32)."""


def _to_int32(name: str, x, scale) -> np.ndarray:
    raw = np.asarray(x, dtype=float) * scale
    bad = ~np.isfinite(raw) | (raw < INT32_MIN - 0.5) | (raw > INT32_MAX + 0.5)
    if bad.any():
        j = int(np.flatnonzero(np.atleast_1d(bad))[0])
        value = np.atleast_1d(np.asarray(x, dtype=float))[j]
        raise WireValueError(f"{name}: joint {j + 1}: {float(value)!r} cannot be sent (not finite or outside int32 "
                             f"after scaling by {np.atleast_1d(scale)[min(j, np.size(scale) - 1)]:.6g})")
    return np.rint(raw).astype(np.int64)


@dataclass(frozen=True, eq=False)
class JointScaling:
    """Per-joint conversions between SI values (rad, rad/s, A, N m) and the wire's int32 units."""

    counts_per_rad: np.ndarray   # (n,)

    @classmethod
    def from_gear(cls, gear_ratio, counts_per_rev: int = ENCODER_COUNTS_PER_REV) -> "JointScaling":
        """Scaling for motors with counts_per_rev encoders behind gear_ratio (motor rev per joint rev)."""
        gear = np.asarray(gear_ratio, dtype=float).reshape(-1)
        if counts_per_rev <= 0 or not np.all(np.isfinite(gear)) or np.any(gear == 0):
            raise WireValueError(f"scaling: expected counts_per_rev > 0 and finite non-zero gear ratios, got "
                                 f"{counts_per_rev!r} and {gear.tolist()}")
        return cls(counts_per_rev * gear / (2.0 * math.pi))

    @property
    def n(self) -> int:
        return self.counts_per_rad.shape[0]

    def position_to_counts(self, q) -> np.ndarray:
        return _to_int32("position", q, self.counts_per_rad)

    def counts_to_position(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=float) / self.counts_per_rad

    def velocity_to_counts(self, qd) -> np.ndarray:
        return _to_int32("velocity", qd, self.counts_per_rad)

    def counts_to_velocity(self, counts) -> np.ndarray:
        return np.asarray(counts, dtype=float) / self.counts_per_rad

    @staticmethod
    def current_to_raw(current) -> np.ndarray:
        return _to_int32("current", current, 1.0 / CURRENT_LSB)

    @staticmethod
    def raw_to_current(raw) -> np.ndarray:
        return np.asarray(raw, dtype=float) * CURRENT_LSB

    @staticmethod
    def torque_to_raw(torque) -> np.ndarray:
        return _to_int32("torque", torque, 1.0 / TORQUE_LSB)

    @staticmethod
    def raw_to_torque(raw) -> np.ndarray:
        return np.asarray(raw, dtype=float) * TORQUE_LSB


def wire_gear_ratio(gear: float) -> Fraction:
    """A gear ratio (motor revolutions per joint revolution) as the wire carries it, numerator over
    denominator (CiA 402 0x6091, the gateway's scaling registers): the closest fraction whose denominator
    is at most GEAR_DENOMINATOR_MAX. Both sides scale with float(wire_gear_ratio(g)), so they agree."""
    return Fraction(float(gear)).limit_denominator(GEAR_DENOMINATOR_MAX)


def c_constants() -> list[tuple[str, int, str]]:
    """(name, value, comment) for the generated C header: the wire units."""
    return [("UNITS_ENCODER_COUNTS_PER_REV", ENCODER_COUNTS_PER_REV, "default motor encoder counts per revolution"),
            ("UNITS_CURRENT_PER_A", round(1 / CURRENT_LSB), "current units (uA) per ampere"),
            ("UNITS_TORQUE_PER_NM", round(1 / TORQUE_LSB), "torque units (mN m) per newton-metre"),
            ("UNITS_TORQUE_CONSTANT_PER_NM_PER_A", round(1 / TORQUE_CONSTANT_LSB),
             "torque-constant units (uN m/A) per N m/A")]
