"""ident's name for armid's input-error base (defined in firmware_bridge.runtime.errors, the bottom layer, so that every
package may derive from it): `from ident.errors import InputError` keeps working for ident's users."""
from __future__ import annotations

from firmware_bridge.runtime.errors import InputError

__all__ = ["InputError", "check_output_file", "check_output_dir"]


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
