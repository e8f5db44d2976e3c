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


def check_output_dir(path, option: str = "-o") -> None:
    """Refuse, before any work, an output folder that cannot be made: a path that is a file, or under one."""
    from pathlib import Path

    p = Path(path)
    for folder in (p, *p.parents):
        if folder.exists():
            if not folder.is_dir():
                raise InputError(f"{option} {path}: {folder} is a file; expected a folder for the outputs")
            return
