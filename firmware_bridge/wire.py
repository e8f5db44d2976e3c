"""Field tables: a wire record defined once as data (name, C type, unit, description), from which the
codecs (struct / numpy, little-endian, packed), the C structs and the documentation tables are made.

    HEADER = Record("header", (Field("version", "uint8", "-", "protocol version"), ...))
    HEADER.pack({"version": 1, ...}) -> bytes;  HEADER.unpack(data, offset) -> tuple of values
    HEADER.c_struct("armid_serial_header_t");  HEADER.markdown()

Values that a C type cannot hold (NaN, fractions in an integer field, out of range) raise
`units.WireValueError` naming the record, the field and the joint; nothing is clipped.
Shared by every firmware_bridge format module; imports nothing of armid outside firmware_bridge.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from firmware_bridge.units import WireValueError


@dataclass(frozen=True)
class CType:
    """A C scalar type on the wire: struct code, numpy code (little-endian), C name, value range."""
    name: str
    code: str
    c_name: str
    lo: float
    hi: float

    @property
    def is_float(self) -> bool:
        return self.code in "fd"

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.code)


def _int_type(name: str, code: str, bits: int, signed: bool) -> CType:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    return CType(name, code, f"{name}_t", lo, hi)


CTYPES: dict[str, CType] = {t.name: t for t in (
    _int_type("uint8", "B", 8, False), _int_type("int8", "b", 8, True),
    _int_type("uint16", "H", 16, False), _int_type("int16", "h", 16, True),
    _int_type("uint32", "I", 32, False), _int_type("int32", "i", 32, True),
    _int_type("uint64", "Q", 64, False), _int_type("int64", "q", 64, True),
    CType("float32", "f", "float", -3.4028234663852886e38, 3.4028234663852886e38),
    CType("float64", "d", "double", -math.inf, math.inf),
)}


@dataclass(frozen=True)
class Field:
    """One field of a record: name (also the C member), C type name (a key of CTYPES), unit, description."""
    name: str
    ctype: str
    unit: str
    doc: str

    def __post_init__(self) -> None:
        if self.ctype not in CTYPES:
            raise ValueError(f"field {self.name}: unknown C type {self.ctype!r}")

    @property
    def type(self) -> CType:
        return CTYPES[self.ctype]


def check_scalar(where: str, field: Field, value) -> int | float:
    """value as a Python int (float for float fields) that the field's C type holds exactly, or
    WireValueError naming `where` and the field."""
    t = field.type
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise WireValueError(f"{where}: {field.name}: expected a number, got {value!r}")
    if t.is_float:
        v = float(value)
        if not math.isfinite(v) or not t.lo <= v <= t.hi:
            raise WireValueError(f"{where}: {field.name}: {v!r} is not a finite {t.name}")
        return v
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value != math.floor(value):
            raise WireValueError(f"{where}: {field.name}: {float(value)!r} is not an integer")
    v = int(value)
    if not t.lo <= v <= t.hi:
        raise WireValueError(f"{where}: {field.name}: {v} outside {t.name} [{t.lo}, {t.hi}]")
    return v


def check_array(where: str, field: Field, values, n: int) -> np.ndarray:
    """(n,) values for a per-joint field, checked like check_scalar; the error names the joint (1-based)."""
    t = field.type
    try:
        arr = values if isinstance(values, np.ndarray) else np.asarray(values)
    except (TypeError, ValueError):
        raise WireValueError(f"{where}: {field.name}: expected {n} numbers, got {values!r}") from None
    if arr.shape != (n,):
        raise WireValueError(f"{where}: {field.name}: expected {n} values (one per joint), got shape {arr.shape}")
    kind = arr.dtype.kind
    if kind in "iu":   # the hot path: integers need at most a range check
        if t.is_float:
            return arr
        info = np.iinfo(arr.dtype)
        if (info.min >= t.lo and info.max <= t.hi) or n == 0 or (arr.min() >= t.lo and arr.max() <= t.hi):
            return arr
    elif kind != "f":
        raise WireValueError(f"{where}: {field.name}: expected numbers, got {arr.dtype} values")
    with np.errstate(invalid="ignore"):
        bad = (arr < t.lo) | (arr > t.hi)
        if kind == "f":
            bad |= ~np.isfinite(arr)
            if not t.is_float:
                bad |= arr != np.floor(np.where(bad, 0.0, arr))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        raise WireValueError(f"{where}: {field.name}: joint {j + 1}: {arr[j].item()!r} cannot be sent as "
                             f"{t.name}{'' if t.is_float else ' (an integer in ' + str([int(t.lo), int(t.hi)]) + ')'}")
    return arr


@dataclass(frozen=True)
class Record:
    """An ordered, packed, little-endian group of fields (a C struct with #pragma pack(1))."""
    name: str
    fields: tuple[Field, ...]

    @cached_property
    def struct(self) -> struct.Struct:
        return struct.Struct("<" + "".join(f.type.code for f in self.fields))

    @cached_property
    def dtype(self) -> np.dtype:
        """numpy structured dtype with the same byte layout (for arrays of records)."""
        return np.dtype([(f.name, "<" + f.type.code) for f in self.fields])

    @property
    def size(self) -> int:
        return self.struct.size

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def offsets(self) -> list[int]:
        """Byte offset of each field in the record."""
        out, at = [], 0
        for f in self.fields:
            out.append(at)
            at += f.type.size
        return out

    def markdown(self, base_offset: int = 0, offset_note: str = "") -> str:
        """The record as a Markdown table: offset, field, C type, unit, description."""
        rows = ["| offset | field | type | unit | description |", "| --- | --- | --- | --- | --- |"]
        for off, f in zip(self.offsets(), self.fields):
            rows.append(f"| {offset_note}{base_offset + off} | `{f.name}` | {f.ctype} | {f.unit} | {f.doc} |")
        return "\n".join(rows)

    def c_struct(self, type_name: str, trailing: str = "") -> str:
        """The record as a C typedef struct (pack the enclosing code with #pragma pack(push, 1)); trailing
        is an extra member line (e.g. a flexible array of joint records)."""
        lines = [f"/* {self.name}: {self.size} bytes */", "typedef struct {"]
        for f in self.fields:
            lines.append(f"    {f.type.c_name} {f.name};  /* {f.unit}: {f.doc} */")
        if trailing:
            lines.append(f"    {trailing}")
        lines.append(f"}} {type_name};")
        return "\n".join(lines)
