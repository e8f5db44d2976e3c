"""The back-off reaction to a collision: the arm yields along the estimated external torque by a set distance at a
set speed, then holds (driver/collision.py's reaction "back_off").

    plan = plan_back_off(model, q, tau_ext, BackOff(distance=0.02, speed=0.1), rate_hz)

The goal is q + distance * tau_ext / max|tau_ext|: the joint with the largest estimate moves by `distance` (rad),
the others in proportion, each in the direction its external torque pushes it. Each joint's goal is kept
LIMIT_MARGIN inside its position limits (a joint pushed against its limit moves less, or not at all). The motion is
a rest-to-rest quintic from q (driver.motion.plan_move, checked against the position, velocity, acceleration and
torque limits before it starts) whose peak velocity is at most `speed` (rad/s) on every joint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from driver import motion
from firmware_bridge.runtime.errors import InputError
from ident.model import Model

MAX_DISTANCE = 0.2       # rad: a back-off is a small yield; a larger setting is refused (degrees by mistake?)
MAX_SPEED = 1.0          # rad/s
LIMIT_MARGIN = 1e-3      # rad: the goal stays this far inside the position limits


@dataclass(frozen=True)
class BackOff:
    """distance (rad): how far the most loaded joint yields; speed (rad/s): the highest joint speed on the way."""

    distance: float = 0.02
    speed: float = 0.1

    def __post_init__(self):
        for name, top in (("distance", MAX_DISTANCE), ("speed", MAX_SPEED)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= top:
                raise InputError(f"collision.back_off_{name}: expected a number more than 0 and at most {top:g} "
                                 f"{'rad' if name == 'distance' else 'rad/s'}, got {v!r}")


def back_off_goal(model: Model, q: np.ndarray, tau_ext: np.ndarray, distance: float) -> np.ndarray:
    """Where the back-off goes from q (rad) for the estimate tau_ext (N m): the module docstring's rule."""
    scale = float(np.max(np.abs(tau_ext)))
    if not (math.isfinite(scale) and scale > 0):
        return np.array(q, dtype=float)
    goal = q + distance * np.asarray(tau_ext, dtype=float) / scale
    lo = np.minimum(model.q_min + LIMIT_MARGIN, q)          # never further beyond a limit than it already is
    hi = np.maximum(model.q_max - LIMIT_MARGIN, q)
    return np.clip(goal, lo, hi)


def plan_back_off(model: Model, q: np.ndarray, tau_ext: np.ndarray, setting: BackOff,
                  rate_hz: float) -> motion.PlannedMotion:
    """The back-off motion from q (rad) along tau_ext (N m), checked (motion.MotionError when a limit refuses
    it)."""
    goal = back_off_goal(model, q, tau_ext, setting.distance)
    speed = 1.0
    for _ in range(8):          # the planner's duration shrinks as 1 / speed (velocity-bound) or its root
        plan = motion.plan_move(model, q, goal, rate_hz, speed=speed, name="back_off")
        peak = float(np.max(np.abs(plan.qd)))
        if peak <= setting.speed:
            return plan
        speed *= (setting.speed / peak) ** 2 * 0.999
    raise motion.MotionError(f"back_off refused: no plan at most {setting.speed:g} rad/s fast")
