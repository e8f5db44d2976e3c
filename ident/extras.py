"""Optional parts of armid and the extra that installs them.

The controller PC's daemon (driver, transports, simulator, stream, recorder) needs neither a convex solver
nor a plotting library; identification reports and physically consistent fits do. Those come with the
`ident` extra (`pip install 'armid[ident]'`), and their modules are imported only where they are used,
through require(), which turns a missing one into one line naming the extra.
"""
from __future__ import annotations

import importlib

from ident.errors import InputError

EXTRA = "ident"


class MissingExtra(InputError):
    """An optional dependency is not installed: the message names what needs it and the extra to install."""


def require(module: str, needed_for: str, extra: str = EXTRA):
    """Import `module` (e.g. "cvxpy", "matplotlib.figure") and return it; MissingExtra naming the package,
    what it is `needed_for` and the extra that installs it (default the ident extra) when it is not installed.
    An ImportError from inside an installed package (a broken installation) is not hidden."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.partition(".")[0]
        if (getattr(exc, "name", None) or "").partition(".")[0] != top:
            raise
        raise MissingExtra(f"{needed_for}: {top} is not installed; install the {extra!r} extra (pip install "
                           f"'armid[{extra}]', or pip install -e '.[{extra}]' in a checkout)") from None
