"""The fleet report: fleet.html with one PNG per base parameter (its value with bars of the drift threshold over
each arm's runs, drifted runs marked), the drift found, and the failed recordings with their reasons (matplotlib's
Figure on the Agg canvas: no pyplot state, no backend change)."""
from __future__ import annotations

import html
from datetime import datetime
from pathlib import Path

import numpy as np

from ident.outputs.fleet_drift import DRIFT_SIGMA, parameter_names, safe_name
from ident.outputs.report import _STYLE, _g, _table

PNG_DPI = 80
PLOTS = "fleet_plots"


def _x(rows: list[dict]) -> tuple[list, str]:
    """x positions of the rows: their dates when every successful row has one, else the run's number per arm."""
    if all(r.get("date") for r in rows):
        return [datetime.fromisoformat(r["date"]) for r in rows], "date"
    count: dict[str, int] = {}
    xs = []
    for r in rows:
        count[r["arm_id"]] = count.get(r["arm_id"], 0) + 1
        xs.append(count[r["arm_id"]])
    return xs, "run"


def _plot(path: Path, name: str, rows: list[dict], xs: list, xlabel: str, legend: bool,
          sigma: float = DRIFT_SIGMA) -> Path:
    """Write _figure's plot of one parameter to path (PNG)."""
    _figure(name, rows, xs, xlabel, legend, sigma).savefig(path, dpi=PNG_DPI)
    return path


def _figure(name: str, rows: list[dict], xs: list, xlabel: str, legend: bool, sigma: float = DRIFT_SIGMA):
    """One parameter over the runs: a line per arm, bars of sigma (the drift threshold) standard deviations as one
    collection per arm (cheaper to draw than errorbar's caps), drifted runs ringed; the legend (arm colours) only
    when asked: the colours are the same in every plot. Dates on x get a few ticks with concise labels (matplotlib.dates), run numbers whole ones."""
    from ident.extras import require

    Figure = require("matplotlib.figure", "the fleet report's plots").Figure
    fig = Figure(figsize=(7.0, 2.4))
    fig.subplots_adjust(left=0.12, right=0.8, top=0.87, bottom=0.2)
    ax = fig.add_subplot()
    for k, arm in enumerate(dict.fromkeys(r["arm_id"] for r in rows)):
        pts = [(x, r) for x, r in zip(xs, rows) if r["arm_id"] == arm and name in r]
        if not pts:
            continue
        colour = f"C{k % 10}"
        x = [p[0] for p in pts]
        y = np.array([r[name] for _, r in pts])
        bar = sigma * np.array([r[f"{name}_std"] for _, r in pts])
        ax.plot(x, y, "o-", ms=3, lw=1, color=colour, label=str(arm))
        ax.vlines(x, y - bar, y + bar, color=colour, lw=1)
        drifted = [(xx, r[name]) for xx, r in pts if r.get(f"{name}_drift")]
        if drifted:
            ax.plot(*zip(*drifted), "o", ms=9, mfc="none", mec="red", mew=1.5)
    ax.set_title(name, fontsize=10)
    ax.set_xlabel(xlabel)
    if xlabel == "date":
        import matplotlib.dates as mdates

        locator = mdates.AutoDateLocator(minticks=3, maxticks=6)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if legend:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def write_fleet_report(rows: list[dict], out: str | Path, sigma: float = DRIFT_SIGMA) -> Path:
    """Write fleet.html and its plots (fleet_plots/NAME.png) into out from the fleet table's rows (with drift,
    ident.outputs.fleet_drift.flag_drift at the threshold sigma); returns the HTML path."""
    out = Path(out)
    (out / PLOTS).mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if r.get("status") == "ok"]
    failed = [r for r in rows if r.get("status") != "ok"]
    names = parameter_names(ok)
    drifted = [n for n in names if any(r.get(f"{n}_drift") for r in ok)]
    parts = [f"<h1>Fleet identification</h1><p>{len({r['arm_id'] for r in rows})} arms, {len(rows)} recordings: "
             f"{len(ok)} identified, {len(failed)} failed. A parameter is flagged when it moved by more than "
             f"{sigma:.3g} combined standard deviations since the arm's previous run.</p>"]
    flagged = [[html.escape(str(r["arm_id"])), html.escape(str(r["run"])), html.escape(str(r.get("previous_run"))),
                html.escape(r["drifted"].replace(";", ", "))] for r in ok if r.get("drifted")]
    parts += ["<h2>Drift</h2>", _table(["arm", "run", "since run", "parameters moved"], flagged) if flagged
              else "<p>No parameter moved by more than the bound.</p>"]
    if failed:
        parts += ["<h2>Failed recordings</h2>", _table(
            ["arm", "run", "recording", "reason"],
            [[html.escape(str(r["arm_id"])), html.escape(str(r["run"])), html.escape(str(r["recording"])),
              f'<span class="l">{html.escape(str(r["error"]))}</span>'] for r in failed])]
    quality = [[html.escape(str(r["arm_id"])), html.escape(str(r["run"])), str(r["samples"]),
                "&mdash;" if r.get("lost_device_samples") is None else str(r["lost_device_samples"]),
                str(r["dropped_samples"]), str(r["stale_repeats"]), str(r["bridged_samples"]),
                str(r["unused_samples"]), _g(r["cond"]),
                _g(r["residual_rms_max"]),
                "&mdash;" if r["validation_relative_max"] is None else f"{100 * r['validation_relative_max']:.2f} %"]
               for r in ok]
    parts += ["<h2>Runs</h2>", _table(["arm", "run", "samples", "lost device samples", "dropped", "stale repeats",
                                       "bridged", "unused", "cond", "max residual RMS (N m)",
                                       "max validation error"], quality),
              "<p>Lost device samples: what the recording says the driver never received (&mdash;: it does not "
              "say). Dropped: samples of the recording no fit row comes from (stale repeats, and unused samples in "
              "segments too short for the filters).</p>"]
    if ok:
        xs, xlabel = _x(ok)
        parts.append(f"<h2>Base parameters over the runs</h2><p>Bars: {sigma:.3g} sigma; red rings: drift "
                     "flagged. Drifted parameters first; the arms' colours (legend of the first plot) are the same in every plot.</p>")
        for k, n in enumerate(drifted + [n for n in names if n not in drifted]):
            png = _plot(out / PLOTS / f"{safe_name(n)}.png", n, ok, xs, xlabel, legend=k == 0, sigma=sigma)
            parts.append(f'<img src="{PLOTS}/{png.name}" alt="{html.escape(n)}">')
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>armid fleet identification</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
    path = out / "fleet.html"
    path.write_text(page, encoding="utf-8")
    return path
