"""Model files: a model loaded by name, from TOML (docs/reference/model-file.md) or from a URDF, every failure
naming the file and the dotted field."""
from __future__ import annotations

import dataclasses
import math
import tomllib
from importlib import resources
from pathlib import Path

import numpy as np

from ident.model import spatial, urdf
from ident.model.robot import (MAX_ABS, MAX_MODEL_BYTES, PRISMATIC, REVOLUTE, SHIPPED_DIR, JointSpec, Model,
                               ModelError, build_model)


# ---------------------------------------------------------------------------------------------------
# TOML

class _Fields:
    """Typed access to a parsed TOML table; every failure names the file and the dotted field."""

    def __init__(self, source: str, table: dict, prefix: str):
        self.source, self.table, self.prefix = source, table, prefix

    def _field(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def has(self, key: str) -> bool:
        return key in self.table

    def only(self, known: tuple[str, ...]) -> None:
        """Refuse a key outside `known`: a misspelt key would otherwise be ignored and its default used."""
        for key in self.table:
            if key not in known:
                raise ModelError(self.source, self._field(key),
                                 "one of the keys " + ", ".join(known) + " (this key is unknown)")

    def sub(self, key: str, required: bool = False) -> "_Fields":
        value = self.table.get(key, None)
        if value is None:
            if required:
                raise ModelError(self.source, self._field(key), "a table")
            value = {}
        if not isinstance(value, dict):
            raise ModelError(self.source, self._field(key), "a table", value)
        return _Fields(self.source, value, self._field(key))

    def number(self, key: str, default: float | None = None, minimum: float | None = None,
               positive: bool = False, bound: float = MAX_ABS) -> float:
        if key not in self.table:
            if default is None:
                raise ModelError(self.source, self._field(key), "a number (required)")
            return default
        v = self.table[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ModelError(self.source, self._field(key), "a finite number", v)
        if abs(v) > bound:
            raise ModelError(self.source, self._field(key), f"a number within +-{bound:g} (SI units)", v)
        if positive and not v > 0:
            raise ModelError(self.source, self._field(key), "a positive number", v)
        if minimum is not None and v < minimum:
            raise ModelError(self.source, self._field(key), f"a number >= {minimum}", v)
        return float(v)

    def vector(self, key: str, length: int, default=None, bound: float = MAX_ABS) -> np.ndarray:
        if key not in self.table:
            if default is None:
                raise ModelError(self.source, self._field(key), f"a list of {length} numbers (required)")
            return np.asarray(default, dtype=float)
        v = self.table[key]
        ok = isinstance(v, list) and len(v) == length and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) <= bound
            for x in v)
        if not ok:
            within = "" if bound == math.inf else f" within +-{bound:g}"
            raise ModelError(self.source, self._field(key), f"a list of {length} finite numbers{within}", v)
        return np.asarray(v, dtype=float)

    def text(self, key: str, default: str | None = None, choices: tuple[str, ...] | None = None) -> str:
        if key not in self.table:
            if default is None:
                raise ModelError(self.source, self._field(key), "a string (required)")
            return default
        v = self.table[key]
        if not isinstance(v, str) or (choices and v not in choices):
            want = "one of " + ", ".join(repr(c) for c in choices) if choices else "a string"
            raise ModelError(self.source, self._field(key), want, v)
        return v


# the keys of each table (docs/reference/model-file.md); anything else is refused by _Fields.only
_TOP_KEYS = ("robot", "joint")
_ROBOT_KEYS = ("name", "gravity", "flange", "rated_payload")
_URDF_ROBOT_KEYS = _ROBOT_KEYS + ("urdf", "base", "tip")
_FRAME_KEYS = ("xyz", "rpy")
_JOINT_KEYS = ("name", "type", "dh", "origin", "axis", "link", "drive", "limits")
_URDF_JOINT_KEYS = ("name", "drive", "limits")
_DH_KEYS = ("alpha", "d", "theta", "r")
_LINK_KEYS = ("mass", "com", "inertia_com", "inertia_origin")
_DRIVE_KEYS = ("Ia", "fc", "fv", "offset", "gear_ratio", "torque_constant")
_LIMIT_KEYS = ("q", "qd", "qdd", "tau")


def _read_frame(f: _Fields) -> tuple[np.ndarray, np.ndarray]:
    f.only(_FRAME_KEYS)
    return spatial.rpy_to_matrix(f.vector("rpy", 3, [0, 0, 0])), f.vector("xyz", 3, [0, 0, 0])


def _read_link(f: _Fields, source: str) -> np.ndarray:
    f.only(_LINK_KEYS)
    mass = f.number("mass", minimum=0.0)
    com = f.vector("com", 3, [0, 0, 0])
    if f.has("inertia_com") == f.has("inertia_origin"):
        raise ModelError(source, f"{f.prefix}.inertia_com", "exactly one of inertia_com or inertia_origin")
    if f.has("inertia_com"):
        chi = spatial.body_parameters(mass, com, spatial.inertia_matrix(f.vector("inertia_com", 6)))
    else:
        chi = np.concatenate([f.vector("inertia_origin", 6), mass * com, [mass]])
    ok, why = spatial.is_physically_consistent(chi)
    if not ok:
        raise ModelError(source, f.prefix, "a physically consistent body", why)
    return chi


def _read_drive(spec: JointSpec, f: _Fields) -> None:
    f.only(_DRIVE_KEYS)
    spec.drive = np.array([f.number("Ia", spec.drive[0], minimum=0.0), f.number("fc", spec.drive[1], minimum=0.0),
                           f.number("fv", spec.drive[2], minimum=0.0), f.number("offset", spec.drive[3])])
    spec.gear_ratio = f.number("gear_ratio", spec.gear_ratio)
    if spec.gear_ratio == 0.0:
        raise ModelError(f.source, f"{f.prefix}.gear_ratio", "a non-zero number", 0)
    spec.torque_constant = f.number("torque_constant", spec.torque_constant, positive=True)


def _read_limits(spec: JointSpec, f: _Fields, required: bool) -> None:
    def get(key, default):   # limits may be huge: 1e16 is how many files say "none"
        return f.number(key, None if required else default, positive=True, bound=math.inf)
    f.only(_LIMIT_KEYS)
    if required or f.has("q"):
        lo, hi = f.vector("q", 2, bound=math.inf)
        if not lo < hi:
            raise ModelError(f.source, f"{f.prefix}.q", "[min, max] with min < max", [lo, hi])
        spec.q_limits = (float(lo), float(hi))
    spec.qd_max = get("qd", spec.qd_max)
    spec.qdd_max = get("qdd", spec.qdd_max)
    spec.tau_max = get("tau", spec.tau_max)


def _joint_from_toml(f: _Fields, index: int, source: str) -> JointSpec:
    f.only(_JOINT_KEYS)
    jtype = {"revolute": REVOLUTE, "prismatic": PRISMATIC}[
        f.text("type", choices=("revolute", "prismatic"))]
    name = f.text("name", default=f"joint{index + 1}")
    if f.has("dh") == f.has("origin"):
        raise ModelError(source, f"{f.prefix}.dh", "exactly one of a [dh] table or an [origin] table")
    if f.has("dh"):
        d = f.sub("dh")
        d.only(_DH_KEYS)
        dh = (d.number("alpha", 0.0), d.number("d", 0.0), d.number("theta", 0.0), d.number("r", 0.0))
        R, p = spatial.mdh_placement(*dh)
        axis = np.array([0.0, 0.0, 1.0])
    else:
        dh = None
        R, p = _read_frame(f.sub("origin"))
        axis = f.vector("axis", 3, [0, 0, 1])
        if np.linalg.norm(axis) < 1e-9:
            raise ModelError(source, f"{f.prefix}.axis", "a non-zero vector", axis.tolist())
    spec = JointSpec(name, jtype, R, p, axis, _read_link(f.sub("link", required=True), source), dh=dh)
    _read_drive(spec, f.sub("drive"))
    _read_limits(spec, f.sub("limits", required=True), required=True)
    return spec


def _load_toml(path: Path, tip: str = "") -> Model:
    source = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ModelError(source, "(syntax)", "valid TOML", str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(source, "(file)", "a readable UTF-8 file", str(exc)) from None
    top = _Fields(source, data, "")
    top.only(_TOP_KEYS)
    robot = top.sub("robot", required=True)
    robot.only(_URDF_ROBOT_KEYS if robot.has("urdf") else _ROBOT_KEYS)
    name = robot.text("name", default=path.stem)
    gravity = robot.vector("gravity", 3, [0.0, 0.0, -9.81])
    flange_R, flange_p = _read_frame(robot.sub("flange"))
    raw_joints = data.get("joint", [])
    if not isinstance(raw_joints, list) or not all(isinstance(j, dict) for j in raw_joints):
        raise ModelError(source, "joint", "an array of tables [[joint]]")
    rated = robot.number("rated_payload", math.inf, minimum=0.0) if robot.has("rated_payload") else math.inf
    if robot.has("urdf"):
        return dataclasses.replace(_urdf_with_overrides(path, robot, raw_joints, gravity, flange_R, flange_p, name,
                                                        tip), rated_payload=rated)
    if tip:
        raise ModelError(source, "(tip)", "no tip: this model's chain ends at its [robot] flange (a tip link "
                         "applies to a URDF, or to a model file with [robot] urdf)", tip)
    specs = [_joint_from_toml(_Fields(source, j, f"joint[{i}]"), i, source) for i, j in enumerate(raw_joints)]
    return build_model(name, source, specs, gravity, flange_R, flange_p, rated)


def _urdf_with_overrides(path: Path, robot: _Fields, raw_joints: list, gravity, flange_R, flange_p,
                         name: str, tip: str = "") -> Model:
    """A URDF chain completed by drive constants and limits given per joint name in the TOML file; `tip`
    (default: [robot] tip) ends the chain."""
    source = str(path)
    urdf_path = (path.parent / robot.text("urdf")).resolve()
    specs, tip_R, tip_p, tip = urdf.read_chain(urdf_path, base=robot.text("base", ""), tip=tip or robot.text("tip", ""))
    by_name = {s.name: s for s in specs}
    for i, raw in enumerate(raw_joints):
        f = _Fields(source, raw, f"joint[{i}]")
        f.only(_URDF_JOINT_KEYS)
        jname = f.text("name")
        if jname not in by_name:
            raise ModelError(source, f"joint[{i}].name", "a movable joint of the URDF chain: " + ", ".join(by_name), jname)
        _read_drive(by_name[jname], f.sub("drive"))
        _read_limits(by_name[jname], f.sub("limits"), required=False)
    R = tip_R @ flange_R
    p = tip_R @ flange_p + tip_p
    return build_model(name, source, specs, gravity, R, p, flange_frame="flange" if robot.has("flange") else tip)


def shipped_models() -> list[str]:
    """Names of the models that ship with armid.

    Returns
    -------
    list of str
        Names `load_model` accepts in place of a path.

    Examples
    --------
    >>> from ident.model import shipped_models
    >>> shipped_models()
    ['generic6', 'puma560']
    """
    folder = resources.files("ident") / SHIPPED_DIR
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_model(path: str | Path, tip: str = "") -> Model:
    """Load a model from a TOML file, a URDF file, or a shipped model's name.

    Parameters
    ----------
    path : str or Path
        A .toml model file (docs/reference/model-file.md), a .urdf file, or the name of a shipped model such as
        "generic6" (`shipped_models`).
    tip : str, optional
        The last link of the chain (the flange frame) in a URDF, or in a model file that names one
        (`[robot] urdf`); a model file without a URDF refuses it. `Model.flange_frame` names the frame.

    Returns
    -------
    Model

    Raises
    ------
    ModelError
        An unusable input, in one line naming the file, the field and what was expected (an InputError).

    Examples
    --------
    >>> from ident.model import load_model
    >>> model = load_model("puma560")
    >>> model.name, model.n
    ('puma560', 6)
    >>> load_model("no-such-arm")
    Traceback (most recent call last):
    ...
    ident.model.robot.ModelError: no-such-arm: (name): expected a .toml or .urdf path, or a shipped model: generic6, puma560
    """
    text = str(path)
    p = Path(text)
    if p.suffix.lower() not in (".toml", ".urdf", ".xml") and not p.exists():
        if text in shipped_models():
            with resources.as_file(resources.files("ident") / SHIPPED_DIR / f"{text}.toml") as shipped:
                return _load_toml(Path(shipped), tip)
        raise ModelError(text, "(name)", "a .toml or .urdf path, or a shipped model: " + ", ".join(shipped_models()))
    if not p.is_file():
        raise ModelError(text, "(file)", "an existing file")
    size = p.stat().st_size
    if size > MAX_MODEL_BYTES:
        raise ModelError(text, "(file)", f"a model file of at most {MAX_MODEL_BYTES >> 20} MiB", f"{size} bytes")
    size = p.stat().st_size
    if size > MAX_MODEL_BYTES:
        raise ModelError(text, "(file)", f"a model file of at most {MAX_MODEL_BYTES >> 20} MiB", f"{size} bytes")
    if p.suffix.lower() == ".toml":
        return _load_toml(p, tip)
    return urdf.load_urdf(p, tip=tip)
