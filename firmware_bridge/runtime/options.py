"""Declared options: each transport (the driver's and the simulator's device side) states its options once, as
Option values in an OptionSet; its parsing, its option names, its docs table and its error messages come from that.

    SPEC = OptionSet("serial",
        Option("port", "text", required=True, what="a device path or pyserial URL", doc="the port to open"),
        Option("baudrate", "integer", 3_000_000, low=50, high=100_000_000, unit="bit/s", doc="line rate"))
    values = SPEC.parse({"port": "/dev/ttyACM0"})      # values.baudrate == 3000000
    SPEC.parse({"port": "x", "baudrate": "fast"})
    # InputError: serial: option 'baudrate': expected an integer in 50..100000000, got 'fast'

Kinds: integer, number (finite), text (not blank), flag (true or false), text or integer, integers (a list),
path (text or a path), any (passed on unchecked: what receives it checks it). An option with `nullable` also
takes None (its default behaviour).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from firmware_bridge.runtime.errors import InputError

KINDS = ("integer", "number", "text", "flag", "text or integer", "integers", "path", "any")


def finite_number(value) -> bool:
    """True for an int or float (not a bool) that is finite: what a numeric option or field may hold."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def plain(x: float) -> str:
    """A bound as a person writes it: 100000000, 0.001, 65.535 (no exponent)."""
    return str(int(x)) if float(x).is_integer() else f"{x:.10g}"


@dataclass(frozen=True)
class Option:
    """One option: its name, kind (KINDS), default, bounds (low..high; above: low itself excluded), unit (s, ms,
    bit/s, ...), what it expects in words (for text kinds; the error message says it), doc (its meaning, for
    the docs table), required, nullable (None is accepted), in_config (False: an object only code can give, not
    a configuration file)."""

    name: str
    kind: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    unit: str = ""
    doc: str = ""
    what: str = ""
    required: bool = False
    nullable: bool = False
    above: bool = False
    in_config: bool = True

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"option {self.name!r}: kind {self.kind!r} is not one of {', '.join(KINDS)}")

    def bounds(self) -> str:
        """The range in words: 'in 1..65535', 'above 0', '>= 1', or ''."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None and not self.above:
            return f"in {plain(lo)}..{plain(hi)}"
        parts = []
        if lo is not None:
            parts.append(f"above {plain(lo)}" if self.above else f">= {plain(lo)}")
        if hi is not None:
            parts.append(f"<= {plain(hi)}")
        return " and ".join(parts)

    def expected(self, in_table: bool = False) -> str:
        """What the option takes, as the error message says it (in_table: as the docs' table does, where an
        option left out takes its default)."""
        unit = f" of {self.unit}" if self.unit else ""
        rng = f" {self.bounds()}" if self.bounds() else ""
        if self.kind == "integer":
            text = f"an integer{unit}{rng}"
        elif self.kind == "number":
            text = f"a number{unit}{rng}"
        elif self.kind == "integers":
            text = f"a list of integers{rng}"
        elif self.kind == "flag":
            text = "true or false"
        else:
            text = self.what or {"text": "text", "text or integer": "text or an integer", "path": "a file path",
                                 "any": "a value"}[self.kind]
        return f"{text} or none" if self.nullable and not in_table else text

    def accepts(self, value) -> bool:
        """True when value is of this option's kind and within its bounds."""
        if value is None:
            return self.nullable
        kind = self.kind
        if kind == "any":
            return True
        if kind == "flag":
            return isinstance(value, bool)
        if kind == "text":
            return isinstance(value, str) and bool(value.strip())
        if kind == "path":
            return isinstance(value, os.PathLike) or (isinstance(value, str) and bool(value.strip()))
        if kind == "text or integer":
            return (isinstance(value, str) and bool(value.strip())) or (
                isinstance(value, int) and not isinstance(value, bool))
        if kind == "integers":
            return isinstance(value, (list, tuple)) and all(self._within(v, integer=True) for v in value)
        return self._within(value, integer=kind == "integer")

    def _within(self, value, integer: bool) -> bool:
        if not finite_number(value) or (integer and not isinstance(value, int)):
            return False
        if self.low is not None and (value <= self.low if self.above else value < self.low):
            return False
        return self.high is None or value <= self.high


class Values(dict):
    """Parsed options: a dict whose keys also read as attributes (values.port)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class OptionSet:
    """The options of one transport, declared once: `where` names it in every message (serial, can device, ...);
    error is the InputError subclass its messages are raised as."""

    def __init__(self, where: str, *options: Option, error: type[InputError] = InputError):
        self.where, self.options, self.error = where, options, error
        self.by_name = {o.name: o for o in options}
        if len(self.by_name) != len(options):
            raise ValueError(f"{where}: an option declared twice")

    @property
    def names(self) -> tuple[str, ...]:
        """The option names, in declaration order."""
        return tuple(self.by_name)

    @property
    def in_config(self) -> tuple[str, ...]:
        """The names of the options a configuration file may give."""
        return tuple(o.name for o in self.options if o.in_config)

    @property
    def required(self) -> tuple[str, ...]:
        """The names of the options that must be given."""
        return tuple(o.name for o in self.options if o.required)

    def fail(self, name: str, expected: str, got) -> InputError:
        """The error for option `name` (one style for every option of every transport)."""
        return self.error(f"{self.where}: option {name!r}: expected {expected}, got {got!r}")

    def parse(self, given: Mapping[str, Any]) -> Values:
        """Every declared option's value: the given one, checked, else its default. The error (self.error) names
        an unknown option with the known ones, a required one missing, or one out of its kind or bounds."""
        for key in given:
            if key not in self.by_name:
                raise self.error(f"{self.where}: unknown option {key!r} (options: {', '.join(self.names)})")
        out = Values()
        for o in self.options:
            if o.name not in given:
                if o.required:
                    raise self.error(f"{self.where}: option {o.name!r}: expected {o.expected()}, got nothing "
                                     f"(it is required)")
                out[o.name] = o.default
                continue
            value = given[o.name]
            if not o.accepts(value):
                raise self.fail(o.name, o.expected(), value)
            out[o.name] = value.strip() if isinstance(value, str) and o.kind != "any" else value
        return out

    def markdown(self) -> str:
        """The options as a Markdown table (the docs' reference pages show it as it is)."""
        rows = ["| option | takes | default | meaning |", "| --- | --- | --- | --- |"]
        for o in self.options:
            if not o.in_config:
                continue
            default = "required" if o.required else ("-" if o.default is None else f"`{_toml(o.default)}`")
            rows.append(f"| `{o.name}` | {o.expected(in_table=True)} | {default} | {o.doc} |")
        return "\n".join(rows) + "\n"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return plain(value)
    if isinstance(value, Iterable):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)
