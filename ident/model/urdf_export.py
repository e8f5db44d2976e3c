"""An armid model as URDF, for Pinocchio, MoveIt or a simulator (docs/reference/result-file.md, "model.urdf
and model.sidecar.json").

Each movable joint j becomes a URDF joint from link j-1 to link j, its origin the model's placement of frame j in
frame j-1 (modified DH models included: the placement is what the DH row makes), its axis the model's. Each link's
<inertial> holds the link's 10 standard parameters: the centre of mass, the mass and the inertia about the centre
of mass. Coulomb and viscous friction go to <dynamics friction= damping=>. What URDF cannot carry goes to a JSON
sidecar beside it: the rotor inertia Ia (Pinocchio's `armature`), the torque offsets, gravity, gear ratios,
torque constants and acceleration limits. The full joint torque armid's RNEA gives is then

    tau = rnea(q, qd, qdd) + Ia qdd + fc sign(qd) + fv qd + offset

with rnea the URDF's rigid-body dynamics under the sidecar's gravity. The flange frame is a fixed joint to a link
named after it. Revolute joints without position limits are written as revolute with limits of +-1e300 rad (a
continuous joint would take two coordinates, cos and sin, in Pinocchio); velocity and effort limits that the
model does not state are written as 0, which armid's URDF reader reads back as none.
"""
from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ident.model import spatial
from ident.model.robot import Model

SIDECAR_FORMAT = "armid-urdf-sidecar/1"
NO_LIMIT = 1e300


def _f(x: float) -> str:
    return repr(float(x))


def _fs(values) -> str:
    return " ".join(_f(v) for v in values)


def link_inertial(chi10: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(mass kg, centre of mass (3,) m, inertia about the centre of mass (3, 3) kg m^2) of a link's 10 standard
    parameters about its frame origin. A massless link keeps its inertia about the origin (its first moments must
    then be zero)."""
    m = float(chi10[9])
    J = spatial.inertia_matrix(chi10[:6])
    if m <= 0.0:
        if np.any(np.abs(chi10[6:9]) > 0.0):
            raise ValueError(f"a link of mass {m} kg with first moments {chi10[6:9].tolist()}: no URDF inertial")
        return 0.0, np.zeros(3), J
    c = chi10[6:9] / m
    S = spatial.skew(c)
    return m, c, J - m * (S.T @ S)


def _limits(model: Model, j: int) -> dict[str, str]:
    lo, hi = float(model.q_min[j]), float(model.q_max[j])
    lo = lo if math.isfinite(lo) else -NO_LIMIT
    hi = hi if math.isfinite(hi) else NO_LIMIT
    qd, tau = float(model.qd_max[j]), float(model.tau_max[j])
    return {"lower": _f(lo), "upper": _f(hi), "velocity": _f(qd if math.isfinite(qd) else 0.0),
            "effort": _f(tau if math.isfinite(tau) else 0.0)}


STICK_RADIUS = 0.03   # m, the stick figure's cylinders; its spheres are 1.5 times as wide


def _stick(link: ET.Element, to: np.ndarray) -> None:
    """A sphere at the link's origin and a cylinder from there to the point `to` (m, in the link's frame)."""
    from scipy.spatial.transform import Rotation

    sphere = ET.SubElement(link, "visual")
    ET.SubElement(ET.SubElement(sphere, "geometry"), "sphere", radius=_f(1.5 * STICK_RADIUS))
    length = float(np.linalg.norm(to))
    if length < 1e-6:
        return
    R = Rotation.align_vectors([to / length], [[0.0, 0.0, 1.0]])[0].as_matrix()
    rod = ET.SubElement(link, "visual")
    ET.SubElement(rod, "origin", xyz=_fs(np.asarray(to) / 2), rpy=_fs(spatial.rpy(R)))
    ET.SubElement(ET.SubElement(rod, "geometry"), "cylinder", radius=_f(STICK_RADIUS), length=_f(length))


def urdf_text(model: Model, link_names: list[str] | None = None, *, visuals: bool = False) -> str:
    """The model as URDF text (see the module docstring for what goes where).

    Parameters
    ----------
    model : Model
        The arm.
    link_names : list of str, optional
        The n + 1 link names, base first, distinct and none named as the flange frame (default:
        base_link, then link1 to linkn).
    visuals : bool, optional
        Give each link a stick figure (a sphere at its joint, a cylinder to the next joint), so that a 3D
        view shows the arm; the dynamics do not change (default False).

    Returns
    -------
    str
        The URDF document; the flange frame is a fixed joint to a link named after it.

    Raises
    ------
    ValueError
        Link names that are not as above, or a link whose inertial parameters URDF cannot carry (a
        massless link with first moments).

    Examples
    --------
    >>> from ident.model import load_model
    >>> from ident.model.urdf_export import urdf_text
    >>> text = urdf_text(load_model("generic6"))
    >>> text.count("<joint "), text.count('type="revolute"')
    (7, 6)
    """
    n = model.n
    links = link_names or ["base_link"] + [f"link{j + 1}" for j in range(n)]
    if len(links) != n + 1 or len(set(links)) != n + 1 or model.flange_frame in links:
        raise ValueError(f"link names: expected {n + 1} distinct names other than {model.flange_frame!r}")
    robot = ET.Element("robot", name=model.name)
    ends = [*model.placement_p[1:], model.flange_p]     # the next joint's origin in each link
    base = ET.SubElement(robot, "link", name=links[0])
    if visuals:
        _stick(base, model.placement_p[0])
    for j in range(n):
        link = ET.SubElement(robot, "link", name=links[j + 1])
        if visuals:
            _stick(link, ends[j])
        m, c, Jc = link_inertial(model.inertial[j])
        inertial = ET.SubElement(link, "inertial")
        ET.SubElement(inertial, "origin", xyz=_fs(c), rpy="0 0 0")
        ET.SubElement(inertial, "mass", value=_f(m))
        ET.SubElement(inertial, "inertia", ixx=_f(Jc[0, 0]), ixy=_f(Jc[0, 1]), ixz=_f(Jc[0, 2]), iyy=_f(Jc[1, 1]),
                      iyz=_f(Jc[1, 2]), izz=_f(Jc[2, 2]))
        joint = ET.SubElement(robot, "joint", name=model.joint_names[j],
                              type="revolute" if model.joint_type[j] == 0 else "prismatic")
        ET.SubElement(joint, "parent", link=links[j])
        ET.SubElement(joint, "child", link=links[j + 1])
        ET.SubElement(joint, "origin", xyz=_fs(model.placement_p[j]), rpy=_fs(spatial.rpy(model.placement_R[j])))
        ET.SubElement(joint, "axis", xyz=_fs(model.axis[j]))
        ET.SubElement(joint, "limit", **_limits(model, j))
        Ia, fc, fv, offset = model.drive[j]
        ET.SubElement(joint, "dynamics", damping=_f(fv), friction=_f(fc))
    ET.SubElement(robot, "link", name=model.flange_frame)
    flange = ET.SubElement(robot, "joint", name=f"{model.flange_frame}_joint", type="fixed")
    ET.SubElement(flange, "parent", link=links[n])
    ET.SubElement(flange, "child", link=model.flange_frame)
    ET.SubElement(flange, "origin", xyz=_fs(model.flange_p), rpy=_fs(spatial.rpy(model.flange_R)))
    ET.indent(robot)
    return '<?xml version="1.0"?>\n' + ET.tostring(robot, encoding="unicode") + "\n"


def sidecar_document(model: Model, urdf_name: str) -> dict:
    """What the URDF cannot carry, per joint, in SI units (see the module's docstring)."""
    joints = []
    for j in range(model.n):
        Ia, fc, fv, offset = (float(x) for x in model.drive[j])
        qdd = float(model.qdd_max[j])
        joints.append({"name": model.joint_names[j], "rotor_inertia": Ia, "coulomb_friction": fc,
                       "viscous_friction": fv, "torque_offset": offset, "gear_ratio": float(model.gear_ratio[j]),
                       "torque_constant": float(model.torque_constant[j]),
                       "qdd_max": qdd if math.isfinite(qdd) else None})
    return {"format": SIDECAR_FORMAT, "urdf": urdf_name, "robot": model.name, "gravity": model.gravity.tolist(),
            "flange_frame": model.flange_frame,
            "torque": "rnea(q, qd, qdd) + rotor_inertia qdd + coulomb_friction sign(qd) + viscous_friction qd "
                      "+ torque_offset (N m or N); rotor_inertia is Pinocchio's armature; the friction terms are "
                      "also the URDF's <dynamics friction= damping=>",
            "units": {"rotor_inertia": "kg m^2 (kg for prismatic joints)", "coulomb_friction": "N m (N)",
                      "viscous_friction": "N m s/rad (N s/m)", "torque_offset": "N m (N)",
                      "torque_constant": "N m/A at the motor", "qdd_max": "rad/s^2 (m/s^2)"},
            "joints": joints}


def write_urdf(model: Model, path: str | Path) -> tuple[Path, Path]:
    """Write the model as URDF and, beside it, the JSON sidecar with what URDF cannot carry.

    Parameters
    ----------
    model : Model
        The model, e.g. the identified one (ident.fit.batch.Identification.identified_model).
    path : str or Path
        The URDF file to write; the sidecar is path with the suffix .sidecar.json.

    Returns
    -------
    urdf : Path
        The URDF file.
    sidecar : Path
        The sidecar JSON file.

    Raises
    ------
    OSError
        A file cannot be written.
    ValueError
        A link whose inertial parameters URDF cannot carry.

    Examples
    --------
    The URDF read back gives the same rigid-body dynamics (the drive terms are in the sidecar):

    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> from ident.model.urdf_export import write_urdf
    >>> model = load_model("generic6")
    >>> q, qd, qdd = np.random.default_rng(0).uniform(-1, 1, (3, 5, 6))
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     urdf, sidecar = write_urdf(model, pathlib.Path(folder) / "generic6.urdf")
    ...     back = load_model(urdf)
    ...     names = urdf.name, sidecar.name
    >>> names
    ('generic6.urdf', 'generic6.sidecar.json')
    >>> bool(np.allclose(dynamics.rnea(back, q, qd, qdd, drive=False), dynamics.rnea(model, q, qd, qdd, drive=False)))
    True
    """
    path = Path(path)
    side = path.with_suffix(".sidecar.json")
    path.write_text(urdf_text(model), encoding="utf-8")
    side.write_text(json.dumps(sidecar_document(model, path.name), indent=1) + "\n", encoding="utf-8")
    return path, side
