"""The servo setpoint message: what a client streams to the driver's servo socket, one per cycle at most
(docs/reference/stream.md, "Servo"). Little-endian, n = number of joints:

    offset  type        name         meaning
    0       char[4]     magic        b"ARSP"
    4       uint16      version      SERVO_VERSION
    6       uint16      n            joints
    8       uint8       mode         8 position (CSP): values are joint positions, rad
                                     10 torque (CST): values are joint torques, N m
    9       uint8[7]    reserved     zero
    16      int64       sent_ns      the client's UNIX time (ns) the setpoint is for (when it was computed):
                                     velocity and acceleration between setpoints are judged by these times,
                                     and the driver's latency figures start from it
    24      uint64      seq          the client's counter, +1 per setpoint
    32      float64[n]  values

Size: 32 + 8 n bytes (80 for six joints); the doubles start at an 8-byte boundary.
"""
from __future__ import annotations

import struct

import numpy as np

MAGIC = b"ARSP"
SERVO_VERSION = 1
MODE_POSITION = 8     # CiA 402 cyclic synchronous position
MODE_TORQUE = 10      # CiA 402 cyclic synchronous torque
MODES = {"position": MODE_POSITION, "torque": MODE_TORQUE}
HEADER = struct.Struct("<4sHHB7xqQ")
HEADER_SIZE = HEADER.size           # 32


class ServoDecodeError(ValueError):
    """A message is not a servo setpoint this code reads; the message says what is wrong."""


def message_size(n: int) -> int:
    return HEADER_SIZE + 8 * n


def encode(mode: int, seq: int, sent_ns: int, values) -> bytes:
    """One setpoint message (values: (n,) float64)."""
    v = np.ascontiguousarray(values, dtype="<f8").reshape(-1)
    return HEADER.pack(MAGIC, SERVO_VERSION, v.size, mode, sent_ns, seq) + v.tobytes()


def decode(payload: bytes, n: int) -> tuple[int, int, int, np.ndarray]:
    """(mode, seq, sent_ns, values (n,)) of a setpoint for an arm of n joints; ServoDecodeError naming what is
    wrong (size, magic, version, joints, mode, a non-finite value)."""
    if len(payload) < HEADER_SIZE:
        raise ServoDecodeError(f"servo setpoint: {len(payload)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, count, mode, sent_ns, seq = HEADER.unpack_from(payload, 0)
    if magic != MAGIC:
        raise ServoDecodeError(f"servo setpoint: magic {magic!r}, expected {MAGIC!r}")
    if version != SERVO_VERSION:
        raise ServoDecodeError(f"servo setpoint: version {version}, this driver reads {SERVO_VERSION}")
    if count != n or len(payload) != message_size(n):
        raise ServoDecodeError(f"servo setpoint: {count} joints in {len(payload)} bytes, the arm has {n} "
                               f"({message_size(n)} bytes)")
    if mode not in (MODE_POSITION, MODE_TORQUE):
        raise ServoDecodeError(f"servo setpoint: mode {mode}, expected {MODE_POSITION} (position) or "
                               f"{MODE_TORQUE} (torque)")
    values = np.frombuffer(payload, dtype="<f8", count=n, offset=HEADER_SIZE)
    if not np.isfinite(values).all():
        k = int(np.argmin(np.isfinite(values)))
        raise ServoDecodeError(f"servo setpoint seq {seq}: value {k} is {values[k]}, not a finite number")
    return mode, seq, sent_ns, values
