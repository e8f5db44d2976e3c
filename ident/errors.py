"""The one base class of every 'your input is wrong' error in armid.

Each subclass carries a message that names the file, field, sample or joint at fault. The `armid` command
prints such errors as one line and exits with status 2; anything else is a bug and keeps its traceback.
"""
from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user or a file: the message says what was wrong and where."""


def check_output_file(path, option: str = "-o") -> None:
    """Refuse, before any work, an output file path that cannot be written: a directory, or a file in a
    folder that does not exist. The InputError names the option and the path."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise InputError(f"{option} {path}: is a directory; expected a file to write")
    if not p.parent.is_dir():
        raise InputError(f"{option} {path}: the folder {p.parent} does not exist")
