"""The one base class of every 'your input is wrong' error in armid.

It lives in the bottom layer so that every package (firmware_bridge, ident, sim, driver, the CLI) may derive
from it. Each subclass carries a message that names the file, field, sample or joint at fault. The `armid`
command prints such errors as one line and exits with status 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user or a file: the message says what was wrong and where."""


QUOTE_CHARS = 80     # the most of a file's text an error message quotes


def quoted(text: str, limit: int = QUOTE_CHARS) -> str:
    """text as repr() quotes it, cut to its first `limit` characters (then "... (N characters)"): what an error
    message may quote of a file's text, however long the line it came from."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
