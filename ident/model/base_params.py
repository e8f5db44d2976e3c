"""Minimal (base) parameters of a Model: the identifiable linear combinations of standard parameters.

Two independent ways, which the tests hold against each other:
  * "qr": numerically, from the regressor at random samples (Zhang, Qin and Zou 2017, eqs. 6-9). The rank comes from
    QR with column pivoting; the base columns are then chosen in standard-parameter order (the first
    columns independent of those before them), which reproduces the names of Gautier-Khalil's
    regrouping (XXR2 = XX2 - YY2 - ...). K_d = R_b^-1 R_d from the QR of [W_b W_d].
  * "closed-form": the Gautier-Khalil rules for modified-DH chains (Gautier and Khalil 1990), in ident.model.gautier_khalil.

Both return a BaseParameters: beta = P @ chi, and Y_base = Y[..., indices], so that Y @ chi == Y_base @ beta.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from ident.model import dynamics, gautier_khalil
from ident.model.base_set import BaseParameters, clean_coefficients
from ident.model.robot import Model

def random_states(model: Model, samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random (q, qd, qdd) within the position limits (±pi where unbounded) and of order one."""
    rng = np.random.default_rng(seed)
    lo = np.where(np.isfinite(model.q_min), model.q_min, -np.pi)
    hi = np.where(np.isfinite(model.q_max), model.q_max, np.pi)
    q = rng.uniform(lo, hi, size=(samples, model.n))
    qd = rng.normal(0.0, 1.0, size=(samples, model.n))
    qdd = rng.normal(0.0, 2.0, size=(samples, model.n))
    return q, qd, qdd


def numerical_base(model: Model, samples: int = 200, seed: int = 0, tol: float = 1e-8) -> BaseParameters:
    """Base parameters by QR of the regressor stacked over random samples.

    tol is relative to each column's norm: a column whose part independent of the others is smaller is
    dependent. A geometry within tol of a special value (a length of 1e-9 m) is ambiguous and refused.
    """
    q, qd, qdd = random_states(model, samples, seed)
    W = dynamics.regressor(model, q, qd, qdd).reshape(-1, 14 * model.n)
    norms = np.linalg.norm(W, axis=0)
    live = norms > tol * max(norms.max(), 1.0)
    Wn = np.zeros_like(W)
    Wn[:, live] = W[:, live] / norms[live]
    # rank from the pivoted QR (rank revealing)
    _, R_piv, _ = scipy.linalg.qr(Wn, mode="economic", pivoting=True)
    diag = np.abs(np.diag(R_piv))
    rank = int(np.sum(diag > tol))
    # base columns in standard order: a column is kept when it is independent of those kept before it
    _, R_nat = scipy.linalg.qr(Wn, mode="economic")
    keep = np.flatnonzero(np.abs(np.diag(R_nat)) > tol)
    if len(keep) != rank:
        raise ArithmeticError(f"{model.source}: base parameters are ambiguous: ordered selection finds {len(keep)} "
                              f"columns, pivoted QR rank {rank}; is a length or angle within {tol:g} of a special value?")
    drop = np.setdiff1d(np.arange(W.shape[1]), keep)
    _, R = scipy.linalg.qr(W[:, np.concatenate([keep, drop])], mode="economic")
    Kd = scipy.linalg.solve_triangular(R[:rank, :rank], R[:rank, rank:])
    P = np.zeros((rank, W.shape[1]))
    P[:, keep] = np.eye(rank)
    P[:, drop] = Kd
    return BaseParameters(indices=keep, P=clean_coefficients(P), standard_names=tuple(model.parameter_names()), method="qr")


def base_parameters(model: Model, method: str = "qr", **options) -> BaseParameters:
    """The base parameters of a model: the combinations of standard parameters that the joint torques
    determine, and the regressor columns that carry them.

    Parameters
    ----------
    model : Model
        The arm.
    method : {"qr", "closed-form"}
        "qr": numerically, from the regressor at random states (any model); "closed-form": the
        Gautier-Khalil regrouping rules (modified-DH models).
    **options
        Of the method: samples, seed, tol for "qr".

    Returns
    -------
    BaseParameters
        count, names (an R marks a regrouped parameter), expressions, P (b, 14n) with beta = P @ chi,
        `from_standard(chi)` and `regressor(Y)`.

    Raises
    ------
    ValueError
        An unknown method.
    ClosedFormError
        "closed-form" on a model that is not modified DH, or a chain its rules do not cover
        (ident.model.gautier_khalil).

    Examples
    --------
    Both methods find the same 58 combinations for generic6, and the base regressor explains the torques
    with them exactly:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model.base_params import base_parameters
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> base = base_parameters(model)
    >>> base.count, base_parameters(model, method="closed-form").count
    (58, 58)
    >>> q, qd, qdd = np.random.default_rng(0).uniform(-1, 1, (3, 20, 6))
    >>> Y = dynamics.regressor(model, q, qd, qdd)
    >>> chi = model.standard_parameters()
    >>> bool(np.allclose(base.regressor(Y) @ base.from_standard(chi), Y @ chi))
    True
    """
    if method == "qr":
        return numerical_base(model, **options)
    if method == "closed-form":
        return gautier_khalil.closed_form_base(model, **options)
    raise ValueError(f"method: expected 'qr' or 'closed-form', got {method!r}")
