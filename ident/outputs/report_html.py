"""HTML pieces that every armid report shares: a table, and the provenance section (armid version, UTC time,
arm id, command line, and each input file with its path relative to the report and its SHA-256), so that the
identification, payload and calibration reports say alike where their numbers came from."""
from __future__ import annotations

import html
import shlex


def table(header: list[str], rows: list[list[str]], classes: list[str] | None = None,
          table_id: str | None = None) -> str:
    """An HTML table; the cells are HTML already (escape text before), `classes` one CSS class per row."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for i, r in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
    attr = f' id="{table_id}"' if table_id else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def provenance_section(p: dict) -> str:
    """The provenance record (ident.outputs.provenance.provenance) as a section: a list with id "provenance" and a
    table with id "provenance-inputs"."""
    inputs = [[f'<span class="l">{html.escape(role)}</span>', f'<span class="l">{html.escape(e["path"])}</span>',
               f'<code>{html.escape(e["sha256"])}</code>'] for role, e in (p.get("inputs") or {}).items()]
    model = p.get("model")
    if model is not None:
        inputs.append(['<span class="l">model</span>', '<span class="l">'
                       + html.escape(model.get("path") or f'{model.get("shipped")} (shipped with armid)') + "</span>",
                       f'<code>{html.escape(model["sha256"])}</code>'])
    facts = [("armid version", p.get("armid_version")), ("created (UTC)", p.get("created_utc")),
             ("arm id", p.get("arm_id")), ("command line", shlex.join(p.get("command_line") or []))]
    lines = "".join(f"<li>{name}: <code>{html.escape(str(value))}</code></li>" for name, value in facts
                    if value is not None)
    return ("<h2>Provenance</h2>" + f'<ul id="provenance">{lines}</ul>'
            + "<p>Input files (paths relative to this folder) and the SHA-256 of their bytes:</p>"
            + table(["input", "path", "SHA-256"], inputs, table_id="provenance-inputs"))
