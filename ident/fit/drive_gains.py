"""Motor currents as input: the drive gains g_j = gear_ratio_j * torque_constant_j (N m/A) with the dynamics.

With currents i (A) the model is g_j i_j = Yb_j beta: linear and homogeneous in (beta, g), so one run fixes
beta and g only up to one common factor (the ratios g_j / g_k and beta / g_1 are identifiable, the scale is
not). A second run with a payload of known mass m_w on the same arm adds the payload's torque, which is
known in scale (the load-separated dynamics of Sun and Ma 1990: tau_w = Yl chi_w):

    unloaded run:   Yb beta - diag(i) g                       = 0
    loaded run:     Yb beta - diag(i) g + Yl[:, free] phi     = -Yl[:, m] m_w

stacked, and solved by WLS (ident.fit.estimate) for theta = [beta, g, phi]; phi are the payload's other
parameters (first moments, inertia) that the data can separate, chosen by ordered QR like the base
parameters (or known values given by the caller). Without a loaded run, `nominal_scale` documents the
alternative: currents times the model's nominal gains, beta identifiable only up to their scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from firmware_bridge.runtime.errors import InputError
from ident.fit.estimate import Fit, wls

PAYLOAD_NAMES = ("XX", "XY", "XZ", "YY", "YZ", "ZZ", "mX", "mY", "mZ")
INDEPENDENCE_TOL = 1e-8   # a payload column whose normalised part independent of the others is smaller is dropped

SCALE_NOTE_NOMINAL = ("currents converted with the model's nominal drive gains (gear_ratio * torque_constant); "
                      "from currents alone the base parameters and the drive gains are identifiable only up to "
                      "one common scale factor: an error in the nominal gains scales every identified parameter. "
                      "Add a run with a payload of known mass (--payload-run, --payload-mass) to fix the scale")
SCALE_NOTE_PAYLOAD = ("absolute scale from the payload run with a known mass: base parameters and drive gains "
                      "identified together")


@dataclass(frozen=True, eq=False)
class GainFit:
    """gains (n,) N m/A and their standard deviations; beta (b,) the base parameters; payload_names and
    payload (k,) the payload parameters (flange frame) the data could separate; fit: the WLS over
    theta = [beta, gains, payload] (for the covariance and statistics)."""

    gains: np.ndarray
    gains_std: np.ndarray
    beta: np.ndarray
    payload_names: tuple[str, ...]
    payload: np.ndarray
    fit: Fit


def gains_with_payload(Wb: np.ndarray, current: np.ndarray, mask: np.ndarray | None,
                       Wb_loaded: np.ndarray, current_loaded: np.ndarray, Yl_loaded: np.ndarray,
                       mask_loaded: np.ndarray | None, payload_mass: float, *, names: list[str] | None = None,
                       payload_known: np.ndarray | None = None) -> GainFit:
    """Base parameters and drive gains from an unloaded and a loaded run (arrays (N, n, b), (N, n) A,
    (N', n, b), (N', n) A, payload regressor (N', n, 10) in the flange frame). payload_mass in kg;
    payload_known (9,) the payload's [XX..ZZ about the flange origin, mX mY mZ] if known, else these are
    estimated where separable. Raises InputError for a non-positive mass or data that cannot fix the gains."""
    if not (np.isfinite(payload_mass) and payload_mass > 0):
        raise InputError(f"payload mass: expected a positive number of kg, got {payload_mass}")
    N1, n, b = Wb.shape
    N2 = Wb_loaded.shape[0]
    if payload_known is not None:
        known = np.append(np.asarray(payload_known, dtype=float), payload_mass)
        free = np.array([], dtype=int)
    else:
        known = np.zeros(10)
        known[9] = payload_mass
        free = _separable_payload_columns(Yl_loaded)
    k = len(free)
    p = b + n + k
    A = np.zeros((N1 + N2, n, p))
    A[:N1, :, :b] = Wb
    A[N1:, :, :b] = Wb_loaded
    joints = np.arange(n)
    A[:N1, joints, b + joints] = -current
    A[N1:, joints, b + joints] = -current_loaded
    A[N1:, :, b + n:] = Yl_loaded[:, :, free]
    rhs = np.zeros((N1 + N2, n))
    rhs[N1:] = -(Yl_loaded @ known)
    mask_all = np.concatenate([np.ones((N1, n), bool) if mask is None else mask,
                               np.ones((N2, n), bool) if mask_loaded is None else mask_loaded])
    labels = (list(names) if names else [f"beta{i + 1}" for i in range(b)]) + \
        [f"g{j + 1}" for j in range(n)] + [PAYLOAD_NAMES[c] + "_load" for c in free]
    fit = wls(A, rhs, mask_all, names=labels)
    gains = fit.beta[b:b + n]
    if (gains <= 0).any():
        j = int(np.argmin(gains))
        raise InputError(f"drive gain of joint {j + 1} came out {gains[j]:.4g} N m/A: the runs cannot fix the "
                         "gains (does the payload move the joints enough?)")
    return GainFit(gains=gains.copy(), gains_std=fit.std[b:b + n], beta=fit.beta[:b].copy(),
                   payload_names=tuple(PAYLOAD_NAMES[c] for c in free), payload=fit.beta[b + n:].copy(), fit=fit)


def _separable_payload_columns(Yl: np.ndarray) -> np.ndarray:
    """Indices among the payload's first 9 parameters whose regressor columns are independent of the
    mass column and of the columns before them (ordered QR on normalised columns)."""
    cols = np.concatenate([Yl[:, :, 9:10], Yl[:, :, :9]], axis=2).reshape(-1, 10)
    norms = np.linalg.norm(cols, axis=0)
    if norms[0] == 0:
        raise InputError("the payload's weight does not act on any joint in the loaded run")
    live = norms > INDEPENDENCE_TOL * norms.max()
    Cn = np.where(live, cols / np.where(live, norms, 1.0), 0.0)
    _, R = scipy.linalg.qr(Cn, mode="economic")
    independent = np.abs(np.diag(R)) > INDEPENDENCE_TOL
    if not independent[0]:
        raise InputError("the payload's mass cannot be separated in the loaded run")
    return np.flatnonzero(independent[1:] & live[1:])
