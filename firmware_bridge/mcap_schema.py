"""What the recorder writes into MCAP: the ROS 2 message definitions of its topics, and their CDR layouts.

Topics (docs/reference/recording.md):

    /joint_states     sensor_msgs/msg/JointState   position q (rad), velocity qd (rad/s), effort torque (N m)
    /motor_currents   sensor_msgs/msg/JointState   effort = motor current (A); position, velocity empty
    /external_torque  sensor_msgs/msg/JointState   effort = the driver's external torque estimate (N m);
                                                   position, velocity empty (stream version 3 on)
    /armid/state      armid_msgs/msg/ArmState      every field of the version-1 state message (docs/reference/stream.md)
    /diagnostics      diagnostic_msgs/msg/DiagnosticArray   the driver's health (driver.diagnostics), once a second
    /tf               tf2_msgs/msg/TFMessage       the links' transforms (ident.model.frames), when the model is known
    /robot_description  std_msgs/msg/String        the model's URDF (ident.model.frames), once at the start

Every message of one recording has the same size (the joint count and the names are fixed), so each
message type has a fixed CDR layout: constant bytes (encapsulation header, sequence lengths, names,
padding) around value slots at fixed offsets. `FixedCdr` builds that layout once, as a template and a
numpy structured dtype with explicit offsets. Encoding a message is then a copy of a few byte slices
into the template (driver.recorder), far faster than the generic encoder of mcap-ros2-support, which
packs every number separately (benchmarks/bench_recorder.py prints both), and a whole recording decodes
in one `np.frombuffer`. The tests check every layout byte for byte against mcap-ros2-support's encoder
and decoder.

CDR here is what ROS 2 writes: the 4-byte encapsulation header 00 01 00 00 (CDR, little-endian), then
the fields in order, each primitive aligned to its own size (at most 8) counted from the end of the
header; a sequence is a uint32 length and its elements; a string a uint32 length (with the NUL), the
UTF-8 bytes and a NUL.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

PROFILE = "ros2"
SCHEMA_ENCODING = "ros2msg"
MESSAGE_ENCODING = "cdr"
CDR_LE = b"\x00\x01\x00\x00"

TOPIC_JOINT_STATES = "/joint_states"
TOPIC_MOTOR_CURRENTS = "/motor_currents"
TOPIC_STATE = "/armid/state"
TOPIC_EXTERNAL_TORQUE = "/external_torque"
TOPIC_DIAGNOSTICS = "/diagnostics"
TOPIC_TF = "/tf"
TOPIC_ROBOT_DESCRIPTION = "/robot_description"

_HEADER_DEPS = """
================================================================================
MSG: std_msgs/Header
builtin_interfaces/Time stamp
string frame_id
================================================================================
MSG: builtin_interfaces/Time
int32 sec
uint32 nanosec
"""

JOINT_STATE = ("sensor_msgs/msg/JointState", """\
std_msgs/Header header
string[] name
float64[] position
float64[] velocity
float64[] effort
""" + _HEADER_DEPS)

ARM_STATE = ("armid_msgs/msg/ArmState", """\
# One version-1 state message of the armid driver (docs/reference/stream.md), every field kept. SI units.
std_msgs/Header header   # stamp = host_time_ns (UNIX time at which the driver read the sample)
uint16 version           # stream version (1)
uint32 flags             # bit 0 ENABLED, 1 MOVING, 2 FAULT, 3 STALE, 4 PAYLOAD
uint64 seq               # +1 per driver cycle; a gap means messages were dropped
int64 device_time_ns     # the drives' timestamp of the sample, ns (device clock)
int64 host_time_ns       # host UNIX time when the sample was read, ns
float64[] q              # joint positions, rad (m for prismatic joints)
float64[] qd             # joint velocities, rad/s
float64[] current        # motor currents, A
float64[] torque         # joint torques from the currents, N m
uint16[] statusword      # CiA 402 statusword (0x6041) per drive
uint16[] error_code      # CiA 402 error code (0x603F) per drive
int8[] mode              # CiA 402 modes of operation display (0x6061) per drive
""" + _HEADER_DEPS)

STRING = ("std_msgs/msg/String", "string data\n")

TF_MESSAGE = ("tf2_msgs/msg/TFMessage", """\
geometry_msgs/TransformStamped[] transforms
================================================================================
MSG: geometry_msgs/TransformStamped
std_msgs/Header header
string child_frame_id
geometry_msgs/Transform transform
================================================================================
MSG: geometry_msgs/Transform
geometry_msgs/Vector3 translation
geometry_msgs/Quaternion rotation
================================================================================
MSG: geometry_msgs/Vector3
float64 x
float64 y
float64 z
================================================================================
MSG: geometry_msgs/Quaternion
float64 x
float64 y
float64 z
float64 w
""" + _HEADER_DEPS)

DIAGNOSTIC_ARRAY = ("diagnostic_msgs/msg/DiagnosticArray", """\
std_msgs/Header header
diagnostic_msgs/DiagnosticStatus[] status
================================================================================
MSG: diagnostic_msgs/DiagnosticStatus
byte OK=0
byte WARN=1
byte ERROR=2
byte STALE=3
byte level
string name
string message
string hardware_id
diagnostic_msgs/KeyValue[] values
================================================================================
MSG: diagnostic_msgs/KeyValue
string key
string value
""" + _HEADER_DEPS)


@dataclass(frozen=True)
class CdrLayout:
    """A fixed-size CDR message: `template` holds the constant bytes (values zero), `dtype` names the value
    slots at their byte offsets (itemsize = the message size)."""

    template: bytes
    dtype: np.dtype

    @property
    def size(self) -> int:
        return len(self.template)

    def record(self) -> np.ndarray:
        """A one-message buffer filled with the template: set its fields, then send `.tobytes()`."""
        return np.frombuffer(bytearray(self.template), dtype=self.dtype)

    def span(self, name: str) -> tuple[int, int]:
        """(byte offset, byte count) of a value slot."""
        dt, offset = self.dtype.fields[name][:2]
        return offset, dt.itemsize

    def constant_mask(self) -> np.ndarray:
        """True at the bytes that every message of this layout has in common with the template."""
        mask = np.ones(self.size, dtype=bool)
        for name in self.dtype.names:
            offset, size = self.span(name)
            mask[offset:offset + size] = False
        return mask

    def decode(self, blobs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Decode many messages at once: (records (M,) of the messages that fit the layout, indices (M,) of
        those in `blobs`). A message fits if it has the layout's size and all its constant bytes."""
        size = self.size
        fits = np.fromiter((len(b) == size for b in blobs), dtype=bool, count=len(blobs))
        index = np.flatnonzero(fits)
        raw = np.frombuffer(b"".join(blobs[i] for i in index), dtype=np.uint8).reshape(len(index), size)
        mask = self.constant_mask()
        same = (raw[:, mask] == np.frombuffer(self.template, dtype=np.uint8)[mask]).all(axis=1)
        index = index[same]
        records = raw[same].copy().view(self.dtype).reshape(-1)
        return records, index


class FixedCdr:
    """Builds a CdrLayout field by field, in the order of the message definition."""

    def __init__(self):
        self._buf = bytearray(CDR_LE)
        self._names: list[str] = []
        self._formats: list = []
        self._offsets: list[int] = []

    def _align(self, size: int) -> None:
        self._buf += bytes(-(len(self._buf) - len(CDR_LE)) % size)

    def _slot(self, name: str, fmt, size: int) -> None:
        self._names.append(name)
        self._formats.append(fmt)
        self._offsets.append(len(self._buf))
        self._buf += bytes(size)

    def uint32_constant(self, value: int) -> "FixedCdr":
        self._align(4)
        self._buf += struct.pack("<I", value)
        return self

    def uint8_constant(self, value: int) -> "FixedCdr":
        self._buf.append(value)
        return self

    def string_constant(self, text: str) -> "FixedCdr":
        data = text.encode()
        self.uint32_constant(len(data) + 1)
        self._buf += data + b"\0"
        return self

    def strings_constant(self, texts: list[str]) -> "FixedCdr":
        self.uint32_constant(len(texts))
        for text in texts:
            self.string_constant(text)
        return self

    def scalar(self, name: str, fmt: str) -> "FixedCdr":
        size = np.dtype(fmt).itemsize
        self._align(size)
        self._slot(name, fmt, size)
        return self

    def sequence(self, name: str, fmt: str, count: int) -> "FixedCdr":
        """A sequence of `count` numbers of numpy format `fmt` (its length is part of the layout)."""
        self.uint32_constant(count)
        size = np.dtype(fmt).itemsize
        if count:
            self._align(size)
            self._slot(name, (fmt, (count,)), size * count)
        return self

    def array(self, name: str, fmt: str, count: int) -> "FixedCdr":
        """A fixed-size array (no length in CDR) of `count` numbers of numpy format `fmt`."""
        size = np.dtype(fmt).itemsize
        self._align(size)
        self._slot(name, (fmt, (count,)), size * count)
        return self

    def header(self, frame_id: str = "", prefix: str = "") -> "FixedCdr":
        """std_msgs/Header: stamp (slots `{prefix}sec`, `{prefix}nanosec`) and a constant frame_id."""
        return self.scalar(f"{prefix}sec", "<i4").scalar(f"{prefix}nanosec", "<u4").string_constant(frame_id)

    def header_constant(self, time_ns: int, frame_id: str = "") -> "FixedCdr":
        """std_msgs/Header with a constant stamp (a message encoded once, not a layout)."""
        sec, nanosec = split_stamp(time_ns)
        self._align(4)
        self._buf += struct.pack("<iI", sec, nanosec)
        return self.string_constant(frame_id)

    def layout(self) -> CdrLayout:
        dtype = np.dtype({"names": self._names, "formats": self._formats, "offsets": self._offsets,
                          "itemsize": len(self._buf)})
        return CdrLayout(bytes(self._buf), dtype)


def joint_state_layout(names: list[str], *, position: bool = True, velocity: bool = True,
                       frame_id: str = "") -> CdrLayout:
    """sensor_msgs/msg/JointState for these joint names; position and velocity may be left empty (as on
    /motor_currents, where only effort is filled)."""
    n = len(names)
    return (FixedCdr().header(frame_id).strings_constant(list(names))
            .sequence("position", "<f8", n if position else 0)
            .sequence("velocity", "<f8", n if velocity else 0)
            .sequence("effort", "<f8", n).layout())


def arm_state_layout(n: int, frame_id: str = "") -> CdrLayout:
    """armid_msgs/msg/ArmState for n joints."""
    cdr = (FixedCdr().header(frame_id).scalar("version", "<u2").scalar("flags", "<u4").scalar("seq", "<u8")
           .scalar("device_time_ns", "<i8").scalar("host_time_ns", "<i8"))
    for name in ("q", "qd", "current", "torque"):
        cdr.sequence(name, "<f8", n)
    return cdr.sequence("statusword", "<u2", n).sequence("error_code", "<u2", n).sequence("mode", "i1", n).layout()


def tf_layout(tree: list[tuple[str, str]]) -> CdrLayout:
    """tf2_msgs/msg/TFMessage of one transform per (parent, child) in `tree`: slots `h{k}_sec`, `h{k}_nanosec`
    (the stamp), `t{k}` (3 float64, translation m) and `r{k}` (4 float64, quaternion x y z w)."""
    cdr = FixedCdr().uint32_constant(len(tree))
    for k, (parent, child) in enumerate(tree):
        cdr.header(parent, prefix=f"h{k}_").string_constant(child)
        cdr.array(f"t{k}", "<f8", 3).array(f"r{k}", "<f8", 4)
    return cdr.layout()


def encode_tf(layout: CdrLayout, time_ns: int, translation: np.ndarray, rotation: np.ndarray) -> bytes:
    """One message of a tf_layout: the stamp time_ns, translations (K, 3) m, quaternions (K, 4) x y z w."""
    buf = bytearray(layout.template)
    sec, nanosec = split_stamp(time_ns)
    values = np.concatenate([translation, rotation], axis=1).tolist()
    for k, row in enumerate(values):
        struct.pack_into("<iI", buf, layout.span(f"h{k}_sec")[0], sec, nanosec)
        struct.pack_into("<7d", buf, layout.span(f"t{k}")[0], *row)
    return bytes(buf)


def encode_diagnostics(statuses: list[dict], time_ns: int) -> bytes:
    """diagnostic_msgs/msg/DiagnosticArray of statuses (driver.diagnostics: level, name, message, hardware_id,
    values [(key, value)])."""
    cdr = FixedCdr().header_constant(time_ns).uint32_constant(len(statuses))
    for st in statuses:
        cdr.uint8_constant(int(st["level"]))
        for key in ("name", "message", "hardware_id"):
            cdr.string_constant(st[key])
        cdr.uint32_constant(len(st["values"]))
        for key, value in st["values"]:
            cdr.string_constant(key).string_constant(value)
    return cdr.layout().template


def encode_string(text: str) -> bytes:
    """std_msgs/msg/String in CDR (variable length, so not a fixed layout)."""
    return FixedCdr().string_constant(text).layout().template


def split_stamp(time_ns: int) -> tuple[int, int]:
    """builtin_interfaces/Time (sec, nanosec) of a UNIX time in ns."""
    sec, nanosec = divmod(int(time_ns), 1_000_000_000)
    return sec, nanosec
