"""One module per `armid` subcommand. Each defines `register(subparsers)`, which adds its parser and sets
`run=<function(args) -> exit status>` as the parser's default. Modules import their heavy parts lazily,
inside the run functions, so that `armid --help` stays fast.

To add a subcommand, write its module here and list it in COMMANDS.
"""
COMMANDS = ("model",)
