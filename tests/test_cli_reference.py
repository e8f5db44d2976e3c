"""docs/reference/cli.md shows each command's synopsis as `armid SUBCOMMAND --help` prints it: every block there
equals the parser's usage (whitespace aside), and every command has its block, so the page cannot drift from
the options."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

from armid.cli import _parser

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "cli.md"


def commands(parser: argparse.ArgumentParser, path=()):
    """(path, parser) of every subcommand that takes no further subcommand."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subs:
        for name, sub in action.choices.items():
            yield from commands(sub, (*path, name))
    if path and not any(a.required for a in subs):
        yield path, parser


def synopses(text: str) -> dict[tuple[str, ...], str]:
    """{command path: synopsis} of the page's fenced blocks that start with `armid `."""
    out = {}
    for block in re.findall(r"```\n(armid .*?)```", text, flags=re.S):
        words = block.split()
        path = tuple(w for w in words[1:][:3] if re.fullmatch(r"[a-z][a-z0-9-]*", w))
        out[path] = " ".join(words)
    return out


def usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().split()[1:])     # without "usage:"


def test_every_commands_synopsis_on_the_page_is_its_usage():
    page = synopses(PAGE.read_text())
    found = dict(commands(_parser()))
    assert set(found) - set(page) == set(), "commands without a synopsis in docs/reference/cli.md"
    for path, parser in found.items():
        assert page[path] == usage(parser), f"armid {' '.join(path)}: the page's synopsis is not the usage"


def test_a_stale_synopsis_is_found():
    path, parser = next(iter(commands(_parser())))
    stale = f"```\n{usage(parser).replace(' [-h]', ' [-h] [--gone X]')}\n```"
    assert synopses(stale)[path] != usage(parser)
