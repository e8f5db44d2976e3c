"""Old module paths kept importable after a module moved: `import ident.dynamics` gives the very module
`ident.model.dynamics` (one object under two names, so isinstance checks and monkeypatching agree).

A package lists its moves once, in its __init__: `alias_moved_modules({"ident.dynamics": "ident.model.dynamics"})`.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder that answers only for the old names in its table, with the module at its new path."""

    def __init__(self) -> None:
        self.moves: dict[str, str] = {}

    def find_spec(self, name, path=None, target=None):
        if name not in self.moves:
            return None
        return importlib.util.spec_from_loader(name, self, origin=self.moves[name])

    def create_module(self, spec):
        return importlib.import_module(self.moves[spec.name])

    def exec_module(self, module) -> None:
        """The module ran already, under its new name."""


_FINDER = _MovedModules()


def alias_moved_modules(moves: dict[str, str]) -> None:
    """Make each old dotted module name (key) import the module now at the new one (value)."""
    _FINDER.moves.update(moves)
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
