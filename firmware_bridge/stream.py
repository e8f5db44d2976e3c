"""The driver's ZeroMQ state message: one documented, versioned binary layout (docs/reference/stream.md), shared by
the driver (producer), the identification service, the recorder and any client (consumers).

Each message is a two-frame multipart: [topic, payload]. Topic b"state" carries STATE below; topic
b"health" carries a UTF-8 JSON object (docs/reference/stream.md lists its keys).

STATE payload, little-endian, no padding, n = number of joints: the header (HEADER_FIELDS, 36 bytes: magic
b"ARMS", version, n, flags, seq, device_time_ns, host_time_ns), then one array of n values per joint field
(JOINT_FIELDS: q, qd, current, torque as float64; statusword, error_code as uint16; mode as int8; tau_ext as
float64). Size: 36 + 45 n bytes (306 for 6 joints). The doubles start at offset 36, not 8-byte aligned. flags:
FLAG_* in bits 0-15; bits 16-31 count the device samples lost between the previous message and this one
(lost_samples).

Versions 1 and 2 had the same layout without tau_ext (36 + 37 n bytes): decode_state still reads them, with
tau_ext 0. A reader of version 2 refuses version 3 messages by their version (and size).

These tables are the one definition: the numpy dtype, the offsets, the C header's struct and macros
(c_constants, c_code; firmware_bridge/armid_wire.h) are made from them.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"ARMS"
STREAM_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # 1 and 2: without tau_ext (decoded with tau_ext 0); 1: without the lost-sample count
LAYOUT_VERSION = 3             # the oldest version with this layout (the C header reads from it on)
TOPIC_STATE = b"state"
TOPIC_HEALTH = b"health"

# driver flags (STATE.flags, bits 0-15)
FLAG_ENABLED = 1 << 0
FLAG_MOVING = 1 << 1
FLAG_FAULT = 1 << 2
FLAG_STALE = 1 << 3
FLAG_PAYLOAD = 1 << 4
FLAG_LOST = 1 << 5
FLAG_CONTACT = 1 << 6
FLAG_COLLISION = 1 << 7
FLAG_LATE = 1 << 8
FLAG_DOCS = {
    FLAG_ENABLED: "every drive is OPERATION ENABLED",
    FLAG_MOVING: "a motion command is being executed",
    FLAG_FAULT: "the driver is in its fault state (a drive fault, the watchdog, a link error)",
    FLAG_STALE: "no new device data in this cycle (values repeat the last sample)",
    FLAG_PAYLOAD: "a payload is set (limits and feed-forward include it)",
    FLAG_LOST: "device samples were lost before this message (their count: lost_samples(flags))",
    FLAG_CONTACT: "a joint's external torque estimate is over its contact threshold",
    FLAG_COLLISION: "a collision was detected and not cleared (the estimate is over a collision threshold, or "
                    "has been since the reaction and not yet back under the contact thresholds)",
    FLAG_LATE: "the drives got the target answering this sample too late (the driver was behind by more than "
               "the drives' setpoint buffer and extrapolation): they held a stale target, not identification data",
}
LOST_SHIFT = 16            # flags bits 16-31: how many (saturates at LOST_MAX)
LOST_MAX = 0xFFFF


class StreamDecodeError(ValueError):
    """A message is not a STATE message of a version this code reads."""


@dataclass(frozen=True)
class StreamField:
    """One field of the STATE payload: name, numpy type (little-endian), C type, unit, meaning. A field of
    the header occurs once; a per-joint field is an array of n values."""
    name: str
    dtype: str
    c_type: str
    unit: str
    doc: str

    @property
    def size(self) -> int:
        """Bytes of one value (of the whole char array for magic)."""
        return np.dtype(self.dtype).itemsize


# The layout, in order: the fixed header, then one contiguous array of n values per joint field. Everything
# else (the numpy dtype, the offsets, the sizes, the C header's struct and macros) is made from these tables.
HEADER_FIELDS = (
    StreamField("magic", "S4", "char", "-", '"ARMS" (MAGIC)'),
    StreamField("version", "<u2", "uint16_t", "-", "STREAM_VERSION"),
    StreamField("n", "<u2", "uint16_t", "-", "number of joints"),
    StreamField("flags", "<u4", "uint32_t", "-", "driver flags (FLAG_*) in bits 0-15; bits 16-31: device samples "
                "lost between the previous message and this one (saturates)"),
    StreamField("seq", "<u8", "uint64_t", "-", "message counter, +1 per cycle (a gap = dropped messages)"),
    StreamField("device_time_ns", "<i8", "int64_t", "ns", "the drives' timestamp of this sample (device clock)"),
    StreamField("host_time_ns", "<i8", "int64_t", "ns", "host UNIX time when the sample was read"),
)
JOINT_FIELDS = (
    StreamField("q", "<f8", "double", "rad", "joint positions (m for prismatic joints)"),
    StreamField("qd", "<f8", "double", "rad/s", "joint velocities"),
    StreamField("current", "<f8", "double", "A", "motor currents"),
    StreamField("torque", "<f8", "double", "N m", "joint torques from the currents"),
    StreamField("statusword", "<u2", "uint16_t", "-", "CiA 402 statusword (0x6041) per drive"),
    StreamField("error_code", "<u2", "uint16_t", "-", "CiA 402 error code (0x603F) per drive"),
    StreamField("mode", "i1", "int8_t", "-", "modes of operation display (0x6061) per drive"),
    StreamField("tau_ext", "<f8", "double", "N m", "external torque estimate (0 without a model observer, and "
                "while the drives are not all enabled)"),
)
_OLD_JOINT_FIELDS = JOINT_FIELDS[:-1]      # versions 1 and 2


def state_dtype(n: int, version: int = STREAM_VERSION) -> np.dtype:
    """The numpy structured dtype of one STATE payload for n joints (packed, little-endian), of `version`."""
    joint = JOINT_FIELDS if version >= LAYOUT_VERSION else _OLD_JOINT_FIELDS
    return np.dtype([(f.name, f.dtype) for f in HEADER_FIELDS] + [(f.name, f.dtype, (n,)) for f in joint])


HEADER_SIZE = state_dtype(0).itemsize          # 36: the doubles that follow are not 8-byte aligned
JOINT_SIZE = sum(f.size for f in JOINT_FIELDS)  # 45 bytes per joint
_OLD_JOINT_SIZE = sum(f.size for f in _OLD_JOINT_FIELDS)
HEADER_OFFSETS = {f.name: state_dtype(0).fields[f.name][1] for f in HEADER_FIELDS}   # byte offset of each
_HEADER_TAIL = struct.Struct("<IQqq")   # flags, seq, device_time_ns, host_time_ns at offset 8
if (HEADER_OFFSETS["flags"], _HEADER_TAIL.size) != (8, HEADER_SIZE - 8):
    raise ImportError("firmware_bridge.stream: _HEADER_TAIL does not match HEADER_FIELDS")


def joint_offset(name: str, n: int) -> int:
    """Byte offset of the per-joint array `name` in a payload of n joints: HEADER_SIZE + (the sizes of the
    per-joint fields before it) * n."""
    at = HEADER_SIZE
    for f in JOINT_FIELDS:
        if f.name == name:
            return at
        at += f.size * n
    raise KeyError(f"no per-joint stream field {name!r}")


def message_size(n: int, version: int = STREAM_VERSION) -> int:
    """Bytes of a STATE payload for n joints: HEADER_SIZE + JOINT_SIZE * n (37 n for versions 1 and 2)."""
    return HEADER_SIZE + (JOINT_SIZE if version >= LAYOUT_VERSION else _OLD_JOINT_SIZE) * n


class StateMessage:
    """A reusable STATE buffer: fill the fields in place, send `buffer` (no allocation per cycle).

    q, qd, current, torque, statusword, error_code, mode, tau_ext are (n,) views into the buffer; `floats` is the
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
        words, mode = joint_offset("statusword", n), joint_offset("mode", n)
        self.floats = raw[HEADER_SIZE:words].view("<f8").reshape(4, n)
        self.words = raw[words:mode].view("<u2").reshape(2, n)
        self.q, self.qd, self.current, self.torque = self.floats
        self.statusword, self.error_code = self.words
        tau_ext = joint_offset("tau_ext", n)
        self.mode = raw[mode:tau_ext].view(np.int8)
        self.tau_ext = raw[tau_ext:].view("<f8")

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
    if len(payload) != message_size(n, version):
        raise StreamDecodeError(f"state message: {len(payload)} bytes for n = {n} (version {version}), expected "
                                f"{message_size(n, version)}")
    values = np.frombuffer(payload, dtype="<f8", count=4 * n, offset=HEADER_SIZE)
    if not np.isfinite(values).all():          # one check over the contiguous q, qd, current, torque block
        k = int(np.argmin(np.isfinite(values)))
        seq = int.from_bytes(payload[12:20], "little")
        raise StreamDecodeError(f"state message seq {seq}: {_FLOAT_FIELDS[k // n]}[{k % n}] is {values[k]}, "
                                f"not a finite number")
    if version < LAYOUT_VERSION:               # the older layout, read into this one with tau_ext 0
        old = np.frombuffer(payload, dtype=state_dtype(n, version))[0]
        rec = np.zeros(1, dtype=state_dtype(n))[0]
        for name in old.dtype.names:
            rec[name] = old[name]
        return rec
    if n:
        ext = np.frombuffer(payload, dtype="<f8", count=n, offset=joint_offset("tau_ext", n))
        if not np.isfinite(ext).all():
            k = int(np.argmin(np.isfinite(ext)))
            seq = int.from_bytes(payload[12:20], "little")
            raise StreamDecodeError(f"state message seq {seq}: tau_ext[{k}] is {ext[k]}, not a finite number")
    return np.frombuffer(payload, dtype=state_dtype(n))[0]


# -- the C header (firmware_bridge.c_header) --------------------------------------------------------------
def _c_name(name: str) -> str:
    return f"STREAM_{name.upper()}"


def c_constants() -> list[tuple[str, int | bytes, str]]:
    """(name, value, comment) for the generated C header: topics, magic, versions, flag bits, the lost-sample
    field, the header's size and each header field's offset and size, each per-joint field's element size."""
    out: list[tuple[str, int | bytes, str]] = [
        ("STREAM_TOPIC_STATE", TOPIC_STATE, "first frame of a state message"),
        ("STREAM_TOPIC_HEALTH", TOPIC_HEALTH, "first frame of a health message (UTF-8 JSON)"),
        ("STREAM_MAGIC", MAGIC, "payload bytes 0-3"),
        ("STREAM_VERSION", STREAM_VERSION, "the version the driver writes"),
        ("STREAM_OLDEST_READABLE_VERSION", LAYOUT_VERSION, "versions from this one to STREAM_VERSION share "
                                                            "the layout (1 and 2 had no tau_ext)"),
    ]
    out += [(_c_name(k), v, f"flags bit: {FLAG_DOCS[v]}") for k, v in globals().items()
            if k.startswith("FLAG_") and k != "FLAG_DOCS"]
    out += [("STREAM_DRIVER_FLAGS_MASK", (1 << LOST_SHIFT) - 1, "flags bits of the driver's FLAG_*"),
            ("STREAM_LOST_SHIFT", LOST_SHIFT, "flags >> this: device samples lost before this message"),
            ("STREAM_LOST_MAX", LOST_MAX, "the lost-sample count saturates here"),
            ("STREAM_HEADER_SIZE", HEADER_SIZE, "bytes before the per-joint arrays (not a multiple of 8)"),
            ("STREAM_JOINT_SIZE", JOINT_SIZE, "bytes per joint, over all per-joint arrays")]
    for f in HEADER_FIELDS:
        out += [(f"{_c_name(f.name)}_OFFSET", HEADER_OFFSETS[f.name], f"{f.name}: byte offset"),
                (f"{_c_name(f.name)}_SIZE", f.size, f"{f.name}: bytes ({f.c_type}{'[4]' if f.name == 'magic' else ''})")]
    out += [(f"{_c_name(f.name)}_ELEM_SIZE", f.size, f"{f.name}[n]: bytes per value ({f.c_type}, {f.unit})")
            for f in JOINT_FIELDS]
    return out


def c_code() -> str:
    """The packed header struct, the per-joint array offsets and the message size as macros of the joint
    count, the lost-sample count of a flags word, and a check of a received payload."""
    members = "\n".join(f"    {f.c_type} {f.name}{'[4]' if f.name == 'magic' else ''};  /* {f.unit}: {f.doc} */"
                        for f in HEADER_FIELDS)
    offsets = [f"#define ARMID_{_c_name(f.name)}_OFFSET(n) (ARMID_STREAM_HEADER_SIZE + "
               f"{(joint_offset(f.name, 1) - HEADER_SIZE)}u * (size_t)(n))  /* {f.name}[n]: {f.c_type}, {f.unit} */"
               for f in JOINT_FIELDS]
    return "\n".join([
        "/* The state stream (docs/reference/stream.md): ZeroMQ multipart [ARMID_STREAM_TOPIC_STATE, payload]. The payload is",
        "   the header below, then one array of n values per joint field, unpadded: the doubles start at offset 36,",
        "   which is not 8-byte aligned. Copy values out with memcpy (never dereference a double * into it). */",
        "#pragma pack(push, 1)",
        f"/* state header: {HEADER_SIZE} bytes */",
        "typedef struct {", members, "} armid_stream_header_t;",
        "#pragma pack(pop)",
        "#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L",
        f'_Static_assert(sizeof(armid_stream_header_t) == ARMID_STREAM_HEADER_SIZE, '
        f'"armid_stream_header_t: {HEADER_SIZE} bytes on the wire");',
        "#endif",
        "",
        *offsets,
        "#define ARMID_STREAM_MESSAGE_SIZE(n) (ARMID_STREAM_HEADER_SIZE + ARMID_STREAM_JOINT_SIZE * (size_t)(n))",
        "#define ARMID_STREAM_LOST_SAMPLES(flags) ((uint32_t)(flags) >> ARMID_STREAM_LOST_SHIFT)",
        "",
        "/* The joint count of a state payload of len bytes, or -1 if it is not one this header reads (magic,",
        "   version or size wrong). The header is copied into *out when out is not NULL. */",
        "static inline int armid_stream_check(const void *payload, size_t len, armid_stream_header_t *out)",
        "{",
        "    armid_stream_header_t h;",
        "    if (len < ARMID_STREAM_HEADER_SIZE) return -1;",
        "    memcpy(&h, payload, sizeof h);",
        "    if (memcmp(h.magic, ARMID_STREAM_MAGIC, ARMID_STREAM_MAGIC_SIZE) != 0) return -1;",
        "    if (h.version < ARMID_STREAM_OLDEST_READABLE_VERSION || h.version > ARMID_STREAM_VERSION) return -1;",
        "    if (len != ARMID_STREAM_MESSAGE_SIZE(h.n)) return -1;",
        "    if (out) *out = h;",
        "    return (int)h.n;",
        "}",
    ])
