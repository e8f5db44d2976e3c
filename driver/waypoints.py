"""The curve through a sampled trajectory's waypoints: times t (N,) s, positions q (N, n) rad and, when given,
velocities qd (N, n) rad/s and accelerations qdd (N, n) rad/s^2 at each waypoint.

  positions only            a cubic spline clamped at rest at both ends (scipy CubicSpline, bc "clamped")
  positions and velocities  a cubic Hermite spline: through every waypoint with its velocity
  and accelerations         a quintic Hermite spline (scipy BPoly.from_derivatives): position, velocity and
                            acceleration at every waypoint

The driver plans run_trajectory's `samples` with it (driver.motion.plan_samples), and a client that wants the
setpoint the driver follows at a time (the ROS 2 bridge's feedback) evaluates the same curve.
"""
from __future__ import annotations

import numpy as np
import scipy.interpolate


def curve(t, q, qd=None, qdd=None):
    """A callable c(tt, nu=0): the nu-th derivative (0, 1, 2) at times tt of the curve through the waypoints,
    its time measured from t[0]. qdd needs qd. Arrays must already be checked (finite, t strictly increasing)."""
    t = np.asarray(t, dtype=float)
    rel = t - t[0]
    q = np.asarray(q, dtype=float)
    if qd is None:
        if qdd is not None:
            raise ValueError("waypoint accelerations need the waypoint velocities")
        return scipy.interpolate.CubicSpline(rel, q, bc_type="clamped")
    qd = np.asarray(qd, dtype=float)
    if qdd is None:
        return scipy.interpolate.CubicHermiteSpline(rel, q, qd)
    return scipy.interpolate.BPoly.from_derivatives(rel, np.stack([q, qd, np.asarray(qdd, dtype=float)], axis=1))
