"""The general static method, armid's generalisation of the torque balance of Gao, Zhao and Li (2025):
payload mass and first moments from every joint's torque at any set of static or constant-velocity poses,
with the full kinematic model.

At rest or at constant velocity, the loaded minus the unloaded torque at the same pose (and velocity) is
the payload's gravity torque, linear in its mass and first moments:

    Delta_tau(q) = Y_g(q) [mX mY mZ m],    Y_g = columns 7-10 of ident.model.dynamics.load_regressor(q, 0, 0)

(the payload's velocity-product torques, of order m |c| qd^2, are left out as in the torque balance).
Stacking every joint's rows over the poses gives one weighted least squares (ident.fit.estimate.wls,
Gautier's per-joint weights) for the four parameters: no parallel joints, no special wrist orientation, no
three-step chain of errors. Any 6R arm whose flange can be turned identifies all four.

    program = plan(model, count=12)       # D-optimal poses, each crossed by a slow constant-velocity pass
    program.write("static.motion.json"); program.targets_csv("static.targets.csv")
    est = identify(model, loaded, unloaded)   # also works on the torque-balance program's recordings

The poses are chosen D-optimally (maximum det of the information matrix of the four parameters) among
random candidates within the joint limits, by greedy forward selection and Fedorov exchange. Each pose is
crossed by a short pass at constant speed (all joints together), so that friction is the same loaded and
unloaded and cancels, as in Gao, Zhao and Li's torque balance; rest segments in a recording are used as well.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ident.model import dynamics
from ident.fit import estimate
from ident.calibration.planning import select_d_optimal
from firmware_bridge.runtime.errors import InputError
from ident.model import Model
from ident.payload.balance import (MOVE_SPEED, POSE_TOLERANCE, RAMP, REST_SPEED, SPEED_TOLERANCE, WINDOW,
                                   MotionProgram, Sweep, check_program, gravity_load_regressor,
                                   paired_differences)
from ident.payload.result import PayloadEstimate

PASS_SPEED = math.radians(2.0)      # rad/s of every joint during a pass
PASS_HALF_WIDTH = math.radians(3.0)  # rad each joint moves either side of the pose
MIN_SAMPLES = 40                    # paired samples in all (rows = samples x joints) below which we refuse
NAMES = ["mX", "mY", "mZ", "m"]


class StaticError(InputError):
    """The static method cannot plan or identify from what it was given."""


@dataclass(frozen=True)
class PoseDesign:
    """D-optimal poses (K, n) rad, log10 det of their information matrix (payload of 1 kg scale) and the
    predicted sigmas (4,) of mX mY mZ m for a torque noise of 1 N m on every joint."""

    poses: np.ndarray
    log10_det: float
    sigma_per_newton_metre: np.ndarray


def design(model: Model, count: int = 12, *, candidates: int = 2000, seed: int = 0,
           margin: float = PASS_HALF_WIDTH + 0.05, torque_share: float = 0.8,
           floor_z: float | None = None) -> PoseDesign:
    """D-optimal poses for the four gravity parameters: `candidates` random poses at least `margin` rad
    inside the joint limits, keeping those whose unloaded gravity torque stays below torque_share of each
    joint's limit and (floor_z) whose flange origin is above z = floor_z m."""
    if not (isinstance(count, int) and count >= 2):
        raise StaticError(f"plan: count {count!r}: expected at least 2 poses")
    lo, hi = model.q_min + margin, model.q_max - margin
    if np.any(lo >= hi):
        j = int(np.argmax(lo >= hi))
        raise StaticError(f"plan: joint {model.joint_names[j]}: its range is too short for a pass of +-{margin:.3g} rad")
    lo, hi = np.where(np.isfinite(lo), lo, -math.pi), np.where(np.isfinite(hi), hi, math.pi)
    Q = np.random.default_rng(seed).uniform(lo, hi, size=(candidates, model.n))
    ok = np.all(np.abs(dynamics.gravity_torques(model, Q)) <= torque_share * model.tau_max, axis=1)
    if floor_z is not None:
        ok &= dynamics.flange_pose(model, Q)[:, 2, 3] > floor_z
    Q = Q[ok]
    F = np.ascontiguousarray(gravity_load_regressor(model, Q))
    if count > len(F):
        raise StaticError(f"plan: {count} poses requested from only {len(F)} feasible candidates")
    idx = select_d_optimal(F, count)
    A = F[idx].reshape(-1, 4)
    s = np.linalg.svd(A, compute_uv=False)
    if s[-1] <= 1e-9 * s[0]:
        raise StaticError(f"plan: {model.name}: no set of poses identifies all of mX, mY, mZ, m (the flange "
                          f"cannot be turned enough)")
    sigma = np.sqrt(np.diag(np.linalg.inv(A.T @ A)))
    return PoseDesign(Q[idx], float(2 * np.sum(np.log10(s))), sigma)


def plan(model: Model, count: int = 12, *, speed: float = PASS_SPEED, half_width: float = PASS_HALF_WIDTH,
         ramp: float = RAMP, candidates: int = 2000, seed: int = 0, floor_z: float | None = None) -> MotionProgram:
    """The static method's motion program: `count` D-optimal poses, each crossed by a pass of every joint
    from -half_width to +half_width rad about it at `speed` rad/s. Run it unloaded, then loaded."""
    if not (math.isfinite(speed) and speed > 0 and math.isfinite(half_width) and half_width > 0):
        raise StaticError(f"plan: speed {speed!r} rad/s and half_width {half_width!r} rad must be positive")
    d = design(model, count, candidates=candidates, seed=seed, margin=half_width + speed * ramp, floor_z=floor_z)
    steps = []
    for k, q in enumerate(d.poses, start=1):
        a, b = q - half_width, q + half_width
        steps += [a - speed * ramp / 2, Sweep(f"pass {k} of {count}", a, b, speed, ramp)]
    program = MotionProgram("static", model.name, tuple(steps), move_speed=MOVE_SPEED, notes=(
        f"{count} D-optimal poses, log10 det {d.log10_det:.2f}; passes of +-{math.degrees(half_width):.3g} deg "
        f"at {math.degrees(speed):.3g} deg/s",))
    try:
        check_program(model, program)
    except InputError as exc:
        raise StaticError(str(exc)) from None
    return program


def identify(model: Model, loaded, unloaded, *, min_samples: int = MIN_SAMPLES, rest_speed: float = REST_SPEED,
             tolerance: float = SPEED_TOLERANCE, window: float = WINDOW,
             pose_tolerance: float = POSE_TOLERANCE) -> PayloadEstimate:
    """Payload mass and first moments (mX, mY, mZ, m) from the same motion recorded unloaded and loaded.

    Every rest or constant-velocity sample of the loaded run is paired with the unloaded run at the same
    pose; every joint's torque difference is the payload's gravity torque, and one weighted least squares
    gives the four parameters.

    Parameters
    ----------
    model : Model
        The arm (without the payload).
    loaded, unloaded : Recording
        The runs with and without the payload (ident.fit.preprocess.Recording: t, q, tau or current).
    min_samples : int
        Paired samples needed at least.
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
        chi with mX, mY, mZ, m (NaN for the inertia, which gravity does not show), their sigmas, and
        whether the mass is positive.

    Raises
    ------
    StaticError
        Too few samples pair up, or the poses do not determine the four parameters (an InputError).

    Examples
    --------
    Recordings that hold each of 8 poses for half a second, torques from the model with and without a
    1.5 kg payload:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> from ident.payload.static import identify
    >>> from ident.fit.preprocess import Recording
    >>> model = load_model("generic6")
    >>> q = np.repeat(np.random.default_rng(0).uniform(-1, 1, (8, 6)), 50, axis=0)
    >>> t = np.arange(len(q)) / 100.0
    >>> def run(arm):
    ...     return Recording(t=t, q=q, tau=dynamics.gravity_torques(arm, q), current=None, qd=None, source=arm.name)
    >>> load = payload_parameters(1.5, [0.0, 0.02, 0.08])
    >>> est = identify(model, run(dynamics.merge_payload(model, load)), run(model))
    >>> round(est.mass, 6), bool(np.allclose(est.com, [0.0, 0.02, 0.08])), est.identified
    (1.5, True, ('mX', 'mY', 'mZ', 'm'))
    """
    t0 = time.perf_counter()
    pairs = paired_differences(model, loaded, unloaded, rest_speed=rest_speed, tolerance=tolerance,
                               window=window, pose_tolerance=pose_tolerance)
    count = sum(len(p.q) for p in pairs)
    if count < min_samples:
        raise StaticError(f"static: {loaded.source} / {unloaded.source}: only {count} rest or constant-velocity "
                          f"samples pair up loaded with unloaded at the same pose; at least {min_samples} are "
                          f"needed: record the same program unloaded and loaded")
    q = np.concatenate([p.q for p in pairs])
    y = np.concatenate([p.dtau for p in pairs])
    W = gravity_load_regressor(model, q)
    active = np.any(np.abs(W) > 1e-12, axis=(0, 2))   # a vertical joint 1 sees no gravity
    try:
        fit = estimate.wls(W[:, active], y[:, active], names=NAMES)
    except estimate.EstimationError as exc:
        raise StaticError(f"static: {loaded.source}: {exc}") from None
    chi = np.full(10, np.nan)
    sigma = np.full(10, np.nan)
    chi[6:10], sigma[6:10] = fit.beta, fit.std
    consistent = bool(fit.beta[3] > 0)
    return PayloadEstimate(
        method="static", chi=chi, sigma=sigma, samples=int(count), consistent=consistent,
        consistency="" if consistent else f"mass {fit.beta[3]:.4g} kg is not positive",
        seconds=time.perf_counter() - t0, frame=model.flange_frame,
        notes=[f"{len(pairs)} segments, {count} samples x {int(active.sum())} joints, WLS cond {fit.cond:.3g}"])
