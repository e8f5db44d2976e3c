"""URDF import with the standard library's XML reader (no mesh stack).

The chain runs from the root link (or `base`) to the `tip` link. Joint j's frame is its child link's
frame, as in URDF and Pinocchio: parent frame * origin(xyz, rpy) * motion about/along `axis`. Fixed
joints are folded into the next placement, and the links they carry are merged into the chain link
they hang from. Movable joints off the chain (gripper fingers, say) are locked at zero and merged the
same way. Links before the first movable joint belong to the fixed base and are ignored. URDF carries
no drive constants or acceleration limits: those default to zero / unit / infinite (see
docs/reference/model-file.md for a TOML file that adds them).
"""
from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from ident.model import spatial
from ident.model.robot import MAX_ABS, PRISMATIC, REVOLUTE, JointSpec, Model, ModelError, build_model

MOVABLE = {"revolute": REVOLUTE, "continuous": REVOLUTE, "prismatic": PRISMATIC}


class _Doc:
    """Parsed URDF with error reporting that names the file and element."""

    def __init__(self, path: Path):
        self.source = str(path)
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as exc:
            raise ModelError(self.source, "(syntax)", "well-formed XML", str(exc)) from None
        except OSError as exc:
            raise ModelError(self.source, "(file)", "a readable file", str(exc)) from None
        if root.tag != "robot":
            raise ModelError(self.source, "(root)", "a <robot> element", root.tag)
        self.name = root.get("name", path.stem)
        self.links = {}
        for el in root.findall("link"):
            name = self._attr(el, "name", "link")
            self.links[name] = el
        self.joints = {}
        for el in root.findall("joint"):
            name = self._attr(el, "name", "joint")
            self.joints[name] = el

    def _attr(self, el, key: str, where: str) -> str:
        value = el.get(key)
        if value is None:
            raise ModelError(self.source, f"{where}.{key}", "an attribute")
        return value

    def numbers(self, el, key: str, count: int, where: str, default=None, bound: float = MAX_ABS) -> np.ndarray:
        text = None if el is None else el.get(key)
        if text is None:
            if default is None:
                raise ModelError(self.source, f"{where}.{key}", f"{count} numbers")
            return np.asarray(default, dtype=float)
        try:
            values = [float(x) for x in text.split()]
        except ValueError:
            raise ModelError(self.source, f"{where}.{key}", f"{count} numbers", text) from None
        if len(values) != count or not all(math.isfinite(v) and abs(v) <= bound for v in values):
            within = "" if bound == math.inf else f" within +-{bound:g}"
            raise ModelError(self.source, f"{where}.{key}", f"{count} finite numbers{within}", text)
        return np.asarray(values)

    def frame(self, el, where: str) -> tuple[np.ndarray, np.ndarray]:
        origin = el.find("origin")
        xyz = self.numbers(origin, "xyz", 3, f"{where}.origin", [0, 0, 0])
        rpy = self.numbers(origin, "rpy", 3, f"{where}.origin", [0, 0, 0])
        return spatial.rpy_to_matrix(rpy), xyz

    def link_parameters(self, name: str) -> np.ndarray:
        """The link's 10 standard parameters about its own frame origin."""
        where = f"link[{name}].inertial"
        inertial = self.links[name].find("inertial")
        if inertial is None:
            return np.zeros(10)
        mass = self.numbers(inertial.find("mass"), "value", 1, f"{where}.mass")[0]
        if mass < 0:
            raise ModelError(self.source, f"{where}.mass", "a mass >= 0", mass)
        inertia = inertial.find("inertia")
        if inertia is None:
            raise ModelError(self.source, f"{where}.inertia", "an <inertia> element")
        six = [self.numbers(inertia, k, 1, f"{where}.inertia")[0] for k in ("ixx", "ixy", "ixz", "iyy", "iyz", "izz")]
        R, p = self.frame(inertial, where)
        at_com = spatial.body_parameters(mass, np.zeros(3), spatial.inertia_matrix(six))
        ok, why = spatial.is_physically_consistent(at_com)
        if not ok:
            raise ModelError(self.source, f"{where}.inertia", "a physically consistent body", why)
        return spatial.transform_body_parameters(at_com, R, p)


def _below(doc: _Doc, jname: str, start: str, path_to) -> bool:
    try:
        path_to(doc.joints[jname].find("child").get("link"))
        return True
    except ModelError:
        return False


def _refuse_cycles(doc: _Doc, child_of: dict[str, str]) -> None:
    """Refuse a joint graph with a cycle (each link has at most one parent here, so a cycle is a walk up
    the parents that comes back to a link): every later walk over the tree would never end."""
    done: set[str] = set()          # links whose walk up reached a root
    for first in doc.links:
        seen: list[str] = []
        link = first
        while link in child_of and link not in done:
            if link in seen:
                loop = seen[seen.index(link):] + [link]
                raise ModelError(doc.source, f"joint[{child_of[link]}]", "joints that form a tree; they form a cycle "
                                 "through the links " + " <- ".join(loop))
            seen.append(link)
            link = doc.joints[child_of[link]].find("parent").get("link")
        done.update(seen)


def _transform(R, p) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, p
    return T


def read_chain(path: Path, base: str = "", tip: str = "") -> tuple[list[JointSpec], np.ndarray, np.ndarray, str]:
    """The movable joints from `base` (default: the root link) to `tip`, the fixed transform (R, p) from
    the last movable joint's frame to the tip link's frame, and the tip link's name (default: the end of
    the movable chain)."""
    doc = _Doc(Path(path))
    src = doc.source
    child_of = {}   # link -> joint that carries it
    children = {}   # link -> joints leaving it
    for jname, el in doc.joints.items():
        jtype = doc._attr(el, "type", f"joint[{jname}]")
        if jtype not in MOVABLE and jtype != "fixed":
            raise ModelError(src, f"joint[{jname}].type", "revolute, continuous, prismatic or fixed", jtype)
        parent = doc._attr(el.find("parent") if el.find("parent") is not None else el, "link", f"joint[{jname}].parent")
        child = doc._attr(el.find("child") if el.find("child") is not None else el, "link", f"joint[{jname}].child")
        for role, link in (("parent", parent), ("child", child)):
            if link not in doc.links:
                raise ModelError(src, f"joint[{jname}].{role}", "a link defined in the file", link)
        if child in child_of:
            raise ModelError(src, f"joint[{jname}].child", f"a link that no other joint carries "
                             f"(joint {child_of[child]!r} carries it already: the joints must form a tree)", child)
        child_of[child] = jname
        children.setdefault(parent, []).append(jname)
    _refuse_cycles(doc, child_of)
    roots = [ln for ln in doc.links if ln not in child_of]
    if len(roots) != 1:
        raise ModelError(src, "(tree)", "exactly one root link", roots)
    start = base or roots[0]
    if start not in doc.links:
        raise ModelError(src, "(base)", "a link of the file", start)

    def path_to(link: str) -> list[str]:
        joints = []
        while link != start:
            if link not in child_of:
                raise ModelError(src, "(tip)", f"a link below {start!r}", link)
            joints.append(child_of[link])
            link = doc.joints[child_of[link]].find("parent").get("link")
        return joints[::-1]

    def movable(jname: str) -> bool:
        return doc.joints[jname].get("type") in MOVABLE

    if tip:
        if tip not in doc.links:
            raise ModelError(src, "(tip)", "a link of the file", tip)
    else:  # the end of the movable chain, when all movable joints lie on one path
        chains = {doc.joints[j].find("child").get("link"): [k for k in path_to(doc.joints[j].find("child").get("link"))
                                                            if movable(k)]
                  for j in doc.joints if movable(j) and _below(doc, j, start, path_to)}
        tip, longest = max(chains.items(), key=lambda kv: len(kv[1]), default=(start, []))
        if any(not set(c) <= set(longest) for c in chains.values()):
            ends = sorted(ln for ln, c in chains.items() if not any(set(c) < set(o) for o in chains.values()))
            raise ModelError(src, "(tip)", "a tip link, since the movable joints branch; candidates: " + ", ".join(ends))
    on_chain = [j for j in path_to(tip) if movable(j)]
    if not on_chain:
        raise ModelError(src, "(chain)", f"at least one movable joint between {start!r} and {tip!r}")
    index = {j: k for k, j in enumerate(on_chain)}

    # walk the whole tree below `start`: each link is merged into the chain body that carries it
    inertial = np.zeros((len(on_chain), 10))
    placement: dict[str, np.ndarray] = {}
    tip_T = np.eye(4)
    stack = [(start, -1, np.eye(4))]    # (link, owning chain joint or -1 for the base, link pose in owner frame)
    while stack:
        link, owner, T = stack.pop()
        if owner >= 0:
            inertial[owner] += spatial.transform_body_parameters(doc.link_parameters(link), T[:3, :3], T[:3, 3])
        if link == tip:
            tip_T = T
        for jname in children.get(link, []):
            el = doc.joints[jname]
            T_child = T @ _transform(*doc.frame(el, f"joint[{jname}]"))
            child = el.find("child").get("link")
            if jname in index:
                placement[jname] = T_child
                stack.append((child, index[jname], np.eye(4)))
            else:
                stack.append((child, owner, T_child))

    specs = []
    for jname in on_chain:
        el = doc.joints[jname]
        where = f"joint[{jname}]"
        axis = doc.numbers(el.find("axis"), "xyz", 3, f"{where}.axis", [1, 0, 0])
        if np.linalg.norm(axis) < 1e-12:
            raise ModelError(src, f"{where}.axis.xyz", "a non-zero vector", axis.tolist())
        limit = el.find("limit")
        jtype = el.get("type")
        lo, hi = -math.inf, math.inf
        if jtype != "continuous" and limit is not None:
            lo = doc.numbers(limit, "lower", 1, f"{where}.limit", [-math.inf], math.inf)[0]
            hi = doc.numbers(limit, "upper", 1, f"{where}.limit", [math.inf], math.inf)[0]
        qd = doc.numbers(limit, "velocity", 1, f"{where}.limit", [math.inf], math.inf)[0] if limit is not None else math.inf
        tau = doc.numbers(limit, "effort", 1, f"{where}.limit", [math.inf], math.inf)[0] if limit is not None else math.inf
        T = placement[jname]
        specs.append(JointSpec(jname, MOVABLE[jtype], T[:3, :3].copy(), T[:3, 3].copy(), axis, inertial[index[jname]],
                               q_limits=(lo, hi) if lo < hi else (-math.inf, math.inf),
                               qd_max=qd if qd > 0 else math.inf, tau_max=tau if tau > 0 else math.inf))
    return specs, tip_T[:3, :3].copy(), tip_T[:3, 3].copy(), tip


def load_urdf(path: Path, tip: str = "") -> Model:
    """A Model from a URDF file: the chain from the root link to `tip` (default: the end of the movable chain)."""
    specs, R, p, tip = read_chain(Path(path), tip=tip)
    name = _Doc(Path(path)).name
    return build_model(name, str(path), specs, [0.0, 0.0, -9.81], R, p, flange_frame=tip)
