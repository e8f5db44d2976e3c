"""Bounded decoding of one command request to the driver (firmware_bridge.runtime.json_requests): at most
MAX_REQUEST_BYTES of UTF-8 JSON, nested at most MAX_DEPTH deep, integers of at most MAX_INT_DIGITS digits, every
number finite. `decode_request` returns the object or raises RequestError naming what was wrong; it never raises
anything else for any input bytes.
"""
from __future__ import annotations

from firmware_bridge.runtime.json_requests import MAX_DEPTH, MAX_INT_DIGITS, decode_bounded, nesting_depth
from ident.errors import InputError

__all__ = ["MAX_REQUEST_BYTES", "MAX_DEPTH", "MAX_INT_DIGITS", "RequestError", "decode_request", "nesting_depth",
           "command_name"]

MAX_REQUEST_BYTES = 4 * 1024 * 1024   # a sampled trajectory of 100 000 six-joint rows fits


class RequestError(InputError):
    """A request that is not a well-formed, bounded JSON object."""


def decode_request(raw: bytes) -> dict:
    """The request object of `raw` (bytes of one ZeroMQ message), or RequestError naming the fault."""
    return decode_bounded(raw, MAX_REQUEST_BYTES, RequestError)


def command_name(raw: bytes) -> str | None:
    """The "cmd" of a request if it is a well-formed one, else None (never raises)."""
    try:
        return decode_request(raw)["cmd"]
    except RequestError:
        return None
