"""Checks after a fit: the signs of an answer that looks like a result but is not one.

A fit always returns numbers. On noise-dominated accelerations (a cut-off far above the motion's band),
a motion that does not excite the parameters, or a model that does not fit the arm, those numbers are
wrong without a word. `fit_warnings` words what is suspicious, one line each:

- the condition number of the weighted base regressor above COND_WARN (the parameters are nearly
  dependent in the data: small errors in the torques move them far);
- a validation error (RMS relative to the RMS torque, on the filtered rows) above VALIDATION_WARN on a
  joint: the parameters do not predict another motion;
- one joint's validation error far above the others' (OUTLIER_RATIO times their median), with its likely
  cause (`outlier_joint_warnings`);
- a parameter beyond what a joint can hold: an offset or a Coulomb friction larger than the joint's torque
  limit, a viscous friction whose torque at the joint's velocity limit (or the fastest velocity in the data
  when the model states none) exceeds it, or a negative friction more than 3 standard deviations below zero.
"""
from __future__ import annotations

import math
import re

import numpy as np

COND_WARN = 1e4          # condition number of the weighted stacked base regressor
VALIDATION_WARN = 0.2    # validation RMS error relative to the RMS torque, on the filtered rows
OUTLIER_RATIO = 3.0      # a joint's validation error this many times the other joints' median is named
SPARSE_ROWS = 0.5        # ... and put down to its motion when fewer than this share of its rows were used
_DRIVE = re.compile(r"^(fc|fv|offset)R?(\d+)$")


def fit_warnings(names: list[str], beta: np.ndarray, std: np.ndarray, cond: float, tau_max: np.ndarray,
                 qd_max: np.ndarray, validation_relative: np.ndarray | None = None,
                 joint_names: list[str] | None = None) -> list[str]:
    """The warnings of one fit, in the order above; [] when nothing is suspicious.

    names, beta, std: the base parameters, their estimates and standard deviations (SI); cond: the fit's
    condition number; tau_max (n,) N m and qd_max (n,) rad/s: the joints' limits (inf when unknown);
    validation_relative (n,): the validation error relative to the RMS torque, if validated."""
    n = len(tau_max)
    joint = (lambda j: joint_names[j] if joint_names else f"joint {j + 1}")
    out = []
    if not cond <= COND_WARN:
        out.append(f"condition number {cond:.3g} above {COND_WARN:g}: the data hardly separate the base "
                   "parameters (a motion that excites them too little, or noise-dominated accelerations: check "
                   "the cut-off and decimation)")
    if validation_relative is not None:
        bad = [j for j in range(n) if not validation_relative[j] <= VALIDATION_WARN]
        if bad:
            listed = ", ".join(f"{joint(j)} {100 * validation_relative[j]:.0f} %" for j in bad)
            out.append(f"validation error above {100 * VALIDATION_WARN:.0f} % of the torque on {listed}: the "
                       "parameters do not predict another motion")
    for k, name in enumerate(names):
        m = _DRIVE.match(name)
        if not m:
            continue
        kind, j = m.group(1), int(m.group(2)) - 1
        if not 0 <= j < n:
            continue
        value, limit = float(beta[k]), float(tau_max[j])
        held = abs(value) * (float(qd_max[j]) if kind == "fv" else 1.0)
        if math.isfinite(limit) and held > limit:
            what = {"fc": "Coulomb friction", "fv": "viscous friction at the velocity limit",
                    "offset": "torque offset"}[kind]
            out.append(f"{name} = {value:.4g}: a {what} of {held:.4g} N m exceeds {joint(j)}'s torque limit "
                       f"{limit:g} N m: not a plausible parameter")
        if kind in ("fc", "fv") and value < -3.0 * float(std[k]):
            out.append(f"{name} = {value:.4g} is negative by more than 3 standard deviations ({float(std[k]):.3g}):"
                       " friction does not push the motion")
    return out


def outlier_joint_warnings(validation_relative: np.ndarray, used_share: np.ndarray, fit_relative: np.ndarray,
                           joint_names: list[str] | None = None) -> list[str]:
    """A line for each joint whose validation error (relative, (n,)) is above OUTLIER_RATIO times the median of
    the other joints', naming the likely cause from the share of its rows the fit used (n,) and its relative
    residual on the fit rows (n,): too few rows (the motion barely moves it), a model that does not fit it
    (its own rows' residual is an outlier too), or an effect that differs between the two motions."""
    v = np.asarray(validation_relative, dtype=float)
    n = v.size
    out = []
    for j in range(n):
        others = np.delete(v, j)
        if n < 3 or not np.all(np.isfinite(others)) or not v[j] > OUTLIER_RATIO * np.median(others):
            continue
        name = joint_names[j] if joint_names else f"joint {j + 1}"
        fit_others = np.median(np.delete(fit_relative, j))
        if used_share[j] < SPARSE_ROWS:
            cause = (f"only {100 * used_share[j]:.0f} % of its rows were used (slow or near a reversal): the "
                     "motion hardly excites it; move it faster or lower --slow")
        elif fit_relative[j] > OUTLIER_RATIO * fit_others:
            cause = ("its own rows fit as badly: the model does not describe it (friction near rest, "
                     "an elastic gear, a wrong torque constant or sign), or its effort is delayed differently "
                     "(--effort-delay)")
        else:
            cause = ("it fits its own rows but not the validation motion: friction or an offset that changed "
                     "between the runs, or a motion of the validation run outside the identification run's range")
        out.append(f"{name}: validation error {100 * v[j]:.0f} %, over {OUTLIER_RATIO:g} x the other joints' "
                   f"median {100 * np.median(others):.0f} %: {cause}")
    return out
