"""The robot description: an immutable serial-arm model, loaded from TOML or URDF.

A Model is numbers only (Pinocchio's Model/Data split): kinematic placements and axes, the standard
parameters of every link and joint, drive constants and limits. Kernels in ident.kernels read its
arrays; nothing here is evaluated per sample. The file format is documented in docs/reference/model-file.md.
"""
from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ident import spatial
from firmware_bridge.errors import QUOTE_CHARS, InputError

REVOLUTE, PRISMATIC = 0, 1
INERTIAL_NAMES = ("XX", "XY", "XZ", "YY", "YZ", "ZZ", "mX", "mY", "mZ", "m")
DRIVE_NAMES = ("Ia", "fc", "fv", "offset")
PARAMS_PER_JOINT = len(INERTIAL_NAMES) + len(DRIVE_NAMES)  # 14
SHIPPED_DIR = "models"
MAX_JOINTS = 32  # movable joints a model may have: a serial arm has 6 or 7 (a chain's base parameters take time
#                  growing with the cube of the count: `armid model show` took 40 s at 32 joints, 3 min at 64)
MAX_MODEL_BYTES = 16 << 20   # a model file (TOML or URDF) is judged from its size first: 32 joints take kilobytes
MAX_ABS = 1e9    # no number of an arm's model in SI units comes near (1e300 is a slip, and overflows the kernels);
#                  limits excepted: 1e16 is how many files say "none"


class ModelError(InputError):
    """A model file is unusable. The message names the file, the field and what was expected."""

    def __init__(self, source: str, field: str, expected: str, got: object = None):
        self.source, self.field, self.expected = source, field, expected
        got_text = repr(got)      # a file's value: quoted at most QUOTE_CHARS long, however long it is
        tail = "" if got is None else f", got {got_text[:QUOTE_CHARS]}" + (
            f"... ({len(got_text)} characters)" if len(got_text) > QUOTE_CHARS else "")
        super().__init__(f"{source}: {field}: expected {expected}{tail}")


def _frozen(a, shape=None) -> np.ndarray:
    arr = np.ascontiguousarray(np.asarray(a, dtype=np.float64))
    if shape is not None:
        arr = arr.reshape(shape)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class Model:
    """A serial arm of n joints: kinematics, standard parameters, drive constants and limits (immutable).

    Joint j moves frame j relative to frame j-1: first the fixed placement (placement_R, placement_p),
    then a rotation about (revolute) or translation along (prismatic) the unit `axis`, both given in
    frame j. Link j is rigidly attached to frame j; its 10 inertial parameters are about the origin
    of frame j, in its axes: [XX XY XZ YY YZ ZZ mX mY mZ m] (kg m^2, kg m, kg). Build one with
    `load_model`; `with_parameters` returns a copy with other standard parameters.

    Parameters
    ----------
    name, source : str
        The model's name and the file it came from (for messages).
    joint_names : tuple of str
        One per joint.
    joint_type : ndarray of int, shape (n,)
        0 revolute, 1 prismatic.
    placement_R, placement_p : ndarray, shape (n, 3, 3) and (n, 3)
        Frame j in frame j-1 before the joint moves (rotation; position in m).
    axis : ndarray, shape (n, 3)
        Unit joint axes in frame j.
    inertial : ndarray, shape (n, 10)
        Standard inertial parameters per link, [XX XY XZ YY YZ ZZ mX mY mZ m].
    drive : ndarray, shape (n, 4)
        Ia (kg m^2), fc (N m), fv (N m s/rad), offset (N m) per joint.
    gear_ratio, torque_constant : ndarray, shape (n,)
        Motor turns per joint turn; motor N m per A.
    q_min, q_max, qd_max, qdd_max, tau_max : ndarray, shape (n,)
        Limits: rad, rad/s, rad/s^2, N m (m, m/s, m/s^2, N for prismatic joints); inf where none.
    gravity : ndarray, shape (3,)
        m/s^2 in the base frame.
    flange_R, flange_p : ndarray, shape (3, 3) and (3,)
        The flange frame in frame n.
    dh : ndarray, shape (n, 4), optional
        alpha, d, theta, r when the model is modified DH.
    rated_payload : float
        kg: the heaviest payload the arm is rated for (inf when not stated).
    flange_frame : str
        The flange frame's name: a URDF chain's tip link, or "flange".

    Examples
    --------
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> model.n, model.joint_names[0], model.is_dh
    (6, 'j1', True)
    >>> chi = model.standard_parameters()
    >>> chi.shape, model.parameter_names()[:3], model.parameter_names()[-1]
    ((84,), ['XX1', 'XY1', 'XZ1'], 'offset6')
    >>> heavier = model.with_parameters(chi * 2)
    >>> float(heavier.standard_parameters()[9] / chi[9])             # m1 doubled; model unchanged
    2.0
    """

    name: str
    source: str
    joint_names: tuple[str, ...]
    joint_type: np.ndarray      # (n,) int: 0 revolute, 1 prismatic
    placement_R: np.ndarray     # (n, 3, 3)
    placement_p: np.ndarray     # (n, 3) m
    axis: np.ndarray            # (n, 3) unit vectors in frame j
    inertial: np.ndarray        # (n, 10) standard inertial parameters
    drive: np.ndarray           # (n, 4) Ia [kg m^2], fc [N m], fv [N m s/rad], offset [N m]
    gear_ratio: np.ndarray      # (n,) motor turns per joint turn
    torque_constant: np.ndarray # (n,) motor N m per A
    q_min: np.ndarray           # (n,) rad or m
    q_max: np.ndarray
    qd_max: np.ndarray          # rad/s or m/s
    qdd_max: np.ndarray         # rad/s^2 or m/s^2
    tau_max: np.ndarray         # N m or N
    gravity: np.ndarray         # (3,) m/s^2 in the base frame
    flange_R: np.ndarray        # (3, 3) flange frame in frame n
    flange_p: np.ndarray        # (3,)
    dh: np.ndarray | None = None  # (n, 4) alpha, d, theta, r when the model is modified DH
    rated_payload: float = math.inf  # kg: the heaviest payload the arm is rated for ([robot] rated_payload)
    flange_frame: str = "flange"     # the flange frame's name: a URDF chain's tip link, or "flange" ([robot] flange)

    @property
    def n(self) -> int:
        """Number of joints."""
        return len(self.joint_names)

    @property
    def is_dh(self) -> bool:
        """True when every joint is described by modified DH parameters (closed-form base parameters apply)."""
        return self.dh is not None

    def standard_parameters(self) -> np.ndarray:
        """The (14n,) vector: per joint XX XY XZ YY YZ ZZ mX mY mZ m Ia fc fv offset."""
        return np.concatenate([self.inertial, self.drive], axis=1).ravel()

    def parameter_names(self) -> list[str]:
        """Names of standard_parameters(), 1-based joint index appended: XX1 ... offset6."""
        return [f"{p}{j + 1}" for j in range(self.n) for p in INERTIAL_NAMES + DRIVE_NAMES]

    def params_matrix(self, chi: np.ndarray | None = None) -> np.ndarray:
        """(n, 14) parameter table for the kernels; chi (14n,) overrides the model's own values."""
        if chi is None:
            return np.ascontiguousarray(np.concatenate([self.inertial, self.drive], axis=1))
        chi = np.asarray(chi, dtype=np.float64)
        if chi.shape != (PARAMS_PER_JOINT * self.n,):
            raise ValueError(f"parameter vector: expected shape ({PARAMS_PER_JOINT * self.n},), got {chi.shape}")
        return np.ascontiguousarray(chi.reshape(self.n, PARAMS_PER_JOINT))

    def with_parameters(self, chi: np.ndarray) -> "Model":
        """A copy of the model with the standard parameters replaced by chi (14n,)."""
        P = self.params_matrix(chi)
        return dataclasses.replace(self, inertial=_frozen(P[:, :10]), drive=_frozen(P[:, 10:]))

    def joint_torque_per_amp(self) -> np.ndarray:
        """(n,) joint torque per motor ampere: gear_ratio * torque_constant (N m/A)."""
        return self.gear_ratio * self.torque_constant


# ---------------------------------------------------------------------------------------------------
# Building a model from plain values (shared by the TOML and URDF readers)

@dataclass
class JointSpec:
    """Everything the readers collect for one joint before the Model is frozen."""

    name: str
    jtype: int
    R: np.ndarray
    p: np.ndarray
    axis: np.ndarray
    inertial: np.ndarray
    drive: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(4))
    gear_ratio: float = 1.0
    torque_constant: float = 1.0
    q_limits: tuple[float, float] = (-math.inf, math.inf)
    qd_max: float = math.inf
    qdd_max: float = math.inf
    tau_max: float = math.inf
    dh: tuple[float, float, float, float] | None = None


def build_model(name: str, source: str, joints: list[JointSpec], gravity, flange_R, flange_p,
                rated_payload: float = math.inf, flange_frame: str = "flange") -> Model:
    """Freeze a list of JointSpec into a Model; flange_frame names the frame (flange_R, flange_p)."""
    if not joints:
        raise ModelError(source, "joint", "at least one movable joint")
    if len(joints) > MAX_JOINTS:
        raise ModelError(source, "joint", f"at most {MAX_JOINTS} movable joints", len(joints))
    dh = None
    if all(j.dh is not None for j in joints):
        dh = _frozen([j.dh for j in joints])
    return Model(
        name=name,
        source=source,
        joint_names=tuple(j.name for j in joints),
        joint_type=np.array([j.jtype for j in joints], dtype=np.int64),
        placement_R=_frozen([j.R for j in joints]),
        placement_p=_frozen([j.p for j in joints]),
        axis=_frozen([j.axis / np.linalg.norm(j.axis) for j in joints]),
        inertial=_frozen([j.inertial for j in joints]),
        drive=_frozen([j.drive for j in joints]),
        gear_ratio=_frozen([j.gear_ratio for j in joints]),
        torque_constant=_frozen([j.torque_constant for j in joints]),
        q_min=_frozen([j.q_limits[0] for j in joints]),
        q_max=_frozen([j.q_limits[1] for j in joints]),
        qd_max=_frozen([j.qd_max for j in joints]),
        qdd_max=_frozen([j.qdd_max for j in joints]),
        tau_max=_frozen([j.tau_max for j in joints]),
        gravity=_frozen(gravity, (3,)),
        flange_R=_frozen(flange_R, (3, 3)),
        flange_p=_frozen(flange_p, (3,)),
        dh=dh,
        rated_payload=float(rated_payload),
        flange_frame=str(flange_frame),
    )


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
    from ident import urdf

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
    ident.model.ModelError: no-such-arm: (name): expected a .toml or .urdf path, or a shipped model: generic6, puma560
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
    if p.suffix.lower() == ".toml":
        return _load_toml(p, tip)
    from ident import urdf

    return urdf.load_urdf(p, tip=tip)
