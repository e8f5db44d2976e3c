"""`PayloadEstimate`: what every payload identification method returns.

The payload's 10 standard parameters chi = [XX XY XZ YY YZ ZZ mX mY mZ m] are about the flange origin in
flange axes (kg m^2, kg m, kg), as `ident.model.dynamics.load_regressor` uses them. A method may identify only
some of them, or only combinations of them (through the last joints, e.g. XX - YY): `identified` names
the parameters that were identified individually, and `combinations` lists the identifiable
combinations with their values and sigmas. Parameters not identified are NaN in `chi` and `sigma`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ident.model import spatial

PARAMETER_NAMES = ("XX", "XY", "XZ", "YY", "YZ", "ZZ", "mX", "mY", "mZ", "m")


@dataclass(frozen=True)
class Combination:
    """An identifiable linear combination of the payload parameters: sum(coefficients * chi)."""
    expression: str            # e.g. "XX - YY"
    coefficients: np.ndarray   # (10,)
    value: float
    sigma: float

    def to_json(self) -> dict:
        return {"expression": self.expression, "coefficients": self.coefficients.tolist(),
                "value": self.value, "sigma": self.sigma}


@dataclass
class PayloadEstimate:
    """A payload identified by one method.

    chi, sigma: (10,) in PARAMETER_NAMES order, NaN where not identified individually, about the origin
    and in the axes of the frame named `frame` (the model's flange frame, `Model.flange_frame`: a URDF's
    tip link, or "flange"). samples: the number of samples (poses or time samples) used. consistent:
    whether the estimate is a body that can exist (positive mass, inertia about the CoM positive definite
    with the triangle inequalities), and why not.
    """
    method: str
    chi: np.ndarray
    sigma: np.ndarray
    samples: int
    combinations: list[Combination] = field(default_factory=list)
    consistent: bool = True
    consistency: str = ""
    seconds: float = float("nan")
    notes: list[str] = field(default_factory=list)
    frame: str = "flange"

    @property
    def identified(self) -> tuple[str, ...]:
        return tuple(name for name, v in zip(PARAMETER_NAMES, self.chi) if np.isfinite(v))

    @property
    def mass(self) -> float:
        """kg"""
        return float(self.chi[9])

    @property
    def com(self) -> np.ndarray:
        """Centre of mass (3,) m in the flange frame `frame` (NaN where the first moment is not identified)."""
        return self.chi[6:9] / self.chi[9]

    @property
    def com_sigma(self) -> np.ndarray:
        """First-order sigma (3,) m of the centre of mass, from the sigmas of mX, mY, mZ and m (taken as
        uncorrelated)."""
        m, sm = self.chi[9], self.sigma[9]
        return np.sqrt((self.sigma[6:9] / m) ** 2 + (self.chi[6:9] * sm / m ** 2) ** 2)

    @property
    def inertia_com(self) -> np.ndarray:
        """Inertia about the centre of mass [XX XY XZ YY YZ ZZ] (6,) kg m^2 in flange axes (NaN unless the
        mass, the first moments and the six flange-origin inertias are all identified)."""
        m, c = self.mass, self.com
        J = spatial.inertia_matrix(self.chi[:6]) - m * (spatial.skew(c).T @ spatial.skew(c))
        return J[[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]

    def to_json(self) -> dict:
        def finite(a):
            return [float(x) if np.isfinite(x) else None for x in np.asarray(a, dtype=float).ravel()]
        return {
            "method": self.method,
            "frame": self.frame,
            "parameters": dict(zip(PARAMETER_NAMES, finite(self.chi))),
            "sigma": dict(zip(PARAMETER_NAMES, finite(self.sigma))),
            "mass_kg": finite([self.mass])[0],
            "com_m": finite(self.com),
            "com_sigma_m": finite(self.com_sigma),
            "inertia_com_kgm2": finite(self.inertia_com),
            "combinations": [c.to_json() for c in self.combinations],
            "samples": self.samples,
            "consistent": self.consistent,
            "consistency": self.consistency,
            "seconds": finite([self.seconds])[0],
            "notes": list(self.notes),
        }

    def set_payload_command(self) -> dict:
        """The driver's set_payload request for this estimate (docs/reference/stream.md): mass, CoM and the inertia
        about the CoM. Raises ValueError when the mass or the centre of mass was not identified; an
        inertia that was not identified is sent as zero (a point mass), which the notes say."""
        com = self.com
        if not (np.isfinite(self.mass) and self.mass > 0 and np.isfinite(com).all()):
            raise ValueError(f"{self.method}: mass and centre of mass are needed to set the payload")
        inertia = self.inertia_com
        if not np.isfinite(inertia).all():
            inertia = np.zeros(6)
        return {"cmd": "set_payload", "mass": self.mass, "com": com.tolist(), "inertia": inertia.tolist()}


@dataclass(frozen=True)
class MethodFailure:
    """A method that gave no estimate, and why (the one-line message of its error)."""
    method: str
    reason: str

    def to_json(self) -> dict:
        return {"method": self.method, "reason": self.reason}
