"""Running several payload methods on the same two recordings, each on its own.

    estimates, failures = identify_each(model, "dynamic", loaded, unloaded)

A method that cannot work on the recordings (the difference method on a wrist-only excitation, the torque
method on runs sampled at other instants, the torque balance without its sweeps) ends in a MethodFailure
naming why; the other methods' estimates are kept. The names: "difference", "torque", "global" (Zhang, Qin
and Zou 2017), "torque-balance" (Gao, Zhao and Li 2025), "static", and the group "dynamic" for the first three.
"""
from __future__ import annotations

import numpy as np

from firmware_bridge.runtime.errors import InputError
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
    """One payload method's estimate from a loaded and an unloaded run.

    Parameters
    ----------
    model : Model
        The arm (without the payload).
    method : str
        "difference", "torque" or "global" (the dynamic methods of Zhang, Qin and Zou (2017): the same
        excitation run with and without the payload), "torque-balance" (the sweeps of Gao, Zhao and Li
        (2025)) or "static" (poses at rest).
    loaded, unloaded : str, Path or Recording
        The runs with and without the payload (ident.fit.preprocess.Recording or a file it reads).
    trajectory : FourierTrajectory, optional
        The dynamic runs' excitation (sets the filter bandwidth).
    consistent : bool
        The global method constrained to a body that can exist.
    base : BaseParameters, optional
        The model's base parameters for the dynamic methods (default: computed).

    Returns
    -------
    PayloadEstimate
        chi and sigma (10,) in the model's flange frame (NaN where not identified), mass, com, the
        driver's set_payload request.

    Raises
    ------
    InputError
        An unknown method, or runs the method cannot work on (named, with the reason).

    Examples
    --------
    Two simulated runs of a shipped excitation, with and without a 1.5 kg payload:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.fit import excitation
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> from ident.payload.methods import identify_one
    >>> from ident.fit.preprocess import Recording
    >>> model = load_model("generic6")
    >>> traj = excitation.preset("seed000")
    >>> t, q, qd, qdd = traj.sample(rate_hz=100.0)
    >>> load = payload_parameters(1.5, [0.0, 0.02, 0.08])
    >>> def run(arm):
    ...     return Recording(t=t, q=q, tau=dynamics.rnea(arm, q, qd, qdd), current=None, qd=None, source=arm.name)
    >>> est = identify_one(model, "global", run(dynamics.merge_payload(model, load)), run(model), trajectory=traj)
    >>> round(est.mass, 3), bool(np.allclose(est.com, [0.0, 0.02, 0.08], atol=1e-4))
    (1.5, True)
    """
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
    """Every method a name stands for, each on its own; one that cannot work on the runs is reported, not
    raised.

    Parameters
    ----------
    model : Model
        The arm (without the payload).
    method : str
        A method (see `identify_one`) or the group "dynamic" (difference, torque and global).
    loaded, unloaded : str, Path or Recording
        The runs with and without the payload.
    trajectory : FourierTrajectory, optional
        The dynamic runs' excitation.
    consistent : bool
        The global method constrained to a body that can exist.

    Returns
    -------
    estimates : list of PayloadEstimate
        Of the methods that worked.
    failures : list of MethodFailure
        Of those that did not, each with its reason (an InputError or a singular system).

    Raises
    ------
    InputError
        An unknown method name. Any other error than bad input or a singular system is a fault and
        propagates.

    Examples
    --------
    >>> from ident.model import dynamics
    >>> from ident.fit import excitation
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> from ident.payload.methods import identify_each
    >>> from ident.fit.preprocess import Recording
    >>> model = load_model("generic6")
    >>> traj = excitation.preset("seed000")
    >>> t, q, qd, qdd = traj.sample(rate_hz=100.0)
    >>> def run(arm):
    ...     return Recording(t=t, q=q, tau=dynamics.rnea(arm, q, qd, qdd), current=None, qd=None, source=arm.name)
    >>> loaded = run(dynamics.merge_payload(model, payload_parameters(1.5, [0.0, 0.02, 0.08])))
    >>> estimates, failures = identify_each(model, "dynamic", loaded, run(model), trajectory=traj)
    >>> [(e.method, round(e.mass, 2)) for e in estimates], failures
    ([('difference', 1.5), ('torque', 1.5), ('global', 1.5)], [])
    """
    names = expand(method)
    base = None
    if sum(name in DYNAMIC for name in names) > 1:     # the model's base parameters, computed once for all
        from ident.model.base_params import base_parameters

        base = base_parameters(model)
    estimates, failures = [], []
    for name in names:
        try:
            estimates.append(identify_one(model, name, loaded, unloaded, trajectory=trajectory,
                                          consistent=consistent, base=base))
        except (InputError, np.linalg.LinAlgError) as exc:
            failures.append(MethodFailure(name, str(exc) or type(exc).__name__))
    return estimates, failures
