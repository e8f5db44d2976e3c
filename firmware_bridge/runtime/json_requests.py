"""Bounded decoding of one JSON request (a command to the driver, a control request to the simulator): sizes
are checked before the JSON parser runs.

A request is at most `max_bytes` of UTF-8 JSON, nested at most MAX_DEPTH deep, whose integers have at most
MAX_INT_DIGITS digits and whose numbers are all finite (no NaN, Infinity, 1e400), and is an object with a "cmd"
string. `decode_bounded` returns the object or raises the caller's error class naming what was wrong; it never
raises anything else for any input bytes, and its cost is linear in the request's size (the nesting is
measured by a regular expression and numpy, not by recursion).
"""
from __future__ import annotations

import json
import re

import numpy as np

from firmware_bridge.runtime.errors import InputError

MAX_DEPTH = 6                         # {"samples": {"q": [[...]]}} is 4 deep
MAX_INT_DIGITS = 18
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside JSON strings (0 for a scalar)."""
    escaped = b"\\" in raw
    if escaped:                          # a quote may stand inside a string: strings out by the expression
        raw = _STRINGS.sub(b'""', raw)
    if not raw:
        return 0
    data = np.frombuffer(raw, np.uint8)
    steps = _OPEN[data]
    if not escaped:                      # a string runs from an odd-numbered quote to the next (a vectorised
        quote = data == ord('"')         # _STRINGS, many times faster on requests of many short strings)
        opened = np.cumsum(quote, dtype=np.int64)
        if opened[-1] & 1:               # a last quote that nothing closes opens no string
            opened[np.flatnonzero(quote)[-1]:] += 1
        steps[(opened & 1).astype(bool)] = 0
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def decode_bounded(raw: bytes, max_bytes: int, error: type[InputError] = InputError) -> dict:
    """The request object of `raw` (bytes of one message), or `error` naming the fault."""
    if len(raw) > max_bytes:
        raise error(f"request of {len(raw)} bytes is over the {max_bytes}-byte bound")
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise error(f"request: nested {depth} deep (at most {MAX_DEPTH})")

    def integer(text: str) -> int:
        digits = len(text.lstrip("-"))
        if digits > MAX_INT_DIGITS:
            raise error(f"request: an integer of {digits} digits (at most {MAX_INT_DIGITS})")
        return int(text)

    def finite(text: str) -> float:
        value = float(text)
        if value != value or value in (float("inf"), float("-inf")):
            raise error(f"request: number {text[:40]} is not finite")
        return value

    def constant(text: str):
        raise error(f"request: {text} is not a number JSON allows")

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"request is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        req = json.loads(text, parse_int=integer, parse_float=finite, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise error(f"request is not JSON: {exc}") from None
    except RecursionError:            # cannot happen below MAX_DEPTH; kept so that nothing escapes
        raise error("request: nested too deep") from None
    except error:                     # our own checks above: already worded
        raise
    except ValueError as exc:         # float() of a huge exponent string and the like
        raise error(f"request: {exc}") from None
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        raise error('request: expected a JSON object with a "cmd" string')
    return req
