"""ident's name for armid's input-error base (defined in firmware_bridge.errors, the bottom layer, so that every
package may derive from it): `from ident.errors import InputError` keeps working for ident's users."""
from __future__ import annotations

from firmware_bridge.errors import InputError

__all__ = ["InputError"]
