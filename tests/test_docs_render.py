"""Every page of the README and the docs renders as written: no code fence opened twice (an empty fence, after
which the block's text renders as prose), no fence left open to the end of the page, and no table row (a line
starting with '|') that markdown-it-py, with GitHub's table extension, does not render inside a table or a code
block. A table needs a header, a delimiter row (|---|---|) and no blank line between its rows.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PARSER = MarkdownIt("commonmark").enable("table")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def pages(root: Path = ROOT) -> list[Path]:
    """The pages checked: README, CHANGELOG, docs/ and the benchmark results."""
    found = [root / "README.md", root / "CHANGELOG.md"]
    for folder in ("docs", "benchmarks/results"):
        found += sorted((root / folder).rglob("*.md"))
    return [p for p in found if p.is_file()]


def rendering_problems(text: str) -> list[str]:
    """What in text (Markdown) does not render as its author meant, one line each with its line number."""
    lines = text.splitlines()
    tokens = PARSER.parse(text)
    problems = []
    covered: set[int] = set()          # source lines inside a rendered table or code block (0-based)
    for tok in tokens:
        if tok.map is None:
            continue
        start, end = tok.map
        if tok.type == "table_open" or tok.type in ("fence", "code_block"):
            covered.update(range(start, end))
        if tok.type == "fence":
            if not tok.content.strip():
                problems.append(f"line {start + 1}: an empty code fence (a fence opened twice?): "
                                "what follows renders as prose")
            closer = lines[end - 1] if end - 1 > start else ""
            marker = _FENCE.match(lines[start]).group(1)
            if not (closer.strip().startswith(marker[0] * len(marker)) and not closer.strip().strip(marker[0])):
                problems.append(f"line {start + 1}: a code fence never closed: the rest of the page is code")
    for i, line in enumerate(lines):
        if line.lstrip().startswith("|") and i not in covered:
            problems.append(f"line {i + 1}: a table row that renders as text: {line.strip()[:60]}")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_renders_its_code_blocks_and_tables(page):
    problems = rendering_problems(page.read_text(encoding="utf-8"))
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_check_finds_a_doubled_fence_an_open_fence_and_a_broken_table():
    doubled = "# Modules\n\n```\n```\ndriver/cycle.py   the loop\n```\n```\n"
    assert any("empty code fence" in p for p in rendering_problems(doubled))
    assert any("never closed" in p for p in rendering_problems("text\n\n```\ncode to the end\n"))
    no_delimiter = "| a | b |\n| 1 | 2 |\n"
    assert len(rendering_problems(no_delimiter)) == 2
    split_by_blank = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n"
    assert rendering_problems(split_by_blank) == ["line 5: a table row that renders as text: | 3 | 4 |"]


def test_the_check_passes_tables_code_and_escaped_pipes():
    fine = ("| a | b |\n|---|---|\n| `x \\| y` | 2 |\n\n"
            "```\n| not a table, code |\n```\n\n"
            "    | indented code |\n\n"
            "- a list\n\n  | k | v |\n  |---|---|\n  | 1 | 2 |\n\n"
            "````markdown\n```\ninner\n```\n````\n")
    assert rendering_problems(fine) == []
