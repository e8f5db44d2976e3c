"""Which payload parameters a set of runs determines: the identifiable directions of a stacked regressor
(the dynamic methods and the payload excitation's criterion both use them)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware_bridge.runtime.errors import InputError

RANK_TOL = 1e-7          # singular values of the column-normalised stacked regressor below this (relative to the
                         # largest) are directions the data do not determine


class PayloadError(InputError):
    """The runs cannot give a payload estimate; the message says which run and why."""


@dataclass(frozen=True, eq=False)
class Identifiable:
    """The directions a stacked regressor A (rows, p) determines. T (p, r): every x = T theta with A T of
    full rank r (theta in column-normalised units); null (p, p - r): the directions A does not see, in
    normalised units (x = scale^-1 u); scale (p,) the column norms; payload (k, 10): an orthonormal basis
    of the identifiable payload combinations c (c . chi determined by the data)."""

    T: np.ndarray
    null: np.ndarray
    scale: np.ndarray
    payload: np.ndarray


def identifiable(A: np.ndarray, payload: slice) -> Identifiable:
    """The identifiable directions of x from rows A (rows, p) with A x = y; `payload` selects the payload's
    10 columns. Raises PayloadError when A determines nothing (no joint moves)."""
    scale = np.linalg.norm(A, axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    _, s, Vt = np.linalg.svd(A / scale, full_matrices=A.shape[0] < A.shape[1])
    r = int(np.sum(s > RANK_TOL * s[0])) if s[0] > 0 else 0
    if r == 0:
        raise PayloadError("the runs do not move the joints the payload acts on")
    V = Vt.T
    null = V[:, r:]
    # c . chi is identifiable iff c is orthogonal to the payload part of every null direction (original
    # units: scale^-1 null); with g orthogonal to null[payload], c = scale[payload] g.
    Np = null[payload]
    if Np.shape[1]:
        u, sv, _ = np.linalg.svd(Np, full_matrices=True)
        k = int(np.sum(sv > RANK_TOL * max(1.0, sv[0]))) if sv.size else 0
        g = u[:, k:]
    else:
        g = np.eye(10)
    basis = (scale[payload][:, None] * g) if g.shape[1] else np.zeros((10, 0))
    payload_basis = np.linalg.qr(basis)[0].T if basis.shape[1] else np.zeros((0, 10))
    return Identifiable(V[:, :r] / scale[:, None], null, scale, payload_basis)
