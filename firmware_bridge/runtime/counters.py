"""Counters as a dataclass: a subclass declares its counts as `name: int = 0` fields (with the dataclass
decorator) and gets their dictionary and their sum with another set of the same counts from here."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Counters:
    """Integer counts, each 0 at first; subclasses name them."""

    def as_dict(self, suffix: str = "") -> dict[str, int]:
        """{name + suffix: count} in declaration order (for link stats, health and JSON)."""
        return {f.name + suffix: getattr(self, f.name) for f in fields(self)}

    def add(self, other: Counters) -> None:
        """Add another set of the same counts to these (e.g. a finished session's to the totals)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
