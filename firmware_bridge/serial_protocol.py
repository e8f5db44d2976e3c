"""The serial link to the joint boards: byte-exact frames, defined once as field tables.

On the wire every frame is COBS-encoded (the `cobs` package) and ends with one 0x00 delimiter. Decoded, a
frame is

    header (6 bytes: version u8, type u8, seq u16, length u16) | payload (length bytes) | CRC-32 u32

all little-endian; the CRC is zlib's CRC-32 (reflected 0xEDB88320, init and xorout 0xFFFFFFFF) over
header and payload. Per-joint messages carry n_joints (1..MAX_JOINTS) in their fixed part, followed by
n_joints joint records. Values are the int32 wire units of firmware_bridge.units (counts, counts/s, uA,
mN m); JointScaling converts to SI.

Host side:
    enc = FrameEncoder();  port.write(enc.encode(Command(controlword=..., mode=..., target_position=...,
                                                         target_torque=...)))
    dec = StreamDecoder();  for msg in dec.feed(port.read(4096)): ...   # dec.counters: drops by reason
Device side: the same, with State, Heartbeat, Fault, HelloAck. See docs/reference/wire-serial.md.
"""
from __future__ import annotations

import enum
import math
import struct
import zlib
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
from cobs import cobs

from firmware_bridge.runtime.counters import Counters
from firmware_bridge.units import WireValueError
from firmware_bridge.wire import Field, Record, check_array, check_scalar

VERSION = 2                  # protocol version, byte 0 of every frame (2: COMMAND carries torque_offset)
MAX_JOINTS = 64              # n_joints above this is refused (bounds the buffers of both sides)
DEFAULT_WATCHDOG_US = 100_000  # host silence (us) after which the device quick-stops enabled drives
CRC32_POLY_REFLECTED = 0xEDB88320
CRC_SIZE = 4


class MsgType(enum.IntEnum):
    """Message type, byte 1 of every frame."""
    HELLO = 1
    HELLO_ACK = 2
    HEARTBEAT = 3
    STATE = 4
    COMMAND = 5
    FAULT = 6


HEADER = Record("header", (
    Field("version", "uint8", "-", "protocol version (VERSION); other versions are dropped"),
    Field("type", "uint8", "-", "message type (MsgType)"),
    Field("seq", "uint16", "-", "sequence number, +1 per frame sent by this side, wraps at 65536"),
    Field("length", "uint16", "byte", "payload length (bytes between header and CRC)"),
))
CRC = Record("trailer", (
    Field("crc", "uint32", "-", "CRC-32 (zlib) of header and payload"),
))

_N = Field("n_joints", "uint8", "-", f"number of joint records that follow (1..{MAX_JOINTS})")


# -- the messages (typed, for the host and the device); fields named as in the tables below ---------------
@dataclass(kw_only=True, eq=False)
class Hello:
    """Host -> device: start of a session; the device answers HelloAck."""
    watchdog_us: int = 0
    seq: int = 0


@dataclass(kw_only=True, eq=False)
class HelloAck:
    """Device -> host: what the device is (joints, cycle, watchdog, encoder and gear per joint)."""
    cycle_period_us: int
    watchdog_us: int
    counts_per_rev: np.ndarray
    gear_ratio: np.ndarray
    seq: int = 0


@dataclass(kw_only=True, eq=False)
class Heartbeat:
    """Either way: I am alive (sender's clock in us)."""
    time_us: int
    seq: int = 0


@dataclass(kw_only=True, eq=False)
class State:
    """Device -> host, one per cycle: every joint's drive status and measurements (wire units)."""
    timestamp_us: int
    cycle: int
    statusword: np.ndarray
    mode_display: np.ndarray
    error_code: np.ndarray
    position: np.ndarray
    velocity: np.ndarray
    current: np.ndarray
    seq: int = 0


@dataclass(kw_only=True, eq=False)
class Command:
    """Host -> device: every joint's controlword, mode and targets (wire units). torque_offset (mN m, CiA 402's
    0x60B2 in mN m) defaults to zeros, one per joint."""
    controlword: np.ndarray
    mode: np.ndarray
    target_position: np.ndarray
    target_torque: np.ndarray
    torque_offset: np.ndarray | None = None
    seq: int = 0

    def __post_init__(self):
        if self.torque_offset is None:
            self.torque_offset = np.zeros(np.size(self.target_torque), np.int64)


@dataclass(kw_only=True, eq=False)
class Fault:
    """Device -> host: drive `joint` (0-based) entered FAULT with error_code."""
    joint: int
    error_code: int
    statusword: int
    seq: int = 0


Message = Hello | HelloAck | Heartbeat | State | Command | Fault


@dataclass(frozen=True)
class MessageSpec:
    """One message type: its class, sender, fixed record and (per-joint messages) its joint record."""
    type: MsgType
    cls: type
    sender: str
    doc: str
    fixed: Record
    joint: Record | None = None

    @property
    def direction(self) -> str:
        return {"host": "host -> device", "device": "device -> host"}.get(self.sender, "either way")

    @cached_property
    def c_name(self) -> str:
        return f"armid_serial_{self.type.name.lower()}"

    @cached_property
    def fixed_plan(self) -> tuple[tuple[str | None, bool], ...]:
        """(name, is_float) per fixed field; name None for n_joints."""
        return tuple((None if f is _N else f.name, f.type.is_float) for f in self.fixed.fields)

    @cached_property
    def joint_plan(self) -> tuple[tuple[str, bool], ...]:
        """(name, is_float) per joint field."""
        return tuple((f.name, f.type.is_float) for f in self.joint.fields) if self.joint else ()

    @cached_property
    def fixed_size(self) -> int:
        return self.fixed.size

    @cached_property
    def joint_size(self) -> int:
        return self.joint.size if self.joint else 0

    @cached_property
    def n_index(self) -> int:
        """Position of n_joints in the fixed record (-1 when the message has no joints)."""
        names = self.fixed.names
        return names.index("n_joints") if "n_joints" in names else -1

    def payload_size(self, n: int = 0) -> int:
        return self.fixed.size + (n * self.joint.size if self.joint else 0)


SPECS: dict[MsgType, MessageSpec] = {s.type: s for s in (
    MessageSpec(MsgType.HELLO, Hello, "host", "opens a session; the device answers HELLO_ACK", Record("hello", (
        Field("watchdog_us", "uint32", "us", "requested host watchdog; 0: the device's default"),))),
    MessageSpec(MsgType.HELLO_ACK, HelloAck, "device", "answers HELLO: the device's joints and settings",
                Record("hello_ack", (
                    _N,
                    Field("cycle_period_us", "uint32", "us", "period of the STATE frames"),
                    Field("watchdog_us", "uint32", "us", "host watchdog in force"),
                )), Record("hello_ack_joint", (
                    Field("counts_per_rev", "uint32", "count", "motor encoder counts per motor revolution"),
                    Field("gear_ratio", "float64", "-", "motor rev per joint rev (motor rad per m if prismatic)"),
                ))),
    MessageSpec(MsgType.HEARTBEAT, Heartbeat, "both", "liveness, at least every watchdog / 2 from the host",
                Record("heartbeat", (Field("time_us", "uint64", "us", "sender's monotonic clock"),))),
    MessageSpec(MsgType.STATE, State, "device", "one per cycle, all joints", Record("state", (
        Field("timestamp_us", "uint64", "us", "device clock at the sample"),
        Field("cycle", "uint32", "-", "device cycle counter (wraps)"),
        _N,
    )), Record("state_joint", (
        Field("statusword", "uint16", "-", "CiA 402 statusword (0x6041)"),
        Field("mode_display", "int8", "-", "modes of operation display (0x6061)"),
        Field("error_code", "uint16", "-", "error code (0x603F), 0 if none"),
        Field("position", "int32", "count", "position actual (0x6064), motor encoder counts"),
        Field("velocity", "int32", "count/s", "velocity actual (0x606C)"),
        Field("current", "int32", "uA", "motor current actual, uA (0x2000 as on CAN; not CiA 402's per-mille 0x6078)"),
    ))),
    MessageSpec(MsgType.COMMAND, Command, "host", "set-points for all joints, latched at the next cycle",
                Record("command", (_N,)), Record("command_joint", (
                    Field("controlword", "uint16", "-", "CiA 402 controlword (0x6040)"),
                    Field("mode", "int8", "-", "modes of operation (0x6060): 0, 8 CSP, 10 CST"),
                    Field("target_position", "int32", "count", "target position (0x607A), motor counts"),
                    Field("target_torque", "int32", "mN m", "target torque, mN m (0x2002 as on CAN; not CiA 402's per-mille 0x6071); CSP: feed-forward"),
                    Field("torque_offset", "int32", "mN m", "torque offset, mN m (0x60B2's role; on CAN in per mille): CSP adds it to the position loop's torque, CST to the target torque"),
                ))),
    MessageSpec(MsgType.FAULT, Fault, "device", "a drive entered FAULT", Record("fault", (
        Field("joint", "uint8", "-", "joint index, 0-based"),
        Field("error_code", "uint16", "-", "error code (0x603F)"),
        Field("statusword", "uint16", "-", "statusword at the fault"),
    ))),
)}
SPEC_OF: dict[type, MessageSpec] = {s.cls: s for s in SPECS.values()}

MAX_FRAME = HEADER.size + max(s.payload_size(MAX_JOINTS) for s in SPECS.values()) + CRC_SIZE
MAX_ENCODED = MAX_FRAME + (MAX_FRAME + 253) // 254 + 1   # COBS overhead and the 0x00 delimiter

_CRC = struct.Struct("<I")
_HEADER = HEADER.struct
_MIN_FRAME = HEADER.size + CRC_SIZE


class FrameError(ValueError):
    """A frame that cannot be decoded; .reason is one of DecoderCounters' drop reasons."""

    def __init__(self, reason: str, detail: str, version: int | None = None):
        super().__init__(f"serial frame: {reason}: {detail}")
        self.reason = reason
        self.version = version   # the frame's protocol version, for reason "version"


# -- encoding ------------------------------------------------------------------------------------------
class _NotPlain(Exception):
    """A value the fast path does not take as it is (it goes through the full checks)."""


@lru_cache(maxsize=1024)
def _joints_struct(kind: MsgType, n: int) -> struct.Struct:
    """n joint records of message type kind, back to back."""
    return struct.Struct("<" + "".join(f.type.code for f in SPECS[kind].joint.fields) * n)


def _plain_values(spec: MessageSpec, msg: Message, n: int) -> list:
    """The fixed values then the joint records, flat, when every value is already a plain int (finite float
    for float fields) and every column an (n,) array of a fitting kind: the common case, checked cheaply.
    struct.pack then refuses integers out of range."""
    flat = []
    for name, is_float in spec.fixed_plan:
        if name is None:
            flat.append(n)
            continue
        v = getattr(msg, name)
        if type(v) is not (float if is_float else int) or (is_float and not math.isfinite(v)):
            raise _NotPlain
        flat.append(v)
    if spec.joint is not None:
        cols = []
        for name, is_float in spec.joint_plan:
            c = getattr(msg, name)
            if type(c) is not np.ndarray or c.shape != (n,) or c.dtype.kind not in ("f" if is_float else "iu"):
                raise _NotPlain
            col = c.tolist()
            if is_float and not all(map(math.isfinite, col)):
                raise _NotPlain
            cols.append(col)
        for row in zip(*cols):
            flat.extend(row)
    return flat


def _checked_values(spec: MessageSpec, msg: Message, n: int) -> list:
    """As _plain_values for any input, through check_scalar / check_array: WireValueError names the field
    and the joint of the first value that cannot be sent."""
    where = spec.type.name
    flat = [n if f is _N else check_scalar(where, f, getattr(msg, f.name)) for f in spec.fixed.fields]
    if spec.joint is not None:
        cols = []
        for f in spec.joint.fields:
            arr = check_array(where, f, getattr(msg, f.name), n)
            cols.append((arr.astype(np.float64) if f.type.is_float else arr.astype(np.int64)).tolist())
        for row in zip(*cols):
            flat.extend(row)
    return flat


def encode_payload(msg: Message) -> tuple[MsgType, bytes]:
    """The message's type and payload bytes; WireValueError for a value its field cannot hold."""
    spec = SPEC_OF.get(type(msg))
    if spec is None:
        raise WireValueError(f"serial: cannot encode {type(msg).__name__} (not a serial message)")
    n = 0
    if spec.joint is not None:
        n = np.size(getattr(msg, spec.joint.fields[0].name))
        if not 1 <= n <= MAX_JOINTS:
            raise WireValueError(f"{spec.type.name}: expected 1..{MAX_JOINTS} joints, got {n}")
    try:
        return spec.type, _pack(spec, _plain_values(spec, msg, n), n)
    except (_NotPlain, struct.error):
        pass
    try:
        return spec.type, _pack(spec, _checked_values(spec, msg, n), n)
    except struct.error as exc:   # not expected after the checks; still one clear error
        raise WireValueError(f"{spec.type.name}: {exc}") from None


def _pack(spec: MessageSpec, flat: list, n: int) -> bytes:
    k = len(spec.fixed.fields)
    fixed = spec.fixed.struct.pack(*flat[:k])
    return fixed + _joints_struct(spec.type, n).pack(*flat[k:]) if n else fixed


def encode_frame(msg: Message, seq: int | None = None) -> bytes:
    """Header + payload + CRC (before COBS). seq: the frame's sequence number (default msg.seq)."""
    kind, payload = encode_payload(msg)
    seq = check_scalar(kind.name, HEADER.fields[2], msg.seq if seq is None else seq)
    body = HEADER.struct.pack(VERSION, int(kind), seq, len(payload)) + payload
    return body + _CRC.pack(zlib.crc32(body))


def encode(msg: Message, seq: int | None = None) -> bytes:
    """The frame as sent on the wire: COBS(header + payload + CRC) followed by 0x00."""
    return cobs_encode(encode_frame(msg, seq)) + b"\0"


def cobs_encode(frame: bytes) -> bytes:
    """COBS encoding of a frame (no 0x00 left in it; the delimiter is not added)."""
    return cobs.encode(frame)


class FrameEncoder:
    """Numbers the frames one side sends (seq 0, 1, ... wrapping at 65536) and encodes them."""

    def __init__(self, first_seq: int = 0):
        self.seq = first_seq & 0xFFFF

    def encode(self, msg: Message) -> bytes:
        """Wire bytes of msg with the next sequence number (msg.seq is set to it)."""
        msg.seq = self.seq
        out = encode(msg)
        self.seq = (self.seq + 1) & 0xFFFF
        return out


def encode_command(seq: int, controlword, mode, target_position, target_torque, torque_offset=None) -> bytes:
    """Host helper: wire bytes of one COMMAND for n joints ((n,) arrays in wire units: controlword,
    mode (0x6060), target_position (counts), target_torque (mN m), torque_offset (mN m, default zeros))."""
    return encode(Command(controlword=controlword, mode=mode, target_position=target_position,
                          target_torque=target_torque, torque_offset=torque_offset), seq)


# -- decoding ------------------------------------------------------------------------------------------
def decode_frame(frame: bytes) -> Message:
    """Decode header + payload + CRC (after COBS). FrameError(reason) when anything is wrong; checks run in
    the order truncated, crc, version, unknown_type, length, value."""
    size = len(frame)
    if size < _MIN_FRAME:
        raise FrameError("truncated", f"{size} bytes, at least {_MIN_FRAME} needed")
    body = memoryview(frame)[:-CRC_SIZE]
    (crc,) = _CRC.unpack_from(frame, size - CRC_SIZE)
    if zlib.crc32(body) != crc:
        raise FrameError("crc", f"CRC {crc:#010x} != computed {zlib.crc32(body):#010x}")
    version, kind, seq, length = _HEADER.unpack_from(body)
    if version != VERSION:
        raise FrameError("version", f"protocol version {version}, this side speaks {VERSION}", version)
    spec = SPECS.get(kind)
    if spec is None:
        raise FrameError("unknown_type", f"message type {kind}")
    payload = body[_HEADER.size:]
    have = len(payload)
    if length != have or have < spec.fixed_size:
        raise FrameError("length", f"{spec.type.name}: header says {length} payload bytes, frame has {have}")
    fixed = spec.fixed.struct.unpack_from(payload)
    values = {name: v for (name, _), v in zip(spec.fixed_plan, fixed) if name is not None}
    for name, is_float in spec.fixed_plan:
        if is_float and not math.isfinite(values[name]):
            raise FrameError("value", f"{spec.type.name}: {name} is not finite")
    if spec.joint is None:
        if have != spec.fixed_size:
            raise FrameError("length", f"{spec.type.name}: {have} payload bytes, expected {spec.fixed_size}")
        return spec.cls(**values, seq=seq)
    n = fixed[spec.n_index]
    if not 1 <= n <= MAX_JOINTS:
        raise FrameError("value", f"{spec.type.name}: n_joints {n} outside 1..{MAX_JOINTS}")
    if have != spec.fixed_size + n * spec.joint_size:
        raise FrameError("length", f"{spec.type.name}: {have} payload bytes, {n} joints need {spec.payload_size(n)}")
    flat = _joints_struct(spec.type, n).unpack_from(payload, spec.fixed_size)
    m = len(spec.joint_plan)
    for i, (name, is_float) in enumerate(spec.joint_plan):
        col = flat[i::m]
        if is_float and not all(map(math.isfinite, col)):
            raise FrameError("value", f"{spec.type.name}: {name} is not finite")
        values[name] = np.array(col, dtype=np.float64 if is_float else np.int64)
    return spec.cls(**values, seq=seq)


def decode(wire: bytes) -> Message:
    """Decode one wire frame (COBS bytes, with or without the trailing 0x00). FrameError when bad."""
    data = bytes(wire)
    if data.endswith(b"\0"):
        data = data[:-1]
    try:
        frame = cobs.decode(data)
    except cobs.DecodeError as exc:
        raise FrameError("cobs", str(exc)) from None
    return decode_frame(frame)


DROP_REASONS = ("cobs", "truncated", "crc", "version", "unknown_type", "length", "value", "overflow")


@dataclass
class DecoderCounters(Counters):
    """What a StreamDecoder saw. frames: messages returned. Drops by reason: cobs (bad COBS), truncated
    (shorter than header + CRC), crc, version, unknown_type, length (payload length wrong for the header or
    for n_joints), value (n_joints out of range, non-finite float), overflow (no delimiter within
    MAX_ENCODED bytes: the bytes up to the next 0x00 are discarded). Sequence: gaps (times a seq was
    skipped), lost (seq numbers skipped in all), backwards (a seq not after the previous one: a restart)."""
    frames: int = 0
    cobs: int = 0
    truncated: int = 0
    crc: int = 0
    version: int = 0
    unknown_type: int = 0
    length: int = 0
    value: int = 0
    overflow: int = 0
    gaps: int = 0
    lost: int = 0
    backwards: int = 0

    @property
    def dropped(self) -> int:
        """Frames dropped, all reasons."""
        return sum(getattr(self, r) for r in DROP_REASONS)


class StreamDecoder:
    """Turns a byte stream arriving in arbitrary chunks into messages. Bad frames are counted (counters)
    and dropped; feed() never raises on bad bytes. Memory stays below max_encoded bytes whatever arrives."""

    def __init__(self, max_encoded: int = MAX_ENCODED):
        self.max_encoded = max_encoded
        self.counters = DecoderCounters()
        self._buf = bytearray()
        self._discarding = False   # inside an overlong frame: skip to the next delimiter
        self._last_seq: int | None = None
        self.other_version: int | None = None   # protocol version of the last frame dropped for its version

    @property
    def buffered(self) -> int:
        """Bytes held while waiting for a delimiter (at most max_encoded)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return the messages completed by them, in order."""
        out: list[Message] = []
        if not data:
            return out
        self._buf += data
        *chunks, rest = self._buf.split(b"\0")
        for chunk in chunks:
            if self._discarding:
                self._discarding = False
                continue
            if not chunk:
                continue
            if len(chunk) > self.max_encoded:
                self.counters.overflow += 1
                continue
            try:
                msg = decode_frame(cobs.decode(chunk))
            except cobs.DecodeError:
                self.counters.cobs += 1
                continue
            except FrameError as exc:
                setattr(self.counters, exc.reason, getattr(self.counters, exc.reason) + 1)
                if exc.reason == "version":
                    self.other_version = exc.version
                continue
            self._sequence(msg.seq)
            out.append(msg)
        if len(rest) > self.max_encoded:
            if not self._discarding:
                self.counters.overflow += 1
            self._discarding = True
            rest = b""
        self._buf = bytearray(rest)
        return out

    def _sequence(self, seq: int) -> None:
        c = self.counters
        c.frames += 1
        if self._last_seq is not None:
            step = (seq - self._last_seq) & 0xFFFF
            if step == 0 or step >= 0x8000:
                c.backwards += 1
            elif step > 1:
                c.gaps += 1
                c.lost += step - 1
        self._last_seq = seq


# -- the C header and the docs ---------------------------------------------------------------------------
def c_constants() -> list[tuple[str, int, str]]:
    """(name, value, comment) for the generated C header."""
    out = [("SERIAL_VERSION", VERSION, "protocol version (header byte 0)"),
           ("SERIAL_HEADER_SIZE", HEADER.size, "bytes: version, type, seq, length"),
           ("SERIAL_CRC_SIZE", CRC_SIZE, "bytes of CRC-32 after the payload"),
           ("SERIAL_MAX_JOINTS", MAX_JOINTS, "largest n_joints"),
           ("SERIAL_MAX_FRAME", MAX_FRAME, "largest frame before COBS (bytes)"),
           ("SERIAL_MAX_ENCODED", MAX_ENCODED, "largest frame on the wire, COBS and delimiter included"),
           ("SERIAL_DEFAULT_WATCHDOG_US", DEFAULT_WATCHDOG_US, "host silence that quick-stops the drives"),
           ("SERIAL_CRC32_POLY", CRC32_POLY_REFLECTED, "CRC-32 polynomial, reflected (zlib)")]
    out += [(f"SERIAL_MSG_{t.name}", int(t), SPECS[t].direction) for t in MsgType]
    return out


def c_code() -> str:
    """Packed structs of the header and every message, size checks, the CRC-32, COBS and a payload-size
    helper."""
    parts = ["#pragma pack(push, 1)", HEADER.c_struct("armid_serial_header_t")]
    asserts = [("armid_serial_header_t", HEADER.size)]
    for spec in SPECS.values():
        trailing = ""
        if spec.joint is not None:
            parts.append(spec.joint.c_struct(f"{spec.c_name}_joint_t"))
            asserts.append((f"{spec.c_name}_joint_t", spec.joint.size))
            trailing = f"{spec.c_name}_joint_t joints[];  /* n_joints records */"
        parts.append(spec.fixed.c_struct(f"{spec.c_name}_t", trailing))
        asserts.append((f"{spec.c_name}_t", spec.fixed.size))
    parts.append("#pragma pack(pop)")
    parts.append("#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L\n" + "\n".join(
        f'_Static_assert(sizeof({name}) == {size}, "{name}: {size} bytes on the wire");' for name, size in asserts)
        + "\n#endif")
    parts.append("""/* CRC-32 as zlib.crc32: reflected polynomial 0xEDB88320, init and xorout 0xFFFFFFFF.
   armid_crc32_update(0, data, len) == armid_crc32(data, len); feed pieces by passing the previous result. */
static inline uint32_t armid_crc32_update(uint32_t crc, const uint8_t *data, size_t len)
{
    crc = ~crc;
    while (len--) {
        crc ^= *data++;
        for (int k = 0; k < 8; k++) {
            crc = (crc >> 1) ^ (ARMID_SERIAL_CRC32_POLY & (0u - (crc & 1u)));
        }
    }
    return ~crc;
}

static inline uint32_t armid_crc32(const uint8_t *data, size_t len)
{
    return armid_crc32_update(0u, data, len);
}""")
    parts.append("""/* COBS as the `cobs` Python package (Cheshire & Baker): encode len bytes of src into dst, which must
   hold ARMID_COBS_MAX_ENCODED(len) bytes; returns the encoded length (no 0x00 in it; send a 0x00 after it). */
#define ARMID_COBS_MAX_ENCODED(len) ((len) + (len) / 254u + 1u)
static inline size_t armid_cobs_encode(const uint8_t *src, size_t len, uint8_t *dst)
{
    size_t out = 1, code_at = 0;
    uint8_t code = 1;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == 0) {
            dst[code_at] = code;
            code_at = out++;
            code = 1;
        } else {
            dst[out++] = src[i];
            if (++code == 0xFF && i + 1 < len) {
                dst[code_at] = code;
                code_at = out++;
                code = 1;
            }
        }
    }
    dst[code_at] = code;
    return out;
}

/* Decode len COBS bytes of src (the bytes between two 0x00 delimiters) into dst (at least len bytes).
   Returns 0 and the decoded length in *out_len, or -1 for input that is not COBS (drop the frame). */
static inline int armid_cobs_decode(const uint8_t *src, size_t len, uint8_t *dst, size_t *out_len)
{
    size_t i = 0, out = 0;
    while (i < len) {
        uint8_t code = src[i++];
        if (code == 0) {
            return -1;
        }
        for (uint8_t k = 1; k < code; k++) {
            if (i >= len || src[i] == 0) {
                return -1;
            }
            dst[out++] = src[i++];
        }
        if (code != 0xFF && i < len) {
            dst[out++] = 0;
        }
    }
    *out_len = out;
    return 0;
}""")
    cases = []
    for spec in SPECS.values():
        size = f"sizeof({spec.c_name}_t)"
        if spec.joint is not None:
            size += f" + (size_t)n_joints * sizeof({spec.c_name}_joint_t)"
        cases.append(f"    case ARMID_SERIAL_MSG_{spec.type.name}: return {size};")
    parts.append("/* Payload bytes of a message of this type with n_joints joints (0 for an unknown type). */\n"
                 "static inline size_t armid_serial_payload_size(uint8_t type, uint8_t n_joints)\n{\n"
                 "    (void)n_joints;\n    switch (type) {\n" + "\n".join(cases) +
                 "\n    default: return 0;\n    }\n}")
    return "\n\n".join(parts)


def doc_tables() -> str:
    """Markdown tables of the header, the trailer and every message (generated into docs/reference/wire-serial.md)."""
    out = ["### Header (6 bytes, offsets in the frame)", "", HEADER.markdown(), "",
           "### Trailer (after the payload)", "", CRC.markdown(offset_note="6 + length + "), ""]
    for spec in SPECS.values():
        size = f"{spec.fixed.size}" + (f" + {spec.joint.size} n_joints" if spec.joint else "")
        out += [f"### {spec.type.name} (type {int(spec.type)}, {spec.direction}; payload {size} bytes)", "",
                f"{spec.doc[0].upper()}{spec.doc[1:]}. Offsets in the payload.", "", spec.fixed.markdown(), ""]
        if spec.joint is not None:
            out += [f"Then n_joints records of {spec.joint.size} bytes; joint k (0-based) at "
                    f"{spec.fixed.size} + {spec.joint.size} k +:", "", spec.joint.markdown(), ""]
    return "\n".join(out).rstrip() + "\n"
