"""The model the driver's observer and feed-forward use ([model] in the driver config), and where it came from.

An identified model is the model.toml that `armid identify --consistent` writes; the result.json beside it holds
the identification's residual statistics (fit.residual_rms_measured: the RMS per joint of the measured torque,
unfiltered, minus the model's over the fit's rows), from which collision thresholds may be derived
(driver/collision.py), and the friction near rest (fit.near_rest_friction) that the observer adds to the model's. A shipped model or any other model file works too; it then has no residual statistics.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from firmware_bridge.runtime.errors import InputError
from ident.model import Model, load_model

IDENTIFIED_MARK = "identified by armid"      # the first line of the header `armid identify` writes


def model_provenance(source: str, model: Model) -> dict:
    """What the log and the health say about a model: its name and file, the file's SHA-256, the header comment
    lines, whether `armid identify` wrote it, and the result.json beside it (or None)."""
    path = Path(source)
    out = {"name": model.name, "source": source, "sha256": None, "header": [], "identified": False,
           "result": None}
    if path.is_file():
        raw = path.read_bytes()
        out["sha256"] = hashlib.sha256(raw).hexdigest()
        for line in raw.decode("utf-8", "replace").splitlines():
            if not line.startswith("#"):
                break
            out["header"].append(line.lstrip("# ").rstrip())
        out["identified"] = bool(out["header"]) and out["header"][0].startswith(IDENTIFIED_MARK)
        result = path.with_name("result.json")
        if result.is_file():
            out["result"] = str(result)
    return out


def residual_rms(result_path: str | None, model: Model) -> np.ndarray | None:
    """fit.residual_rms_measured (n,) N m of the result.json at result_path, when it is of this model's joints;
    None when there is no file or the fit has no such statistics (then the thresholds' rule falls back to the
    torque limits). InputError naming the file when it is unreadable or malformed."""
    if result_path is None:
        return None
    try:
        doc = json.loads(Path(result_path).read_text())
        joints = doc["model"]["joints"]
        values = doc["fit"]["residual_rms_measured"]
        rms = None if values is None else np.asarray(values, dtype=float)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{result_path}: cannot read the residual statistics (fit.residual_rms_measured): "
                         f"{exc}") from None
    if rms is None:
        return None
    if list(joints) != list(model.joint_names) or rms.shape != (model.n,) or not np.all(np.isfinite(rms) & (rms > 0)):
        raise InputError(f"{result_path}: fit.residual_rms_measured: expected {model.n} positive numbers for the "
                         f"joints {', '.join(model.joint_names)}")
    return rms


def near_rest_friction(result_path: str | None, model: Model) -> tuple[np.ndarray, np.ndarray] | None:
    """(fs, vs) (n,) N m, rad/s: fit.near_rest_friction (excess, velocity) of the result.json at result_path, the
    friction near rest the identification found on the samples its fit left out (ident.fit.near_rest); None when
    there is no file or no such entry. InputError naming the file when it is malformed."""
    if result_path is None:
        return None
    try:
        doc = json.loads(Path(result_path).read_text())
        entry = doc["fit"].get("near_rest_friction")
        if entry is None:
            return None
        fs, vs = (np.asarray(entry[k], dtype=float) for k in ("excess", "velocity"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{result_path}: cannot read the friction near rest (fit.near_rest_friction): "
                         f"{exc}") from None
    if (fs.shape != (model.n,) or vs.shape != (model.n,) or not np.all(np.isfinite(fs) & (fs >= 0))
            or not np.all(np.isfinite(vs) & (vs > 0))):
        raise InputError(f"{result_path}: fit.near_rest_friction: expected excess (N m, >= 0) and velocity (rad/s, "
                         f"> 0) of {model.n} numbers each")
    return fs, vs


def load_watch_model(source: str, driver_model: Model) -> tuple[Model, dict]:
    """The model at `source` (a path or a shipped name) and its provenance; InputError unless it has the driver
    model's joints (the same count and names)."""
    model = load_model(source)
    if model.n != driver_model.n or tuple(model.joint_names) != tuple(driver_model.joint_names):
        raise InputError(f"model.path: {source}: joints {', '.join(model.joint_names)}; the driver's model "
                         f"{driver_model.name} has {', '.join(driver_model.joint_names)}")
    return model, model_provenance(source, model)
