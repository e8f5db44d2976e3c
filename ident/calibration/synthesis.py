"""Identifiability and minimal model synthesis (after Pashkevich 2004): complete redundant -> complete irreducible.

The aggregated Jacobian J_a stacks the identification Jacobian of every pose (rows [dp; L dω] for a
full pose, [dp] for a position), its angle columns scaled by the arm's reach L so that lengths and
angles compare. Its SVD classifies each term; greedy rank-increment column selection in the order of a
strategy (letters J joint offsets, B base, T tool, L left-to-right, R right-to-left) gives the
irreducible model. Terms that the selection drops are deleted when their nominal value is zero and
kept fixed at their nominal value otherwise (joint terms are never deleted).

Relative measurements (an unknown, constant base-to-sensor transform): the base terms are selected
first as the sensor transform; they are fitted but not counted as robot parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ident.calibration.model import RZ, CalibrationModel, tool_kinematics
from firmware_bridge.runtime.errors import InputError
from ident.model import REVOLUTE

MEASURES = ("pose", "position")
STRATEGY_LETTERS = "JBTLR"
RANK_TOL = 1e-7


def measurement_rows(measure: str) -> slice:
    """Rows of the (6, m) pose Jacobian that a measurement sees: all six, or the three position rows."""
    if measure not in MEASURES:
        raise InputError(f"measurement: expected one of {', '.join(MEASURES)}, got {measure!r}")
    return slice(0, 6) if measure == "pose" else slice(0, 3)


def random_configurations(cm: CalibrationModel, count: int, seed: int = 0) -> np.ndarray:
    """(count, n) joint positions drawn uniformly within the limits (±pi rad or ±1 m where unlimited)."""
    rng = np.random.default_rng(seed)
    wide = np.where(cm.joint_type == REVOLUTE, np.pi, 1.0)
    lo = np.where(np.isfinite(cm.q_min), cm.q_min, -wide)
    hi = np.where(np.isfinite(cm.q_max), cm.q_max, wide)
    return rng.uniform(lo, hi, size=(count, cm.n))


def scaled_jacobian(cm: CalibrationModel, q, measure: str, values: np.ndarray | None = None,
                    jac: np.ndarray | None = None) -> np.ndarray:
    """Aggregated Jacobian (N*rows, m) with orientation rows and angle columns times the reach (m)."""
    rows = measurement_rows(measure)
    if jac is None:
        jac = tool_kinematics(cm, q, values)[1]
    J = jac[:, rows, :].copy()
    if measure == "pose":
        J[:, 3:, :] *= cm.length_scale
    J *= cm.column_scale()
    return J.reshape(-1, cm.m)


@dataclass(frozen=True)
class Identifiability:
    """SVD classification of every term: status 'identifiable', 'non-identifiable' or 'semi-identifiable';
    groups: the semi-identifiable terms that only appear in fixed combinations (indices into the model)."""

    rank: int
    singular_values: np.ndarray
    status: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]


def classify(Ja: np.ndarray, tol: float = RANK_TOL) -> Identifiability:
    """Classify the columns of an aggregated Jacobian by its SVD (Pashkevich 2004)."""
    if Ja.shape[0] < Ja.shape[1]:       # thin SVD needs rows >= columns to return the whole V
        Ja = np.vstack([Ja, np.zeros((Ja.shape[1] - Ja.shape[0], Ja.shape[1]))])
    _, s, Vt = np.linalg.svd(Ja, full_matrices=False)
    rank = int(np.sum(s > tol * s[0])) if s.size and s[0] > 0 else 0
    N = Vt[rank:].T                                    # (m, m - rank) null-space basis
    col = np.linalg.norm(Ja, axis=0)
    zero = col <= tol * max(col.max(), 1e-300)
    row = np.linalg.norm(N, axis=1)
    status = tuple("non-identifiable" if z else ("identifiable" if r < 1e-6 else "semi-identifiable")
                   for z, r in zip(zero, row))
    semi = [j for j, st in enumerate(status) if st == "semi-identifiable"]
    P = N @ N.T
    parent = {j: j for j in semi}

    def find(j):
        while parent[j] != j:
            j = parent[j]
        return j

    for a in semi:
        for b in semi:
            if a < b and abs(P[a, b]) > 1e-6:
                parent[find(b)] = find(a)
    groups: dict[int, list[int]] = {}
    for j in semi:
        groups.setdefault(find(j), []).append(j)
    return Identifiability(rank, s, status, tuple(tuple(g) for g in groups.values()))


def strategy_order(cm: CalibrationModel, strategy: str) -> list[int]:
    """Term indices in the order a strategy examines them, e.g. 'JL', 'BJR', 'TJL'.

    J: joint terms; B: base terms; T: tool terms; then L (left to right) or R (right to left) for the
    rest. Without L or R the rest follows left to right.
    """
    s = strategy.upper()
    if not s or any(c not in STRATEGY_LETTERS for c in s) or len(set(s)) != len(s) or ("L" in s and "R" in s):
        raise InputError(f"strategy: letters from J B T followed by L or R, each once (e.g. JL, BJR), got {strategy!r}")
    groups = {"J": np.flatnonzero(cm.is_joint), "B": np.flatnonzero((cm.segment == 0) & ~cm.is_joint),
              "T": np.flatnonzero((cm.segment == cm.n) & ~cm.is_joint), "L": np.arange(cm.m), "R": np.arange(cm.m)[::-1]}
    order: list[int] = []
    for c in s + ("" if ("L" in s or "R" in s) else "L"):
        order += [int(k) for k in groups[c] if k not in order]
    return order


def select_columns(Ja: np.ndarray, order: list[int], tol: float = RANK_TOL) -> list[int]:
    """Greedy selection: keep a column when it raises the rank of the kept set (Gram-Schmidt, twice)."""
    scale = np.linalg.norm(Ja, axis=0).max()
    basis: list[np.ndarray] = []
    kept = []
    for k in order:
        v = Ja[:, k].copy()
        norm = np.linalg.norm(v)
        if norm <= tol * scale:
            continue
        for _ in range(2):
            for b in basis:
                v -= (b @ v) * b
        r = np.linalg.norm(v)
        if r > 10.0 * tol * norm:
            basis.append(v / r)
            kept.append(k)
    return kept


@dataclass(frozen=True, eq=False)
class IrreducibleModel:
    """A complete irreducible model: which terms of the redundant chain are identified, fixed or deleted.

    identified (m,) bool: estimated; fixed (m,) bool: kept at the nominal value (joint terms and terms
    with a non-zero nominal value that the selection dropped); sensor (m,) bool: base terms standing for
    the unknown sensor transform (relative measurements only; also identified).
    """

    model: CalibrationModel
    identified: np.ndarray
    fixed: np.ndarray
    sensor: np.ndarray
    measure: str
    relative: bool
    strategy: str
    identifiability: Identifiability

    @property
    def count(self) -> int:
        """Number of identified robot parameters (sensor terms excluded)."""
        return int(np.sum(self.identified & ~self.sensor))

    @property
    def deleted(self) -> np.ndarray:
        """(m,) True for terms removed from the model."""
        return ~(self.identified | self.fixed)

    def names(self) -> list[str]:
        """Names of the identified terms, in chain order."""
        names = self.model.names()
        return [names[k] for k in np.flatnonzero(self.identified)]


def synthesize(cm: CalibrationModel, measure: str = "position", *, relative: bool = False, strategy: str = "JL",
               count: int = 60, seed: int = 0, q: np.ndarray | None = None) -> IrreducibleModel:
    """The complete irreducible model: which terms of the redundant chain a measurement can identify.

    Columns of the aggregated identification Jacobian (at the nominal values, over `count` random
    configurations or at q) are taken in the order of `strategy` and kept when they raise its rank;
    the others are fixed at their nominal values or deleted.

    Parameters
    ----------
    cm : CalibrationModel
        The complete redundant model (`ident.calibration.model.from_model`).
    measure : {"position", "pose"}
        What the sensor measures: the tool point, or its position and orientation.
    relative : bool
        The sensor frame is unknown: its base terms are identified too, and not counted as robot
        parameters.
    strategy : str
        Column order: the letters J, B, T, then L or R (default "JL").
    count : int
        Random configurations for the Jacobian.
    seed : int
        Seed of the random configurations.
    q : ndarray, shape (N, n), optional
        Configurations to use instead.

    Returns
    -------
    IrreducibleModel
        identified, fixed and sensor masks over the terms; `count` identified robot parameters;
        `names()` the identified terms.

    Raises
    ------
    InputError
        An unknown measure or strategy letter.

    Examples
    --------
    A 6R arm measured at a tool point has 3 + 4R - 2s identifiable parameters (R = 6 revolute joints; s the
    trailing joints whose axes pass through the point: here the last one, the point lies on its axis);
    measured in full pose, 6 + 4R:

    >>> from ident.calibration.model import from_model
    >>> from ident.calibration.synthesis import expected_count, synthesize
    >>> from ident.model import load_model
    >>> cm = from_model(load_model("generic6"), tool=(0.0, 0.0, 0.1))
    >>> synthesize(cm, "position").count, expected_count(cm, "position")
    (25, 25)
    >>> synthesize(cm, "pose").count
    30
    """
    if q is None:
        q = random_configurations(cm, count, seed)
    Ja = scaled_jacobian(cm, q, measure)
    order = strategy_order(cm, strategy)
    base = [k for k in order if cm.segment[k] == 0 and not cm.is_joint[k]]
    if relative:
        order = base + [k for k in order if k not in base]
    kept = select_columns(Ja, order)
    identified = np.zeros(cm.m, dtype=bool)
    identified[kept] = True
    fixed = ~identified & (cm.is_joint | (cm.nominal != 0.0))
    sensor = np.zeros(cm.m, dtype=bool)
    if relative:
        sensor[base] = identified[base]
    return IrreducibleModel(cm, identified, fixed, sensor, measure, relative, strategy.upper(), classify(Ja))


def describe(irr: IrreducibleModel) -> str:
    """The model in Pashkevich's notation, e.g. '[Tx Ty Tz Rx Ry]_0 Rz(q1) [Tx Rx Ry]_1 Rz(q2)^o [...]_2';
    ^o marks a term kept fixed at its nominal value."""
    cm = irr.model
    names = cm.names()
    out, seg_terms = [], []

    def flush(seg):
        if seg_terms:
            out.append("[" + " ".join(seg_terms) + f"]_{seg}")
        seg_terms.clear()

    seg = 0
    for k in range(cm.m):
        if irr.deleted[k]:
            continue
        mark = "^o" if irr.fixed[k] else ""
        if cm.is_joint[k]:
            flush(seg)
            out.append(names[k] + mark)
            seg = int(cm.segment[k])
        else:
            seg = int(cm.segment[k])
            seg_terms.append(names[k][:2] + mark)
    flush(seg)
    return " ".join(out)


def trailing_tool_axes(cm: CalibrationModel, tol: float = 1e-9) -> int:
    """s of Pashkevich's formulas: the trailing revolute joints whose axes pass through the tool point
    (their offsets cannot move it; 1 for a tool on the last axis, 2 for a tool where the last two meet)."""
    _, jac = tool_kinematics(cm, np.zeros((1, cm.n)))
    s = 0
    for k in np.flatnonzero(cm.is_joint)[::-1]:
        if cm.kind[k] != RZ or np.linalg.norm(jac[0, :3, k]) > tol * cm.length_scale:
            break
        s += 1
    return s


def expected_count(cm: CalibrationModel, measure: str, relative: bool = False) -> int:
    """Pashkevich's parameter count: 6 + 4R + 2P (pose), 3 + 4R + 2P - 2s (position); 6 fewer when relative."""
    R = int(np.sum(cm.joint_type == REVOLUTE))
    P = cm.n - R
    N = 6 + 4 * R + 2 * P if measure == "pose" else 3 + 4 * R + 2 * P - 2 * trailing_tool_axes(cm)
    return N - 6 if relative else N


def with_terms(cm: CalibrationModel, names: list[str], measure: str = "position", *, relative: bool = False,
               count: int = 60, seed: int = 0) -> IrreducibleModel:
    """An irreducible model that identifies exactly the named terms (e.g. Pashkevich's planar experiment:
    Tx0 Ty0 Rz(q1) Tx1 Rz(q2) Tx2); raises InputError naming terms that are unknown or not independent."""
    all_names = cm.names()
    unknown = [nm for nm in names if nm not in all_names]
    if unknown:
        raise InputError(f"terms: unknown {', '.join(unknown)}; the model has {', '.join(all_names)}")
    idx = [all_names.index(nm) for nm in names]
    Ja = scaled_jacobian(cm, random_configurations(cm, count, seed), measure)
    kept = select_columns(Ja, idx)
    if len(kept) < len(idx):
        raise InputError("terms: not independent for " + measure + " measurements: "
                         + ", ".join(all_names[k] for k in idx if k not in kept))
    identified = np.zeros(cm.m, dtype=bool)
    identified[idx] = True
    fixed = ~identified
    sensor = identified & (cm.segment == 0) & ~cm.is_joint if relative else np.zeros(cm.m, dtype=bool)
    return IrreducibleModel(cm, identified, fixed, sensor, measure, relative, "given", classify(Ja[:, idx]))
