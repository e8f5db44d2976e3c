"""Bounded decoding of one command request: sizes are checked before the JSON parser runs.

A request is at most MAX_REQUEST_BYTES of UTF-8 JSON, nested at most MAX_DEPTH deep, whose integers have
at most MAX_INT_DIGITS digits and whose numbers are all finite (no NaN, Infinity, 1e400). `decode_request`
returns the object or raises RequestError naming what was wrong; it never raises anything else for any
input bytes, and its cost is linear in the request's size (the nesting is measured by a regular
expression and numpy, not by recursion).
"""
from __future__ import annotations

import json
import re

import numpy as np

from ident.errors import InputError

MAX_REQUEST_BYTES = 4 * 1024 * 1024   # a sampled trajectory of 100 000 six-joint rows fits
MAX_DEPTH = 6                         # {"samples": {"q": [[...]]}} is 4 deep
MAX_INT_DIGITS = 18
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


class RequestError(InputError):
    """A request that is not a well-formed, bounded JSON object."""


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of [ and { outside JSON strings (0 for a scalar)."""
    skeleton = _STRINGS.sub(b'""', raw)
    if not skeleton:
        return 0
    steps = _OPEN[np.frombuffer(skeleton, np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def _int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise RequestError(f"request: an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise RequestError(f"request: number {text[:40]} is not finite")
    return value


def _constant(text: str):
    raise RequestError(f"request: {text} is not a number JSON allows")


def decode_request(raw: bytes) -> dict:
    """The request object of `raw` (bytes of one ZeroMQ message), or RequestError naming the fault."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise RequestError(f"request of {len(raw)} bytes is over the {MAX_REQUEST_BYTES}-byte bound")
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise RequestError(f"request: nested {depth} deep (at most {MAX_DEPTH})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"request is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    try:
        req = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise RequestError(f"request is not JSON: {exc}") from None
    except RecursionError:            # cannot happen below MAX_DEPTH; kept so that nothing escapes
        raise RequestError("request: nested too deep") from None
    except ValueError as exc:         # float() of a huge exponent string and the like
        raise RequestError(f"request: {exc}") from None
    if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
        raise RequestError('request: expected a JSON object with a "cmd" string')
    return req


def command_name(raw: bytes) -> str | None:
    """The "cmd" of a request if it is a well-formed one, else None (never raises)."""
    try:
        return decode_request(raw)["cmd"]
    except RequestError:
        return None
