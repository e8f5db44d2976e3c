"""Payloads: the body a tool, gripper or workpiece adds at the flange.

`payload_parameters(mass, com, inertia)` turns the engineer's description (kg, CoM in m, inertia about the
CoM) into the 10 standard parameters about the flange origin that `ident.dynamics.load_regressor` and
`merge_payload` use. The identification methods live beside this module in ident/payload/.
"""
from __future__ import annotations

import math

import numpy as np

from ident import spatial
from firmware_bridge.errors import InputError


def payload_parameters(mass: float, com, inertia=(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)) -> np.ndarray:
    """The 10 standard parameters of a payload about the flange origin, flange axes.

    mass (kg), com (3,) m in the flange frame, inertia [XX XY XZ YY YZ ZZ] about the centre of mass in
    flange axes (kg m^2). Raises InputError for a body that cannot exist.
    """
    com = np.asarray(com, dtype=float)
    six = np.asarray(inertia, dtype=float)
    if not (isinstance(mass, (int, float)) and math.isfinite(mass) and mass >= 0):
        raise InputError(f"payload: mass: expected a number of kg >= 0, got {mass!r}")
    if com.shape != (3,) or not np.isfinite(com).all():
        raise InputError(f"payload: com: expected 3 finite numbers (m, flange frame), got {com.tolist()!r}")
    if six.shape != (6,) or not np.isfinite(six).all():
        raise InputError(f"payload: inertia: expected 6 finite numbers XX XY XZ YY YZ ZZ (kg m^2), got {six.tolist()!r}")
    chi = spatial.body_parameters(float(mass), com, spatial.inertia_matrix(six))
    ok, why = spatial.is_physically_consistent(chi)
    if not ok:
        raise InputError(f"payload: not a physical body: {why}")
    return chi
