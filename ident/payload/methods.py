"""Running several payload methods on the same two recordings, each on its own.

    estimates, failures = identify_each(model, "dynamic", loaded, unloaded)

A method that cannot work on the recordings (the difference method on a wrist-only excitation, the torque
method on runs sampled at other instants, the torque balance without its sweeps) ends in a MethodFailure
naming why; the other methods' estimates are kept. The names: "difference", "torque", "global" (seed 000),
"torque-balance" (seed 001), "static", and the group "dynamic" for the three of seed 000.
"""
from __future__ import annotations

import numpy as np

from firmware_bridge.errors import InputError
from ident.model import Model
from ident.payload.result import MethodFailure, PayloadEstimate

DYNAMIC = ("difference", "torque", "global")
GROUPS = {"dynamic": DYNAMIC}
METHODS = DYNAMIC + ("torque-balance", "static")


def expand(method: str) -> tuple[str, ...]:
    """The methods a name stands for: a group ("dynamic") or one method. InputError for an unknown name."""
    if method in GROUPS:
        return GROUPS[method]
    if method in METHODS:
        return (method,)
    raise InputError(f"method: expected one of {', '.join(METHODS + tuple(GROUPS))}, got {method!r}")


def identify_one(model: Model, method: str, loaded, unloaded, *, trajectory=None, consistent: bool = False,
                 base=None) -> PayloadEstimate:
    """One method's estimate from the loaded and unloaded recordings (ident.preprocess.Recording).
    trajectory: the dynamic runs' FourierTrajectory (sets the filter bandwidth); consistent: the global
    method constrained to a real body; base: the model's BaseParameters for the dynamic methods (default:
    computed). Raises InputError when the method cannot work on them."""
    if method in DYNAMIC:
        from ident.payload import dynamic

        options = {key: v for key, v in (("trajectory", trajectory), ("base", base)) if v is not None}
        return dynamic.identify(model, loaded, unloaded, method=method, consistent=consistent and method == "global",
                                **options)
    if method == "torque-balance":
        from ident.payload import balance

        return balance.identify(model, loaded, unloaded)
    if method == "static":
        from ident.payload import static

        return static.identify(model, loaded, unloaded)
    raise InputError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")


def identify_each(model: Model, method: str, loaded, unloaded, *, trajectory=None,
                  consistent: bool = False) -> tuple[list[PayloadEstimate], list[MethodFailure]]:
    """Every method `method` stands for (expand), each on its own: (the estimates of those that worked,
    a MethodFailure with the reason for each that did not). A method fails on an InputError (input it
    cannot use) or a singular system (numpy LinAlgError); any other error is a fault and propagates."""
    names = expand(method)
    base = None
    if sum(name in DYNAMIC for name in names) > 1:     # the model's base parameters, computed once for all
        from ident.base_params import base_parameters

        base = base_parameters(model)
    estimates, failures = [], []
    for name in names:
        try:
            estimates.append(identify_one(model, name, loaded, unloaded, trajectory=trajectory,
                                          consistent=consistent, base=base))
        except (InputError, np.linalg.LinAlgError) as exc:
            failures.append(MethodFailure(name, str(exc) or type(exc).__name__))
    return estimates, failures
