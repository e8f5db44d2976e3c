"""EtherCAT-through-Modbus-TCP gateway: the register layout of the CiA 402 process image, defined once as data.

A vendor gateway is the EtherCAT master of n CiA 402 drives and a Modbus TCP server to the host:

  input registers (function 4, read-only), from INPUT_BASE:
      header (INPUT_HEADER_SIZE registers), then one block of INPUT_DRIVE_STRIDE registers per drive;
  holding registers (functions 3, 6, 16, read/write), from HOLDING_BASE:
      header (HOLDING_HEADER_SIZE registers: host watchdog), then one block of HOLDING_DRIVE_STRIDE
      registers per drive;
  the input image mirrored in read-only holding registers from INPUT_MIRROR_BASE (functions 3 and 23), so
  that one read/write-multiple request (function 23) writes the commands and reads the state.

Values are the integer wire units of firmware_bridge.units (counts, counts/s, uA, mN m). A 32-bit value
takes two registers, high word first (big-endian words, big-endian bytes in each word: "ABCD", pymodbus's
word_order="big"), and always starts at an even offset inside its block. The fixed strides let a host
read the whole input image of up to DRIVES_PER_READ drives in one request of at most 125 registers.

encode_inputs / decode_inputs and encode_outputs / decode_outputs convert between the images (numpy
arrays of n drives) and uint16 words; anything that cannot be represented, or that a gateway of this
layout cannot have sent, raises GatewayError naming the field, the drive and the register address.
This module depends on nothing of armid's but firmware_bridge.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property, lru_cache
from typing import Sequence

import numpy as np

from firmware_bridge import cia402

LAYOUT_VERSION = 1          # input register 0; a host refuses any other value
INPUT_BASE = 0x0000         # first input register (function 4)
HOLDING_BASE = 0x0400       # first holding register (functions 3/6/16): a request to the wrong table fails
MAX_READ_REGISTERS = 125    # Modbus limit of one read (functions 3, 4)
MAX_WRITE_REGISTERS = 123   # Modbus limit of one write (function 16)
INPUT_MIRROR_BASE = 0x0800  # the input image again, as read-only holding registers (functions 3, 23)
MAX_READWRITE_WRITE = 121   # Modbus limit of the write part of function 23 (its read part: 125)
MAX_DRIVES = 64             # drives one gateway of this layout serves

# gateway status bits (input register gateway_status)
STATUS_DATA_VALID = 1 << 0        # the image holds this cycle's values (cleared when one could not be encoded)
STATUS_WATCHDOG_EXPIRED = 1 << 1  # the host watchdog ran out; cleared by the next watchdog write
STATUS_DRIVE_FAULT = 1 << 2       # some drive reports the fault bit (statusword bit 3)

_KINDS = {"u16": (1, 0, 0xFFFF), "i16": (1, -0x8000, 0x7FFF),
          "u32": (2, 0, 0xFFFFFFFF), "i32": (2, -0x80000000, 0x7FFFFFFF)}


class GatewayError(ValueError):
    """A process image that cannot be encoded or decoded (names the field, drive and register)."""


@dataclass(frozen=True)
class Field:
    """One value of a block: offset (registers from the block start), kind (u16, i16, u32, i32), unit,
    the CiA 402 object it carries (0 if none), the allowed range [lo, hi] (None: the kind's range) or the
    allowed values, and a one-line description."""

    name: str
    offset: int
    kind: str
    unit: str
    doc: str
    index: int = 0
    lo: int | None = None
    hi: int | None = None
    allowed: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        """Registers taken: 1 or 2."""
        return _KINDS[self.kind][0]

    @cached_property
    def bounds(self) -> tuple[int, int]:
        """The inclusive range a value must lie in."""
        _, lo, hi = _KINDS[self.kind]
        return (lo if self.lo is None else self.lo, hi if self.hi is None else self.hi)


_MODES = tuple(int(m) for m in cia402.Mode)

INPUT_HEADER: tuple[Field, ...] = (
    Field("layout_version", 0, "u16", "-", f"layout version, {LAYOUT_VERSION}; a host refuses any other"),
    Field("drive_count", 1, "u16", "-", "number of drives n in the image", lo=1, hi=MAX_DRIVES),
    Field("gateway_status", 2, "u16", "bits", "bit 0 data valid, bit 1 host watchdog expired, bit 2 a drive faulted"),
    Field("refused_writes", 3, "u16", "count", "holding-register writes refused so far (wraps at 65536)"),
    Field("cycle_counter", 4, "u32", "cycles", "+1 at every process-image update (wraps at 2^32)"),
    Field("timestamp_us", 6, "u32", "us", "device time of the image (wraps at 2^32 us, 71.6 min)"),
)
INPUT_HEADER_SIZE = 8

INPUT_DRIVE: tuple[Field, ...] = (
    Field("statusword", 0, "u16", "bits", "statusword", cia402.STATUSWORD),
    Field("mode_display", 1, "i16", "-", "modes of operation display (INTEGER8)", cia402.MODES_OF_OPERATION_DISPLAY,
          lo=-128, hi=127),
    Field("error_code", 2, "u16", "-", "error code", cia402.ERROR_CODE),
    Field("position", 4, "i32", "counts", "position actual value (motor encoder counts)", cia402.POSITION_ACTUAL),
    Field("velocity", 6, "i32", "counts/s", "velocity actual value", cia402.VELOCITY_ACTUAL),
    Field("current", 8, "i32", "uA", "current actual value (motor current)", cia402.CURRENT_ACTUAL),
    Field("torque", 10, "i32", "mN m", "torque actual value (joint torque)", cia402.TORQUE_ACTUAL),
)
INPUT_DRIVE_STRIDE = 12     # offset 3 is reserved (reads 0) so that 32-bit values start at even offsets

HOLDING_HEADER: tuple[Field, ...] = (
    Field("watchdog", 0, "u16", "-", "host watchdog: every write (any value) re-arms it"),
    Field("watchdog_timeout_ms", 1, "u16", "ms", "host watchdog time; 0 reads as disabled (a host may not write 0)"),
)
HOLDING_HEADER_SIZE = 2

HOLDING_DRIVE: tuple[Field, ...] = (
    Field("controlword", 0, "u16", "bits", "controlword", cia402.CONTROLWORD),
    Field("mode", 1, "i16", "-", "modes of operation: " + ", ".join(f"{int(m)} {m.name}" for m in cia402.Mode),
          cia402.MODES_OF_OPERATION, allowed=_MODES),
    Field("target_position", 2, "i32", "counts", "target position (CSP)", cia402.TARGET_POSITION),
    Field("target_torque", 4, "i32", "mN m", "target torque (CST; torque feed-forward in CSP)", cia402.TARGET_TORQUE),
)
HOLDING_DRIVE_STRIDE = 6

DRIVES_PER_READ = (MAX_READ_REGISTERS - INPUT_HEADER_SIZE) // INPUT_DRIVE_STRIDE        # 9
DRIVES_PER_WRITE = (MAX_WRITE_REGISTERS - HOLDING_HEADER_SIZE) // HOLDING_DRIVE_STRIDE  # 20
DRIVES_PER_EXCHANGE = min(DRIVES_PER_READ,                                              # 9: one function 23
                          (MAX_READWRITE_WRITE - HOLDING_HEADER_SIZE) // HOLDING_DRIVE_STRIDE)


def input_count(n: int) -> int:
    """Input registers of an n-drive image (header included)."""
    return INPUT_HEADER_SIZE + INPUT_DRIVE_STRIDE * n


def holding_count(n: int) -> int:
    """Holding registers of an n-drive image (header included)."""
    return HOLDING_HEADER_SIZE + HOLDING_DRIVE_STRIDE * n


def _field(fields_: tuple[Field, ...], name: str) -> Field:
    for f in fields_:
        if f.name == name:
            return f
    raise KeyError(name)


def input_address(name: str, drive: int | None = None) -> int:
    """Absolute input-register address of a header field (drive None) or of drive `drive`'s field (0-based)."""
    if drive is None:
        return INPUT_BASE + _field(INPUT_HEADER, name).offset
    return INPUT_BASE + INPUT_HEADER_SIZE + INPUT_DRIVE_STRIDE * drive + _field(INPUT_DRIVE, name).offset


def holding_address(name: str, drive: int | None = None) -> int:
    """Absolute holding-register address of a header field (drive None) or of drive `drive`'s field."""
    if drive is None:
        return HOLDING_BASE + _field(HOLDING_HEADER, name).offset
    return HOLDING_BASE + HOLDING_HEADER_SIZE + HOLDING_DRIVE_STRIDE * drive + _field(HOLDING_DRIVE, name).offset


# -- the images ------------------------------------------------------------------------------------------
@dataclass
class InputImage:
    """What the gateway reports: header values and (n,) int64 arrays in wire units (counts, counts/s, uA,
    mN m). layout_version and drive_count are implied (LAYOUT_VERSION, n)."""

    gateway_status: int
    refused_writes: int
    cycle_counter: int
    timestamp_us: int
    statusword: np.ndarray
    mode_display: np.ndarray
    error_code: np.ndarray
    position: np.ndarray
    velocity: np.ndarray
    current: np.ndarray
    torque: np.ndarray

    @property
    def n(self) -> int:
        return int(np.shape(self.statusword)[0])


@dataclass
class OutputImage:
    """What the host commands: watchdog words and (n,) int64 arrays in wire units (counts, mN m)."""

    watchdog: int
    watchdog_timeout_ms: int
    controlword: np.ndarray
    mode: np.ndarray
    target_position: np.ndarray
    target_torque: np.ndarray

    @property
    def n(self) -> int:
        return int(np.shape(self.controlword)[0])


_NUMPY = {"u16": ">u2", "i16": ">i2", "u32": ">u4", "i32": ">i4"}


def _dtype(group: tuple[Field, ...], size: int) -> np.dtype:
    """The big-endian structured dtype of a block: its words, viewed field by field."""
    return np.dtype({"names": [f.name for f in group], "formats": [_NUMPY[f.kind] for f in group],
                     "offsets": [2 * f.offset for f in group], "itemsize": 2 * size})


@dataclass(frozen=True)
class _Block:
    what: str
    base: int
    header: tuple[Field, ...]
    header_size: int
    drive: tuple[Field, ...]
    stride: int
    implied: tuple[str, ...]  # header fields not in the image dataclass

    @property
    def header_dtype(self) -> np.dtype:
        return _dtype(self.header, self.header_size)

    @property
    def drive_dtype(self) -> np.dtype:
        return _dtype(self.drive, self.stride)

    def count(self, n: int) -> int:
        return self.header_size + self.stride * n


_INPUTS = _Block("input", INPUT_BASE, INPUT_HEADER, INPUT_HEADER_SIZE, INPUT_DRIVE, INPUT_DRIVE_STRIDE,
                 ("layout_version", "drive_count"))
_OUTPUTS = _Block("holding", HOLDING_BASE, HOLDING_HEADER, HOLDING_HEADER_SIZE, HOLDING_DRIVE,
                  HOLDING_DRIVE_STRIDE, ())


def _fail(block: _Block, f: Field, value: int, drive: int | None) -> GatewayError:
    lo, hi = f.bounds
    where = "" if drive is None else f" drive {drive + 1}"
    addr = block.base + (f.offset if drive is None else block.header_size + block.stride * drive + f.offset)
    expected = ", ".join(map(str, f.allowed)) if f.allowed is not None else f"{lo}..{hi}"
    return GatewayError(f"gateway {block.what} image:{where} {f.name} (register {addr:#06x}) = {value}: "
                        f"expected {expected}")


_INTEGER_TYPES = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32))


def _trusted(f: Field) -> frozenset:
    """Integer dtypes that cannot hold a value outside f's range (no check needed: the sim's uint16
    statuswords, int8 modes, int32 counts)."""
    lo, hi = f.bounds
    if f.allowed is not None:
        return frozenset()
    return frozenset(t for t in _INTEGER_TYPES if np.iinfo(t).min >= lo and np.iinfo(t).max <= hi)


def _narrowed(f: Field) -> bool:
    """True when f's values are narrower than its kind (a decoded word must still be checked)."""
    return f.lo is not None or f.hi is not None or f.allowed is not None


_SPECS = {b.what: (b.header_dtype, b.drive_dtype, tuple(_trusted(f) for f in b.drive)) for b in (_INPUTS, _OUTPUTS)}


@lru_cache(maxsize=None)
def _allowed_table(f: Field) -> np.ndarray:
    """table[v - lo] is True for the allowed values of f (a lookup instead of np.isin)."""
    lo, hi = f.bounds
    table = np.zeros(hi - lo + 1, dtype=bool)
    table[np.asarray(f.allowed) - lo] = True
    return table


def _check(block: _Block, f: Field, values: np.ndarray) -> None:
    """GatewayError for the first drive whose value of field f lies outside its range or allowed set."""
    lo, hi = f.bounds
    bad = (values < lo) | (values > hi)
    if f.allowed is not None:
        bad |= ~_allowed_table(f)[np.clip(values, lo, hi) - lo]
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise _fail(block, f, int(values[k]), k)


def _integers(block: _Block, name: str, value, shape: tuple[int, ...]) -> np.ndarray:
    """value as an integer array of the given shape; GatewayError for anything else (NaN, 1.5, strings)."""
    try:
        arr = np.asarray(value)
        if arr.dtype == object or arr.dtype.kind not in "iufb":
            raise TypeError
    except (TypeError, ValueError):
        raise GatewayError(f"gateway {block.what} image: {name}: expected integers, got {value!r}") from None
    if arr.shape != shape:
        raise GatewayError(f"gateway {block.what} image: {name}: expected shape {shape}, got {arr.shape}")
    if arr.dtype.kind == "f":
        if not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)) and np.all(np.abs(arr) < 2.0 ** 62)):
            raise GatewayError(f"gateway {block.what} image: {name}: expected integers, got {arr.tolist()!r}")
        arr = arr.astype(np.int64)
    elif arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    elif arr.dtype == np.uint64:
        if np.any(arr > np.uint64(2 ** 62)):
            raise GatewayError(f"gateway {block.what} image: {name}: {arr.tolist()!r} is out of range")
        arr = arr.astype(np.int64)
    return arr


def _encode(block: _Block, image) -> np.ndarray:
    shape = np.shape(getattr(image, block.drive[0].name))
    n = shape[0] if len(shape) == 1 else 0
    if not 1 <= n <= MAX_DRIVES:
        raise GatewayError(f"gateway {block.what} image: {n} drives, expected 1..{MAX_DRIVES}")
    header_dtype, drive_dtype, trusted = _SPECS[block.what]
    implied = {"layout_version": LAYOUT_VERSION, "drive_count": n}
    header = []
    for f in block.header:
        v = implied[f.name] if f.name in block.implied else getattr(image, f.name)
        if type(v) is not int:
            v = int(_integers(block, f.name, v, ()))
        lo, hi = f.bounds
        if not lo <= v <= hi:
            raise _fail(block, f, v, None)
        header.append(v)
    words = np.zeros(block.count(n), dtype=">u2")
    words[:block.header_size].view(header_dtype)[0] = tuple(header)
    drives = words[block.header_size:].view(drive_dtype)
    for f, safe in zip(block.drive, trusted):
        v = getattr(image, f.name)
        if not (type(v) is np.ndarray and v.dtype in safe and v.shape == (n,)):
            v = _integers(block, f.name, v, (n,))
            _check(block, f, v)
        drives[f.name] = v
    return words.astype(np.uint16)


def _words(block: _Block, words) -> np.ndarray:
    """words as big-endian uint16; GatewayError for anything but a 1-D sequence of 16-bit integers."""
    if type(words) is list and all(type(x) is int for x in words):  # what a Modbus client returns
        try:
            return np.array(words, dtype=">u2")
        except OverflowError:
            pass  # out of range: found and named below
    try:
        w = np.asarray(words)
        if w.dtype == object or w.dtype.kind not in "iu" or w.ndim != 1:
            raise TypeError
    except (TypeError, ValueError, OverflowError):
        raise GatewayError(f"gateway {block.what} image: expected a sequence of register words") from None
    if w.dtype != np.uint16:
        bad = (w < 0) | (w > 0xFFFF)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise GatewayError(f"gateway {block.what} image: register {block.base + k:#06x} = {int(w[k])}: "
                               f"not a 16-bit word")
    return w.astype(">u2")


def _drives_in(block: _Block, count: int, n: int | None) -> int:
    body = count - block.header_size
    if body <= 0 or body % block.stride:
        raise GatewayError(f"gateway {block.what} image: {count} registers is not a header of "
                           f"{block.header_size} plus whole drive blocks of {block.stride}")
    got = body // block.stride
    if n is not None and got != n:
        raise GatewayError(f"gateway {block.what} image: {count} registers hold {got} drives, expected {n}")
    return got


def _decode(block: _Block, w: np.ndarray, n: int | None) -> dict[str, object]:
    """Field values of big-endian words w (from _words)."""
    _drives_in(block, w.shape[0], n)
    header_dtype, drive_dtype, _ = _SPECS[block.what]
    values: dict[str, object] = {}
    for f, v in zip(block.header, w[:block.header_size].view(header_dtype)[0].item()):
        lo, hi = f.bounds
        if not lo <= v <= hi:
            raise _fail(block, f, v, None)
        values[f.name] = v
    drives = w[block.header_size:].view(drive_dtype)
    for f in block.drive:
        v = drives[f.name].astype(np.int64)
        if _narrowed(f):  # a word always fits its kind; only narrower ranges need a look
            _check(block, f, v)
        values[f.name] = v
    return values


_INPUT_NAMES = tuple(f.name for f in fields(InputImage))
_OUTPUT_NAMES = tuple(f.name for f in fields(OutputImage))


# -- public codec ----------------------------------------------------------------------------------------
def encode_inputs(image: InputImage) -> np.ndarray:
    """The input registers (uint16 words, INPUT_BASE first) of an image; GatewayError if a value does not
    fit its field (statusword 0..65535, mode display -128..127, int32 values, ...)."""
    return _encode(_INPUTS, image)


def decode_inputs(words: Sequence[int] | np.ndarray, n: int | None = None) -> InputImage:
    """The image in input registers read from INPUT_BASE (the whole image). Checks the layout version first,
    then that drive_count matches the number of words (and n when given). GatewayError otherwise."""
    w = _words(_INPUTS, words)
    if w.shape[0] < INPUT_HEADER_SIZE:
        raise GatewayError(f"gateway input image: {w.shape[0]} registers, the header alone is {INPUT_HEADER_SIZE}")
    if w[0] != LAYOUT_VERSION:
        raise GatewayError(f"gateway input image: layout_version (register {INPUT_BASE:#06x}) = {int(w[0])}, "
                           f"this host speaks version {LAYOUT_VERSION}")
    values = _decode(_INPUTS, w, n)
    if values["drive_count"] != (w.shape[0] - INPUT_HEADER_SIZE) // INPUT_DRIVE_STRIDE:
        raise GatewayError(f"gateway input image: drive_count (register {input_address('drive_count'):#06x}) = "
                           f"{values['drive_count']}, but {w.shape[0]} registers were read")
    return InputImage(**{name: values[name] for name in _INPUT_NAMES})


def encode_outputs(image: OutputImage) -> np.ndarray:
    """The holding registers (uint16 words, HOLDING_BASE first) of a command image; GatewayError for an
    unknown mode of operation or a value that does not fit its field."""
    return _encode(_OUTPUTS, image)


def decode_outputs(words: Sequence[int] | np.ndarray, n: int | None = None) -> OutputImage:
    """The command image in holding registers read from HOLDING_BASE (the whole image); GatewayError for an
    unknown mode of operation, or a word count that is not a whole number of drives (or not n)."""
    values = _decode(_OUTPUTS, _words(_OUTPUTS, words), n)
    return OutputImage(**{name: values[name] for name in _OUTPUT_NAMES})


# -- generated artefacts: C constants and the documentation tables ---------------------------------------
def c_constants() -> list[tuple[str, int, str]]:
    """(name, value, comment) for the C header: layout version, bases, sizes, strides, field offsets, status bits."""
    out = [
        ("ARMID_GW_LAYOUT_VERSION", LAYOUT_VERSION, "input register 0; hosts refuse other versions"),
        ("ARMID_GW_INPUT_BASE", INPUT_BASE, "first input register (function 4)"),
        ("ARMID_GW_HOLDING_BASE", HOLDING_BASE, "first holding register (functions 3, 6, 16)"),
        ("ARMID_GW_INPUT_MIRROR_BASE", INPUT_MIRROR_BASE, "the input image as read-only holding registers (3, 23)"),
        ("ARMID_GW_INPUT_HEADER_SIZE", INPUT_HEADER_SIZE, "registers"),
        ("ARMID_GW_INPUT_DRIVE_STRIDE", INPUT_DRIVE_STRIDE, "registers per drive block"),
        ("ARMID_GW_HOLDING_HEADER_SIZE", HOLDING_HEADER_SIZE, "registers"),
        ("ARMID_GW_HOLDING_DRIVE_STRIDE", HOLDING_DRIVE_STRIDE, "registers per drive block"),
        ("ARMID_GW_MAX_DRIVES", MAX_DRIVES, "drives per gateway"),
        ("ARMID_GW_DRIVES_PER_READ", DRIVES_PER_READ, "drives whose inputs fit one read of 125 registers"),
        ("ARMID_GW_DRIVES_PER_WRITE", DRIVES_PER_WRITE, "drives whose outputs fit one write of 123 registers"),
        ("ARMID_GW_DRIVES_PER_EXCHANGE", DRIVES_PER_EXCHANGE, "drives whose whole exchange fits one function 23"),
        ("ARMID_GW_STATUS_DATA_VALID", STATUS_DATA_VALID, "gateway_status bit"),
        ("ARMID_GW_STATUS_WATCHDOG_EXPIRED", STATUS_WATCHDOG_EXPIRED, "gateway_status bit"),
        ("ARMID_GW_STATUS_DRIVE_FAULT", STATUS_DRIVE_FAULT, "gateway_status bit"),
    ]
    for prefix, group, where in (("IN_HDR", INPUT_HEADER, "input header"), ("IN_DRV", INPUT_DRIVE, "input drive block"),
                                 ("HOLD_HDR", HOLDING_HEADER, "holding header"),
                                 ("HOLD_DRV", HOLDING_DRIVE, "holding drive block")):
        for f in group:
            out.append((f"ARMID_GW_{prefix}_{f.name.upper()}", f.offset,
                        f"{where} offset, {f.kind}{'' if f.size == 1 else ' high word first'}, {f.unit}"))
    return out


def _table(block: _Block, title: str) -> list[str]:
    lines = [f"**{title}**", "", "| register | field | type | unit | CiA 402 | description |",
             "| --- | --- | --- | --- | --- | --- |"]
    for f in block.header:
        lines.append(f"| {block.base + f.offset} | {f.name} | {f.kind} | {f.unit} | | {f.doc} |")
    first = block.base + block.header_size
    used = {f.offset + k for f in block.drive for k in range(f.size)}
    rows = list(block.drive) + [Field("reserved", o, "u16", "-", "reads 0") for o in range(block.stride) if o not in used]
    for f in sorted(rows, key=lambda f: f.offset):
        obj = f"0x{f.index:04X}" if f.index else ""
        lines.append(f"| {first} + {block.stride} k + {f.offset} | {f.name} | {f.kind} | {f.unit} | {obj} | {f.doc} |")
    return lines


def register_tables_markdown() -> str:
    """The register tables of docs/wire-gateway.md (k = drive index, 0-based)."""
    return "\n".join(_table(_INPUTS, "Input registers (function 4), read-only") + [""]
                     + _table(_OUTPUTS, "Holding registers (functions 3, 6, 16), read/write")) + "\n"


if __name__ == "__main__":  # python -m firmware_bridge.gateway: print the tables for the docs
    print(register_tables_markdown(), end="")
