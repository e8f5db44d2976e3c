"""Calibration report: an HTML page with the summary, the parameter table and matplotlib figures (PNG)."""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from ident.calibration.fit import Identification
from ident.calibration.io import term_status
from ident.outputs.report_html import provenance_section


def _figures(result: Identification, accuracy: np.ndarray, folder: Path) -> list[str]:
    from ident.extras import require

    # the Agg canvas of a bare Figure: no pyplot state and no backend change (a notebook's inline plots stay)
    Figure = require("matplotlib.figure", "the calibration report's plots").Figure

    names = []
    before = np.linalg.norm(result.residual_before, axis=1) * 1e3
    after = np.linalg.norm(result.residual_after, axis=1) * 1e3
    fig = Figure(figsize=(8, 6), layout="constrained")
    ax = fig.subplots(2, 1)
    idx = np.arange(len(before))
    ax[0].bar(idx, before, color="tab:red", label=f"before (RMS {result.rms_before * 1e3:.3f} mm)")
    ax[0].set_ylabel("position error [mm]")
    ax[0].legend()
    ax[1].bar(idx, after, color="tab:green", label=f"after (RMS {result.rms_after * 1e3:.4f} mm)")
    if result.outliers.size:
        ax[1].bar(result.outliers, after[result.outliers], color="tab:orange", label="outliers")
    ax[1].set_xlabel("pose")
    ax[1].set_ylabel("position error [mm]")
    ax[1].legend()
    fig.savefig(folder / "residuals.png", dpi=100)
    names.append("residuals.png")

    irr = result.irreducible
    cm = irr.model
    k = np.flatnonzero(irr.identified)
    scale = 1e3     # mm and mrad
    fig = Figure(figsize=(max(6, 0.3 * len(k)), 4), layout="constrained")
    ax = fig.subplots()
    ax.errorbar(np.arange(len(k)), result.errors[k] * scale, yerr=2 * result.sigma[k] * scale, fmt="o", capsize=3)
    ax.set_xticks(np.arange(len(k)), [cm.names()[i] for i in k], rotation=90)
    ax.set_ylabel("error [mm or mrad], bars: 2 sigma")
    ax.axhline(0.0, color="k", lw=0.5)
    fig.savefig(folder / "parameters.png", dpi=100)
    names.append("parameters.png")

    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    ax.hist(accuracy * 1e3, bins=30)
    ax.set_xlabel("predicted 1-sigma position error over the workspace [mm]")
    ax.set_ylabel("poses")
    fig.savefig(folder / "accuracy.png", dpi=100)
    names.append("accuracy.png")
    return names


def write_report(folder: str | Path, result: Identification, accuracy: np.ndarray, title: str,
                 provenance: dict | None = None) -> Path:
    """Write report.html and its PNG figures into folder; accuracy (N,) m: predicted position sigma at
    random workspace poses; provenance: the record of ident.outputs.provenance (shown at the end). Returns the HTML
    path."""
    folder = Path(folder)
    figs = _figures(result, accuracy, folder)
    irr = result.irreducible
    cm = irr.model
    rows = []
    for k, (nm, unit, st) in enumerate(zip(cm.names(), cm.unit(), term_status(result))):
        if st == "deleted":
            continue
        f = 1e3
        u = "mm" if unit == "m" else "mrad"
        rows.append(f"<tr><td>{html.escape(nm)}</td><td>{st}</td><td>{cm.nominal[k]:.6g} {unit}</td>"
                    f"<td>{result.errors[k] * f:.4f} {u}</td><td>{result.sigma[k] * f:.4f} {u}</td></tr>")
    outl = ", ".join(str(i) for i in result.outliers) or "none"
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60em}} td,th{{padding:2px 8px;text-align:right}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{len(result.residual_after)} poses, {irr.measure} measurements{' (relative)' if irr.relative else ''};
{irr.count} identified parameters (strategy {irr.strategy}).</p>
<ul><li>RMS position error before: {result.rms_before * 1e3:.4f} mm</li>
<li>RMS position error after: {result.rms_after * 1e3:.4f} mm</li>
<li>measurement noise estimate: {result.noise * 1e3:.4f} mm</li>
<li>predicted position accuracy over the workspace: mean {np.mean(accuracy) * 1e3:.4f} mm,
max {np.max(accuracy) * 1e3:.4f} mm (1 sigma)</li>
<li>outliers (residual above {result.threshold * 1e3:.4g} mm, 3 times the larger of the noise estimate and
the stated measurement noise): {outl}</li></ul>
{''.join(f'<p><img src="{f}" alt="{f}"></p>' for f in figs)}
<h2>Parameters</h2>
<table><tr><th>term</th><th>status</th><th>nominal</th><th>error</th><th>sigma</th></tr>
{''.join(rows)}</table>{'' if provenance is None else provenance_section(provenance)}</body></html>
"""
    out = folder / "report.html"
    out.write_text(page, encoding="utf-8")
    return out
