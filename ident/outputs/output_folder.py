"""The output folder of one identification: result.json, report.html with its plots, and with a consistent fit the
identified model as model.toml, model.urdf and its sidecar (what `armid identify` writes)."""
from __future__ import annotations

import time
from pathlib import Path

from ident.fit.batch import Identification
from ident.model import Model
from ident.model.urdf_export import write_urdf
from ident.outputs import report
from ident.outputs.reference import compare_with_reference
from ident.outputs.results import write_model, write_result


def write_identification(ident: Identification, out: str | Path, source: str, *, with_report: bool = True,
                         provenance: dict | None = None, reference: Model | None = None,
                         reference_label: str | None = None) -> dict[str, Path]:
    """Write what `armid identify` writes into the directory out (created): result.json (with provenance,
    ident.outputs.provenance.provenance, when given), report.html (+ PNGs) unless with_report is false and, with a
    consistent fit, model.toml, model.urdf and model.sidecar.json (ident.model.urdf_export). source names the
    recording in model.toml's header. The report's writing is timed into result.json's seconds. With a reference
    model, result.json and report.html compare the base parameters with its (ident.outputs.reference), calling it
    reference_label (default: its `[robot] name`); the report shows the provenance record too.

    Returns
    -------
    dict
        What was written, by name ("result", "report", "model", "urdf", "urdf sidecar"): its path.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    comparison = None if reference is None else compare_with_reference(ident, reference, reference_label)
    written = {}
    if with_report:
        started = time.perf_counter()
        written["report"] = report.write_report(ident, out, reference=comparison, provenance=provenance)
        ident.seconds["report"] = time.perf_counter() - started
    written = {"result": write_result(ident, out / "result.json", provenance, comparison), **written}
    model = ident.identified_model()
    if model is not None:
        written["model"] = write_model(
            model, out / "model.toml",
            header=f"identified by armid from {source}: physically consistent standard parameters\n"
                   f"(base projection fitted by WLS; unidentifiable directions from {ident.model.source})")
        written["urdf"], written["urdf sidecar"] = write_urdf(model, out / "model.urdf")
    return written
