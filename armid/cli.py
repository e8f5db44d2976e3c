"""`armid`: one console command, one subcommand per job (the modules in armid.commands)."""
from __future__ import annotations

import argparse
import importlib
import sys

from armid import logs
from armid.commands import COMMANDS


def version() -> str:
    """The installed distribution's version (importlib.metadata), or "unknown" when run from a source tree
    that was never installed."""
    from importlib import metadata

    try:
        return metadata.version("armid")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="armid", description="Driver and identification service for robot arms.")
    parser.add_argument("--version", action="version", version=f"armid {version()}")
    logs.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"armid.commands.{name}").register(sub)
    for command in sub.choices.values():      # also after the subcommand: `armid driver --log-format json`
        logs.add_arguments(command, defaults=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `armid` command. Bad input (an InputError) ends with one line on stderr and
    exit status 2; Ctrl-C with status 130. Logging goes to stderr as --log-level and --log-format say
    (armid.logs)."""
    from ident.errors import InputError

    args = _parser().parse_args(argv)
    args.command_line = ["armid", *(sys.argv[1:] if argv is None else argv)]   # for results' provenance
    try:
        _, args.log_format = logs.configure(args.log_level, args.log_format)
    except InputError as exc:
        print(f"armid: {exc}", file=sys.stderr)
        return 2
    if args.log_format != "json":      # JSON logs stay one object per line
        from armid.jit import install_notice

        install_notice()
    try:
        return int(args.run(args) or 0)
    except InputError as exc:
        print(f"armid: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("armid: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into head & co.
        logs.shutdown()
        sys.stderr.close()
        return 0
    finally:
        logs.shutdown()       # every record queued is written before the exit status


if __name__ == "__main__":
    sys.exit(main())
