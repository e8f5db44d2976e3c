"""Motions the driver executes, planned and checked against the limits as a whole before anything moves.

A `PlannedMotion` is sampled once, at the cycle rate, when the command arrives: position setpoints and a
torque feed-forward per cycle (`feed_forward_torque`: the model's rigid body, rotor inertia, gravity and payload,
and its identified Coulomb and viscous friction, the Coulomb term's sign smoothed so the torque is continuous). The cycle then only indexes arrays (no planning, no allocation at 1 kHz).
Every plan goes through `ident.model.limits.check_motion` (position, velocity, acceleration, the inverse-dynamics
torque of the model with its payload) and refuses the whole motion with the joint, quantity and time of
the first violation. Nothing non-finite is ever planned.

  plan_move(model, q_from, q_to, rate_hz)      a synchronised quintic (rest to rest) whose duration is the
                                               shortest that keeps velocity, acceleration and torque limits
  plan_trajectory(model, q_now, traj, ...)     a Fourier excitation (a file or a shipped preset,
                                               ident.fit.excitation), blended in from rest at its mean pose and
                                               out to rest there when it does not start and end at rest,
                                               preceded by a checked move to its start pose
  plan_samples(model, q_now, t, q, ...)        a sampled joint trajectory (spline through the samples),
                                               preceded by a checked move to its first sample
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from driver import waypoints
from ident.model import dynamics
from ident.errors import InputError
from ident.model.limits import LimitError, check_motion
from ident.model import Model

# Peak |velocity| and |acceleration| of the rest-to-rest quintic s(u) = 10u^3 - 15u^4 + 6u^5 over a
# distance D in time T: 15/8 D/T and 10/sqrt(3) D/T^2.
_QUINTIC_VMAX = 15.0 / 8.0
_QUINTIC_AMAX = 10.0 / math.sqrt(3.0)
SPEED_SCALE = 0.9            # plans use at most 90 % of the velocity and acceleration limits
MIN_MOVE_DURATION = 0.05     # s
AT_REST = 1e-6               # rad/s: a trajectory must start and end slower than this
MAX_MOTION_S = 600.0         # default bound on a motion's duration (s): refused before anything is sampled
MAX_SAMPLES_IN = 100_000     # the most samples a sampled trajectory may give
BLEND_S = 2.0                # s: the default blend of a trajectory that does not start and end at rest
MAX_BLEND_S = 60.0
FRICTION_SMOOTHING = 0.01    # rad/s: the width of the tanh that stands for sign(qd) in the feed-forward's Coulomb term


class MotionError(InputError):
    """A motion command cannot be planned (bad arguments, or a limit it would break)."""


@dataclass(frozen=True, eq=False)
class PlannedMotion:
    """Setpoints at rate_hz: q, qd, qdd, tau_ff (K, n) in rad, rad/s, rad/s^2, N m; segments names its
    parts with their first sample index."""

    name: str
    rate_hz: float
    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray
    tau_ff: np.ndarray
    segments: tuple[tuple[str, int], ...]
    preempt: bool = False        # asked to take over from a running motion (driver.blending)
    friction: bool = True        # tau_ff holds the model's friction (with_feed_forward)

    @property
    def samples(self) -> int:
        return self.q.shape[0]

    @property
    def duration(self) -> float:
        return (self.samples - 1) / self.rate_hz

    def progress(self, k: int) -> dict:
        """How far the motion is at its k-th setpoint: elapsed_s and duration_s (s), fraction (0..1), and the
        segment it is in with the time that segment began (segment_start_s)."""
        return progress_of(self.name, self.rate_hz, self.samples, self.segments, k)


def progress_of(name: str, rate_hz: float, samples: int, segments: tuple, k: int) -> dict:
    """PlannedMotion.progress of a motion of `samples` setpoints with these segments, at its k-th setpoint."""
    k = min(max(int(k), 0), samples - 1)
    segment, first = segments[0]
    for label, start in segments:
        if start <= k:
            segment, first = label, start
    return {"name": name, "elapsed_s": k / rate_hz, "duration_s": (samples - 1) / rate_hz,
            "fraction": k / max(samples - 1, 1), "segment": segment, "segment_start_s": first / rate_hz}


def rigid_body_model(model: Model) -> Model:
    """The model without friction and torque offset: the rigid body, rotor inertia and gravity (the feed-forward's
    part from the inverse dynamics)."""
    chi = model.standard_parameters().reshape(model.n, 14).copy()
    chi[:, 11:14] = 0.0
    return model.with_parameters(chi.reshape(-1))


def feed_forward_torque(model: Model, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray,
                        friction: bool = True) -> np.ndarray:
    """The torque (K, n) N m the drives get as their CSP torque offset along (q, qd, qdd) (K, n): the rigid body with
    rotor inertia, gravity and payload (rigid_body_model), plus the model's Coulomb and viscous friction,
    fc tanh(qd / FRICTION_SMOOTHING) + fv qd. The tanh makes the torque continuous through zero velocity (within
    1 % of fc from 2.6 times FRICTION_SMOOTHING on), so a joint at rest or reversing gets no step. The friction
    offset is left out: a constant the drives' integrators hold, and it would step at the motion's ends where the
    hold's feed-forward (gravity) takes over. friction False: the rigid body alone (for drives that compensate
    friction themselves)."""
    tau = dynamics.rnea(rigid_body_model(model), q, qd, qdd)
    if not friction:
        return tau
    fc, fv = model.drive[:, 1], model.drive[:, 2]
    return tau + fc * np.tanh(np.asarray(qd) / FRICTION_SMOOTHING) + fv * qd


def _finite_pose(model: Model, name: str, q) -> np.ndarray:
    q = np.asarray(q, dtype=float).reshape(-1)
    if q.shape != (model.n,):
        raise MotionError(f"{name}: expected {model.n} joint values, got {q.size}")
    bad = ~np.isfinite(q)
    if bad.any():
        raise MotionError(f"{name}: joint {model.joint_names[int(np.argmax(bad))]} is not finite ({q[bad][0]})")
    return q


def _quintic(D: np.ndarray, T: float, rate_hz: float) -> tuple[np.ndarray, ...]:
    K = max(2, int(math.ceil(T * rate_hz)) + 1)
    u = np.linspace(0.0, 1.0, K)[:, None]
    T = (K - 1) / rate_hz
    s = u ** 3 * (10 - 15 * u + 6 * u ** 2)
    ds = 30 * u ** 2 * (1 - u) ** 2 / T
    dds = 60 * u * (1 - u) * (1 - 2 * u) / T ** 2
    return s * D, ds * D, dds * D


def check_duration(name: str, duration: float, max_s: float) -> None:
    """Refuse a motion longer than max_s (s) before it is sampled, naming the bound."""
    if not (math.isfinite(duration) and duration <= max_s):
        raise MotionError(f"{name} refused: it would last {duration:.4g} s, over the {max_s:g} s bound on a "
                          f"motion (driver.max_motion_s)")


def _checked(model: Model, t: np.ndarray, q, qd, qdd, what: str) -> None:
    finite = np.isfinite(q).all(axis=1) & np.isfinite(qd).all(axis=1) & np.isfinite(qdd).all(axis=1)
    if not finite.all():
        k = int(np.argmin(finite))
        raise MotionError(f"{what} refused: its setpoints are not finite at t = {t[k]:.4f} s")
    try:
        check_motion(model, t, q, qd, qdd)
    except LimitError as exc:
        raise MotionError(f"{what} refused: {exc}") from None


def warm_up(model: Model, rate_hz: float) -> None:
    """Compile (or load from numba's cache) the kernels planning calls in this process (the driver plans a stop, a
    preempting blend and a back-off beside its cycle): a short move at the middle of the position limits, with and
    without friction in its feed-forward. A move a limit refuses has compiled them as well."""
    mid = 0.5 * (model.q_min + model.q_max)
    q0 = np.where(np.isfinite(mid), mid, 0.0)
    try:
        plan = plan_move(model, q0, q0 + 1e-3, rate_hz, name="warm-up")
        with_feed_forward(plan, model, not plan.friction)
    except MotionError:
        pass


def plan_move(model: Model, q_from, q_to, rate_hz: float, *, speed: float = 1.0, name: str = "move_to",
              max_s: float = MAX_MOTION_S) -> PlannedMotion:
    """A rest-to-rest synchronised quintic from q_from to q_to (rad), at `speed` (0 < speed <= 1) of the
    fastest duration that the velocity and acceleration limits allow; lengthened while the torque limit is
    broken (at most 4 times x2), then refused with the joint, quantity and time. Refused when it would last
    longer than max_s (s)."""
    q0 = _finite_pose(model, f"{name}: start", q_from)
    q1 = _finite_pose(model, f"{name}: goal", q_to)
    if not (isinstance(speed, (int, float)) and 0.0 < speed <= 1.0):
        raise MotionError(f"{name}: speed {speed!r}: expected 0 < speed <= 1")
    lo, hi = model.q_min, model.q_max
    outside = (q1 < lo) | (q1 > hi)
    if outside.any():
        j = int(np.argmax(outside))
        raise MotionError(f"{name} refused: joint {model.joint_names[j]}: goal {q1[j]:.4g} outside the position "
                          f"limits [{lo[j]:.4g}, {hi[j]:.4g}]")
    D = q1 - q0
    scale = SPEED_SCALE * speed
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t_v = np.nanmax(np.where(D != 0, _QUINTIC_VMAX * np.abs(D) / (scale * model.qd_max), 0.0))
        t_a = np.nanmax(np.where(D != 0, np.sqrt(_QUINTIC_AMAX * np.abs(D) / (scale * model.qdd_max)), 0.0))
    T = max(MIN_MOVE_DURATION, float(t_v), float(t_a))
    for attempt in range(5):
        check_duration(name, T, max_s)
        dq, dqd, dqdd = _quintic(D, T, rate_hz)
        q = q0 + dq
        t = np.arange(q.shape[0]) / rate_hz
        try:
            check_motion(model, t, q, dqd, dqdd)
        except LimitError as exc:
            if exc.quantity != "torque" or attempt == 4:
                raise MotionError(f"{name} refused: {exc}") from None
            T *= 2.0
            continue
        return _motion(model, name, rate_hz, [(name, q, dqd, dqdd)])
    raise AssertionError("unreachable")


def _motion(model: Model, name: str, rate_hz: float, parts) -> PlannedMotion:
    q = np.concatenate([p[1] for p in parts])
    qd = np.concatenate([p[2] for p in parts])
    qdd = np.concatenate([p[3] for p in parts])
    starts, k = [], 0
    for p in parts:
        starts.append((p[0], k))
        k += p[1].shape[0]
    tau_ff = _checked_feed_forward(model, name, rate_hz, q, qd, qdd, True)
    for a in (q, qd, qdd):
        a.setflags(write=False)
    return PlannedMotion(name, float(rate_hz), q, qd, qdd, tau_ff, tuple(starts))


def _checked_feed_forward(model: Model, name: str, rate_hz: float, q, qd, qdd, friction: bool) -> np.ndarray:
    tau_ff = feed_forward_torque(model, q, qd, qdd, friction)
    over = np.abs(tau_ff) > model.tau_max       # the torque sent: checked itself, not only the model's whole torque
    if over.any():
        k, j = np.argwhere(over)[0]
        raise MotionError(f"{name}: joint {j + 1}'s torque feed-forward {tau_ff[k, j]:.4g} N m at t = {k / rate_hz:.3f} s "
                          f"is outside its torque limit {model.tau_max[j]:.4g} N m")
    tau_ff.setflags(write=False)
    return tau_ff


def with_feed_forward(plan: PlannedMotion, model: Model, friction: bool) -> PlannedMotion:
    """The plan with its torque feed-forward with or without the model's friction (feed_forward_torque), checked
    against the torque limits again; the plan itself when it already is so."""
    if plan.friction == friction:
        return plan
    tau_ff = _checked_feed_forward(model, plan.name, plan.rate_hz, plan.q, plan.qd, plan.qdd, friction)
    return dataclasses.replace(plan, tau_ff=tau_ff, friction=friction)


def _cycle_times(duration: float, rate_hz: float) -> np.ndarray:
    """Times of whole cycles from 0 to duration; the last is duration itself (at most one cycle after
    the one before)."""
    t = np.arange(int(math.ceil(duration * rate_hz - 1e-9)) + 1) / rate_hz
    t[-1] = duration
    return t


def _with_approach(model: Model, name: str, q_now, t, q, qd, qdd, rate_hz: float,
                   qd_ends: tuple[np.ndarray, np.ndarray], max_s: float,
                   parts: tuple[tuple[str, int], ...] | None = None) -> PlannedMotion:
    """The motion (t, q, qd, qdd), preceded by a move from q_now; qd_ends, the exact velocities at its
    start and end, must be at rest. parts: the motion's named segments (name, first sample), default one."""
    for label, v in zip(("start", "end"), qd_ends):
        if np.max(np.abs(v)) > AT_REST:
            j = int(np.argmax(np.abs(v)))
            raise MotionError(f"{name} refused: it does not {label} at rest (joint {model.joint_names[j]}: "
                              f"velocity {v[j]:.4g} rad/s at its {label}); design it to start and end at rest, or blend it in "
                              f"and out (blend_s)")
    _checked(model, t, q, qd, qdd, name)
    approach = plan_move(model, q_now, q[0], rate_hz, name=f"{name}: move to start", max_s=max_s)
    bounds = [k for _, k in parts or ((name, 0),)] + [q.shape[0]]
    pieces = [(label, q[a:b], qd[a:b], qdd[a:b]) for (label, _), a, b in zip(parts or ((name, 0),), bounds, bounds[1:])]
    return _motion(model, name, rate_hz, [("move to start", approach.q, approach.qd, approach.qdd), *pieces])


def plan_trajectory(model: Model, q_now, traj, rate_hz: float, *, periods: float = 1.0,
                    max_s: float = MAX_MOTION_S, blend_s: float | None = None) -> PlannedMotion:
    """A Fourier trajectory (ident.fit.excitation.FourierTrajectory) over `periods` periods, preceded by a move
    from q_now to its start pose; checked as a whole; refused beyond max_s (s).

    blend_s: seconds of a smooth blend from rest at the trajectory's mean pose into the motion and, after
    it, back to rest there (FourierTrajectory.blended); the blends are part of the motion and checked with
    it. None (default): BLEND_S when the trajectory does not start and end at rest, else none. 0: no blend
    (a trajectory that does not start and end at rest is then refused)."""
    if traj.n != model.n:
        raise MotionError(f"run_trajectory: the trajectory has {traj.n} joints, the arm {model.n}")
    if not (periods > 0 and math.isfinite(periods)):
        raise MotionError(f"run_trajectory: periods {periods!r}: expected a positive number")
    end = periods * traj.period
    rest = traj.evaluate(np.array([0.0, end]))[1]
    if blend_s is None:
        blend_s = 0.0 if np.abs(rest).max() <= AT_REST else BLEND_S
    if not (math.isfinite(blend_s) and 0.0 <= blend_s <= MAX_BLEND_S):
        raise MotionError(f"run_trajectory: blend_s {blend_s!r}: expected 0 to {MAX_BLEND_S:g} s")
    check_duration("run_trajectory", end + 2 * blend_s, max_s)
    if end * rate_hz < 2:
        raise MotionError(f"run_trajectory: periods {periods!r}: {end:.3g} s is shorter than two cycles")
    q_now = _finite_pose(model, "current pose", q_now)
    if blend_s == 0.0:
        t = _cycle_times(end, rate_hz)
        q, qd, qdd = traj.evaluate(t)
        return _with_approach(model, "run_trajectory", q_now, t, q, qd, qdd, rate_hz, (rest[0], rest[1]), max_s)
    t = _cycle_times(end + 2 * blend_s, rate_hz)
    q, qd, qdd = traj.blended(t - blend_s, lead=blend_s, end=end)
    at_rest = traj.blended(np.array([-blend_s, end + blend_s]), lead=blend_s, end=end)[1]
    lead = int(round(blend_s * rate_hz))
    tail = int(round((end + blend_s) * rate_hz))
    return _with_approach(model, "run_trajectory", q_now, t, q, qd, qdd, rate_hz, (at_rest[0], at_rest[1]), max_s,
                          parts=(("blend in", 0), ("run_trajectory", lead), ("blend out", tail)))


def plan_samples(model: Model, q_now, t, q, rate_hz: float, *, max_s: float = MAX_MOTION_S, qd=None,
                 qdd=None, preempt: bool = False) -> PlannedMotion:
    """A sampled trajectory t (N,) s strictly increasing, q (N, n) rad, resampled at rate_hz through its waypoints
    (driver.waypoints: a cubic spline clamped at rest at both ends; with waypoint velocities qd (N, n) rad/s a cubic
    Hermite spline, with accelerations qdd (N, n) rad/s^2 too a quintic one, which must then start and end at rest);
    preceded by a move from q_now to q[0]; checked as a whole; refused beyond max_s (s) or MAX_SAMPLES_IN samples.
    preempt: the trajectory may start in motion (a running motion blends into it, driver.blending); it must still
    end at rest."""
    t = np.asarray(t, dtype=float).reshape(-1)
    if t.size > MAX_SAMPLES_IN:
        raise MotionError(f"run_trajectory: samples: {t.size} samples, over the bound of {MAX_SAMPLES_IN}")
    q = np.atleast_2d(np.asarray(q, dtype=float))
    if q.shape != (t.size, model.n):
        raise MotionError(f"run_trajectory: samples: expected q of shape ({t.size}, {model.n}), got {q.shape}")
    derivatives = {}
    for key, value in (("qd", qd), ("qdd", qdd)):
        if value is not None:
            value = np.atleast_2d(np.asarray(value, dtype=float))
            if value.shape != q.shape:
                raise MotionError(f"run_trajectory: samples: expected {key} of shape {q.shape}, got {value.shape}")
            derivatives[key] = value
    if "qdd" in derivatives and "qd" not in derivatives:
        raise MotionError("run_trajectory: samples: qdd (waypoint accelerations) needs qd (waypoint velocities)")
    if t.size < 2:
        raise MotionError("run_trajectory: samples: at least 2 samples are needed")
    finite = np.isfinite(t) & np.isfinite(q).all(axis=1)
    for value in derivatives.values():
        finite &= np.isfinite(value).all(axis=1)
    if not finite.all():
        k = int(np.argmin(finite))
        raise MotionError(f"run_trajectory: samples: sample {k} is not finite")
    if np.any(np.diff(t) <= 0):
        k = int(np.argmax(np.diff(t) <= 0)) + 1
        raise MotionError(f"run_trajectory: samples: time is not strictly increasing at sample {k} (t = {t[k]})")
    check_duration("run_trajectory", float(t[-1] - t[0]), max_s)
    spline = waypoints.curve(t, q, derivatives.get("qd"), derivatives.get("qdd"))
    tt = _cycle_times(t[-1] - t[0], rate_hz)
    qd_t, qdd_t = spline(tt, 1), spline(tt, 2)
    if "qdd" in derivatives:
        for label, k in (("start", 0), ("end", -1))[1 if preempt else 0:]:
            a = derivatives["qdd"][k]
            if np.max(np.abs(a)) > AT_REST:
                j = int(np.argmax(np.abs(a)))
                raise MotionError(f"run_trajectory refused: it does not {label} at rest (joint "
                                  f"{model.joint_names[j]}: acceleration {a[j]:.4g} rad/s^2 at its {label})")
    return _with_approach(model, "run_trajectory", _finite_pose(model, "current pose", q_now), tt,
                          spline(tt), qd_t, qdd_t, rate_hz, (np.zeros(model.n) if preempt else qd_t[0], qd_t[-1]), max_s)
