"""A base parameter set: which linear combinations of the standard parameters a model can identify
(`BaseParameters`, beta = P @ chi), as both ways of finding it (ident.model.base_params) return it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ZERO_TOL = 1e-9  # coefficients below this (relative to the row's largest) are exact zeros


@dataclass(frozen=True, eq=False)
class BaseParameters:
    """The base parameters of a model.

    indices  (b,) standard-parameter columns kept (their regressor columns form the base regressor)
    P        (b, 14n) with beta = P @ chi
    names    e.g. ["ZZR1", "fc1", ...]; an R marks a regrouped parameter
    """

    indices: np.ndarray
    P: np.ndarray
    standard_names: tuple[str, ...]
    method: str

    @property
    def count(self) -> int:
        return len(self.indices)

    @property
    def names(self) -> list[str]:
        out = []
        for row, k in zip(self.P, self.indices):
            base = self.standard_names[k]
            regrouped = np.count_nonzero(row) > 1 or row[k] != 1.0
            if regrouped:
                i = len(base.rstrip("0123456789"))
                base = base[:i] + "R" + base[i:]
            out.append(base)
        return out

    @property
    def expressions(self) -> list[str]:
        """Readable definitions, e.g. 'XXR2 = XX2 - YY2 - 0.1849*m3'."""
        return [f"{name} = {_linear_text(row, self.standard_names)}" for name, row in zip(self.names, self.P)]

    @property
    def eliminated(self) -> list[str]:
        """Standard parameters that are not kept as base columns (no effect, or regrouped into others)."""
        kept = set(self.indices.tolist())
        return [nm for k, nm in enumerate(self.standard_names) if k not in kept]

    def from_standard(self, chi: np.ndarray) -> np.ndarray:
        """Base parameter values (b,) of a standard parameter vector (14n,)."""
        return self.P @ np.asarray(chi, dtype=float)

    def regressor(self, Y: np.ndarray) -> np.ndarray:
        """Base regressor from a standard regressor (..., 14n) -> (..., b)."""
        return Y[..., self.indices]


def _linear_text(row: np.ndarray, names) -> str:
    parts = []
    for k in np.flatnonzero(row):
        c = row[k]
        sign = "-" if c < 0 else "+"
        mag = abs(c)
        term = names[k] if np.isclose(mag, 1.0, rtol=1e-12, atol=0) else f"{mag:.6g}*{names[k]}"
        parts.append((sign, term))
    if not parts:
        return "0"
    first_sign, first = parts[0]
    text = ("-" if first_sign == "-" else "") + first
    return text + "".join(f" {s} {t}" for s, t in parts[1:])


def clean_coefficients(P: np.ndarray) -> np.ndarray:
    """Round numerical noise: exact zeros, and coefficients within 1e-9 of an integer to that integer."""
    P = P.copy()
    scale = np.maximum(np.abs(P).max(axis=1, keepdims=True), 1.0)
    P[np.abs(P) < ZERO_TOL * scale] = 0.0
    near = np.abs(P - np.round(P)) < ZERO_TOL * scale
    P[near] = np.round(P[near])
    return P
