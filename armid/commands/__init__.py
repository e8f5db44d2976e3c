"""One module per `armid` subcommand. Each defines `register(subparsers)`, which adds its parser and sets
`run=<function(args) -> exit status>` as the parser's default. Modules import their heavy parts lazily,
inside the run functions, so that `armid --help` stays fast.

To add a subcommand, write its module here: every module of this package that defines `register` is a
subcommand (modules whose name starts with an underscore are helpers, not subcommands).
"""
import pkgutil

COMMANDS = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))
