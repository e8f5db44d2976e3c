"""Closed-form base parameters of modified-DH chains: Gautier & Khalil (1990).

The rules act on rows of P (beta = P chi), starting from the identity:
  1. no-effect rules (prismatic links before r1; r1 parallel to gravity, extended to the links that spin
     about joint 1's fixed axis; links parallel to r1 up to r2);
  2. regrouping from link n down to link 2: eq. (15) for revolute joints (YY, mZ, m move to link j-1),
     eq. (16) for prismatic joints (the inertia tensor moves to link j-1);
  3. the drive columns (an extension of the paper, whose model has no drives):
     Ia_r1 joins ZZR_r1, and Ia_r2 joins ZZR_r2 when r2 is perpendicular to r1 (their regressor columns
     are both qdd_j on joint j); the masses of the translating links before r1 are resolved against the
     Ia and offset columns of those prismatic joints, by exact linear algebra in the basis
     {qdd_l on joint i, constant on joint i}, whose coefficients are z_i . z_l and z_i . g.
Prismatic joints between r1 and r2 are refused (ClosedFormError): the paper leaves them to a case-by-case
study (its eqs. 19/20 cover only part of it), and the numerical method handles them.
r1 is the first revolute joint, r2 the first revolute joint after r1 that is not parallel to it.
"""
from __future__ import annotations

import numpy as np

from ident.model import spatial
from firmware_bridge.runtime.errors import InputError
from ident.model.base_set import BaseParameters, clean_coefficients
from ident.model.robot import PARAMS_PER_JOINT, PRISMATIC, REVOLUTE, Model

XX, XY, XZ, YY, YZ, ZZ, MX, MY, MZ, M, IA, FC, FV, OFFSET = range(14)
INERTIA = (XX, XY, XZ, YY, YZ, ZZ)
TENSOR_ENTRIES = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))  # (row, col) of XX XY XZ YY YZ ZZ
PAR_TOL = 1e-9


class ClosedFormError(InputError):
    """The closed-form rules do not apply to this model (not modified DH)."""


def _frames_at_zero(model: Model) -> np.ndarray:
    """Orientation of every joint frame in the base at q = 0, (n, 3, 3)."""
    R = np.eye(3)
    out = []
    for j in range(model.n):
        R = R @ model.placement_R[j]
        out.append(R.copy())
    return np.array(out)


def closed_form_base(model: Model) -> BaseParameters:
    """Base parameters of a modified-DH model by the Gautier-Khalil rules."""
    if not model.is_dh:
        raise ClosedFormError(f"{model.source}: closed-form base parameters need a modified-DH model (this one is not)")
    n = model.n
    alpha, d, theta, r = (np.asarray(model.dh[:, k]) for k in range(4))
    sigma = np.asarray(model.joint_type)
    size = PARAMS_PER_JOINT * n
    P = np.eye(size)
    alive = np.ones(size, dtype=bool)

    def ix(j: int, k: int) -> int:
        return PARAMS_PER_JOINT * j + k

    z = _frames_at_zero(model)[:, :, 2]
    g = np.asarray(model.gravity)
    revolute = [j for j in range(n) if sigma[j] == REVOLUTE]
    r1 = revolute[0] if revolute else n

    def parallel_to_r1(j: int) -> bool:
        return r1 < n and abs(abs(z[j] @ z[r1]) - 1.0) < PAR_TOL

    r2 = next((j for j in revolute if j > r1 and not parallel_to_r1(j)), n)
    between = [j + 1 for j in range(r1 + 1, r2) if sigma[j] == PRISMATIC]
    if between:
        raise ClosedFormError(f"{model.source}: prismatic joint(s) {between} lie between r1 = {r1 + 1} and r2 = {r2 + 1}; "
                              "Gautier and Khalil (1990, section IV-C) leave their first moments and masses to a case-by-case study, "
                              "which this closed form does not do: use method='qr'")

    # 1. parameters with no effect
    no_effect = set()
    for j in range(r1):  # rule 1: translating links before r1
        no_effect.update(ix(j, k) for k in INERTIA + (MX, MY, MZ))
    if r1 < n:
        gravity_along_r1 = np.linalg.norm(g) > 0 and abs(abs(z[r1] @ g) - np.linalg.norm(g)) < PAR_TOL * np.linalg.norm(g)
        if gravity_along_r1 and all(parallel_to_r1(j) for j in range(r1)):  # rule 2
            no_effect.update((ix(r1, MX), ix(r1, MY)))
        # rule 2 extended to links whose origin stays on the fixed axis of joint 1: joints 1..j revolute and
        # coaxial (alpha in {0, pi}, d = 0). Such a link only spins about that axis: its mass has no effect,
        # nor have its first moments when gravity is along the axis.
        j = 0
        while j < r2 and sigma[j] == REVOLUTE and (j == 0 or (abs(np.sin(alpha[j])) < PAR_TOL and abs(d[j]) < PAR_TOL)):
            no_effect.add(ix(j, M))
            if gravity_along_r1:
                no_effect.update((ix(j, MX), ix(j, MY)))
            j += 1
        for j in range(r1, r2):  # rule 3
            if parallel_to_r1(j):
                no_effect.update(ix(j, k) for k in (XX, XY, XZ, YY, YZ, MZ))

    # 2. regrouping from link n down to link 2
    for j in range(n - 1, 0, -1):
        if sigma[j] == REVOLUTE:
            S, C = np.sin(alpha[j]), np.cos(alpha[j])
            yy, mz, m = P[ix(j, YY)].copy(), P[ix(j, MZ)].copy(), P[ix(j, M)].copy()
            dj, rj = d[j], r[j]
            P[ix(j, XX)] -= yy
            P[ix(j - 1, XX)] += yy + 2 * rj * mz + rj**2 * m
            P[ix(j - 1, XY)] += dj * S * mz + dj * rj * S * m
            P[ix(j - 1, XZ)] += -dj * C * mz - dj * rj * C * m
            P[ix(j - 1, YY)] += C**2 * yy + 2 * rj * C**2 * mz + (dj**2 + rj**2 * C**2) * m
            P[ix(j - 1, YZ)] += C * S * yy + 2 * rj * C * S * mz + rj**2 * C * S * m
            P[ix(j - 1, ZZ)] += S**2 * yy + 2 * rj * S**2 * mz + (dj**2 + rj**2 * S**2) * m
            P[ix(j - 1, MX)] += dj * m
            P[ix(j - 1, MY)] += -S * mz - r[j] * S * m
            P[ix(j - 1, MZ)] += C * mz + r[j] * C * m
            P[ix(j - 1, M)] += m
            alive[[ix(j, YY), ix(j, MZ), ix(j, M)]] = False
            continue
        Rj, _ = spatial.mdh_placement(alpha[j], d[j], theta[j], r[j])
        # eq. (16): J_{j-1} += R J_j R^T, row by row
        J = {(a, b): P[ix(j, k)].copy() for k, (a, b) in zip(INERTIA, TENSOR_ENTRIES)}
        J.update({(b, a): v for (a, b), v in list(J.items())})
        for k, (a, b) in zip(INERTIA, TENSOR_ENTRIES):
            for c in range(3):
                for e in range(3):
                    P[ix(j - 1, k)] += Rj[a, c] * Rj[b, e] * J[(c, e)]
        alive[[ix(j, k) for k in INERTIA]] = False

    # 3. drive columns
    if r1 < n:
        P[ix(r1, ZZ)] += P[ix(r1, IA)]
        alive[ix(r1, IA)] = False
        if r2 < n and abs(z[r2] @ z[r1]) < PAR_TOL:
            P[ix(r2, ZZ)] += P[ix(r2, IA)]
            alive[ix(r2, IA)] = False
    _resolve_translating_masses(P, alive, no_effect, z, g, r1, n, ix)

    alive[list(no_effect)] = False
    keep = np.flatnonzero(alive)
    return BaseParameters(indices=keep, P=clean_coefficients(P[keep]), standard_names=tuple(model.parameter_names()),
                          method="closed-form")


def _resolve_translating_masses(P, alive, no_effect, z, g, r1, n, ix) -> None:
    """Dependencies among m_k (k <= r1), Ia_k and offset_k (k < r1) while only prismatic joints move them.

    Their regressor columns live in the basis {qdd_l on joint i, 1 on joint i} (i, l < r1):
    m_k: sum_{i<=k, i<r1} [sum_{l<=k, l<r1} (z_i.z_l) qdd_l - z_i.g] on joint i; Ia_k: qdd_k on k; offset_k: 1 on k.
    A column dependent on those before it (standard order) is folded into them.
    """
    t = min(r1, n)
    if t == 0:
        return
    dim = t * t + t

    def mass_column(k: int) -> np.ndarray:
        v = np.zeros(dim)
        upto = min(k, t - 1)
        for i in range(upto + 1):
            for l in range(upto + 1):
                v[i * t + l] += z[i] @ z[l]
            v[t * t + i] -= z[i] @ g
        return v

    candidates = []
    for k in range(min(r1 + 1, n)):
        if ix(k, M) not in no_effect:
            candidates.append((ix(k, M), mass_column(k)))
        if k < t:
            e = np.zeros(dim)
            e[k * t + k] = 1.0
            candidates.append((ix(k, IA), e))
            e = np.zeros(dim)
            e[t * t + k] = 1.0
            candidates.append((ix(k, OFFSET), e))
    candidates = [c for c in candidates if alive[c[0]]]
    kept_idx, kept_cols = [], []
    for idx, col in candidates:
        if kept_cols:
            B = np.array(kept_cols).T
            coef, *_ = np.linalg.lstsq(B, col, rcond=None)
            if np.linalg.norm(B @ coef - col) < 1e-10 * max(1.0, np.linalg.norm(col)):
                for kidx, c in zip(kept_idx, coef):
                    if abs(c) > 1e-12:
                        P[kidx] += c * P[idx]
                alive[idx] = False
                continue
        elif np.linalg.norm(col) < 1e-12:
            no_effect.add(idx)
            continue
        kept_idx.append(idx)
        kept_cols.append(col)
