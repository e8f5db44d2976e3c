"""Every relative link in the README and the docs leads somewhere: the file exists, and a `#fragment` into a
Markdown page names one of its headings (GitHub's anchors). Links are read with markdown-it-py, so a link
written inside a code block or a code span is not a link, as on GitHub. The docs' index lists every page.
"""
from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
PARSER = MarkdownIt("commonmark").enable("table")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """The pages whose links are checked: README, CHANGELOG, docs/ and the benchmark results."""
    pages = [root / "README.md", root / "CHANGELOG.md"]
    for folder in ("docs", "benchmarks/results"):
        pages += sorted((root / folder).rglob("*.md"))
    return [p for p in pages if p.is_file()]


def _inline_text(token) -> str:
    return "".join(child.content for child in token.children or () if child.type in ("text", "code_inline"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(c for c in heading.lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The fragments a link may use into page: one per heading, repeats numbered -1, -2, ..."""
    tokens = PARSER.parse(page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found = set()
    for i, tok in enumerate(tokens):
        if tok.type != "heading_open":
            continue
        base = slug(_inline_text(tokens[i + 1]))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    """Every link and image target of page, in order, as written."""
    out = []
    for tok in PARSER.parse(page.read_text(encoding="utf-8")):
        for child in tok.children or ():
            if child.type == "link_open":
                out.append(child.attrs["href"])
            elif child.type == "image":
                out.append(child.attrs["src"])
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of page that lead nowhere, each with the reason."""
    bad = []
    for target in links(page):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or target.startswith("mailto:"):
            continue                        # an absolute URL: not ours to check offline
        path = unquote(parts.path)
        dest = page if not path else (page.parent / path).resolve()
        if not dest.exists():
            bad.append(f"{target}: no such file {dest}")
            continue
        if parts.fragment and dest.suffix == ".md" and dest.is_file():
            if parts.fragment not in anchors(dest):
                bad.append(f"{target}: no heading #{parts.fragment} in {dest.name}")
    return bad


def test_every_relative_link_in_the_readme_and_the_docs_resolves():
    pages = markdown_files()
    assert ROOT / "README.md" in pages and len(pages) > 10
    problems = [f"{page.relative_to(ROOT)}: {p}" for page in pages for p in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_missing_file_and_a_missing_heading_and_ignores_code(tmp_path):
    (tmp_path / "guides").mkdir()
    (tmp_path / "target.md").write_text("# The `stream` topic\n\n## Fields, in order\n")
    page = tmp_path / "guides" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](../target.md) [fine anchor](../target.md#fields-in-order) [code anchor](../target.md#the-stream-topic)\n"
        "[here](#page) [web](https://example.org/nowhere.md)\n"
        "[gone](../missing.md) ![picture](img/none.png) [bad anchor](../target.md#nothing)\n\n"
        "    [indented code](../not-a-link.md)\n\n"
        "```\n[fenced code](../not-a-link-either.md)\n```\n"
        "and `[span](../nor-this.md)`\n")
    found = broken_links(page)
    assert len(found) == 3, found
    assert found[0].startswith("../missing.md: no such file")
    assert found[1].startswith("img/none.png: no such file")
    assert found[2] == "../target.md#nothing: no heading #nothing in target.md"


def test_github_anchors_of_headings_with_code_punctuation_and_repeats(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Serial with `[realtime]`, at load 3\n\n## Gateway, 1 kHz\n\n## Gateway, 1 kHz\n")
    assert anchors(page) == {"serial-with-realtime-at-load-3", "gateway-1-khz", "gateway-1-khz-1"}


def test_the_docs_index_lists_every_page_of_the_docs():
    index = ROOT / "docs" / "index.md"
    listed = {(index.parent / unquote(urlsplit(t).path)).resolve() for t in links(index) if not urlsplit(t).scheme}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p != index}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - listed)
    assert not missing, f"docs/index.md does not list: {missing}"
