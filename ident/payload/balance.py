"""Payload mass and centre of mass by joint-torque balance (Gao, Zhao, Li 2025), for closed
controllers that only move point to point at constant speed.

At constant velocity (qdd = 0) the torque of the loaded arm minus that of the unloaded arm at the same
angle, speed and direction is the payload's gravity torque: the links' gravity and the (load-independent)
friction cancel. With two parallel joints 2 and 3 and the flange turned so that one of its axes lies along
link 3, three small least-squares steps give the payload:

  1. mass: joint 2 swept with links 2 and 3 collinear (sweep a) against joint 3 swept with link 2 vertical
     (sweep b), paired at the same link-3 angle theta: Delta_tau2_a - Delta_tau3_b = m g a2 cos(theta);
  2. with m known, the two CoM coordinates across link 3 from joint 3's torque, flange x6 along link 3 and
     z6 along the joint axis (the paper's pose 5b): x and y;
  3. with m and x known, z from joint 3's torque with z6 along link 3 and y6 along the axis (pose 5d).

Every regressor here comes from the arm's kinematic model (the gravity load regressor of
ident.model.dynamics), not from the paper's planar formulas: g a2 cos(theta) is the mass column of joint 2 minus
that of joint 3, and the paper's offsets (a3, d5, d6) are in the first-moment columns. So the same code
serves any arm with two parallel joints 2 and 3, and noise-free data give the payload exactly.

    program = plan(model, speed=math.radians(1.0))      # the 4 sweeps (2 orientations x sweeps a, b)
    program.write("balance.motion.json")                # driver requests: move_to + run_trajectory samples
    program.targets_csv("balance.targets.csv")          # joint targets (deg) for a pendant
    ... run it unloaded and record, attach the payload, run it again and record ...
    est = identify(model, load_recording("loaded.csv"), load_recording("unloaded.csv"))

This module also holds what the general static method (ident.payload.static) shares: the motion program
(`MotionProgram`, `Sweep`, `run_program`) and the pairing of loaded with unloaded constant-velocity
samples (`paired_differences`).
"""
from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.ndimage
import scipy.optimize

from ident.model import dynamics
from ident.fit import estimate
from firmware_bridge.runtime.errors import InputError
from ident.model import REVOLUTE, Model
from ident.payload.result import PayloadEstimate
from ident.fit.preprocess import Recording

SEED_SPEED = math.radians(1.0)                        # rad/s: the paper's simulated sweeps, 1 deg/s
SEED_RANGE = (0.0, math.radians(55.0))                # rad: link angle above the horizontal, 0-55 deg
MIN_SAMPLES = 21        # paired constant-velocity samples per sweep below which the fit is refused: the paper's
                        # LS failed with 20 (25 % speed) and held at 20 % speed (about 25 at the same rate)
REST_SPEED = 2e-3       # rad/s: a joint slower than this is at rest
SPEED_TOLERANCE = 0.02  # a constant-velocity sample is within 2 % of its segment's plateau velocity
WINDOW = 0.1            # s: velocities are differences over this window; segments lose it at each end
POSE_TOLERANCE = 2e-3   # rad: loaded and unloaded samples closer than this are at the same pose
PARALLEL_TOLERANCE = 1e-6   # |1 - |z2 . z3|| below which joints 2 and 3 are parallel
AXIS_TOLERANCE = math.radians(1.0)   # a flange axis within 1 deg of joint 3's axis lies along it
RAMP = 0.5              # s: smooth start and stop of every sweep (outside the measured range)
FILE_STEP = 0.02        # s between the samples of a sweep in the motion file
MOVE_SPEED = 0.3        # share of the fastest move_to between sweeps
FORMAT = "armid-motion"


class BalanceError(InputError):
    """The torque-balance method cannot plan for this arm or cannot identify from these recordings."""


# ---------------------------------------------------------------------------------------------------
# Motion programs (shared with ident.payload.static)

@dataclass(frozen=True)
class Sweep:
    """A constant-velocity joint-space line: from `start` to `end` (n,) rad at `speed` rad/s (of the
    fastest joint), with smooth RAMP-second starts and stops outside [start, end]."""

    name: str
    start: np.ndarray
    end: np.ndarray
    speed: float
    ramp: float = RAMP

    def samples(self, step: float = FILE_STEP) -> tuple[np.ndarray, np.ndarray]:
        """(t (K,) s, q (K, n) rad): at rest at both ends, `speed` between start and end, the ramps
        (raised-cosine velocity, ramp seconds) before start and after end."""
        d = self.end - self.start
        length = float(np.max(np.abs(d)))
        if not (length > 0 and self.speed > 0 and self.ramp > 0):
            raise BalanceError(f"{self.name}: a sweep needs distinct start and end, a positive speed and ramp")
        u = d / length
        cruise = length / self.speed
        total = cruise + 2 * self.ramp
        k = max(int(math.ceil(total / step)), 8)
        t = np.linspace(0.0, total, k + 1)
        # path coordinate s(t): ramp distance speed*ramp/2 before start, raised-cosine velocity
        r, v = self.ramp, self.speed
        s = np.where(t < r, v * (t / 2 - r / (2 * math.pi) * np.sin(math.pi * t / r)),
                     v * (t - r / 2))
        tail = t > r + cruise
        te = t[tail] - r - cruise
        s[tail] = v * (r / 2 + cruise) + v * (te - (te / 2 - r / (2 * math.pi) * np.sin(math.pi * te / r)))
        q = self.start - u * (v * r / 2) + s[:, None] * u
        return t, q


@dataclass(frozen=True)
class MotionProgram:
    """What an identification method asks the arm to do: steps of `move_to` targets (n,) rad and
    constant-velocity `Sweep`s, run once unloaded and once loaded (`runs`).

    write(path): a JSON motion file of driver requests (docs/guides/payload.md), run by `run_program`.
    targets_csv(path): the joint targets in degrees, in order, for a closed controller's pendant.
    """

    method: str
    model: str
    steps: tuple                   # of np.ndarray (move_to target) or Sweep
    runs: tuple[str, ...] = ("unloaded", "loaded")
    move_speed: float = MOVE_SPEED
    notes: tuple[str, ...] = ()

    @property
    def sweeps(self) -> list[Sweep]:
        return [s for s in self.steps if isinstance(s, Sweep)]

    def requests(self) -> list[dict]:
        """The driver requests of one run, in order: move_to, then run_trajectory with samples."""
        out = []
        for step in self.steps:
            if isinstance(step, Sweep):
                t, q = step.samples()
                out.append({"cmd": "run_trajectory", "samples": {"t": t.tolist(), "q": q.tolist()},
                            "name": step.name})
            else:
                out.append({"cmd": "move_to", "q": np.asarray(step, float).tolist(), "speed": self.move_speed})
        return out

    def write(self, path: str | Path) -> None:
        """Write the JSON motion file: {"format", "method", "model", "runs", "notes", "steps": [request]}."""
        doc = {"format": FORMAT, "method": self.method, "model": self.model, "runs": list(self.runs),
               "notes": list(self.notes), "steps": self.requests()}
        Path(path).write_text(json.dumps(doc))

    def targets_csv(self, path: str | Path) -> None:
        """Write the joint targets for a pendant: run, step, action (a joint move to a sweep's start, or
        the sweep: a linear joint move at constant speed to its end), speed (deg/s, sweeps only), q1..qn in
        degrees; the rows of the unloaded run, then those of the loaded run."""
        n = len(self.sweeps[0].start) if self.sweeps else len(self.steps[0])
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["run", "step", "action", "speed_deg_per_s"] + [f"q{j + 1}_deg" for j in range(n)])
            for run in self.runs:
                for k, step in enumerate(self.steps, start=1):
                    if isinstance(step, Sweep):
                        end = step.samples()[1][-1]
                        w.writerow([run, k, f"linear joint move at constant speed: {step.name}",
                                    f"{math.degrees(step.speed):.4g}"] + _deg(end))
                    else:
                        w.writerow([run, k, "joint move", ""] + _deg(step))


def _deg(q) -> list[str]:
    return [f"{math.degrees(x):.4f}" for x in np.asarray(q, float)]


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def load_program(path: str | Path) -> dict:
    """Read a motion file written by MotionProgram.write; InputError naming the file and field if it is not one."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:   # JSONDecodeError is a ValueError
        raise InputError(f"{path}: not a readable JSON motion file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise InputError(f"{path}: format: expected {FORMAT!r}")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not all(isinstance(s, dict) and s.get("cmd") in ("move_to", "run_trajectory")
                                              for s in steps):
        raise InputError(f"{path}: steps: expected a list of move_to / run_trajectory requests")
    return doc


def run_program(steps: list[dict], send: Callable[[dict], dict], *, poll: float = 0.2,
                timeout: float = 3600.0, sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> None:
    """Send the requests of one run to a driver, one after the other, each once the previous motion has
    ended. send(request) -> reply is the caller's link to the driver (a ZeroMQ REQ socket in the CLI);
    a step's end is polled with {"cmd": "status"} every `poll` s, for at most timeout s per step.
    InputError when the driver refuses a step (its reason), faults, or a step does not end in time."""
    for k, req in enumerate(steps, start=1):
        reply = send({key: v for key, v in req.items() if key != "name"})
        if not reply.get("ok"):
            raise InputError(f"motion step {k} ({req.get('name', req['cmd'])}): refused by the driver: "
                             f"{reply.get('error')}")
        deadline = clock() + timeout
        while True:
            status = send({"cmd": "status"})
            if status.get("fault"):
                raise InputError(f"motion step {k}: the driver faulted: {status['fault']}")
            if not status.get("moving", False):
                break
            if clock() > deadline:
                raise InputError(f"motion step {k}: still moving after {timeout} s")
            sleep(poll)


def check_program(model: Model, program: MotionProgram) -> None:
    """BalanceError unless every sweep keeps the model's position, velocity, acceleration and (unloaded)
    torque limits, as the driver will check them."""
    from ident.model.limits import LimitError, check_motion

    for sweep in program.sweeps:
        t, q = sweep.samples(step=0.005)
        qd = np.gradient(q, t, axis=0)
        qdd = np.gradient(qd, t, axis=0)
        try:
            check_motion(model, t, q, qd, qdd)
        except LimitError as exc:
            raise BalanceError(f"plan for {model.name}: {sweep.name}: {exc}") from None


# ---------------------------------------------------------------------------------------------------
# Constant-velocity segments and the loaded - unloaded pairing (shared with ident.payload.static)

@dataclass(frozen=True)
class Segment:
    """Samples `index` of a recording at rest (speed 0) or moving along the unit joint-space `direction`
    at `speed` rad/s (its norm); `s` (len(index),) is the position along the direction from q[index[0]]."""

    index: np.ndarray
    origin: np.ndarray
    direction: np.ndarray
    speed: float
    s: np.ndarray

    @property
    def moving(self) -> bool:
        return self.speed > 0


@dataclass(frozen=True)
class Pair:
    """A loaded segment matched with an unloaded one: the loaded poses q (K, n) rad and velocities qd,
    and dtau (K, n) N m, loaded minus unloaded torque at the same pose (unloaded interpolated along the
    segment); `joints` the indices of the moving joints."""

    q: np.ndarray
    qd: np.ndarray
    dtau: np.ndarray
    joints: tuple[int, ...]
    speed: float


def torques(model: Model, rec: Recording) -> np.ndarray:
    """The recording's joint torques (N, n) N m (motor currents times gear ratio times torque constant)."""
    if rec.n != model.n:
        raise BalanceError(f"{rec.source}: {rec.n} joints, the model {model.name} has {model.n}")
    return rec.tau if rec.tau is not None else rec.current * model.joint_torque_per_amp()


def _velocity(t: np.ndarray, q: np.ndarray, window: float) -> tuple[np.ndarray, int]:
    """Joint velocities (N, n) as differences over +-w samples, w covering window/2 s; and w."""
    dt = float(np.median(np.diff(t)))
    w = max(1, int(round(window / 2 / dt)))
    N = len(t)
    hi = np.minimum(np.arange(N) + w, N - 1)
    lo = np.maximum(np.arange(N) - w, 0)
    return (q[hi] - q[lo]) / (t[hi] - t[lo])[:, None], w


def segments(t: np.ndarray, q: np.ndarray, *, rest_speed: float = REST_SPEED,
             tolerance: float = SPEED_TOLERANCE, window: float = WINDOW) -> list[Segment]:
    """The rest and constant-velocity segments of a recording (t (N,) s, q (N, n) rad).

    Samples are grouped by which joints move (faster than rest_speed) and in which sense; in each group,
    the samples whose velocity is within `tolerance` of the group's median velocity (max-norm) are kept,
    less `window` at each end of every stretch (so no acceleration enters). Rest groups lose the window
    at each end too."""
    v, w = _velocity(t, q, window)
    sense = np.where(np.abs(v) > rest_speed, np.sign(v), 0.0).astype(np.int64) + 1
    code = sense @ (3 ** np.arange(q.shape[1]))
    out = []
    bounds = np.flatnonzero(np.diff(code)) + 1
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(t)]):
        if b - a < 2 * w + 2:
            continue
        vv = v[a:b]
        moving = np.any(sense[a] != 1)
        if moving:
            plateau = np.median(vv, axis=0)
            keep = np.max(np.abs(vv - plateau), axis=1) <= tolerance * np.max(np.abs(plateau))
        else:
            plateau = np.zeros(q.shape[1])
            keep = np.ones(b - a, dtype=bool)
        keep = scipy.ndimage.binary_erosion(keep, iterations=w, border_value=0)
        labels, count = scipy.ndimage.label(keep)
        for lab in range(1, count + 1):
            idx = a + np.flatnonzero(labels == lab)
            if len(idx) < 2:
                continue
            speed = float(np.linalg.norm(plateau))
            u = plateau / speed if moving else np.zeros_like(plateau)
            origin = q[idx[0]].copy()
            out.append(Segment(idx, origin, u, speed, (q[idx] - origin) @ u))
    return out


def paired_differences(model: Model, loaded: Recording, unloaded: Recording, *,
                       rest_speed: float = REST_SPEED, tolerance: float = SPEED_TOLERANCE,
                       window: float = WINDOW, pose_tolerance: float = POSE_TOLERANCE) -> list[Pair]:
    """Loaded minus unloaded torques at the same poses, for every rest or constant-velocity segment of the
    loaded recording that the unloaded one also has (same line in joint space within pose_tolerance rad,
    same direction, speed within 10 %). The unloaded torque at the loaded sample's pose: along a moving
    segment linearly interpolated (no extrapolation), at rest the unloaded segment's mean. (Smoothing the
    unloaded torque first would not change the estimates, whose regressors are smooth along the segment,
    and would hide the unloaded run's noise from the residuals and so from the sigmas.)"""
    tau_l, tau_u = torques(model, loaded), torques(model, unloaded)
    seg_l = segments(loaded.t, loaded.q, rest_speed=rest_speed, tolerance=tolerance, window=window)
    seg_u = segments(unloaded.t, unloaded.q, rest_speed=rest_speed, tolerance=tolerance, window=window)
    pairs = []
    for L in seg_l:
        best, best_keep = None, None
        for U in seg_u:
            if L.moving != U.moving:
                continue
            ql = loaded.q[L.index]
            if L.moving:
                if L.direction @ U.direction < 1 - 1e-3 or abs(L.speed - U.speed) > 0.1 * U.speed:
                    continue
                rel = ql - U.origin
                s = rel @ U.direction
                off = np.max(np.abs(rel - s[:, None] * U.direction[None, :]), axis=1)
                keep = (off < pose_tolerance) & (s >= U.s[0]) & (s <= U.s[-1])
            else:
                keep = np.max(np.abs(ql - unloaded.q[U.index].mean(axis=0)), axis=1) < pose_tolerance
            if keep.sum() >= 2 and (best_keep is None or keep.sum() > best_keep.sum()):
                best, best_keep = U, keep
        if best is None:
            continue
        idx = L.index[best_keep]
        if L.moving:
            s = (loaded.q[idx] - best.origin) @ best.direction
            order = np.argsort(best.s)
            ref = np.column_stack([np.interp(s, best.s[order], tau_u[best.index[order], j]) for j in range(model.n)])
        else:
            ref = np.broadcast_to(tau_u[best.index].mean(axis=0), (len(idx), model.n))
        joints = tuple(int(j) for j in np.flatnonzero(np.abs(L.direction) > 1e-3))
        pairs.append(Pair(loaded.q[idx], np.broadcast_to(L.direction * L.speed, (len(idx), model.n)).copy(),
                          tau_l[idx] - ref, joints, L.speed))
    return pairs


def gravity_load_regressor(model: Model, q: np.ndarray) -> np.ndarray:
    """(K, n, 4) columns mX mY mZ m of the payload's gravity torques (qd = qdd = 0) at the poses q (K, n)."""
    zero = np.zeros_like(q)
    return dynamics.load_regressor(model, q, zero, zero)[:, :, 6:10]


# ---------------------------------------------------------------------------------------------------
# Kinematics of the plan

def _prefix(model: Model, k: int) -> Model:
    """The first k joints of the model with the flange at frame k (its kinematics give frame k)."""
    per_joint = ("joint_names", "joint_type", "placement_R", "placement_p", "axis", "inertial", "drive",
                 "gear_ratio", "torque_constant", "q_min", "q_max", "qd_max", "qdd_max", "tau_max")
    fields = {name: getattr(model, name)[:k] for name in per_joint}
    fields["dh"] = None if model.dh is None else model.dh[:k]
    return dataclasses.replace(model, flange_R=np.eye(3), flange_p=np.zeros(3), **fields)


def _frame_R(model: Model, q: np.ndarray, k: int) -> np.ndarray:
    """Rotation (K, 3, 3) of frame k (1-based) in the base at the poses q (K, n)."""
    return dynamics.flange_pose(_prefix(model, k), np.atleast_2d(q)[:, :k])[:, :3, :3]


def _unit_across(v: np.ndarray, axis: np.ndarray, what: str) -> np.ndarray:
    """v without its component along the axis, normalised."""
    v = v - (v @ axis) * axis
    norm = np.linalg.norm(v)
    if norm < 1e-6:
        raise BalanceError(f"{what} has no length across its joint axis")
    return v / norm


@dataclass(frozen=True)
class _Geometry:
    """Joints 2 and 3 (indices 1, 2) of an arm fit for the torque balance: sigma = z2 . z3 (+1 or -1),
    link directions across the axes (l2 in frame 2: joint 2 -> joint 3; l3 in frame 3: joint 3 -> joint 4)."""

    sigma: float
    l2: np.ndarray
    l3: np.ndarray
    z3: np.ndarray    # joint 3's axis in frame 3


def geometry(model: Model) -> _Geometry:
    """The parallel joints 2 and 3; BalanceError when the arm has none (use the static method)."""
    if model.n < 6 or np.any(model.joint_type[:6] != REVOLUTE):
        raise BalanceError(f"torque balance: {model.name}: needs six revolute joints (2, 3 parallel, and a "
                           f"wrist to turn the flange); use the static method")
    z2 = model.axis[1]
    z3_in2 = model.placement_R[2] @ model.axis[2]
    dot = float(z2 @ z3_in2)
    if abs(1 - abs(dot)) > PARALLEL_TOLERANCE:
        raise BalanceError(f"torque balance: {model.name}: joints {model.joint_names[1]} and "
                           f"{model.joint_names[2]} are not parallel (angle "
                           f"{math.degrees(math.acos(min(1.0, abs(dot)))):.3g} deg); the method needs two parallel "
                           f"joints 2 and 3: use the static method")
    l2 = _unit_across(model.placement_p[2], z2, f"link {model.joint_names[1]}")
    l3 = _unit_across(model.placement_p[3], model.axis[2], f"link {model.joint_names[2]}")
    return _Geometry(math.copysign(1.0, dot), l2, l3, model.axis[2].copy())


def _wrap_into(q: np.ndarray, lo: float, hi: float) -> np.ndarray | None:
    """q (values of one joint) shifted by a multiple of 2 pi into [lo, hi] as a whole, nearest to 0; None
    when no shift fits."""
    best = None
    for k in range(-3, 4):
        x = q + 2 * math.pi * k
        if x.min() >= lo and x.max() <= hi and (best is None or abs(x.mean()) < abs(best.mean())):
            best = x
    return best


def _elevation(model: Model, q: np.ndarray, k: int, link: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Angle (K,) rad of the link direction (in frame k) above the horizontal, towards h."""
    up = -np.asarray(model.gravity) / np.linalg.norm(model.gravity)
    d = _frame_R(model, q, k) @ link
    return np.arctan2(d @ up, d @ h)


def _joint_for_elevation(model: Model, q: np.ndarray, j: int, k: int, link: np.ndarray, h: np.ndarray,
                         theta: np.ndarray) -> np.ndarray:
    """Values of joint j (index) that put the link (frame k) at elevations theta (rad), the other joints
    as in q: the elevation changes one for one with a horizontal joint axis."""
    probe = np.array([q, q])
    probe[1, j] += 1e-3
    e = _elevation(model, probe, k, link, h)
    slope = np.sign(np.angle(np.exp(1j * (e[1] - e[0]))))
    return q[j] + slope * (theta - e[0])


def wrist_orientation(model: Model, along_link: str, *, grid: int = 16, tries: int = 8) -> np.ndarray:
    """Joints 4..6 (3,) rad that put the flange axis `along_link` ("x" or "z") along link 3 and another
    flange axis (z, resp. y) along joint 3's axis: the paper's poses 5b ("x") and 5d ("z"). Solved on the
    arm's kinematics: the best point of a grid^3 search within the wrist's limits, refined by bounded least
    squares from the `tries` best grid points, for both senses of each axis; the solution nearest the middle of the ranges wins.
    BalanceError when the wrist cannot reach it."""
    g = geometry(model)
    lo, hi = model.q_min[3:6], model.q_max[3:6]
    lo_f = np.where(np.isfinite(lo), lo, -math.pi)
    hi_f = np.where(np.isfinite(hi), hi, math.pi)
    R3 = _frame_R(model, np.zeros(model.n), 3)[0]

    def flange_in_3(w: np.ndarray) -> np.ndarray:
        q = np.zeros((len(w), model.n))
        q[:, 3:6] = w
        return np.einsum("ji,njk->nik", R3, dynamics.flange_pose(model, q)[:, :3, :3])

    axes = [np.linspace(lo_f[i], hi_f[i], grid) for i in range(3)]
    W = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    R = flange_in_3(W)
    solutions = []
    for s1, s2 in itertools.product((1.0, -1.0), (1.0, -1.0)):
        if along_link == "x":
            x, z = s1 * g.l3, s2 * g.z3
            target = np.column_stack([x, np.cross(z, x), z])
        else:
            z, y = s1 * g.l3, s2 * g.z3
            target = np.column_stack([np.cross(y, z), y, z])
        for k in np.argsort(np.sum((R - target) ** 2, axis=(1, 2)))[:tries]:
            res = scipy.optimize.least_squares(lambda w: (flange_in_3(w[None, :])[0] - target).ravel(), W[k],
                                               bounds=(lo_f, hi_f), xtol=1e-15, ftol=1e-15, gtol=1e-15)
            if res.cost < 1e-20:
                solutions.append(res.x)
                break
    if not solutions:
        raise BalanceError(f"torque balance: {model.name}: the wrist cannot put flange {along_link} along link 3 "
                           f"within its limits")
    middle = (lo_f + hi_f) / 2
    return min(solutions, key=lambda w: float(np.sum((w - middle) ** 2)))


def plan(model: Model, speed: float = SEED_SPEED, *, angles: tuple[float, float] = SEED_RANGE,
         q1: float = 0.0, ramp: float = RAMP) -> MotionProgram:
    """The paper's motion program for this arm: for the two wrist orientations (flange x along link 3,
    then z along link 3), sweep a (joint 2, links 2 and 3 collinear) and sweep b (joint 3, link 2
    vertical), each moving link 3 from angles[0] to angles[1] (rad above the horizontal) at `speed` rad/s;
    joint 1 at q1 rad. Run it unloaded, then loaded. BalanceError when the arm has no parallel joints 2, 3
    or the sweeps leave its limits."""
    if not (math.isfinite(speed) and speed > 0):
        raise BalanceError(f"torque balance: speed {speed!r}: expected a positive number of rad/s")
    if not (math.isfinite(ramp) and ramp > 0):
        raise BalanceError(f"torque balance: ramp {ramp!r}: expected a positive number of s")
    th0, th1 = (float(a) for a in angles)
    if not (math.isfinite(th0) and math.isfinite(th1) and th0 < th1):
        raise BalanceError(f"torque balance: angles {angles!r}: expected two increasing angles (rad)")
    g = geometry(model)
    if not (model.q_min[0] <= q1 <= model.q_max[0]):
        raise BalanceError(f"torque balance: q1 = {q1} rad is outside the limits of {model.joint_names[0]}")
    up = -np.asarray(model.gravity) / np.linalg.norm(model.gravity)
    q = np.zeros(model.n)
    q[0] = q1
    z2 = _frame_R(model, q, 2)[0] @ model.axis[1]
    if abs(z2 @ up) > 1e-6:
        raise BalanceError(f"torque balance: {model.name}: the axis of {model.joint_names[1]} is not horizontal")
    # links collinear: turn l3 (frame 3, expressed in frame 2 at q3 = 0) onto l2 about joint 3's axis
    v0 = model.placement_R[2] @ g.l3
    z = model.placement_R[2] @ model.axis[2]
    q3_line = math.atan2(float(np.cross(v0, g.l2) @ z), float(v0 @ g.l2))
    margin = speed * ramp / 2
    theta = np.array([th0 - margin, th1 + margin])
    wrists = {along: wrist_orientation(model, along) for along in ("x", "z")}
    reasons = []
    for side, fold in itertools.product((1.0, -1.0), (0.0, math.pi)):
        h = side * np.cross(up, z2)
        what = f"link 3 towards {'+' if side > 0 else '-'}(up x z2), links {'folded' if fold else 'stretched'}"
        qa = q.copy()
        qa[2] = q3_line + fold
        q2a = _wrap_into(_joint_for_elevation(model, qa, 1, 3, g.l3, h, theta), model.q_min[1], model.q_max[1])
        q3l = _wrap_into(np.array([q3_line + fold]), model.q_min[2], model.q_max[2])
        q2v = _wrap_into(_joint_for_elevation(model, q, 1, 2, g.l2, h, np.array([math.pi / 2])),
                         model.q_min[1], model.q_max[1])
        if q2a is None or q3l is None or q2v is None:
            bad = [name for name, x in ((f"{model.joint_names[1]} for sweep a", q2a),
                                        (f"{model.joint_names[2]} for links 2-3 in line", q3l),
                                        (f"{model.joint_names[1]} for link 2 vertical", q2v)) if x is None]
            reasons.append(f"{what}: {', '.join(bad)} out of range")
            continue
        qb = q.copy()
        qb[1] = q2v[0]
        q3b = _wrap_into(_joint_for_elevation(model, qb, 2, 3, g.l3, h, theta), model.q_min[2], model.q_max[2])
        if q3b is None:
            reasons.append(f"{what}: {model.joint_names[2]} for sweep b out of range")
            continue
        steps = []
        for along in ("x", "z"):
            wrist = wrists[along]
            a0, a1, b0, b1 = (q.copy() for _ in range(4))
            for p in (a0, a1, b0, b1):
                p[3:6] = wrist
            a0[1], a1[1], a0[2], a1[2] = q2a[0], q2a[1], q3l[0], q3l[0]
            b0[1], b1[1], b0[2], b1[2] = q2v[0], q2v[0], q3b[0], q3b[1]
            inner = lambda p0, p1: (p0 + (p1 - p0) * margin / np.max(np.abs(p1 - p0)),
                                    p1 - (p1 - p0) * margin / np.max(np.abs(p1 - p0)))
            sa, sb = inner(a0, a1), inner(b0, b1)
            label = {"x": "flange x along link 3", "z": "flange z along link 3"}[along]
            line = "folded" if fold else "collinear"
            steps += [a0, Sweep(f"sweep a, {label}: {model.joint_names[1]}, links 2-3 {line}", *sa, speed, ramp),
                      b0, Sweep(f"sweep b, {label}: {model.joint_names[2]}, link 2 vertical", *sb, speed, ramp)]
        program = MotionProgram("torque-balance", model.name, tuple(steps), notes=(
            f"sweeps of link 3 from {math.degrees(th0):.3g} to {math.degrees(th1):.3g} deg above the horizontal "
            f"at {math.degrees(speed):.4g} deg/s",))
        try:
            check_program(model, program)
        except BalanceError as exc:
            reasons.append(f"{what}: {exc}")
            continue
        return program
    raise BalanceError(f"torque balance: {model.name}: no sweep fits the limits ({'; '.join(reasons)})")


# ---------------------------------------------------------------------------------------------------
# Identification

def _flange_axis_along(model: Model, q: np.ndarray) -> int | None:
    """Which flange axis (0 x, 1 y, 2 z) lies along joint 3's axis at pose q, or None."""
    R3 = _frame_R(model, q, 3)[0]
    Rf = dynamics.flange_pose(model, q)[:3, :3]
    along = np.abs(Rf.T @ (R3 @ model.axis[2]))
    k = int(np.argmax(along))
    return k if along[k] > math.cos(AXIS_TOLERANCE) else None


def _ls(phi: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Least squares y = phi b over K samples: (b, sigma(b))."""
    try:
        fit = estimate.ols(phi[:, None, :], y[:, None])
    except estimate.EstimationError as exc:
        raise BalanceError(f"torque balance: {what}: {exc}") from None
    return fit.beta, fit.std


def identify(model: Model, loaded: Recording, unloaded: Recording, *, min_samples: int = MIN_SAMPLES,
             rest_speed: float = REST_SPEED, tolerance: float = SPEED_TOLERANCE, window: float = WINDOW,
             pose_tolerance: float = POSE_TOLERANCE) -> PayloadEstimate:
    """Payload mass and centre of mass by the joint-torque balance of Gao, Zhao and Li (2025).

    Their three-step least squares, from recordings of `plan`'s program run unloaded and loaded. Only
    constant-velocity samples are used, loaded paired with unloaded at the same angle, so that friction
    cancels.

    Parameters
    ----------
    model : Model
        The arm (without the payload); joints 2 and 3 must be parallel.
    loaded, unloaded : Recording
        The program's runs with and without the payload (t, q, tau or current).
    min_samples : int
        Paired constant-velocity samples each sweep must keep.
    rest_speed : float
        rad/s: a joint slower than this is at rest.
    tolerance : float
        A constant-velocity sample is within this fraction of its segment's plateau velocity.
    window : float
        s: velocities are differences over this window; segments lose it at each end.
    pose_tolerance : float
        rad: loaded and unloaded samples closer than this are at the same pose.

    Returns
    -------
    PayloadEstimate
        Mass and first moments (NaN for the inertia) with their sigmas.

    Raises
    ------
    BalanceError
        The arm or the recordings do not allow the method, in particular a sweep that keeps fewer than
        min_samples paired constant-velocity samples (one line, an InputError).

    Examples
    --------
    The program's sweeps, simulated with and without a 1.5 kg payload:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> from ident.payload import balance, payload_parameters
    >>> from ident.fit.preprocess import Recording
    >>> model = load_model("generic6")
    >>> sweeps = [sweep.samples() for sweep in balance.plan(model).sweeps]
    >>> t = np.concatenate([ts + 100.0 * k for k, (ts, _) in enumerate(sweeps)])   # 100 s apart
    >>> q = np.concatenate([qs for _, qs in sweeps])
    >>> qd = np.gradient(q, t, axis=0)
    >>> qdd = np.gradient(qd, t, axis=0)
    >>> def run(arm):
    ...     return Recording(t=t, q=q, tau=dynamics.rnea(arm, q, qd, qdd), current=None, qd=None, source=arm.name)
    >>> load = payload_parameters(1.5, [0.0, 0.02, 0.08])
    >>> est = balance.identify(model, run(dynamics.merge_payload(model, load)), run(model))
    >>> round(est.mass, 6), bool(np.allclose(est.com, [0.0, 0.02, 0.08], atol=1e-6))
    (1.5, True)
    """
    t0 = time.perf_counter()
    g = geometry(model)
    pairs = paired_differences(model, loaded, unloaded, rest_speed=rest_speed, tolerance=tolerance,
                               window=window, pose_tolerance=pose_tolerance)
    sweeps: dict[tuple[int, int], Pair] = {}    # (flange axis along joint 3, swept joint) -> pair
    for p in pairs:
        if len(p.joints) != 1 or p.joints[0] not in (1, 2):
            continue
        axis = _flange_axis_along(model, p.q[0])
        if axis is None:
            continue
        key = (axis, p.joints[0])
        if key not in sweeps or len(p.q) > len(sweeps[key].q):
            sweeps[key] = p
    names = "xyz"
    joint2, joint3 = model.joint_names[1], model.joint_names[2]
    with_ab = [a for a in (2, 1, 0) if (a, 1) in sweeps and (a, 2) in sweeps]
    if not with_ab:
        found = ", ".join(f"{joint2 if j == 1 else joint3} swept with flange {names[a]} along the axis"
                          for a, j in sweeps) or "none"
        raise BalanceError(
            f"torque balance: {loaded.source} / {unloaded.source}: no orientation has both sweep a ({joint2} "
            f"swept) and sweep b ({joint3} swept) paired loaded/unloaded at constant velocity (found: {found}); "
            f"record the program of balance.plan unloaded and loaded")
    first = with_ab[0]
    second = next((a for a in (1, 0, 2) if a != first and any(k[0] == a for k in sweeps)), None)
    if second is None:
        raise BalanceError(f"torque balance: {loaded.source}: no sweep with a second flange axis along the axis "
                           f"of {joint3} (only flange {names[first]}); the centre of mass needs both orientations")
    for (axis, j), p in sweeps.items():
        if len(p.q) < min_samples:
            raise BalanceError(
                f"torque balance: {loaded.source}: the sweep of {model.joint_names[j]} with flange {names[axis]} "
                f"along the axis has only {len(p.q)} constant-velocity samples paired with the unloaded run at "
                f"{math.degrees(p.speed):.3g} deg/s; at least {min_samples} are needed (Gao, Zhao and Li's fit failed "
                f"with 20): sweep slower or record at a higher rate")
    # step 1: the mass, sweep a's joint 2 against sweep b's joint 3 at the same link-3 angle
    d, r, shared = [], [], []
    for axis in with_ab:
        pa, pb = sweeps[(axis, 1)], sweeps[(axis, 2)]
        gap = np.max(np.abs(pa.q[0, [0, 3, 4, 5]] - pb.q[0, [0, 3, 4, 5]]))
        if gap > pose_tolerance:
            raise BalanceError(f"torque balance: {loaded.source}: sweeps a and b (flange {names[axis]} along the "
                               f"axis) differ in joints 1, 4-6 by {gap:.3g} rad; they must share them")
        link_a = pa.q[:, 1] + g.sigma * pa.q[:, 2]
        link_b = pb.q[:, 1] + g.sigma * pb.q[:, 2]
        order = np.argsort(link_b)
        inside = (link_a >= link_b.min()) & (link_a <= link_b.max())
        if inside.sum() < min_samples:
            raise BalanceError(f"torque balance: {loaded.source}: sweeps a and b share only {int(inside.sum())} "
                               f"link-3 angles; at least {min_samples} are needed")
        d.append(pa.dtau[inside, 1] - np.interp(link_a[inside], link_b[order], pb.dtau[order, 2]))
        Ya = gravity_load_regressor(model, pa.q[inside])
        r.append(Ya[:, 1, 3] - Ya[:, 2, 3])
        shared.append(int(inside.sum()))
    (m,), (sm,) = _ls(np.concatenate(r)[:, None], np.concatenate(d), "mass")
    if not m > 0:
        raise BalanceError(f"torque balance: {loaded.source}: the mass comes out {m:.4g} kg: the loaded and "
                           f"unloaded recordings may be swapped")

    def joint3_rows(axis: int) -> tuple[np.ndarray, np.ndarray]:
        """Joint 3's gravity regressor (K, 4) and torque differences minus the mass term, orientation axis."""
        ps = [p for (a, _), p in sweeps.items() if a == axis]
        Y = gravity_load_regressor(model, np.concatenate([p.q for p in ps]))[:, 2, :]
        return Y, np.concatenate([p.dtau[:, 2] for p in ps]) - m * Y[:, 3]

    # step 2: the two CoM coordinates across joint 3's axis in the first orientation
    across = [k for k in range(3) if k != first]
    Y, y = joint3_rows(first)
    c12, s12 = _ls(m * Y[:, across], y, f"{names[across[0]]}, {names[across[1]]}")
    # step 3: the coordinate along the axis of the first orientation, from the second orientation
    known = next(k for k in range(3) if k not in (second, first))
    Y, y = joint3_rows(second)
    (c3,), (s3,) = _ls(m * Y[:, [first]], y - m * Y[:, known] * c12[across.index(known)], names[first])
    com, com_sigma = np.zeros(3), np.zeros(3)
    com[across], com_sigma[across] = c12, s12
    com[first], com_sigma[first] = c3, s3
    chi = np.full(10, np.nan)
    sigma = np.full(10, np.nan)
    chi[6:9], chi[9] = m * com, m
    sigma[6:9] = np.sqrt((m * com_sigma) ** 2 + (com * sm) ** 2)
    sigma[9] = sm
    return PayloadEstimate(
        method="torque-balance", chi=chi, sigma=sigma, samples=int(sum(len(p.q) for p in sweeps.values())),
        consistent=True, seconds=time.perf_counter() - t0, frame=model.flange_frame,
        notes=[f"mass from {joint2} (sweep a) - {joint3} (sweep b) at {sum(shared)} link-3 angles in "
               f"{len(with_ab)} orientation(s)",
               f"{names[across[0]]}, {names[across[1]]} from {joint3} with flange {names[first]} along its axis",
               f"{names[first]} from {joint3} with flange {names[second]} along its axis",
               "sigmas of each step given the previous steps' values; CoM sigmas add the mass sigma"])
