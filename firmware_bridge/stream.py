"""The driver's ZeroMQ state message: one documented, versioned binary layout (docs/reference/stream.md), shared by
the driver (producer), the identification service, the recorder and any client (consumers).

Each message is a two-frame multipart: [topic, payload]. Topic b"state" carries STATE below; topic
b"health" carries a UTF-8 JSON object (docs/reference/stream.md lists its keys).

STATE payload, little-endian, no padding, n = number of joints:

    offset  type        name             meaning
    0       char[4]     magic            b"ARMS"
    4       uint16      version          STREAM_VERSION
    6       uint16      n                joints
    8       uint32      flags            driver flags (FLAG_*) in bits 0-15; bits 16-31: device samples lost
                                         between the previous message and this one (LOST_SHIFT, saturates)
    12      uint64      seq              message counter, +1 per cycle (a gap = dropped messages)
    20      int64       device_time_ns   the drives' timestamp of this sample (ns, device clock)
    28      int64       host_time_ns     host UNIX time (ns, time.time_ns()) when the sample was read
    36      float64[n]  q                joint positions, rad (m for prismatic joints)
            float64[n]  qd               joint velocities, rad/s
            float64[n]  current          motor currents, A
            float64[n]  torque           joint torques from the currents, N m
            uint16[n]   statusword       CiA 402 statusword (0x6041) per drive
            uint16[n]   error_code       CiA 402 error code (0x603F) per drive
            int8[n]     mode             modes of operation display (0x6061) per drive

Size: 36 + 37 n bytes (258 bytes for 6 joints).
"""
from __future__ import annotations

import struct

import numpy as np

MAGIC = b"ARMS"
STREAM_VERSION = 2
READABLE_VERSIONS = (1, 2)     # version 1 has the same layout, without the lost-sample count
TOPIC_STATE = b"state"
TOPIC_HEALTH = b"health"

# driver flags (STATE.flags)
FLAG_ENABLED = 1 << 0      # every drive is OPERATION ENABLED
FLAG_MOVING = 1 << 1       # a motion command is being executed
FLAG_FAULT = 1 << 2        # the driver is in its fault state (a drive fault, the watchdog, a link error)
FLAG_STALE = 1 << 3        # no new device data in this cycle (values repeat the last sample)
FLAG_PAYLOAD = 1 << 4      # a payload is set (limits and feed-forward include it)
FLAG_LOST = 1 << 5         # device samples were lost before this message (their count: lost_samples(flags))
LOST_SHIFT = 16            # flags bits 16-31: how many (saturates at LOST_MAX)
LOST_MAX = 0xFFFF

HEADER_SIZE = 36
_HEADER_TAIL = struct.Struct("<IQqq")   # flags, seq, device_time_ns, host_time_ns at offset 8


class StreamDecodeError(ValueError):
    """A message is not a STATE message of a version this code reads."""


def state_dtype(n: int) -> np.dtype:
    """The numpy structured dtype of one STATE payload for n joints (packed, little-endian)."""
    return np.dtype([("magic", "S4"), ("version", "<u2"), ("n", "<u2"), ("flags", "<u4"), ("seq", "<u8"),
                     ("device_time_ns", "<i8"), ("host_time_ns", "<i8"),
                     ("q", "<f8", (n,)), ("qd", "<f8", (n,)), ("current", "<f8", (n,)), ("torque", "<f8", (n,)),
                     ("statusword", "<u2", (n,)), ("error_code", "<u2", (n,)), ("mode", "i1", (n,))])


def message_size(n: int) -> int:
    return HEADER_SIZE + 37 * n


class StateMessage:
    """A reusable STATE buffer: fill the fields in place, send `buffer` (no allocation per cycle).

    q, qd, current, torque, statusword, error_code, mode are (n,) views into the buffer; `floats` is the
    (4, n) float64 block q, qd, current, torque and `words` the (2, n) uint16 block statusword, error_code
    (the layout keeps each block contiguous, so a whole sample is three copies)."""

    def __init__(self, n: int):
        self.n = n
        self._array = np.zeros(1, dtype=state_dtype(n))
        self.record = self._array[0]
        self.record["magic"] = MAGIC
        self.record["version"] = STREAM_VERSION
        self.record["n"] = n
        raw = self._array.view(np.uint8)
        self.buffer = memoryview(raw)
        # views into the buffer, for in-place writes by the cycle
        self.floats = raw[HEADER_SIZE:HEADER_SIZE + 32 * n].view("<f8").reshape(4, n)
        self.words = raw[HEADER_SIZE + 32 * n:HEADER_SIZE + 36 * n].view("<u2").reshape(2, n)
        self.q, self.qd, self.current, self.torque = self.floats
        self.statusword, self.error_code = self.words
        self.mode = raw[HEADER_SIZE + 36 * n:].view(np.int8)

    def set_header(self, seq: int, flags: int, device_time_ns: int, host_time_ns: int) -> None:
        """Write the per-message header fields (one struct.pack_into into the buffer)."""
        _HEADER_TAIL.pack_into(self.buffer, 8, flags, seq, device_time_ns, host_time_ns)


def lost_flags(lost: int) -> int:
    """The flags bits that report `lost` device samples (0 when none)."""
    return 0 if lost <= 0 else FLAG_LOST | (min(int(lost), LOST_MAX) << LOST_SHIFT)


def lost_samples(flags: int) -> int:
    """Device samples lost between the previous message and this one, from a message's flags."""
    return int(flags) >> LOST_SHIFT


_FLOAT_FIELDS = ("q", "qd", "current", "torque")


def decode_state(payload: bytes) -> np.void:
    """Decode one STATE payload into a numpy record (fields as in the module docstring).
    Raises StreamDecodeError naming what is wrong (size, magic, version, a non-finite value)."""
    if len(payload) < HEADER_SIZE:
        raise StreamDecodeError(f"state message: {len(payload)} bytes, shorter than the {HEADER_SIZE}-byte header")
    if bytes(payload[:4]) != MAGIC:
        raise StreamDecodeError(f"state message: magic {bytes(payload[:4])!r}, expected {MAGIC!r}")
    version = int.from_bytes(payload[4:6], "little")
    if version not in READABLE_VERSIONS:
        raise StreamDecodeError(f"state message: version {version}, this reader knows "
                                f"{', '.join(map(str, READABLE_VERSIONS))}")
    n = int.from_bytes(payload[6:8], "little")
    if len(payload) != message_size(n):
        raise StreamDecodeError(f"state message: {len(payload)} bytes for n = {n}, expected {message_size(n)}")
    values = np.frombuffer(payload, dtype="<f8", count=4 * n, offset=HEADER_SIZE)
    if not np.isfinite(values).all():          # one check over the contiguous q, qd, current, torque block
        k = int(np.argmin(np.isfinite(values)))
        seq = int.from_bytes(payload[12:20], "little")
        raise StreamDecodeError(f"state message seq {seq}: {_FLOAT_FIELDS[k // n]}[{k % n}] is {values[k]}, "
                                f"not a finite number")
    return np.frombuffer(payload, dtype=state_dtype(n))[0]
