"""The robot description: an immutable serial-arm model (model_file.py and urdf.py load it).

A Model is numbers only (Pinocchio's Model/Data split): kinematic placements and axes, the standard
parameters of every link and joint, drive constants and limits. Kernels in ident.model.kernels read its
arrays; nothing here is evaluated per sample. The file format is documented in docs/reference/model-file.md.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.errors import QUOTE_CHARS, InputError

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
