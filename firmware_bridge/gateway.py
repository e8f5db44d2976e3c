"""EtherCAT-through-Modbus-TCP gateway: the register layout of the CiA 402 process image, defined once as data.

A vendor gateway is the EtherCAT master of n CiA 402 drives and a Modbus TCP server to the host:

  input registers (function 4, read-only), from INPUT_BASE:
      header (INPUT_HEADER_SIZE registers), then one block of INPUT_DRIVE_STRIDE registers per drive;
  holding registers (functions 3, 6, 16, read/write), from HOLDING_BASE:
      header (HOLDING_HEADER_SIZE registers: host watchdog), then one block of HOLDING_DRIVE_STRIDE
      registers per drive;
  the input image mirrored in read-only holding registers from INPUT_MIRROR_BASE (functions 3 and 23), so
  that one read/write-multiple request (function 23) writes the commands and reads the state;
  scaling input registers (function 4, read-only, constant), from SCALING_BASE: one block of
  SCALING_DRIVE_STRIDE registers per drive (encoder counts per motor revolution, gear ratio as numerator
  and denominator, motor torque constant), so that a host needs no model file to convert the image to SI.

Values are the integer wire units of firmware_bridge.units (counts, counts/s, uA, mN m). A 32-bit value
takes two registers, high word first (big-endian words, big-endian bytes in each word: "ABCD", pymodbus's
word_order="big"), and always starts at an even offset inside its block. The fixed strides let a host
read the whole input image of up to DRIVES_PER_READ drives in one request of at most 125 registers.

encode_inputs / decode_inputs and encode_outputs / decode_outputs convert between the images (numpy
arrays of n drives) and uint16 words; anything that cannot be represented, or that a gateway of this
layout cannot have sent, raises GatewayError naming the field, the drive and the register address.
The Field tables are compiled into small arrays at import, and one numba kernel per block and direction
packs or unpacks every field of every drive and says which value was bad first; encode_*_into and
decode_*_into do the same into preallocated buffers (int64 values one row per field, uint16 words) for
a host's or a gateway's hot path. This module depends on nothing of armid's but firmware_bridge (and
numpy, numba).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Sequence

import numba
import numpy as np

from firmware_bridge import cia402
from firmware_bridge.canopen_map import CURRENT_ACTUAL_UA, TARGET_TORQUE_MNM, TORQUE_ACTUAL_MNM

LAYOUT_VERSION = 2          # input register 0; a host refuses any other value (2: torque_offset in each holding block)
INPUT_BASE = 0x0000         # first input register (function 4)
HOLDING_BASE = 0x0400       # first holding register (functions 3/6/16): a request to the wrong table fails
MAX_READ_REGISTERS = 125    # Modbus limit of one read (functions 3, 4)
MAX_WRITE_REGISTERS = 123   # Modbus limit of one write (function 16)
INPUT_MIRROR_BASE = 0x0800  # the input image again, as read-only holding registers (functions 3, 23)
MAX_READWRITE_WRITE = 121   # Modbus limit of the write part of function 23 (its read part: 125)
MAX_DRIVES = 64             # drives one gateway of this layout serves
SCALING_BASE = 0x1000       # first scaling input register (function 4): beyond the largest input image

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
    Field("current", 8, "i32", "uA", "current actual value (motor current)", CURRENT_ACTUAL_UA),
    Field("torque", 10, "i32", "mN m", "torque actual value (joint torque)", TORQUE_ACTUAL_MNM),
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
    Field("target_torque", 4, "i32", "mN m", "target torque (CST; torque feed-forward in CSP)", TARGET_TORQUE_MNM),
    Field("torque_offset", 6, "i32", "mN m", "torque offset (0x60B2 in mN m): CSP adds it to the position loop's "
          "torque, CST to the target torque", cia402.TORQUE_OFFSET),
)
HOLDING_DRIVE_STRIDE = 8

SCALING_DRIVE: tuple[Field, ...] = (
    Field("counts_per_rev", 0, "u32", "counts", "motor encoder counts per motor revolution",
          cia402.POSITION_ENCODER_RESOLUTION, lo=1),
    Field("gear_numerator", 2, "i32", "motor rev", "gear ratio = numerator / denominator, motor revolutions per "
          "joint revolution (motor rad per m if prismatic); negative: the joint turns against the motor",
          cia402.GEAR_RATIO),
    Field("gear_denominator", 4, "u32", "joint rev", "gear ratio denominator: joint revolutions", cia402.GEAR_RATIO,
          lo=1),
    Field("torque_constant", 6, "u32", "uN m/A", "motor torque constant: joint torque = gear ratio x this x current"),
)
SCALING_DRIVE_STRIDE = 8

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
    """What the host commands: watchdog words and (n,) int64 arrays in wire units (counts, mN m).
    torque_offset defaults to zeros."""

    watchdog: int
    watchdog_timeout_ms: int
    controlword: np.ndarray
    mode: np.ndarray
    target_position: np.ndarray
    target_torque: np.ndarray
    torque_offset: np.ndarray | None = None

    def __post_init__(self):
        if self.torque_offset is None:
            self.torque_offset = np.zeros(np.shape(self.controlword), np.int64)

    @property
    def n(self) -> int:
        return int(np.shape(self.controlword)[0])


@dataclass
class ScalingImage:
    """The gateway's scaling: (n,) int64 arrays, counts per motor revolution, gear ratio numerator and
    denominator (motor revolutions per joint revolution = numerator / denominator), motor torque constant in
    uN m/A (firmware_bridge.units.TORQUE_CONSTANT_LSB)."""

    counts_per_rev: np.ndarray
    gear_numerator: np.ndarray
    gear_denominator: np.ndarray
    torque_constant: np.ndarray

    @property
    def n(self) -> int:
        return int(np.shape(self.counts_per_rev)[0])

    def counts_per_rad(self) -> np.ndarray:
        """(n,) encoder counts per joint radian (per metre for a prismatic joint)."""
        return self.counts_per_rev * (self.gear_numerator / self.gear_denominator) / (2 * np.pi)


def scaling_count(n: int) -> int:
    """Scaling registers of n drives."""
    return SCALING_DRIVE_STRIDE * n


# -- the codec: each block's Field table compiled into arrays, one numba kernel per direction ---------------
# The columns of a compiled field table (one row per Field, in the table's order): offset in the block,
# registers (1, 2), signed (0, 1), the inclusive bounds, where the field's allowed-value table starts in the
# block's lookup table (-1: none), and whether a decoded word must be checked (values narrower than the kind).
_OFF, _SIZE, _SIGNED, _LO, _HI, _TABLE, _NARROW = range(7)
# what the kernels return besides -1 (all good) and a field's code (>= 0: header field i, or
# len(header) + f * n + k for drive field f of drive k, 0-based)
_SHAPE = -2          # the caller's arrays do not have the block's shapes
_SHORT = -3          # fewer words than the input header
_LAYOUT = -4         # layout_version is not LAYOUT_VERSION
_BLOCKS = -5         # not a header plus whole drive blocks
_DRIVES = -6         # a whole number of drives, but not the number expected
_COUNT = -7          # drive_count disagrees with the number of words
_BAD_WORD = -16      # _BAD_WORD - i: word i is not a 16-bit word


@dataclass(frozen=True)
class _Block:
    what: str
    base: int
    header: tuple[Field, ...]
    header_size: int
    drive: tuple[Field, ...]
    stride: int
    implied: tuple[str, ...]  # header fields not in the image dataclass

    def count(self, n: int) -> int:
        return self.header_size + self.stride * n

    @cached_property
    def compiled(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(header spec, drive spec, allowed-value lookup): the Field tables as arrays for the kernels."""
        tables: list[np.ndarray] = []
        at = 0

        def spec(group: tuple[Field, ...]) -> np.ndarray:
            nonlocal at
            rows = []
            for f in group:
                lo, hi = f.bounds
                start = -1
                if f.allowed is not None:
                    table = np.zeros(hi - lo + 1, dtype=np.bool_)
                    table[np.asarray(f.allowed) - lo] = True
                    tables.append(table)
                    start, at = at, at + table.size
                narrowed = f.lo is not None or f.hi is not None or f.allowed is not None
                rows.append((f.offset, f.size, f.kind[0] == "i", lo, hi, start, narrowed))
            return np.array(rows, dtype=np.int64).reshape(len(group), 7)

        header, drive = spec(self.header), spec(self.drive)
        lookup = np.concatenate(tables) if tables else np.zeros(0, dtype=np.bool_)
        return header, drive, lookup

    def address(self, f: Field, drive: int | None) -> int:
        return self.base + (f.offset if drive is None else self.header_size + self.stride * drive + f.offset)


_INPUTS = _Block("input", INPUT_BASE, INPUT_HEADER, INPUT_HEADER_SIZE, INPUT_DRIVE, INPUT_DRIVE_STRIDE,
                 ("layout_version", "drive_count"))
_OUTPUTS = _Block("holding", HOLDING_BASE, HOLDING_HEADER, HOLDING_HEADER_SIZE, HOLDING_DRIVE,
                  HOLDING_DRIVE_STRIDE, ())
_SCALING = _Block("scaling", SCALING_BASE, (), 0, SCALING_DRIVE, SCALING_DRIVE_STRIDE, ())
_DRIVE_COUNT_AT = next(i for i, f in enumerate(INPUT_HEADER) if f.name == "drive_count")
_LAYOUT_AT = next(i for i, f in enumerate(INPUT_HEADER) if f.name == "layout_version")


@numba.njit(cache=True, nogil=True, inline="always")
def _allowed(v, spec, i, lookup) -> bool:
    """True when v lies in field i's bounds and, if it has them, its allowed values."""
    lo = spec[i, _LO]
    if v < lo or v > spec[i, _HI]:
        return False
    t = spec[i, _TABLE]
    return t < 0 or lookup[t + v - lo]


@numba.njit(cache=True, nogil=True, inline="always")
def _put(v, spec, i, lookup, out, at) -> bool:
    """Field i of spec (value v) into out[at] (and out[at + 1], high word first); False when v is outside its
    bounds or allowed values (nothing written)."""
    if not _allowed(v, spec, i, lookup):
        return False
    if spec[i, _SIZE] == 1:
        out[at] = v & 0xFFFF
    else:
        out[at] = (v >> 16) & 0xFFFF
        out[at + 1] = v & 0xFFFF
    return True


@numba.njit(cache=True, nogil=True)
def _pack(header, drives, h_spec, d_spec, lookup, header_size, stride, out):
    """Encode kernel: header values (H,) and drive values (F, n) (int64, wire units) into the block's words out
    (header_size + stride * n,) uint16 (reserved words 0). Returns -1, or the code of the first value that does
    not fit (header fields in order, then drive fields one field at a time, drives in order), or _SHAPE."""
    nh, nf, n = h_spec.shape[0], d_spec.shape[0], drives.shape[1]
    if header.shape[0] != nh or drives.shape[0] != nf or out.shape[0] != header_size + stride * n:
        return _SHAPE
    for i in range(out.shape[0]):
        out[i] = 0
    for i in range(nh):
        if not _put(header[i], h_spec, i, lookup, out, h_spec[i, _OFF]):
            return i
    for f in range(nf):
        for k in range(n):
            if not _put(drives[f, k], d_spec, f, lookup, out, header_size + stride * k + d_spec[f, _OFF]):
                return nh + f * n + k
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _get(words, spec, i, lookup, at, out, j) -> bool:
    """Field i of spec from words[at] (and at + 1) into out[j]; False when a narrowed field's value is not allowed."""
    v = np.int64(words[at])
    if spec[i, _SIZE] == 1:
        if spec[i, _SIGNED] and v >= 0x8000:
            v -= 0x10000
    else:
        v = (v << 16) | np.int64(words[at + 1])
        if spec[i, _SIGNED] and v >= 0x80000000:
            v -= 0x100000000
    out[j] = v
    return not spec[i, _NARROW] or _allowed(v, spec, i, lookup)


@numba.njit(cache=True, nogil=True)
def _unpack(words, h_spec, d_spec, lookup, header_size, stride, layout_at, layout, count_at, header, drives):
    """Decode kernel: words (a whole image, any integer dtype) into header (H,) and drives (F, n) int64 (wire
    units; n = drives.shape[1] is the number of drives expected). Checks, in this order: every word is 16-bit;
    with layout_at >= 0 the header is complete and words[layout_at] == layout; the words are a header plus whole
    drive blocks, n of them; the narrowed fields (header, then drive fields one at a time); with count_at >= 0
    header[count_at] == n. Returns -1 or what failed first (_BAD_WORD - i, _SHORT, ..., a field's code)."""
    m = words.shape[0]
    for i in range(m):
        if words[i] < 0 or words[i] > 0xFFFF:
            return _BAD_WORD - i
    if layout_at >= 0:
        if m < header_size:
            return _SHORT
        if words[layout_at] != layout:
            return _LAYOUT
    body = m - header_size
    if body <= 0 or body % stride:
        return _BLOCKS
    n = drives.shape[1]
    if body // stride != n:
        return _DRIVES
    nh, nf = h_spec.shape[0], d_spec.shape[0]
    if header.shape[0] != nh or drives.shape[0] != nf:
        return _SHAPE
    for i in range(nh):
        if not _get(words, h_spec, i, lookup, h_spec[i, _OFF], header, i):
            return i
    for f in range(nf):
        row = drives[f]
        for k in range(n):
            if not _get(words, d_spec, f, lookup, header_size + stride * k + d_spec[f, _OFF], row, k):
                return nh + f * n + k
    if count_at >= 0 and header[count_at] != n:
        return _COUNT
    return -1


# the compiled tables as module constants, so that numba bakes them into one kernel per block and direction
# (three arguments to dispatch instead of eleven: ~1 us less per call)
_IN_H, _IN_D, _IN_LOOKUP = _INPUTS.compiled
_OUT_H, _OUT_D, _OUT_LOOKUP = _OUTPUTS.compiled
_SC_H, _SC_D, _SC_LOOKUP = _SCALING.compiled


@numba.njit(cache=True, nogil=True)
def _pack_inputs(header, drives, out):
    return _pack(header, drives, _IN_H, _IN_D, _IN_LOOKUP, INPUT_HEADER_SIZE, INPUT_DRIVE_STRIDE, out)


@numba.njit(cache=True, nogil=True)
def _pack_outputs(header, drives, out):
    return _pack(header, drives, _OUT_H, _OUT_D, _OUT_LOOKUP, HOLDING_HEADER_SIZE, HOLDING_DRIVE_STRIDE, out)


@numba.njit(cache=True, nogil=True)
def _unpack_inputs(words, header, drives):
    return _unpack(words, _IN_H, _IN_D, _IN_LOOKUP, INPUT_HEADER_SIZE, INPUT_DRIVE_STRIDE, _LAYOUT_AT, LAYOUT_VERSION,
                   _DRIVE_COUNT_AT, header, drives)


@numba.njit(cache=True, nogil=True)
def _unpack_outputs(words, header, drives):
    return _unpack(words, _OUT_H, _OUT_D, _OUT_LOOKUP, HOLDING_HEADER_SIZE, HOLDING_DRIVE_STRIDE, -1, LAYOUT_VERSION, -1,
                   header, drives)


@numba.njit(cache=True, nogil=True)
def _pack_scaling(header, drives, out):
    return _pack(header, drives, _SC_H, _SC_D, _SC_LOOKUP, 0, SCALING_DRIVE_STRIDE, out)


@numba.njit(cache=True, nogil=True)
def _unpack_scaling(words, header, drives):
    return _unpack(words, _SC_H, _SC_D, _SC_LOOKUP, 0, SCALING_DRIVE_STRIDE, -1, LAYOUT_VERSION, -1, header, drives)


_KERNELS = {"input": (_pack_inputs, _unpack_inputs), "holding": (_pack_outputs, _unpack_outputs),
            "scaling": (_pack_scaling, _unpack_scaling)}


def _fail(block: _Block, f: Field, value: int, drive: int | None) -> GatewayError:
    lo, hi = f.bounds
    where = "" if drive is None else f" drive {drive + 1}"
    expected = ", ".join(map(str, f.allowed)) if f.allowed is not None else f"{lo}..{hi}"
    return GatewayError(f"gateway {block.what} image:{where} {f.name} (register {block.address(f, drive):#06x}) = "
                        f"{value}: expected {expected}")


def _field_error(block: _Block, code: int, header: np.ndarray, drives: np.ndarray) -> GatewayError:
    """The GatewayError of a field's code from _pack or _unpack (field, drive, register, value)."""
    nh = len(block.header)
    if code < nh:
        return _fail(block, block.header[code], int(header[code]), None)
    f, k = divmod(code - nh, drives.shape[1])
    return _fail(block, block.drive[f], int(drives[f, k]), k)


def _decode_error(block: _Block, code: int, w: np.ndarray, n: int | None, header: np.ndarray,
                  drives: np.ndarray) -> GatewayError:
    """The GatewayError of what _unpack found wrong (code != -1) in words w (n: the drives the caller expects)."""
    m = w.shape[0]
    if code >= 0:
        return _field_error(block, code, header, drives)
    if code <= _BAD_WORD:
        k = _BAD_WORD - code
        return GatewayError(f"gateway {block.what} image: register {block.base + k:#06x} = {int(w[k])}: "
                            f"not a 16-bit word")
    if code == _SHORT:
        return GatewayError(f"gateway {block.what} image: {m} registers, the header alone is {block.header_size}")
    if code == _LAYOUT:
        return GatewayError(f"gateway {block.what} image: layout_version (register "
                            f"{block.address(block.header[_LAYOUT_AT], None):#06x}) = "
                            f"{int(w[_LAYOUT_AT])}, this host speaks version {LAYOUT_VERSION}")
    if code == _BLOCKS:
        return GatewayError(f"gateway {block.what} image: {m} registers is not a header of {block.header_size} plus "
                            f"whole drive blocks of {block.stride}")
    if code == _DRIVES:
        return GatewayError(f"gateway {block.what} image: {m} registers hold {(m - block.header_size) // block.stride} "
                            f"drives, expected {n}")
    if code == _COUNT:
        return GatewayError(f"gateway {block.what} image: drive_count (register "
                            f"{block.address(block.header[_DRIVE_COUNT_AT], None):#06x}) = "
                            f"{int(header[_DRIVE_COUNT_AT])}, but {m} registers were read")
    return GatewayError(f"gateway {block.what} image: buffers of the wrong shape: header {header.shape}, drives "
                        f"{drives.shape} (expected ({len(block.header)},), ({len(block.drive)}, n))")


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
    """The words of an image dataclass: its values checked for type and shape here, for range by _pack."""
    shape = np.shape(getattr(image, block.drive[0].name))
    n = shape[0] if len(shape) == 1 else 0
    if not 1 <= n <= MAX_DRIVES:
        raise GatewayError(f"gateway {block.what} image: {n} drives, expected 1..{MAX_DRIVES}")
    implied = {"layout_version": LAYOUT_VERSION, "drive_count": n}
    header = np.empty(len(block.header), dtype=np.int64)
    for i, f in enumerate(block.header):
        v = implied[f.name] if f.name in block.implied else getattr(image, f.name)
        if type(v) is not int:
            v = int(_integers(block, f.name, v, ()))
        lo, hi = f.bounds
        if not lo <= v <= hi:      # here: a Python int may not fit int64
            raise _fail(block, f, v, None)
        header[i] = v
    drives = np.empty((len(block.drive), n), dtype=np.int64)
    for i, f in enumerate(block.drive):
        v = getattr(image, f.name)
        if not (type(v) is np.ndarray and v.dtype.kind in "iu" and v.dtype != np.uint64 and v.shape == (n,)):
            v = _integers(block, f.name, v, (n,))
        drives[i] = v
    out = np.empty(block.count(n), dtype=np.uint16)
    _pack_into(block, header, drives, out)
    return out


def _pack_into(block: _Block, header: np.ndarray, drives: np.ndarray, out: np.ndarray) -> None:
    if header.dtype != np.int64 or drives.dtype != np.int64 or out.dtype != np.uint16 or drives.ndim != 2:
        raise GatewayError(f"gateway {block.what} image: expected int64 values and a uint16 buffer, got "
                           f"{header.dtype}, {drives.dtype}, {out.dtype}")
    code = _KERNELS[block.what][0](header, drives, out)
    if code >= 0:
        raise _field_error(block, code, header, drives)
    if code != -1:
        raise GatewayError(f"gateway {block.what} image: buffers of the wrong shape: header {header.shape}, "
                           f"drives {drives.shape}, words {out.shape}")


def _words(block: _Block, words) -> np.ndarray:
    """words as a 1-D int64 or uint16 array (not yet range-checked: the kernel does); GatewayError for anything
    but a 1-D sequence of integers."""
    if type(words) is list:               # what a Modbus client returns
        w = np.array(words) if words else np.zeros(0, dtype=np.int64)
        if w.dtype == np.int64 and w.ndim == 1:
            return w
    elif type(words) is np.ndarray and words.ndim == 1 and words.dtype in (np.int64, np.uint16):
        return words if words.flags.c_contiguous else np.ascontiguousarray(words)
    try:
        w = np.asarray(words)
        if w.dtype == object or w.dtype.kind not in "iu" or w.ndim != 1:
            raise TypeError
    except (TypeError, ValueError, OverflowError):
        raise GatewayError(f"gateway {block.what} image: expected a sequence of register words") from None
    bad = (w < 0) | (w > 0xFFFF)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise GatewayError(f"gateway {block.what} image: register {block.base + k:#06x} = {int(w[k])}: "
                           f"not a 16-bit word")
    return w.astype(np.int64)


def _unpack_into(block: _Block, w: np.ndarray, n: int | None, header: np.ndarray, drives: np.ndarray) -> None:
    if header.dtype != np.int64 or drives.dtype != np.int64 or drives.ndim != 2:
        raise GatewayError(f"gateway {block.what} image: expected int64 arrays to decode into, got {header.dtype}, "
                           f"{drives.dtype}")
    code = _KERNELS[block.what][1](w, header, drives)
    if code != -1:
        raise _decode_error(block, code, w, n, header, drives)


def _decode(block: _Block, words, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(header values, (F, n) drive values) of an image's words; GatewayError for anything a gateway of this
    layout cannot have sent."""
    w = _words(block, words)
    got = max((w.shape[0] - block.header_size) // block.stride, 0)
    header = np.zeros(len(block.header), dtype=np.int64)
    drives = np.zeros((len(block.drive), got if n is None else max(n, 0)), dtype=np.int64)
    _unpack_into(block, w, n, header, drives)
    return header, drives


def _image(cls, block: _Block, header: np.ndarray, drives: np.ndarray):
    values = dict(zip((f.name for f in block.header), header.tolist()))
    values.update(zip((f.name for f in block.drive), drives))
    return cls(**{f.name: values[f.name] for f in fields(cls)})


# -- public codec ----------------------------------------------------------------------------------------
def encode_inputs(image: InputImage) -> np.ndarray:
    """The input registers (uint16 words, INPUT_BASE first) of an image; GatewayError if a value does not
    fit its field (statusword 0..65535, mode display -128..127, int32 values, ...)."""
    return _encode(_INPUTS, image)


def decode_inputs(words: Sequence[int] | np.ndarray, n: int | None = None) -> InputImage:
    """The image in input registers read from INPUT_BASE (the whole image). Checks the layout version first,
    then that drive_count matches the number of words (and n when given). GatewayError otherwise."""
    return _image(InputImage, _INPUTS, *_decode(_INPUTS, words, n))


def encode_outputs(image: OutputImage) -> np.ndarray:
    """The holding registers (uint16 words, HOLDING_BASE first) of a command image; GatewayError for an
    unknown mode of operation or a value that does not fit its field."""
    return _encode(_OUTPUTS, image)


def decode_outputs(words: Sequence[int] | np.ndarray, n: int | None = None) -> OutputImage:
    """The command image in holding registers read from HOLDING_BASE (the whole image); GatewayError for an
    unknown mode of operation, or a word count that is not a whole number of drives (or not n)."""
    return _image(OutputImage, _OUTPUTS, *_decode(_OUTPUTS, words, n))


def encode_scaling(image: ScalingImage) -> np.ndarray:
    """The scaling registers (uint16 words, SCALING_BASE first) of n drives; GatewayError for a value that
    does not fit its field (counts per revolution and gear denominator at least 1)."""
    return _encode(_SCALING, image)


def decode_scaling(words: Sequence[int] | np.ndarray, n: int | None = None) -> ScalingImage:
    """The scaling of the drives in registers read from SCALING_BASE (whole drive blocks, n of them when
    given); GatewayError otherwise (a zero counts per revolution or gear denominator included)."""
    return _image(ScalingImage, _SCALING, *_decode(_SCALING, words, n))


# -- the hot path: preallocated int64 values and uint16 words, one numba call per image ---------------------
def field_row(group: tuple[Field, ...], name: str) -> int:
    """The row of field `name` in the value arrays of group (INPUT_HEADER, INPUT_DRIVE, HOLDING_HEADER,
    HOLDING_DRIVE): the arrays of the *_into functions hold the fields in their table's order."""
    return next(i for i, f in enumerate(group) if f.name == name)


def encode_inputs_into(header: np.ndarray, drives: np.ndarray, out: np.ndarray) -> np.ndarray:
    """encode_inputs without allocating: header (len(INPUT_HEADER),) int64 in INPUT_HEADER's order (its
    layout_version and drive_count are set here), drives (len(INPUT_DRIVE), n) int64, one row per INPUT_DRIVE
    field (wire units), into out (input_count(n),) uint16, which is returned. The same checks and GatewayError
    as encode_inputs; after an error out holds no valid image."""
    n = drives.shape[1] if drives.ndim == 2 else 0
    if not 1 <= n <= MAX_DRIVES:
        raise GatewayError(f"gateway input image: {n} drives, expected 1..{MAX_DRIVES}")
    header[_LAYOUT_AT] = LAYOUT_VERSION
    header[_DRIVE_COUNT_AT] = n
    _pack_into(_INPUTS, header, drives, out)
    return out


def encode_outputs_into(header: np.ndarray, drives: np.ndarray, out: np.ndarray) -> np.ndarray:
    """encode_outputs without allocating: header (len(HOLDING_HEADER),) int64 (watchdog, watchdog_timeout_ms),
    drives (len(HOLDING_DRIVE), n) int64, one row per HOLDING_DRIVE field (controlword, mode, counts, mN m),
    into out (holding_count(n),) uint16, which is returned. The same checks and GatewayError as encode_outputs;
    after an error out holds no valid image."""
    n = drives.shape[1] if drives.ndim == 2 else 0
    if not 1 <= n <= MAX_DRIVES:
        raise GatewayError(f"gateway holding image: {n} drives, expected 1..{MAX_DRIVES}")
    _pack_into(_OUTPUTS, header, drives, out)
    return out


def decode_inputs_into(words: Sequence[int] | np.ndarray, header: np.ndarray, drives: np.ndarray) -> None:
    """decode_inputs without allocating an image: the whole input image of n = drives.shape[1] drives into
    header (len(INPUT_HEADER),) and drives (len(INPUT_DRIVE), n), int64, in the tables' order (wire units).
    The same checks and GatewayError as decode_inputs(words, n); after an error the arrays hold no valid image."""
    _unpack_into(_INPUTS, _words(_INPUTS, words), drives.shape[1], header, drives)


def decode_outputs_into(words: Sequence[int] | np.ndarray, header: np.ndarray, drives: np.ndarray) -> None:
    """decode_outputs without allocating an image: the whole holding image of n = drives.shape[1] drives into
    header (len(HOLDING_HEADER),) and drives (len(HOLDING_DRIVE), n), int64, in the tables' order. The same
    checks and GatewayError as decode_outputs(words, n)."""
    _unpack_into(_OUTPUTS, _words(_OUTPUTS, words), drives.shape[1], header, drives)


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
        ("ARMID_GW_SCALING_BASE", SCALING_BASE, "first scaling input register (function 4, read-only)"),
        ("ARMID_GW_SCALING_DRIVE_STRIDE", SCALING_DRIVE_STRIDE, "scaling registers per drive block"),
        ("ARMID_GW_DRIVES_PER_READ", DRIVES_PER_READ, "drives whose inputs fit one read of 125 registers"),
        ("ARMID_GW_DRIVES_PER_WRITE", DRIVES_PER_WRITE, "drives whose outputs fit one write of 123 registers"),
        ("ARMID_GW_DRIVES_PER_EXCHANGE", DRIVES_PER_EXCHANGE, "drives whose whole exchange fits one function 23"),
        ("ARMID_GW_STATUS_DATA_VALID", STATUS_DATA_VALID, "gateway_status bit"),
        ("ARMID_GW_STATUS_WATCHDOG_EXPIRED", STATUS_WATCHDOG_EXPIRED, "gateway_status bit"),
        ("ARMID_GW_STATUS_DRIVE_FAULT", STATUS_DRIVE_FAULT, "gateway_status bit"),
    ]
    for prefix, group, where in (("IN_HDR", INPUT_HEADER, "input header"), ("IN_DRV", INPUT_DRIVE, "input drive block"),
                                 ("HOLD_HDR", HOLDING_HEADER, "holding header"),
                                 ("HOLD_DRV", HOLDING_DRIVE, "holding drive block"),
                                 ("SCALE_DRV", SCALING_DRIVE, "scaling drive block")):
        for f in group:
            out.append((f"ARMID_GW_{prefix}_{f.name.upper()}", f.offset,
                        f"{where} offset, {f.kind}{'' if f.size == 1 else ' high word first'}, {f.unit}"))
    return out


def _table(block: _Block, title: str) -> list[str]:
    lines = [f"**{title}**", "", "| register | field | type | unit | object | description |",
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
    """The register tables of docs/reference/wire-gateway.md (k = drive index, 0-based)."""
    return "\n".join(_table(_INPUTS, "Input registers (function 4), read-only") + [""]
                     + _table(_OUTPUTS, "Holding registers (functions 3, 6, 16), read/write") + [""]
                     + _table(_SCALING, "Scaling input registers (function 4), read-only, constant")) + "\n"


if __name__ == "__main__":  # python -m firmware_bridge.gateway: print the tables for the docs
    print(register_tables_markdown(), end="")
