"""A controlled stop along the path: the running motion slowed to rest on its own path, the drives staying enabled
(the `stop` command; what a trajectory controller does on cancel).

From setpoint k on, the motion's time runs slower and slower: original time t_o = k / rate + sigma(tau) with
sigma' = v(tau), v falling from 1 to 0 as 1 - (3 x^2 - 2 x^3), x = tau / T. The setpoints follow the same path
(positions interpolated between the motion's setpoints), velocities qd_o v, accelerations qdd_o v^2 + qd_o v'. T is
long enough that the braking term stays within half the acceleration limit at the velocities of the stop's start
(at least MIN_STOP_S); the stop is checked against the limits like every motion (positions, velocities,
accelerations, torques) before it replaces the rest of the motion, and refused otherwise.
"""
from __future__ import annotations

import math

import numpy as np

from driver import motion as planning

MIN_STOP_S = 0.05             # s: the shortest stop
BRAKE_SHARE = 0.5             # of the acceleration limit the braking term may use
LEAD_S = 0.05                 # s: a stop is planned from this far ahead of the running setpoint


def plan_stop(model, m: planning.PlannedMotion, k: int) -> planning.PlannedMotion:
    """The stop of motion `m` starting at its setpoint k (MotionError if it would break a limit)."""
    r = m.rate_hz
    k = min(max(int(k), 0), m.samples - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.nanmax(np.where(model.qdd_max > 0, 1.5 * np.abs(m.qd[k]) / (BRAKE_SHARE * model.qdd_max), 0.0))
    T = max(MIN_STOP_S, float(need))
    tau = np.arange(int(math.ceil(T * r)) + 1) / r
    tau[-1] = T
    x = tau / T
    v = 1.0 - (3 * x**2 - 2 * x**3)
    dv = -(6 * x - 6 * x**2) / T
    sigma = T * (x - x**3 + x**4 / 2)
    idx = np.minimum(k + sigma * r, m.samples - 1)
    lo = np.floor(idx).astype(int)
    hi = np.minimum(lo + 1, m.samples - 1)
    w = (idx - lo)[:, None]
    at = lambda a: (1 - w) * a[lo] + w * a[hi]                       # noqa: E731 -- the motion between setpoints
    q, qd_o, qdd_o = at(m.q), at(m.qd), at(m.qdd)
    qd = qd_o * v[:, None]
    qdd = qdd_o * (v**2)[:, None] + qd_o * dv[:, None]
    planning._checked(model, tau, q, qd, qdd, "stop")
    stop = planning._motion(model, "stop", r, [("stop", q, qd, qdd)])
    return planning.with_feed_forward(stop, model, m.friction)           # as the motion it stops


class HandOver:
    """Motion m runs on from its setpoint k0 up to k1 - 1 (segment "hand-over"), then `successor` (a stop, or a blend
    into a new trajectory, planned from m's setpoint k1) from its first setpoint. Nothing is copied: the cycle
    switches from m to the successor when it reaches k1, so a hand-over costs the cycle the same whatever the
    successor's length. Reported as one motion named as the successor, its segments after the hand-over's."""

    __slots__ = ("old", "k0", "k1", "successor")

    def __init__(self, m: planning.PlannedMotion, k0: int, k1: int, successor: planning.PlannedMotion):
        if not 0 <= k0 <= k1 < m.samples:
            raise ValueError(f"hand-over: setpoints {k0}..{k1} outside the motion's 0..{m.samples - 1}")
        self.old, self.k0, self.k1, self.successor = m, k0, k1, successor

    @property
    def samples(self) -> int:
        return self.k1 - self.k0 + self.successor.samples

    @property
    def segments(self) -> tuple:
        head = (("hand-over", 0),) if self.k1 > self.k0 else ()
        return head + tuple((name, k + (self.k1 - self.k0)) for name, k in self.successor.segments)

    def progress(self, k: int) -> dict:
        """The progress at the old motion's setpoint k (k0 <= k < k1): PlannedMotion.progress of the joined motion."""
        s = self.successor
        return planning.progress_of(s.name, s.rate_hz, self.samples, self.segments, k - self.k0)


