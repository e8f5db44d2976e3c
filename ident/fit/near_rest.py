"""The friction near rest that the fit leaves out: a Stribeck excess identified from the samples the fit drops.

The model's friction is fc sign(qd) + fv qd + offset. Real joints add a breakaway excess near rest (Stribeck's
rise, Armstrong-Helouvry 1994): the friction is larger just after a reversal than fc. The fit leaves those rows out
(their velocity is under slow_velocity) because its linear model has no term for it, and so does everything that
uses the model: the external-torque observer then passes the excess as a short burst at every velocity reversal,
which, at a well identified model, is the largest thing it passes. This module identifies the excess on those very
samples, after the fit, in the textbook exponential form

    f_rest(v) = fs exp(-(v / vs)^2) sign(v)         (N m; v the joint's velocity, rad/s)

per joint: the residual e = y - W beta of the full-rate samples (the measured effort against the fitted model's
torque at the filtered motion) with MIN_SPEED_RATIO * smoothing <= |v| < slow_velocity (above the width of the
observer's tanh, so that sign(v) and its smoothing agree); fs by least squares for each vs of a geometric grid
(VS_GRID_POINTS from slow_velocity / VS_GRID_SPAN to slow_velocity), the vs of the smallest squared error kept.
An excess that is not significant (fs under SIGNIFICANCE standard errors of its estimate, or negative) is 0: then
nothing is added to the model's friction.

    fs, vs = near_rest_friction(qd, e, slow_velocity=0.2)      # (n,) N m, (n,) rad/s
"""
from __future__ import annotations

import numpy as np

MIN_SPEED_RATIO = 3.0     # samples from this many times the observer's tanh width up (tanh(3) = 0.995)
VS_GRID_POINTS = 40
VS_GRID_SPAN = 40.0       # vs from slow_velocity / VS_GRID_SPAN to slow_velocity
SIGNIFICANCE = 5.0        # fs kept when at least this many standard errors above 0
MIN_SAMPLES = 50          # fewer samples in the band: no excess identified
SMOOTHING = 0.01          # rad/s: the observer's default tanh width (driver/observer.py DEFAULT_FRICTION_SMOOTHING)


def near_rest_friction(qd: np.ndarray, residual: np.ndarray, slow_velocity: float,
                       smoothing: float = SMOOTHING) -> tuple[np.ndarray, np.ndarray]:
    """(fs, vs) (n,) N m and rad/s from full-rate velocities qd (N, n) rad/s and the fitted model's residual
    (N, n) N m, on the samples of each joint with MIN_SPEED_RATIO * smoothing <= |qd| < slow_velocity; fs = 0
    (and vs = slow_velocity / VS_GRID_SPAN) where the excess is not significant or the band holds too few
    samples."""
    qd = np.asarray(qd, dtype=float)
    residual = np.asarray(residual, dtype=float)
    n = qd.shape[1]
    grid = np.geomspace(slow_velocity / VS_GRID_SPAN, slow_velocity, VS_GRID_POINTS)
    fs, vs = np.zeros(n), np.full(n, grid[0])
    for j in range(n):
        speed = np.abs(qd[:, j])
        band = (speed >= MIN_SPEED_RATIO * smoothing) & (speed < slow_velocity) & np.isfinite(residual[:, j])
        if band.sum() < MIN_SAMPLES:
            continue
        v, e = qd[band, j], residual[band, j]
        best = None
        for width in grid:
            phi = np.exp(-(v / width) ** 2) * np.sign(v)
            norm = float(phi @ phi)
            if norm <= 0.0:
                continue
            a = float(phi @ e) / norm
            sse = float(np.sum((e - a * phi) ** 2))
            if best is None or sse < best[0]:
                best = (sse, a, width, norm)
        if best is None:
            continue
        sse, a, width, norm = best
        stderr = np.sqrt(sse / max(len(e) - 2, 1) / norm)
        if a > 0.0 and a >= SIGNIFICANCE * stderr:
            fs[j], vs[j] = a, width
    return fs, vs
