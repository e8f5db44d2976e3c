"""The identification report: report.html with PNG plots (matplotlib, Agg, no pyplot state).

Plots: measured vs predicted torque per joint, residuals, validation (when given; with the reference model's
prediction beside the identified model's when a reference is given), the excitation trajectory, the relative
standard deviation of every base parameter and, with a reference model, each base parameter's difference from
the reference in units of its std. Tables: the fit per joint, the base parameters with sigma % (badly identified
ones flagged), the comparison with the reference model (flagged beyond 3 sigma), drive gains, the consistent
standard parameters when computed, and the provenance (armid version, UTC time, command line, input files
with their SHA-256) from the same record as result.json's.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from ident.fit.batch import Identification
from ident.outputs.reference import REFERENCE_SIGMA, ReferenceComparison
from ident.outputs.report_html import provenance_section
from ident.outputs.report_html import table as _table
from ident.outputs.results import BADLY_IDENTIFIED_PCT, losses_note

PNG_DPI = 90


def _figure(rows: int, height: float = 1.7):
    from ident.extras import require

    Figure = require("matplotlib.figure", "the report's plots").Figure   # Agg canvas: no display, no pyplot state

    size = 0.8 + height * rows
    fig = Figure(figsize=(9.0, size))     # fixed margins: constrained layout costs seconds per figure
    fig.subplots_adjust(left=0.1, right=0.98, top=1 - 0.35 / size, bottom=0.45 / size, hspace=0.12)
    return fig, fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]


def _joint_plot(path: Path, t: np.ndarray, series: list[tuple[np.ndarray, str, dict]], names, ylabel: str,
                title: str) -> Path:
    fig, axes = _figure(len(names))
    for j, ax in enumerate(axes):
        for y, label, style in series:
            ax.plot(t, y[:, j], label=label, **style)
        ax.set_ylabel(f"{names[j]}\n{ylabel}")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize="small", ncols=len(series))
    axes[0].set_title(title)
    axes[-1].set_xlabel("time (s)")
    fig.savefig(path, dpi=PNG_DPI)
    return path


def _sigma_plot(path: Path, names: list[str], pct: np.ndarray) -> Path:
    from ident.extras import require

    Figure = require("matplotlib.figure", "the report's plots").Figure

    fig = Figure(figsize=(9.0, 3.4))
    fig.subplots_adjust(left=0.08, right=0.99, top=0.9, bottom=0.25)
    ax = fig.subplots()
    shown = np.clip(np.where(np.isfinite(pct), pct, 1e4), 1e-3, 1e4)
    colors = ["tab:red" if not p <= BADLY_IDENTIFIED_PCT else "tab:blue" for p in pct]
    ax.bar(np.arange(len(names)), shown, color=colors)
    ax.axhline(BADLY_IDENTIFIED_PCT, color="tab:red", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(names)), names, rotation=90, fontsize=7)
    ax.set_ylabel("relative std (%)")
    ax.set_title(f"base parameters: relative standard deviation (red: above {BADLY_IDENTIFIED_PCT:g} %)")
    fig.savefig(path, dpi=PNG_DPI)
    return path


def _reference_plot(path: Path, c: ReferenceComparison) -> Path:
    """Each base parameter's (identified - reference) / std, with its +-REFERENCE_SIGMA bar."""
    from ident.extras import require

    Figure = require("matplotlib.figure", "the report's plots").Figure

    fig = Figure(figsize=(9.0, 3.4))
    fig.subplots_adjust(left=0.08, right=0.99, top=0.9, bottom=0.25)
    ax = fig.subplots()
    x = np.arange(len(c.names))
    limit = max(4 * REFERENCE_SIGMA, 1.0)
    z = np.clip(np.nan_to_num(c.sigma_difference, nan=0.0, posinf=limit, neginf=-limit), -limit, limit)
    for flagged, colour in ((False, "tab:blue"), (True, "tab:red")):
        k = c.flagged == flagged
        ax.errorbar(x[k], z[k], yerr=REFERENCE_SIGMA, fmt="o", ms=3, capsize=2, color=colour, lw=0.8)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(x, c.names, rotation=90, fontsize=7)
    ax.set_ylabel("(identified - reference) / std")
    ax.set_title(f"identified vs reference {c.model_name}: bars +-{REFERENCE_SIGMA:g} std (red: reference "
                 f"outside them; clipped at +-{limit:g})")
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=PNG_DPI)
    return path


def write_plots(ident: Identification, out: str | Path,
                reference: ReferenceComparison | None = None) -> dict[str, Path]:
    """Write the PNG plots into out; returns {name: path}. With a reference comparison, also reference.png and
    the reference model's torque on the validation plot."""
    out = Path(out)
    names = list(ident.model.joint_names)
    rows, fit = ident.rows, ident.fit
    predicted = rows.W @ fit.beta
    measured = ident.torque
    plots = {
        "torque": _joint_plot(out / "torque.png", rows.t, [(measured, "measured (filtered rows)", {"lw": 1.2}),
                                                          (predicted, "predicted (WLS)", {"lw": 1.0, "ls": "--"})],
                              names, "N m", f"identification data ({Path(rows.source).name}): torque"),
        "residuals": _joint_plot(out / "residuals.png", rows.t,
                                 [(measured - predicted, "measured - predicted", {"lw": 0.8, "color": "tab:red"})],
                                 names, "N m", "residuals (rows below the slow-velocity threshold included)"),
        "trajectory": _joint_plot(out / "trajectory.png", rows.t, [(rows.q, "q (rad)", {"lw": 1.0}),
                                                                  (rows.qd, "qd (rad/s)", {"lw": 0.8})],
                                  names, "", "excitation trajectory (recorded, filtered)"),
        "sigma": _sigma_plot(out / "sigma.png", ident.base.names, fit.relative_std_pct),
    }
    if reference is not None:
        plots["reference"] = _reference_plot(out / "reference.png", reference)
    if ident.validation is not None:
        v = ident.validation
        series = [(v.rows.in_torque(ident.gains) if ident.gains is not None else v.rows.y, "measured", {"lw": 1.2}),
                  (v.predicted, "predicted (identified)", {"lw": 1.0, "ls": "--"})]
        if reference is not None:
            series.append((v.rows.W @ reference.reference, f"predicted ({reference.model_name})",
                           {"lw": 0.9, "ls": ":"}))
        plots["validation"] = _joint_plot(out / "validation.png", v.rows.t, series, names, "N m",
                                          f"validation ({Path(v.rows.source).name}): torque")
    return plots


def _g(x: float, digits: int = 4) -> str:
    return "&mdash;" if x is None or not np.isfinite(x) else f"{x:.{digits}g}"


_STYLE = """body{font-family:system-ui,sans-serif;max-width:1000px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f0f0f0}tr.bad td{background:#fde8e8}td.l{text-align:left}img{max-width:100%}
.note{background:#fff7dd;padding:.5em 1em;border-left:4px solid #e0b000}
.warn{background:#fde8e8;padding:.5em 1em;border-left:4px solid #c00000}"""


def _reference_section(c: ReferenceComparison) -> list[str]:
    rows = [[html.escape(n), _g(v, 6), _g(s, 3), _g(r, 6), _g(z, 4),
             f"beyond {REFERENCE_SIGMA:g} sigma" if f else ""]
            for n, v, s, r, z, f in zip(c.names, c.identified, c.std, c.reference, c.sigma_difference, c.flagged)]
    return [f"<h2>Comparison with the reference model {html.escape(c.model_name)}</h2>",
            f"<p>{c.within} of {len(c.names)} base parameters within {REFERENCE_SIGMA:g} identified standard "
            f"deviations of the reference model's. Difference in sigma: (identified - reference) / std.</p>",
            '<img src="reference.png" alt="identified vs reference">',
            _table(["name", "identified", "std", "reference", "difference (sigma)", "flag"], rows,
                   ["bad" if f else "" for f in c.flagged], table_id="reference-comparison")]


def write_html(ident: Identification, out: str | Path, plots: dict[str, Path],
               reference: ReferenceComparison | None = None, provenance: dict | None = None) -> Path:
    """Write report.html into out, referring to the PNG plots by file name; with the comparison with a reference
    model and the provenance record (ident.outputs.provenance.provenance) when given."""
    out = Path(out)
    fit, rows, model = ident.fit, ident.rows, ident.model
    pct = fit.relative_std_pct
    bad = [not p <= BADLY_IDENTIFIED_PCT for p in pct]
    losses = losses_note(rows)
    parts = [f"<h1>Identification of {html.escape(model.name)}</h1>",
             f"<p>Data <code>{html.escape(rows.source)}</code>: {rows.samples} samples at {rows.rate_hz:g} Hz "
             f"({rows.kind}){', ' + html.escape(rows.gaps_note()) if rows.gaps_note() else ''}"
             f"{'; ' + html.escape(losses) if losses else ''}; cut-off {rows.cutoff_hz:.3g} Hz, decimation {rows.factor}, "
             f"{len(rows.t)} rows, "
             f"rows slower than {ident.slow_velocity:g} rad/s left out. Weighted least squares (Gautier's weights): "
             f"condition number {fit.cond:.4g}; {sum(bad)} of {len(bad)} base parameters above "
             f"{BADLY_IDENTIFIED_PCT:g} % relative standard deviation. Bandwidth {rows.bandwidth_hz:.4g} Hz "
             f"({html.escape(rows.bandwidth_source)}).</p>"]
    if ident.warnings:
        items = "".join(f"<li>{html.escape(w)}</li>" for w in ident.warnings)
        parts.append(f'<div class="warn"><b>Warnings: this result may be wrong.</b><ul>{items}</ul></div>')
    if ident.scale_note:
        parts.append(f'<p class="note">Scale: {html.escape(ident.scale_note)}.</p>')
    joint_rows = []
    for j, name in enumerate(model.joint_names):
        measured = ident.residual_rms_measured
        r = [html.escape(name), _g(fit.sigma_joint[j]), _g(fit.residual_rms[j]),
             _g(measured[j]) if measured is not None else "&mdash;", str(int(fit.rows[j]))]
        if ident.validation is not None:
            v = ident.validation
            r += [_g(v.rms[j]), f"{100 * v.relative[j]:.2f} %"]
            r += ([_g(v.rms_measured[j]), f"{100 * v.relative_measured[j]:.2f} %"] if v.rms_measured is not None
                  else ["&mdash;", "&mdash;"])
        if ident.gains is not None:
            r += [_g(ident.gains[j], 6) + ("" if ident.gains_std is None else f" &plusmn; {_g(ident.gains_std[j], 2)}")]
        joint_rows.append(r)
    header = ["joint", "sigma_j (N m)", "residual RMS vs filtered rows (N m)",
              "residual RMS vs measured torque (N m)", "rows used"]
    if ident.validation is not None:
        header += ["validation RMS vs filtered rows (N m)", "relative", "validation RMS vs measured torque (N m)",
                   "relative"]
    if ident.gains is not None:
        header += ["drive gain (N m/A)" + (" identified" if ident.gains_std is not None else " nominal")]
    parts += ["<h2>Fit per joint</h2>", _table(header, joint_rows),
              "<p>Against the filtered rows: the torques low-pass filtered and decimated as the regressor was (what "
              "the fit sees). Against the measured torque: the recorded torque at the same samples, not filtered "
              "(sensor noise included: the error a user of the model sees).</p>"]
    parts += ['<h2>Measured and predicted torque</h2><img src="torque.png" alt="torque">',
              '<img src="residuals.png" alt="residuals">']
    if "validation" in plots:
        parts.append('<h2>Validation</h2><img src="validation.png" alt="validation">')
    param_rows = [[html.escape(n), _g(v, 6), _g(s, 3), ("&infin;" if not np.isfinite(p) else f"{p:.2f}")
                   + (" &#9888;" if b else ""), f'<span class="l">{html.escape(e)}</span>']
                  for n, v, s, p, b, e in zip(ident.base.names, fit.beta, fit.std, pct, bad, ident.base.expressions)]
    parts += ["<h2>Base parameters</h2>", '<img src="sigma.png" alt="relative standard deviations">',
              _table(["name", "value (SI)", "std", "sigma %", "definition"], param_rows,
                     ["bad" if b else "" for b in bad])]
    if reference is not None:
        parts += _reference_section(reference)
    if ident.consistent is not None:
        c = ident.consistent
        P = c.chi.reshape(model.n, -1)
        std_rows = [[html.escape(model.joint_names[j])] + [_g(x, 5) for x in P[j]] for j in range(model.n)]
        parts += [f"<h2>Physically consistent standard parameters</h2><p>Solver: {html.escape(c.status)}; the "
                  f"weighted fit is worse than WLS by chi&sup2; {c.chi2_increase:.3g}.</p>",
                  _table(["joint", "XX", "XY", "XZ", "YY", "YZ", "ZZ", "mX", "mY", "mZ", "m", "Ia", "fc", "fv",
                          "offset"], std_rows)]
    parts.append('<h2>Excitation trajectory</h2><img src="trajectory.png" alt="trajectory">')
    if provenance is not None:
        parts.append(provenance_section(provenance))
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>armid identification: "
            f"{html.escape(model.name)}</title><style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
    path = out / "report.html"
    path.write_text(page)
    return path


def write_report(ident: Identification, out: str | Path, *, reference: ReferenceComparison | None = None,
                 provenance: dict | None = None) -> Path:
    """Write report.html and its PNG plots into the directory out (created).

    Parameters
    ----------
    ident : Identification
        The identification to report.
    out : str or Path
        The output directory.
    reference : ReferenceComparison, optional
        The comparison with a reference model (ident.outputs.reference.compare_with_reference): a table, a plot and the
        reference model's torque on the validation plot.
    provenance : dict, optional
        The provenance record (ident.outputs.provenance.provenance) that result.json holds too.

    Returns
    -------
    Path
        report.html.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return write_html(ident, out, write_plots(ident, out, reference), reference, provenance)
