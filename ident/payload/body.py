"""Payloads: the body a tool, gripper or workpiece adds at the flange.

`payload_parameters(mass, com, inertia)` turns the engineer's description (kg, CoM in m, inertia about the
CoM) into the 10 standard parameters about the flange origin that `ident.model.dynamics.load_regressor` and
`merge_payload` use. The identification methods live beside this module in ident/payload/.
"""
from __future__ import annotations

import math

import numpy as np

from ident.model import spatial
from firmware_bridge.runtime.errors import InputError


def payload_parameters(mass: float, com, inertia=(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)) -> np.ndarray:
    """The 10 standard parameters of a payload about the flange origin, in flange axes.

    Parameters
    ----------
    mass : float
        kg, >= 0.
    com : array_like, shape (3,)
        The centre of mass in the flange frame, m.
    inertia : array_like, shape (6,)
        [XX XY XZ YY YZ ZZ] about the centre of mass, in flange axes, kg m^2 (default: a point mass).

    Returns
    -------
    ndarray, shape (10,)
        [XX XY XZ YY YZ ZZ mX mY mZ m] about the flange origin (kg m^2, kg m, kg), the layout of
        ident.model.dynamics.load_regressor and merge_payload.

    Raises
    ------
    InputError
        A mass, centre of mass or inertia that is not a number of the right shape, or a body that cannot
        exist (an inertia that breaks the triangle inequalities, a negative mass).

    Examples
    --------
    A 2 kg point mass 0.1 m along the flange's z axis (the parallel-axis theorem: XX = YY = m z^2):

    >>> from ident.payload import payload_parameters
    >>> payload_parameters(2.0, [0.0, 0.0, 0.1]).round(12).tolist()
    [0.02, 0.0, 0.0, 0.02, 0.0, 0.0, 0.0, 0.0, 0.2, 2.0]
    >>> payload_parameters(1.0, [0, 0, 0], [0.1, 0, 0, 0.01, 0, 0.01])
    Traceback (most recent call last):
    ...
    firmware_bridge.runtime.errors.InputError: payload: not a physical body: ...
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
