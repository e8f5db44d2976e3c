"""What `armid identify` writes: result.json (docs/reference/result-file.md) and the identified model file (TOML,
docs/reference/model-file.md) that ident.model.load_model reads back to the same torques."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ident.fit.batch import Identification
from ident.fit.consistent import min_eigenvalues
from ident.model import Model
from ident.outputs.provenance import relative_path
from ident.outputs.reference import ReferenceComparison
from ident.model.spatial import rpy as _rpy

FORMAT = "armid-identification/1"
BADLY_IDENTIFIED_PCT = 10.0   # relative standard deviation above which a parameter is flagged


def _num(x: float) -> float | None:
    """JSON has no inf/NaN: those become null."""
    x = float(x)
    return x if math.isfinite(x) else None


def _nums(a) -> list:
    return [_num(v) for v in np.asarray(a, dtype=float).ravel()]


def _source(source: str, out_dir: str | Path | None) -> str:
    """A source file's name relative to out_dir when it is an existing file; else as given."""
    if out_dir is None or not Path(source).is_file():
        return source
    return relative_path(source, out_dir)


def dropped_samples(rows) -> int:
    """Samples of the recording that no fit row comes from.

    Parameters
    ----------
    rows : ident.fit.batch.Rows
        The recording's fit rows.

    Returns
    -------
    int
        The stale repeats dropped (ident.fit.resample) plus the samples in segments too short for the filters
        (Rows.unused_samples); samples bridged in are not counted.
    """
    return (0 if rows.mended is None else int(rows.mended.repeats)) + int(rows.unused_samples)


def losses_note(rows) -> str:
    """What a recording lost, in words.

    Parameters
    ----------
    rows : ident.fit.batch.Rows
        The recording's fit rows.

    Returns
    -------
    str
        "the recording reports 6 device samples lost before it; 4 of its samples dropped (...)", or "" when
        it reports none and none were dropped.
    """
    parts = []
    if rows.lost_device_samples:
        parts.append(f"the recording reports {rows.lost_device_samples} device samples lost before it")
    dropped = dropped_samples(rows)
    if dropped:
        parts.append(f"{dropped} of its samples dropped (stale repeats, segments too short)")
    return "; ".join(parts)


def result_document(ident: Identification, out_dir: str | Path | None = None,
                    provenance: dict | None = None, reference: ReferenceComparison | None = None) -> dict:
    """The content of result.json as plain Python values (SI units). Source files are named relative to
    out_dir when given; provenance (ident.outputs.provenance.provenance) is stored as it is; a comparison with a
    reference model (ident.outputs.reference.compare_with_reference) as the block "reference"."""
    fit, base, rows = ident.fit, ident.base, ident.rows
    rel = fit.relative_std_pct
    doc: dict = {
        "format": FORMAT,
        "provenance": provenance,
        "model": {"name": ident.model.name, "source": _source(ident.model.source, out_dir), "joints": list(ident.model.joint_names)},
        "data": {"source": _source(rows.source, out_dir), "kind": rows.kind, "samples": rows.samples, "rate_hz": rows.rate_hz,
                 "bandwidth_hz": rows.bandwidth_hz, "bandwidth_from": rows.bandwidth_source,
                 "resampling": None if rows.mended is None else rows.mended.as_dict(),
                 "cutoff_hz": rows.cutoff_hz, "effort_delay_s": rows.effort_delay, "segments": rows.segments,
                 "unused_samples": rows.unused_samples, "bridged_samples": rows.bridged_samples,
                 "late_windows_s": [] if rows.late_cut is None else [[_num(a), _num(b)]
                                                                     for a, b in rows.late_cut.windows],
                 "late_cut_samples": 0 if rows.late_cut is None else int(rows.late_cut.samples),
                 "lost_device_samples": rows.lost_device_samples, "dropped_samples": dropped_samples(rows), "decimation": rows.factor, "rows": int(len(rows.t)),
                 "rows_used_per_joint": [int(r) for r in fit.rows], "slow_velocity_rad_s": ident.slow_velocity},
        "base_parameters": [
            {"name": name, "expression": expr, "value": _num(v), "std": _num(s), "relative_std_pct": _num(r),
             "badly_identified": bool(not r <= BADLY_IDENTIFIED_PCT)}
            for name, expr, v, s, r in zip(base.names, base.expressions, fit.beta, fit.std, rel)],
        "fit": {"method": "wls", "cond": _num(fit.cond), "sigma_joint": _nums(fit.sigma_joint),
                "residual_rms": _nums(fit.residual_rms), "ols_residual_rms": _nums(ident.ols.residual_rms),
                "residual_rms_measured": None if ident.residual_rms_measured is None
                else _nums(ident.residual_rms_measured), "units": "N m",
                "near_rest_friction": None if ident.near_rest is None
                else {"excess": _nums(ident.near_rest[0]), "velocity": _nums(ident.near_rest[1]),
                      "units": ["N m", "rad/s"]}},
        "warnings": list(ident.warnings),
        "seconds": {k: round(v, 4) for k, v in ident.seconds.items()},
    }
    if ident.gains is not None:
        doc["drive_gains"] = {"values": _nums(ident.gains), "unit": "N m/A",
                              "identified": ident.gains_std is not None,
                              "std": None if ident.gains_std is None else _nums(ident.gains_std),
                              "scale": ident.scale_note}
    if ident.consistent is not None:
        c = ident.consistent
        doc["standard_parameters"] = {
            "names": ident.model.parameter_names(), "values": _nums(c.chi),
            "base_projection": _nums(c.beta), "chi2_increase": _num(c.chi2_increase), "solver_status": c.status,
            "min_pseudo_inertia_eigenvalue": _nums(min_eigenvalues(c.chi, ident.model.n))}
    if ident.validation is not None:
        v = ident.validation
        doc["validation"] = {"source": _source(v.rows.source, out_dir), "rows": int(len(v.rows.t)), "rms": _nums(v.rms),
                             "relative": _nums(v.relative),
                             "rms_measured": None if v.rms_measured is None else _nums(v.rms_measured),
                             "relative_measured": None if v.relative_measured is None else _nums(v.relative_measured),
                             "units": "N m"}
    if reference is not None:
        doc["reference"] = {"model": reference.model_name, "values": _nums(reference.reference),
                            "sigma_difference": _nums(reference.sigma_difference),
                            "flagged": [bool(f) for f in reference.flagged], "within": reference.within}
    if ident.trajectory is not None:
        t = ident.trajectory
        doc["trajectory"] = {"base_frequency": t.base_frequency, "harmonics": t.harmonics}
    return doc


def write_result(ident: Identification, path: str | Path, provenance: dict | None = None,
                 reference: ReferenceComparison | None = None) -> Path:
    """Write result.json (with its provenance block, ident.outputs.provenance.provenance, and the comparison with a
    reference model when given; source paths relative to its directory); returns its path."""
    path = Path(path)
    doc = result_document(ident, path.parent, provenance, reference)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
    return path


def _limit(x: float) -> float:
    return float(x) if math.isfinite(x) else math.copysign(1e300, x)


def model_document(model: Model) -> dict:
    """A model as the TOML tables of docs/reference/model-file.md (inertia about the link-frame origin, exact)."""
    joints = []
    for j in range(model.n):
        inertial = model.inertial[j]
        m = float(inertial[9])
        com = (inertial[6:9] / m).tolist() if m > 0 else [0.0, 0.0, 0.0]
        entry: dict = {"name": model.joint_names[j], "type": "revolute" if model.joint_type[j] == 0 else "prismatic"}
        if model.is_dh:
            alpha, d, theta, r = (float(x) for x in model.dh[j])
            entry["dh"] = {"alpha": alpha, "d": d, "theta": theta, "r": r}
        else:
            entry["origin"] = {"xyz": model.placement_p[j].tolist(), "rpy": _rpy(model.placement_R[j])}
            entry["axis"] = model.axis[j].tolist()
        entry["link"] = {"mass": m, "com": com, "inertia_origin": inertial[:6].tolist()}
        Ia, fc, fv, offset = (float(x) for x in model.drive[j])
        entry["drive"] = {"Ia": Ia, "fc": fc, "fv": fv, "offset": offset,
                          "gear_ratio": float(model.gear_ratio[j]), "torque_constant": float(model.torque_constant[j])}
        entry["limits"] = {"q": [_limit(model.q_min[j]), _limit(model.q_max[j])], "qd": _limit(model.qd_max[j]),
                           "qdd": _limit(model.qdd_max[j]), "tau": _limit(model.tau_max[j])}
        joints.append(entry)
    robot = {"name": model.name, "gravity": model.gravity.tolist(),
             "flange": {"xyz": model.flange_p.tolist(), "rpy": _rpy(model.flange_R)}}
    return {"robot": robot, "joint": joints}


def write_model(model: Model, path: str | Path, header: str = "") -> Path:
    """Write a model file (TOML) that ident.model.load_model reads back to the same torques."""
    import tomli_w

    path = Path(path)
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(lines + tomli_w.dumps(model_document(model)))
    return path
