"""A new trajectory taking over from a running motion while it moves (run_trajectory's `preempt`): from the running
motion's position, velocity and acceleration at a setpoint a little ahead (LEAD_S, so that the cycle has not passed
it when the hand-over comes), a quintic over BLEND_S seconds reaches the new trajectory's position, velocity and
acceleration at BLEND_S into it (twice, four, eight times as long while the blend breaks a limit); the new trajectory
goes on from there. Time 0 of the new trajectory is the
hand-over. The blend is checked against the limits (positions, velocities, accelerations, torques) before it is
handed to the cycle; the rest of the new trajectory was checked when it was planned. Refused (nothing changes) when
the blend would break a limit.
"""
from __future__ import annotations

import math

import numpy as np

from driver import motion as planning

BLEND_S = 0.3                 # s: the quintic from the running motion into the new one; doubled while a limit is
BLEND_TRIES = 4               # broken, at most this many times (then refused)
LEAD_S = 0.05                 # s: the hand-over setpoint, ahead of the running one


def quintic(x0, v0, a0, x1, v1, a1, T: float, tau: np.ndarray):
    """q, qd, qdd at times tau (M,) of the quintic with these positions, velocities and accelerations (n,) at 0 and
    at T."""
    x0, v0, a0, x1, v1, a1 = (np.asarray(a, dtype=float) for a in (x0, v0, a0, x1, v1, a1))
    c3 = (20 * (x1 - x0) - (8 * v1 + 12 * v0) * T - (3 * a0 - a1) * T**2) / (2 * T**3)
    c4 = (30 * (x0 - x1) + (14 * v1 + 16 * v0) * T + (3 * a0 - 2 * a1) * T**2) / (2 * T**4)
    c5 = (12 * (x1 - x0) - 6 * (v1 + v0) * T - (a0 - a1) * T**2) / (2 * T**5)
    t = tau[:, None]
    q = x0 + v0 * t + a0 / 2 * t**2 + c3 * t**3 + c4 * t**4 + c5 * t**5
    qd = v0 + a0 * t + 3 * c3 * t**2 + 4 * c4 * t**3 + 5 * c5 * t**4
    qdd = a0 + 6 * c3 * t + 12 * c4 * t**2 + 20 * c5 * t**3
    return q, qd, qdd


def plan_blend(model, old: planning.PlannedMotion, at: int, new: planning.PlannedMotion) -> planning.PlannedMotion:
    """From setpoint `at` of the running motion `old` into the trajectory part of `new` (its segment
    "run_trajectory", time 0 at the hand-over): the blend, then the rest of the new trajectory (MotionError when the
    blend breaks a limit)."""
    r = old.rate_hz
    start = dict(new.segments).get("run_trajectory", 0)
    refusal = None
    for attempt in range(BLEND_TRIES):                   # longer blends while a limit is broken
        kb = min(int(round(BLEND_S * 2**attempt * r)), new.samples - start - 1)
        if kb < 1:
            raise planning.MotionError("run_trajectory: preempt: the new trajectory is too short to blend into")
        T = kb / r
        tau = np.arange(kb) / r
        i = start + kb
        q, qd, qdd = quintic(old.q[at], old.qd[at], old.qdd[at], new.q[i], new.qd[i], new.qdd[i], T, tau)
        try:
            planning._checked(model, tau, q, qd, qdd, f"run_trajectory: preempt: the blend over {T:g} s")
            break
        except planning.MotionError as exc:
            refusal = exc
            if kb == new.samples - start - 1:
                raise
    else:
        raise refusal
    blend = planning.with_feed_forward(planning._motion(model, "blend", r, [("blend", q, qd, qdd)]), model,
                                       new.friction)
    parts = {name: np.concatenate([getattr(blend, name), getattr(new, name)[i:]]) for name in ("q", "qd", "qdd", "tau_ff")}
    for a in parts.values():
        a.setflags(write=False)
    return planning.PlannedMotion("run_trajectory", r, parts["q"], parts["qd"], parts["qdd"], parts["tau_ff"],
                                  (("blend", 0), ("run_trajectory", kb)), friction=new.friction)


def lead_cycles(rate_hz: float, factor: float = 1.0) -> int:
    return max(1, int(math.ceil(factor * LEAD_S * rate_hz)))
