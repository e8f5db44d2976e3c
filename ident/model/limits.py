"""Checks of sampled joint motions against a model's limits, before anything moves.

One function serves the excitation designer, the driver's command checks and the simulator:
`check_motion` raises a LimitError naming the joint, the quantity, the value, the limit and the time.
"""
from __future__ import annotations

import numpy as np

from ident.model import dynamics
from firmware_bridge.runtime.errors import InputError
from ident.model.robot import Model


class LimitError(InputError):
    """A motion leaves the model's limits. Attributes name the first violation found."""

    def __init__(self, joint: str, quantity: str, value: float, limit: float, time: float, unit: str,
                 relation: str = "outside the limit"):
        self.joint, self.quantity, self.value, self.limit, self.time = joint, quantity, value, limit, time
        super().__init__(f"{joint}: {quantity} {value:.4g} {unit} {relation} {limit:.4g} {unit} "
                         f"at t = {time:.4f} s")


_UNITS = {"position": ("rad", "m"), "velocity": ("rad/s", "m/s"), "acceleration": ("rad/s^2", "m/s^2"),
          "torque": ("N m", "N")}


def _first_violation(model: Model, t: np.ndarray, x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     quantity: str) -> None:
    over = (x > hi) | (x < lo)
    if not over.any():
        return
    k, j = np.argwhere(over)[0]
    limit = hi[j] if x[k, j] > hi[j] else lo[j]
    unit = _UNITS[quantity][int(model.joint_type[j])]
    raise LimitError(f"joint {model.joint_names[j]}", quantity, float(x[k, j]), float(limit), float(t[k]), unit)


def check_motion(model: Model, t, q, qd=None, qdd=None, *, torque: bool = True, floor_z: float | None = None,
                 scale: float = 1.0) -> None:
    """Raise LimitError unless every sample keeps q, qd, qdd and (torque=True) the inverse-dynamics
    torque of the model within its limits, and (floor_z) the flange origin above z = floor_z (m, base frame).

    scale < 1 tightens every limit (a safety margin): e.g. 0.95 keeps 5 % away from each bound.
    """
    t = np.asarray(t, dtype=float)
    q = np.atleast_2d(np.asarray(q, dtype=float))
    centre, half = (model.q_max + model.q_min) / 2, (model.q_max - model.q_min) / 2
    _first_violation(model, t, q, centre - scale * half, centre + scale * half, "position")
    if qd is not None:
        qd = np.atleast_2d(np.asarray(qd, dtype=float))
        _first_violation(model, t, qd, -scale * model.qd_max, scale * model.qd_max, "velocity")
    if qdd is not None:
        qdd = np.atleast_2d(np.asarray(qdd, dtype=float))
        _first_violation(model, t, qdd, -scale * model.qdd_max, scale * model.qdd_max, "acceleration")
    if torque and qd is not None and qdd is not None:
        tau = dynamics.rnea(model, q, qd, qdd)
        _first_violation(model, t, tau, -scale * model.tau_max, scale * model.tau_max, "torque")
    if floor_z is not None:
        z = dynamics.flange_pose(model, q)[:, 2, 3]
        below = np.flatnonzero(z < floor_z)
        if below.size:
            k = below[0]
            raise LimitError("flange", "height", float(z[k]), floor_z, float(t[k]), "m", "is below the floor plane z =")


def limit_usage(model: Model, q, qd, qdd) -> dict[str, tuple[float, str]]:
    """The largest share of each limit a motion uses: {"position" | "velocity" | "acceleration" | "torque":
    (fraction, joint name)}; 1.0 is at the limit. Positions count from the middle of their range."""
    q, qd, qdd = (np.atleast_2d(np.asarray(x, dtype=float)) for x in (q, qd, qdd))
    centre, half = (model.q_max + model.q_min) / 2, (model.q_max - model.q_min) / 2
    shares = {"position": np.abs(q - centre) / half, "velocity": np.abs(qd) / model.qd_max,
              "acceleration": np.abs(qdd) / model.qdd_max,
              "torque": np.abs(dynamics.rnea(model, q, qd, qdd)) / model.tau_max}
    out = {}
    for quantity, share in shares.items():
        per_joint = np.nan_to_num(share, nan=0.0).max(axis=0)
        j = int(np.argmax(per_joint))
        out[quantity] = (float(per_joint[j]), model.joint_names[j])
    return out
