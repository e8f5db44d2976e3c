"""The payload report: payload.json, report.html and a PNG of the mass and centre of mass with their
3-sigma bars (matplotlib, Agg).

One report can hold several estimates of the same payload (e.g. the three dynamic methods side by side,
or torque balance against the static method), so that they are compared on one page, and the methods
that gave no estimate, each with its reason.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from ident.payload.result import PARAMETER_NAMES, MethodFailure, PayloadEstimate
from ident.outputs.report_html import provenance_section

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
    frames = sorted({e.frame for e in estimates})
    ax_c.set_ylabel(f"centre of mass (mm, frame {', '.join(frames)})")
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
             + f" mm in frame {html.escape(e.frame)}; {e.samples} samples; {_g(1e3 * e.seconds, 3)} ms</p>",
             "<p>" + ("a body that can exist" if e.consistent else f"<b>not physically consistent</b>: "
                      f"{html.escape(e.consistency)}") + "</p>",
             _table([f"parameter (origin and axes of {e.frame})", "value (kg, kg m, kg m²)", "sigma"], rows)]
    if e.combinations:
        parts.append("<p>identifiable combinations:</p>" + _table(
            ["combination", "value", "sigma"], [[c.expression, _g(c.value), _g(c.sigma)] for c in e.combinations]))
    if e.notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in e.notes) + "</ul>")
    return "\n".join(parts)


def _failures(failures: list[MethodFailure]) -> str:
    if not failures:
        return ""
    return ("<h2>methods that gave no estimate</h2><ul>"
            + "".join(f"<li><b>{html.escape(f.method)}</b>: {html.escape(f.reason)}</li>" for f in failures) + "</ul>")


def write_report(estimates: list[PayloadEstimate], out: str | Path, title: str = "payload identification",
                 failures: list[MethodFailure] = (), provenance: dict | None = None) -> dict[str, Path]:
    """payload.json, payload.png and report.html in the directory out (created).

    Parameters
    ----------
    estimates : list of PayloadEstimate
        The estimates to write, side by side.
    out : str or Path
        The output directory.
    title : str
        The report's title.
    failures : list of MethodFailure
        The methods that gave no estimate, with their reasons (payload.json "failed", a section of the page).
    provenance : dict, optional
        The provenance record (ident.outputs.provenance.provenance, paths relative to out), stored as payload.json's
        "provenance" and shown at the end of report.html.

    Returns
    -------
    dict
        "json", "plot", "report": the paths written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"provenance": provenance, "frame": ", ".join(sorted({e.frame for e in estimates})),
           "estimates": [e.to_json() for e in estimates], "failed": [f.to_json() for f in failures]}
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
            + "".join(_section(e) for e in estimates) + _failures(failures)
            + ("" if provenance is None else provenance_section(provenance)) + "</body></html>")
    (out / "report.html").write_text(page)
    return {"json": out / "payload.json", "plot": png, "report": out / "report.html"}


def read_set_payload(path: str | Path, method: str | None = None) -> tuple[str, dict, str]:
    """(method, set_payload request, frame) of the first estimate in a payload.json (of `method`, when given),
    checked before it goes to a driver: InputError naming the file and the field for anything write_report
    would not have written (not JSON, NaN or Infinity, a missing or mistyped field). frame: the flange
    frame the centre of mass is in ("flange" for a file that does not name one)."""
    from ident.errors import InputError

    def fail(field: str, expected: str, got=None) -> InputError:
        return InputError(f"{path}: {field}: expected {expected}" + ("" if got is None else f", got {got!r}"))

    try:   # NaN and Infinity (which Python's json reads) are refused below, naming their field
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    except ValueError as exc:
        raise InputError(f"{path}: not a payload.json of `armid payload identify`: {exc}") from None
    estimates = doc.get("estimates") if isinstance(doc, dict) else None
    if not isinstance(estimates, list) or not all(isinstance(e, dict) for e in estimates):
        raise fail("estimates", "a list of estimate objects (a payload.json of `armid payload identify`)")
    chosen = [(k, e) for k, e in enumerate(estimates) if method in (None, e.get("method"))]
    if not chosen:
        raise fail("estimates", f"an estimate of method {method!r}; found "
                   + (", ".join(str(e.get("method")) for e in estimates) or "none"))
    k, estimate = chosen[0]
    name = str(estimate.get("method"))
    command = estimate.get("set_payload")
    where = f"estimates[{k}].set_payload"
    if command is None:
        raise fail(where, f"the mass and centre of mass to apply (the {name} estimate has none)")
    if not isinstance(command, dict) or command.get("cmd") != "set_payload":
        raise fail(where, 'an object with "cmd": "set_payload"', command)
    unknown = sorted(set(command) - {"cmd", "mass", "com", "inertia"})
    if unknown:
        raise fail(f"{where}.{unknown[0]}", "only cmd, mass, com and inertia (unknown field)")

    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)

    frame = estimate.get("frame", "flange")
    if not isinstance(frame, str) or not frame:
        raise fail(f"estimates[{k}].frame", "the name of the flange frame", frame)
    mass = command.get("mass")
    if not (number(mass) and mass > 0):
        raise fail(f"{where}.mass", "a finite mass > 0 in kg", mass)
    for key, size, unit in (("com", 3, "m"), ("inertia", 6, "kg m^2")):
        value = command.get(key)
        if value is None and key == "inertia":
            continue
        if not (isinstance(value, list) and len(value) == size and all(number(x) for x in value)):
            raise fail(f"{where}.{key}", f"a list of {size} finite numbers in {unit}", value)
    return name, command, frame
