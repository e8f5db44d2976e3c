"""The payload report: payload.json, report.html and a PNG of the mass and centre of mass with their
3-sigma bars (matplotlib, Agg).

One report can hold several estimates of the same payload (e.g. the three dynamic methods side by side,
or torque balance against the static method), so that they are compared on one page.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from ident.payload.result import PARAMETER_NAMES, PayloadEstimate

PNG_DPI = 90


def _g(x: float, digits: int = 5) -> str:
    return f"{x:.{digits}g}" if np.isfinite(x) else "—"


def _plot(path: Path, estimates: list[PayloadEstimate]) -> Path:
    from ident.extras import require

    Figure = require("matplotlib.figure", "the payload report's plot").Figure   # no pyplot state

    fig = Figure(figsize=(9.0, 3.2))
    fig.subplots_adjust(left=0.08, right=0.99, top=0.86, bottom=0.2, wspace=0.3)
    ax_m, ax_c = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 3]})
    x = np.arange(len(estimates))
    ax_m.errorbar(x, [e.mass for e in estimates], yerr=[3 * e.sigma[9] for e in estimates], fmt="o", capsize=4)
    ax_m.set_xticks(x, [e.method for e in estimates], rotation=20, fontsize=8)
    ax_m.set_ylabel("mass (kg)")
    ax_m.set_title("mass, ±3σ")
    width = 0.8 / max(len(estimates), 1)
    for k, e in enumerate(estimates):
        ax_c.errorbar(np.arange(3) + (k - (len(estimates) - 1) / 2) * width, 1e3 * e.com,
                      yerr=3e3 * e.com_sigma, fmt="o", capsize=4, label=e.method)
    ax_c.set_xticks(np.arange(3), ["x", "y", "z"])
    ax_c.set_ylabel("centre of mass (mm, flange frame)")
    ax_c.set_title("centre of mass, ±3σ")
    ax_c.grid(alpha=0.3)
    ax_c.legend(fontsize="small")
    fig.savefig(path, dpi=PNG_DPI)
    return path


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _section(e: PayloadEstimate) -> str:
    rows = [[name, _g(v), _g(s)] for name, v, s in zip(PARAMETER_NAMES, e.chi, e.sigma)]
    parts = [f"<h2>{html.escape(e.method)}</h2>",
             f"<p>mass {_g(e.mass)} kg ± {_g(e.sigma[9], 2)}; centre of mass "
             + ", ".join(f"{_g(1e3 * c, 4)} ± {_g(1e3 * s, 2)}" for c, s in zip(e.com, e.com_sigma))
             + f" mm; {e.samples} samples; {_g(1e3 * e.seconds, 3)} ms</p>",
             "<p>" + ("a body that can exist" if e.consistent else f"<b>not physically consistent</b>: "
                      f"{html.escape(e.consistency)}") + "</p>",
             _table(["parameter (flange origin, flange axes)", "value (kg, kg m, kg m²)", "sigma"], rows)]
    if e.combinations:
        parts.append("<p>identifiable combinations:</p>" + _table(
            ["combination", "value", "sigma"], [[c.expression, _g(c.value), _g(c.sigma)] for c in e.combinations]))
    if e.notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in e.notes) + "</ul>")
    return "\n".join(parts)


def write_report(estimates: list[PayloadEstimate], out: str | Path, title: str = "payload identification") -> dict[str, Path]:
    """payload.json, payload.png and report.html in the directory out (created)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"estimates": [e.to_json() for e in estimates]}
    for d, e in zip(doc["estimates"], estimates):
        try:
            d["set_payload"] = e.set_payload_command()
        except ValueError:
            d["set_payload"] = None
    (out / "payload.json").write_text(json.dumps(doc, indent=2) + "\n")
    png = _plot(out / "payload.png", estimates)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:auto} table{border-collapse:collapse}"
            " td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><img src='{png.name}' alt='mass and centre of mass'>"
            + "".join(_section(e) for e in estimates) + "</body></html>")
    (out / "report.html").write_text(page)
    return {"json": out / "payload.json", "plot": png, "report": out / "report.html"}
