"""The servo setpoint message: what a client streams to the driver's servo socket, one per cycle at most
(docs/reference/stream.md, "Servo"). Little-endian, n = number of joints:

    offset  type        name         meaning
    0       char[4]     magic        b"ARSP"
    4       uint16      version      SERVO_VERSION
    6       uint16      n            joints
    8       uint8       mode         8 position (CSP): values are joint positions, rad
                                     10 torque (CST): values are joint torques, N m
    9       uint8[7]    reserved     zero
    16      uint64      token        the session token of the reply to the `servo` command: the driver uses
                                     setpoints of the session that started servo mode only
    24      int64       sent_ns      the client's UNIX time (ns) the setpoint is for (when it was computed):
                                     velocity and acceleration between setpoints are judged by these times,
                                     checked against the driver's own clock, and the driver's latency figures
                                     start from it
    32      uint64      seq          the client's counter, +1 per setpoint (a gap: setpoints lost on the way)
    40      float64[n]  values

Size: 40 + 8 n bytes (88 for six joints); the doubles start at an 8-byte boundary. Version 1 (no token, a
32-byte header) is refused with a reason of its own (ServoVersionError).
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

MAGIC = b"ARSP"
SERVO_VERSION = 2
MODE_POSITION = 8     # CiA 402 cyclic synchronous position
MODE_TORQUE = 10      # CiA 402 cyclic synchronous torque
MODES = {"position": MODE_POSITION, "torque": MODE_TORQUE}
HEADER = struct.Struct("<4sHHB7xQqQ")
HEADER_SIZE = HEADER.size           # 40
# (name, offset, C type) of the header's fields, as the table above
FIELDS = (("magic", 0, "char[4]"), ("version", 4, "uint16_t"), ("n", 6, "uint16_t"), ("mode", 8, "uint8_t"),
          ("reserved", 9, "uint8_t[7]"), ("token", 16, "uint64_t"), ("sent_ns", 24, "int64_t"), ("seq", 32, "uint64_t"))


class ServoDecodeError(ValueError):
    """A message is not a servo setpoint this code reads; the message says what is wrong."""


class ServoVersionError(ServoDecodeError):
    """A setpoint of another version of the format (an older client: it carries no session token)."""


class Setpoint(NamedTuple):
    """A decoded setpoint: mode, session token, seq, sent_ns (client's UNIX ns), values (n,)."""

    mode: int
    token: int
    seq: int
    sent_ns: int
    values: np.ndarray


def message_size(n: int) -> int:
    return HEADER_SIZE + 8 * n


def encode(mode: int, token: int, seq: int, sent_ns: int, values) -> bytes:
    """One setpoint message (values: (n,) float64) of the session with this token."""
    v = np.ascontiguousarray(values, dtype="<f8").reshape(-1)
    return HEADER.pack(MAGIC, SERVO_VERSION, v.size, mode, token, sent_ns, seq) + v.tobytes()


def decode(payload: bytes, n: int) -> Setpoint:
    """The setpoint of a message for an arm of n joints; ServoDecodeError naming what is wrong (size, magic,
    version (ServoVersionError), joints, mode, a non-finite value). The token is the caller's to check."""
    if len(payload) >= 6 and payload[:4] == MAGIC:
        version = int.from_bytes(payload[4:6], "little")
        if version != SERVO_VERSION:
            raise ServoVersionError(f"servo setpoint: version {version}, this driver reads {SERVO_VERSION} only "
                                    f"(version 2 carries the session token of the servo command's reply: update "
                                    f"the client)")
    if len(payload) < HEADER_SIZE:
        raise ServoDecodeError(f"servo setpoint: {len(payload)} bytes, shorter than the {HEADER_SIZE}-byte header")
    magic, version, count, mode, token, sent_ns, seq = HEADER.unpack_from(payload, 0)
    if magic != MAGIC:
        raise ServoDecodeError(f"servo setpoint: magic {magic!r}, expected {MAGIC!r}")
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
    return Setpoint(mode, token, seq, sent_ns, values)


def c_constants() -> list[tuple[str, int | bytes, str]]:
    """(name, value, comment) for the generated C header: magic, version, modes, the header's size and each
    field's offset."""
    return [("SERVO_MAGIC", MAGIC, "payload bytes 0-3"),
            ("SERVO_VERSION", SERVO_VERSION, "the only version the driver reads"),
            ("SERVO_MODE_POSITION", MODE_POSITION, "mode: values are joint positions, rad (CSP)"),
            ("SERVO_MODE_TORQUE", MODE_TORQUE, "mode: values are joint torques, N m (CST)"),
            ("SERVO_HEADER_SIZE", HEADER_SIZE, "bytes before the values (a multiple of 8)"),
            *((f"SERVO_{name.upper()}_OFFSET", offset, f"{name}: byte offset ({ctype})")
              for name, offset, ctype in FIELDS)]


def c_code() -> str:
    """The packed header struct, the message size as a macro of the joint count, and a function that writes
    one setpoint."""
    members = "\n".join(f"    {ctype.split('[')[0]} {name}{'[' + ctype.split('[')[1] if '[' in ctype else ''};"
                        for name, _, ctype in FIELDS)
    return "\n".join([
        "/* A servo setpoint (docs/reference/stream.md, \"Servo\"): ZeroMQ PUSH to the driver's servo socket, one",
        "   message per setpoint: the header below, then n doubles (rad or N m, as mode says). token is the one the",
        "   reply to the servo command gave; seq +1 per setpoint; sent_ns the UNIX time (ns) the setpoint is for. */",
        "#pragma pack(push, 1)",
        f"/* servo setpoint header: {HEADER_SIZE} bytes */",
        "typedef struct {", members, "} armid_servo_header_t;",
        "#pragma pack(pop)",
        "#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L",
        (f'_Static_assert(sizeof(armid_servo_header_t) == ARMID_SERVO_HEADER_SIZE, '
         f'"armid_servo_header_t: {HEADER_SIZE} bytes on the wire");'),
        "#endif",
        "",
        "#define ARMID_SERVO_MESSAGE_SIZE(n) (ARMID_SERVO_HEADER_SIZE + 8u * (size_t)(n))",
        "",
        "/* Write one setpoint of n values into out (ARMID_SERVO_MESSAGE_SIZE(n) bytes); returns its size. */",
        "static inline size_t armid_servo_encode(void *out, uint8_t mode, uint64_t token, uint64_t seq,",
        "                                        int64_t sent_ns, const double *values, uint16_t n)",
        "{",
        "    armid_servo_header_t h;",
        "    memset(&h, 0, sizeof h);",
        "    memcpy(h.magic, ARMID_SERVO_MAGIC, 4);",
        "    h.version = ARMID_SERVO_VERSION;",
        "    h.n = n;",
        "    h.mode = mode;",
        "    h.token = token;",
        "    h.sent_ns = sent_ns;",
        "    h.seq = seq;",
        "    memcpy(out, &h, sizeof h);",
        "    memcpy((uint8_t *)out + sizeof h, values, 8u * (size_t)n);",
        "    return ARMID_SERVO_MESSAGE_SIZE(n);",
        "}",
    ])
