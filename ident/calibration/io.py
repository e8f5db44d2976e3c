"""Calibration files: pose lists and measurement CSVs in, calibrated model (TOML table, URDF) and tables out.

Measurement CSV (docs/guides/calibration.md): one pose per row, comma separated, SI units;
  n joint values (rad or m), then the measured tool point x y z (m), then optionally the tool
  orientation as a quaternion qx qy qz qw (n + 7 columns) or a rotation vector rx ry rz in rad
  (n + 6 columns). An optional first header row (any non-numeric first cell) and lines starting with #
  are skipped. A pose list (the output of `armid calibrate plan`) is the same with only the n joint values.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import tomli_w
from scipy.spatial.transform import Rotation

from ident.calibration.fit import Identification
from ident.calibration.model import KINDS, TZ, CalibrationModel
from firmware_bridge.runtime.errors import InputError
from ident.model import PRISMATIC, Model


class CalibrationFileError(InputError):
    """A calibration file that cannot be used: names the file, line and column."""


@dataclass(frozen=True)
class Measurements:
    """q (N, n) joint values; positions (N, 3) m; orientations (N, 3, 3) or None; source file; lines (N,)
    the file line of each pose."""

    q: np.ndarray
    positions: np.ndarray
    orientations: np.ndarray | None
    source: str
    lines: np.ndarray


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, cells) of the data rows: blank and # lines skipped, a non-numeric first row is a header."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationFileError(f"{path}: cannot read ({exc})") from None
    rows = []
    for lineno, row in enumerate(csv.reader(text.splitlines()), start=1):
        cells = [c.strip() for c in row]
        if not cells or all(c == "" for c in cells) or cells[0].startswith("#"):
            continue
        rows.append((lineno, cells))
    if rows and not _is_number(rows[0][1][0]):
        rows = rows[1:]
    return rows


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


MAX_ABS = 1e3   # no joint value (rad or m), coordinate (m) or rotation (rad) of a measured arm comes near it


def _column_name(c: int, n: int, width: int) -> str:
    """The name of 0-based column c in a file of n joints and `width` columns (the module docstring)."""
    if c < n:
        return f"q{c + 1}"
    tail = ("x", "y", "z") + (("qx", "qy", "qz", "qw") if width == n + 7 else ("rx", "ry", "rz"))
    return tail[c - n] if c - n < len(tail) else f"column {c + 1}"


def _numbers(path: Path, rows, widths: tuple[int, ...], what: str, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        raise CalibrationFileError(f"{path}: no {what} rows")
    width = len(rows[0][1])
    if width not in widths:
        raise CalibrationFileError(f"{path}: line {rows[0][0]}: expected {' or '.join(map(str, widths))} columns "
                                   f"({what}), got {width}")
    out = np.empty((len(rows), width))
    for i, (lineno, cells) in enumerate(rows):
        if len(cells) != width:
            raise CalibrationFileError(f"{path}: line {lineno}: expected {width} columns like line {rows[0][0]}, "
                                       f"got {len(cells)}")
        for c, cell in enumerate(cells):
            try:
                v = float(cell)
            except ValueError:
                raise CalibrationFileError(f"{path}: line {lineno}, column {c + 1}: not a number: {cell!r}") from None
            if not math.isfinite(v):
                raise CalibrationFileError(f"{path}: line {lineno}, column {c + 1}: not finite: {cell!r}")
            if abs(v) > MAX_ABS:
                name = _column_name(c, width if n is None else n, width)
                raise CalibrationFileError(f"{path}: line {lineno}, column {c + 1} ({name}): {cell} is out of range: "
                                           f"expected |value| <= {MAX_ABS:g} (SI units: rad or m)")
            out[i, c] = v
    return out, np.array([r[0] for r in rows])


def read_poses(path: str | Path, n: int) -> np.ndarray:
    """(N, n) joint values (rad or m) from a pose list CSV."""
    path = Path(path)
    return _numbers(path, _rows(path), (n,), f"{n} joint values")[0]


def read_measurements(path: str | Path, n: int) -> Measurements:
    """Joint values and measured tool points (and orientations) from a measurement CSV.

    Parameters
    ----------
    path : str or Path
        The CSV (see the module docstring and docs/guides/calibration.md).
    n : int
        The arm's number of joints.

    Returns
    -------
    Measurements
        q (N, n), positions (N, 3) m, orientations (N, 3, 3) or None, and each pose's file line.

    Raises
    ------
    CalibrationFileError
        A file that cannot be read, or a cell that is not a number of the expected count and range, or a
        quaternion that is not of unit norm; the file, line and column are named (an InputError).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ident.calibration.io import read_measurements
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder) / "meas.csv"
    ...     _ = path.write_text("q1,q2,x,y,z" + chr(10) + "0.1,0.2,0.5,0.0,0.3" + chr(10) + "0.3,-0.1,0.4,0.1,0.3")
    ...     meas = read_measurements(path, n=2)
    ...     meas.q.tolist(), meas.positions[1].tolist(), meas.orientations, meas.lines.tolist()
    ([[0.1, 0.2], [0.3, -0.1]], [0.4, 0.1, 0.3], None, [2, 3])
    """
    path = Path(path)
    data, lines = _numbers(path, _rows(path), (n + 3, n + 6, n + 7),
                           f"{n} joint values, x y z, optionally qx qy qz qw or rx ry rz", n)
    q, p = data[:, :n], data[:, n:n + 3]
    R = None
    if data.shape[1] == n + 7:
        quat = data[:, n + 3:]
        norm = np.linalg.norm(quat, axis=1)
        bad = np.flatnonzero(np.abs(norm - 1.0) > 1e-3)
        if bad.size:
            raise CalibrationFileError(f"{path}: line {lines[bad[0]]}: the quaternion qx qy qz qw has norm "
                                       f"{norm[bad[0]]:.6g}, expected 1")
        R = Rotation.from_quat(quat / norm[:, None]).as_matrix()
    elif data.shape[1] == n + 6:
        R = Rotation.from_rotvec(data[:, n + 3:]).as_matrix()
    return Measurements(q, p, R, str(path), lines)


UNITS_FACTOR = 100.0   # measured points further from the base than this many times the arm's reach: not metres


def reach(cm: CalibrationModel) -> float:
    """An upper bound of the tool point's distance from the base (m): the chain's constant translations, the
    tool's included, and each prismatic joint's largest travel."""
    translation = (cm.kind <= TZ) & ~cm.is_joint
    travel = [max(abs(lo), abs(hi)) for lo, hi, t in zip(cm.q_min, cm.q_max, cm.joint_type) if t == PRISMATIC]
    return float(np.abs(cm.nominal[translation]).sum() + sum(x for x in travel if math.isfinite(x)))


def check_units(meas: Measurements, cm: CalibrationModel) -> None:
    """Refuse measured points that cannot be in metres: a median distance from the base more than UNITS_FACTOR
    times the arm's reach (points in mm are about 1000 times it; a tracker a few metres from the arm stays far
    below). The CalibrationFileError names the file and the column, and suggests metres."""
    arm = reach(cm)
    size = float(np.median(np.linalg.norm(meas.positions, axis=1))) if len(meas.positions) else 0.0
    if arm > 0 and size > UNITS_FACTOR * arm:
        c = int(np.argmax(np.median(np.abs(meas.positions), axis=0)))
        n = meas.q.shape[1]
        width = n + 3 + (0 if meas.orientations is None else 3)
        raise CalibrationFileError(
            f"{meas.source}: column {n + c + 1} ({_column_name(n + c, n, width)}): the measured points lie "
            f"{size:.4g} from the base (median), {size / arm:.0f} times the arm's reach of {arm:.3g} m: in mm? "
            f"Measurements are in metres (SI): divide by 1000")


def write_poses(path: str | Path, q: np.ndarray, joint_names: tuple[str, ...]) -> None:
    """Write a pose list CSV: a header of joint names, then one row of joint values per pose.

    Parameters
    ----------
    path : str or Path
        The file to write.
    q : ndarray, shape (N, n)
        The poses, rad (m for prismatic joints).
    joint_names : tuple of str
        The n joint names for the header.

    Returns
    -------
    None

    Raises
    ------
    OSError
        The file cannot be written.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from ident.calibration.io import read_poses, write_poses
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = pathlib.Path(folder) / "poses.csv"
    ...     write_poses(path, np.array([[0.1, 0.2], [0.3, 0.4]]), ("j1", "j2"))
    ...     read_poses(path, 2).tolist()
    [[0.1, 0.2], [0.3, 0.4]]
    """
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([f"{nm} [rad or m]" for nm in joint_names])
        for row in np.asarray(q):
            w.writerow([repr(float(v)) for v in row])


# ---------------------------------------------------------------------------------------------------
# Results

def term_status(result: Identification) -> list[str]:
    """'identified', 'sensor', 'fixed' or 'deleted' per term."""
    irr = result.irreducible
    return ["sensor" if s else "identified" if i else "fixed" if f else "deleted"
            for i, f, s in zip(irr.identified, irr.fixed, irr.sensor)]


def write_parameter_table(path: str | Path, result: Identification) -> None:
    """CSV: term, unit, status, nominal, error, value, sigma (m or rad)."""
    cm = result.irreducible.model
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["term", "unit", "status", "nominal", "error", "value", "sigma"])
        for k, (nm, unit, st) in enumerate(zip(cm.names(), cm.unit(), term_status(result))):
            w.writerow([nm, unit, st, repr(float(cm.nominal[k])), repr(float(result.errors[k])),
                        repr(float(result.values[k])), repr(float(result.sigma[k]))])


def write_residuals(path: str | Path, result: Identification, lines: np.ndarray) -> None:
    """CSV per pose: file line, position error before and after (m), residual x y z after (m)."""
    before = np.linalg.norm(result.residual_before, axis=1)
    after = np.linalg.norm(result.residual_after, axis=1)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["pose", "line", "error_before_m", "error_after_m", "ex_m", "ey_m", "ez_m", "outlier"])
        out = set(result.outliers.tolist())
        for i in range(len(before)):
            w.writerow([i, int(lines[i]), repr(float(before[i])), repr(float(after[i])),
                        *[repr(float(v)) for v in result.residual_after[i]], int(i in out)])


def segment_transforms(cm: CalibrationModel, values: np.ndarray) -> list[np.ndarray]:
    """(n + 1) 4x4 transforms: segment j (joint offsets of joint j+1 folded in at its end)."""
    out = []
    T = np.eye(4)
    for k in range(cm.m):
        v = values[k]
        if cm.is_joint[k]:
            E = _elementary(cm.kind[k], v)
            out.append(T @ E)
            T = np.eye(4)
            continue
        T = T @ _elementary(cm.kind[k], v)
    out.append(T)
    return out


def _elementary(kind: int, v: float) -> np.ndarray:
    E = np.eye(4)
    a = kind % 3
    if kind < 3:
        E[a, 3] = v
    else:
        E[:3, :3] = Rotation.from_rotvec(np.eye(3)[a] * v).as_matrix()
    return E


def calibrated_urdf(cm: CalibrationModel, values: np.ndarray, model: Model | None = None) -> str:
    """URDF text of the calibrated chain: links base_link, link1..linkn, tool; each joint's origin is the
    identified segment before it (offset included), its axis z; the tool frame is a fixed joint."""
    robot = ET.Element("robot", name=f"{cm.name}_calibrated")
    segs = segment_transforms(cm, values)
    links = ["base_link"] + [f"link{j + 1}" for j in range(cm.n)] + ["tool"]
    for name in links:
        ET.SubElement(robot, "link", name=name)
    for j in range(cm.n + 1):
        T = segs[j]
        last = j == cm.n
        jname = "tool_joint" if last else cm.joint_names[j]
        jtype = "fixed" if last else ("prismatic" if cm.joint_type[j] == PRISMATIC else "revolute")
        el = ET.SubElement(robot, "joint", name=jname, type=jtype)
        ET.SubElement(el, "parent", link=links[j])
        ET.SubElement(el, "child", link=links[j + 1])
        rpy = Rotation.from_matrix(T[:3, :3]).as_euler("xyz")
        ET.SubElement(el, "origin", xyz=" ".join(repr(float(v)) for v in T[:3, 3]),
                      rpy=" ".join(repr(float(v)) for v in rpy))
        if not last:
            ET.SubElement(el, "axis", xyz="0 0 1")
            lo, hi = cm.q_min[j], cm.q_max[j]
            limit = {"effort": repr(float(model.tau_max[j])) if model is not None and np.isfinite(model.tau_max[j]) else "0",
                     "velocity": repr(float(model.qd_max[j])) if model is not None and np.isfinite(model.qd_max[j]) else "0"}
            if np.isfinite(lo) and np.isfinite(hi):
                limit.update(lower=repr(float(lo)), upper=repr(float(hi)))
            ET.SubElement(el, "limit", **limit)
    ET.indent(robot)
    return '<?xml version="1.0"?>\n' + ET.tostring(robot, encoding="unicode") + "\n"


def calibration_toml(result: Identification, model: Model | None, tool: np.ndarray, initial: str = "nominal",
                     provenance: dict | None = None) -> str:
    """The calibrated model as TOML: the nominal modified-DH table (when the model has one) and every term
    with its nominal value, error, value, sigma and status (SI units). initial: where the chain's nominal
    values came from ('nominal' model geometry or 'axis fit'). provenance: the provenance record
    (ident.outputs.provenance.provenance), written as the table [provenance] without its null entries."""
    irr = result.irreducible
    cm = irr.model
    doc: dict = {"calibration": {
        "model": cm.name, "source": model.source if model is not None else "", "tool": [float(v) for v in tool],
        "tool_frame": model.flange_frame if model is not None else "flange",
        "initial": initial, "measure": irr.measure, "relative": irr.relative, "strategy": irr.strategy, "parameters": irr.count,
        "rms_before_m": result.rms_before, "rms_after_m": result.rms_after, "noise_m": result.noise,
        "outlier_threshold_m": result.threshold, "poses": int(len(result.residual_after)), "outliers": [int(i) for i in result.outliers]}}
    if provenance is not None:
        from ident.outputs.provenance import for_toml

        doc["provenance"] = for_toml(provenance)
    if model is not None and model.dh is not None:
        doc["nominal_dh"] = [{"joint": nm, "alpha": float(a), "d": float(d), "theta": float(t), "r": float(r)}
                             for nm, (a, d, t, r) in zip(model.joint_names, model.dh)]
    doc["term"] = [{"name": nm, "kind": KINDS[cm.kind[k]], "segment": int(cm.segment[k]),
                    "joint": int(cm.joint[k]) + 1 if cm.joint[k] >= 0 else 0, "unit": unit, "status": st,
                    "nominal": float(cm.nominal[k]), "error": float(result.errors[k]), "value": float(result.values[k]),
                    "sigma": float(result.sigma[k])}
                   for k, (nm, unit, st) in enumerate(zip(cm.names(), cm.unit(), term_status(result)))]
    header = ("# Calibrated kinematic model (armid calibrate identify). SI units: m, rad.\n"
              "# The chain is the product of the terms in order; joint terms are Rz(q + value) or Tz(q + value).\n"
              "# status: identified, sensor (relative measurements), fixed (kept at nominal) or deleted (zero).\n")
    return header + tomli_w.dumps(doc)
