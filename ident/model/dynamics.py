"""Rigid-body dynamics of a Model over batches of samples (numba kernels in ident.model.kernels).

Every function takes float64 arrays of shape (N, n) (or one sample of shape (n,), answered without the
batch axis) and SI units: rad, rad/s, rad/s^2 (m for prismatic joints), N m.

    tau = rnea(model, q, qd, qdd)                  # (N, n)
    Y = regressor(model, q, qd, qdd)               # (N, n, 14n), tau == Y @ model.standard_parameters()
    M = mass_matrix(model, q)                      # (N, n, n)
    qdd = forward_dynamics(model, q, qd, tau)      # (N, n)
"""
from __future__ import annotations

import numpy as np

from ident.model import kernels, spatial
from ident.model.robot import Model

_ZERO3 = np.zeros(3)
_ZERO3.setflags(write=False)      # read-only as every kernel input is (_read_only)


def _read_only(a, dtype=np.float64) -> np.ndarray:
    """A contiguous read-only view of a: what every kernel of this module gets for an input array, so that numba
    compiles one version of it whether the caller's array was writable or not (it types the two apart)."""
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.flags.writeable = False
    return view


def _batch(model: Model, name: str, x, n: int | None = None) -> tuple[np.ndarray, bool]:
    """(N, n) contiguous float64 read-only view of x (_read_only), and whether x was a single sample."""
    n = model.n if n is None else n
    arr = np.asarray(x, dtype=np.float64)
    single = arr.ndim == 1
    if single:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != n:
        raise ValueError(f"{name}: expected shape (N, {n}) or ({n},), got {np.shape(x)}")
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise ValueError(f"{name}: non-finite value at sample {bad[0]}, joint {bad[1] + 1}")
    return _read_only(arr), single


def _samples(model: Model, **arrays) -> tuple[list[np.ndarray], bool]:
    out, singles = [], set()
    for name, x in arrays.items():
        arr, single = _batch(model, name, x)
        out.append(arr)
        singles.add(single)
    lengths = {a.shape[0] for a in out}
    if len(lengths) != 1 or len(singles) != 1:
        raise ValueError("inputs must have the same shape: " + ", ".join(f"{k} {np.shape(v)}" for k, v in arrays.items()))
    return out, singles.pop()


def _chain(model: Model):
    return (_read_only(model.joint_type, np.int64), _read_only(model.placement_R), _read_only(model.placement_p),
            _read_only(model.axis))


def _gravity(model: Model, gravity: bool) -> np.ndarray:
    return _read_only(model.gravity) if gravity else _ZERO3


def rnea(model: Model, q, qd, qdd, params: np.ndarray | None = None, *, gravity: bool = True,
         drive: bool = True) -> np.ndarray:
    """Joint torques for a motion, by the recursive Newton-Euler algorithm.

    Parameters
    ----------
    model : Model
        The arm (ident.model.load_model).
    q, qd, qdd : array_like, shape (N, n) or (n,)
        Joint positions (rad), velocities (rad/s) and accelerations (rad/s^2); m, m/s, m/s^2 for
        prismatic joints.
    params : ndarray, shape (14n,), optional
        Standard parameters replacing the model's (XX XY XZ YY YZ ZZ mX mY mZ m Ia fc fv offset per joint).
    gravity : bool
        False leaves out gravity.
    drive : bool
        False leaves out the rotor inertia Ia, the Coulomb and viscous friction and the torque offset.

    Returns
    -------
    ndarray, shape (N, n) or (n,)
        Joint torques (N m; N for prismatic joints).

    Raises
    ------
    ValueError
        An input of the wrong shape or with a non-finite value (named, with sample and joint).

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> zero = np.zeros(6)
    >>> tau = dynamics.rnea(model, zero, zero, zero, drive=False)   # holding the arm still at q = 0
    >>> bool(np.allclose(tau, dynamics.gravity_torques(model, zero)))
    True
    >>> dynamics.rnea(model, zero, zero, zero, gravity=False, drive=False)
    array([0., 0., 0., 0., 0., 0.])
    """
    (Q, QD, QDD), single = _samples(model, q=q, qd=qd, qdd=qdd)
    out = np.empty_like(Q)
    kernels.rnea(*_chain(model), _gravity(model, gravity), _read_only(model.params_matrix(params)), Q, QD, QDD, drive,
                 out)
    return out[0] if single else out


def regressor(model: Model, q, qd, qdd, out: np.ndarray | None = None) -> np.ndarray:
    """Standard regressor Y: the joint torques are linear in the standard parameters, tau = Y @ chi.

    Parameters
    ----------
    model : Model
        The arm.
    q, qd, qdd : array_like, shape (N, n) or (n,)
        Joint positions, velocities and accelerations (rad, rad/s, rad/s^2).
    out : ndarray, shape (N, n, 14n), optional
        A preallocated C-contiguous float64 array to write into (every entry is written).

    Returns
    -------
    ndarray, shape (N, n, 14n) or (n, 14n)
        Columns per joint j: XX XY XZ YY YZ ZZ mX mY mZ m of link j, then Ia, fc, fv, offset of joint j,
        the order of `Model.standard_parameters`.

    Raises
    ------
    ValueError
        Inputs of the wrong shape or non-finite, or `out` of the wrong shape or layout.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> q, qd, qdd = np.random.default_rng(0).uniform(-1, 1, (3, 10, 6))
    >>> Y = dynamics.regressor(model, q, qd, qdd)
    >>> Y.shape
    (10, 6, 84)
    >>> bool(np.allclose(Y @ model.standard_parameters(), dynamics.rnea(model, q, qd, qdd)))
    True
    """
    (Q, QD, QDD), single = _samples(model, q=q, qd=qd, qdd=qdd)
    shape = (Q.shape[0], model.n, 14 * model.n)
    if out is None:
        out = np.empty(shape)
    elif out.shape != shape or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous float64 array of shape {shape}")
    kernels.regressor(*_chain(model), _read_only(model.gravity), Q, QD, QDD, out)
    return out[0] if single else out


def mass_matrix(model: Model, q, params: np.ndarray | None = None, *, drive: bool = True) -> np.ndarray:
    """Joint-space inertia matrix M(q), by the composite-rigid-body algorithm.

    Parameters
    ----------
    model : Model
        The arm.
    q : array_like, shape (N, n) or (n,)
        Joint positions (rad).
    params : ndarray, shape (14n,), optional
        Standard parameters replacing the model's.
    drive : bool
        True adds the rotor inertias Ia to the diagonal.

    Returns
    -------
    ndarray, shape (N, n, n) or (n, n)
        Symmetric positive definite (kg m^2).

    Raises
    ------
    ValueError
        q of the wrong shape or non-finite.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> q = np.full(6, 0.3)
    >>> M = dynamics.mass_matrix(model, q)
    >>> bool(np.allclose(M, M.T)), bool(np.all(np.linalg.eigvalsh(M) > 0))
    (True, True)
    >>> qdd = np.eye(6)[2]                  # M qdd is the inertial part of RNEA
    >>> inertial = dynamics.rnea(model, q, np.zeros(6), qdd, gravity=False, drive=False)
    >>> bool(np.allclose(dynamics.mass_matrix(model, q, drive=False) @ qdd, inertial))
    True
    """
    Q, single = _batch(model, "q", q)
    out = np.empty((Q.shape[0], model.n, model.n))
    kernels.mass_matrix(*_chain(model), _read_only(model.params_matrix(params)), Q, drive, out)
    return out[0] if single else out


def gravity_torques(model: Model, q, params: np.ndarray | None = None) -> np.ndarray:
    """Gravity torques G(q): what holds the arm still against gravity (no friction, no offset).

    Parameters
    ----------
    model : Model
        The arm.
    q : array_like, shape (N, n) or (n,)
        Joint positions (rad).
    params : ndarray, shape (14n,), optional
        Standard parameters replacing the model's.

    Returns
    -------
    ndarray, shape (N, n) or (n,)
        Joint torques (N m).

    Raises
    ------
    ValueError
        q of the wrong shape or non-finite.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> G = dynamics.gravity_torques(model, np.zeros(6))
    >>> G.shape, bool(G[0] == 0.0)                  # the first axis is vertical: gravity does no work on it
    ((6,), True)
    """
    z = np.zeros_like(np.asarray(q, dtype=np.float64))
    return rnea(model, q, z, z, params, drive=False)


def coriolis_torques(model: Model, q, qd, params: np.ndarray | None = None) -> np.ndarray:
    """Centrifugal and Coriolis torques C(q, qd) qd, without gravity or drive terms.

    Parameters
    ----------
    model : Model
        The arm.
    q, qd : array_like, shape (N, n) or (n,)
        Joint positions (rad) and velocities (rad/s).
    params : ndarray, shape (14n,), optional
        Standard parameters replacing the model's.

    Returns
    -------
    ndarray, shape (N, n) or (n,)
        Joint torques (N m).

    Raises
    ------
    ValueError
        Inputs of the wrong shape or non-finite.

    Examples
    --------
    The skew symmetry of M' - 2 C gives qd' (C qd) = qd' M' qd / 2, with M' the time derivative of the
    mass matrix along qd; at rest the Coriolis and centrifugal torques vanish.

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> q = np.full(6, 0.2)
    >>> bool(np.allclose(dynamics.coriolis_torques(model, q, np.zeros(6)), 0.0))
    True
    >>> qd = np.linspace(-1, 1, 6)
    >>> h = 1e-6                                   # dM/dt along qd, by central differences
    >>> def M(q):
    ...     return dynamics.mass_matrix(model, q, drive=False)
    >>> dM = (M(q + h * qd) - M(q - h * qd)) / (2 * h)
    >>> bool(np.isclose(qd @ dynamics.coriolis_torques(model, q, qd), qd @ dM @ qd / 2))
    True
    """
    return rnea(model, q, qd, np.zeros_like(np.asarray(q, dtype=np.float64)), params, gravity=False, drive=False)


def forward_dynamics(model: Model, q, qd, tau, params: np.ndarray | None = None, *,
                     drive: bool = True) -> np.ndarray:
    """Joint accelerations under joint torques: solves M(q) qdd = tau - rnea(q, qd, 0).

    Parameters
    ----------
    model : Model
        The arm.
    q, qd, tau : array_like, shape (N, n) or (n,)
        Joint positions (rad), velocities (rad/s) and torques (N m).
    params : ndarray, shape (14n,), optional
        Standard parameters replacing the model's.
    drive : bool
        True includes Ia in M and the Coulomb and viscous friction and offset in the bias; a simulator with
        its own friction model passes False and subtracts its friction from tau.

    Returns
    -------
    ndarray, shape (N, n) or (n,)
        Joint accelerations (rad/s^2).

    Raises
    ------
    ValueError
        Inputs of the wrong shape or non-finite, or a mass matrix that is not positive definite (the sample
        is named: check the inertial parameters).

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> q, qd, qdd = np.random.default_rng(1).uniform(-1, 1, (3, 6))
    >>> tau = dynamics.rnea(model, q, qd, qdd)
    >>> bool(np.allclose(dynamics.forward_dynamics(model, q, qd, tau), qdd))
    True
    """
    (Q, QD, TAU), single = _samples(model, q=q, qd=qd, tau=tau)
    out = np.empty_like(Q)
    ok = np.empty(Q.shape[0], dtype=np.bool_)
    kernels.forward_dynamics(*_chain(model), _read_only(model.gravity), _read_only(model.params_matrix(params)),
                             Q, QD, TAU, drive, out, ok)
    if not ok.all():
        s = int(np.argmin(ok))
        raise ValueError(f"mass matrix is not positive definite at sample {s} (check the inertial parameters)")
    return out[0] if single else out


def flange_pose(model: Model, q) -> np.ndarray:
    """Pose of the flange frame in the base frame.

    Parameters
    ----------
    model : Model
        The arm.
    q : array_like, shape (N, n) or (n,)
        Joint positions (rad).

    Returns
    -------
    ndarray, shape (N, 4, 4) or (4, 4)
        Homogeneous transforms (rotation, position in m).

    Raises
    ------
    ValueError
        q of the wrong shape or non-finite.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> T = dynamics.flange_pose(model, np.zeros(6))
    >>> bool(np.allclose(T[:3, :3] @ T[:3, :3].T, np.eye(3))), T[3].tolist()
    (True, [0.0, 0.0, 0.0, 1.0])
    """
    return flange_kinematics(model, q)[0]


def jacobian(model: Model, q) -> np.ndarray:
    """Geometric Jacobian of the flange origin, in base axes.

    Parameters
    ----------
    model : Model
        The arm.
    q : array_like, shape (N, n) or (n,)
        Joint positions (rad).

    Returns
    -------
    ndarray, shape (N, 6, n) or (6, n)
        Rows [v; w]: the flange origin's linear velocity (m/s) over its angular velocity (rad/s) per unit
        joint velocity.

    Raises
    ------
    ValueError
        q of the wrong shape or non-finite.

    Examples
    --------
    The linear rows are the derivative of the flange position:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> q, dq = np.full(6, 0.4), np.linspace(-1, 1, 6) * 1e-6
    >>> moved = dynamics.flange_pose(model, q + dq)[:3, 3] - dynamics.flange_pose(model, q - dq)[:3, 3]
    >>> bool(np.allclose(moved / 2, dynamics.jacobian(model, q)[:3] @ dq, atol=1e-12))
    True
    """
    return flange_kinematics(model, q)[1]


def flange_kinematics(model: Model, q) -> tuple[np.ndarray, np.ndarray]:
    """Flange pose and geometric Jacobian in one pass (see `flange_pose` and `jacobian`).

    Parameters
    ----------
    model : Model
        The arm.
    q : array_like, shape (N, n) or (n,)
        Joint positions (rad).

    Returns
    -------
    pose : ndarray, shape (N, 4, 4) or (4, 4)
        The flange frame in the base frame.
    jacobian : ndarray, shape (N, 6, n) or (6, n)
        Rows [v; w] of the flange origin, base axes.

    Raises
    ------
    ValueError
        q of the wrong shape or non-finite.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> T, J = dynamics.flange_kinematics(model, np.zeros((5, 6)))
    >>> T.shape, J.shape
    ((5, 4, 4), (5, 6, 6))
    """
    Q, single = _batch(model, "q", q)
    pose = np.empty((Q.shape[0], 4, 4))
    jac = np.empty((Q.shape[0], 6, model.n))
    kernels.flange_kinematics(*_chain(model), _read_only(model.flange_R),
                              _read_only(model.flange_p), Q, pose, jac)
    return (pose[0], jac[0]) if single else (pose, jac)


def wrench_torques(model: Model, q, link: int, point, force, moment=(0.0, 0.0, 0.0)) -> np.ndarray:
    """Joint torques that an external wrench on one link makes: tau = J(q)^T [force; moment].

    Parameters
    ----------
    model : Model
        The arm.
    q : array_like, shape (N, n) or (n,)
        Joint positions (rad).
    link : int
        The link the wrench acts on, 1..n (link k is the one joint k moves).
    point : array_like, shape (3,)
        Where the force acts, in link `link`'s frame (m).
    force, moment : array_like, shape (3,)
        The force (N) and moment (N m) in base axes.

    Returns
    -------
    ndarray, shape (N, n) or (n,)
        The torques (N m; N for prismatic joints) the joints feel; zero beyond `link`.

    Raises
    ------
    ValueError
        A link outside 1..n, or a vector of the wrong shape or non-finite.

    Examples
    --------
    A force pushing the flange of a stretched arm sideways loads every joint up to it:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> tau = dynamics.wrench_torques(model, np.zeros(6), 6, model.flange_p, [0.0, 10.0, 0.0])
    >>> J = dynamics.jacobian(model, np.zeros(6))
    >>> bool(np.allclose(tau, J[:3].T @ [0.0, 10.0, 0.0]))
    True
    """
    Q, single = _batch(model, "q", q)
    if isinstance(link, bool) or not isinstance(link, (int, np.integer)) or not 1 <= link <= model.n:
        raise ValueError(f"link: expected an integer 1..{model.n}, got {link!r}")
    vectors = []
    for name, v in (("point", point), ("force", force), ("moment", moment)):
        arr = np.asarray(v, dtype=np.float64)
        if arr.shape != (3,) or not np.isfinite(arr).all():
            raise ValueError(f"{name}: expected 3 finite numbers, got {np.asarray(v).tolist()!r}")
        vectors.append(arr)
    out = np.empty_like(Q)
    kernels.wrench_torques(*_chain(model), Q, int(link) - 1, _read_only(vectors[0]),
                           _read_only(np.concatenate(vectors[1:])), out)
    return out[0] if single else out


def flange_to_link_matrix(model: Model) -> np.ndarray:
    """The linear map from a payload's 10 parameters in the flange frame to parameters of the last link.

    Parameters
    ----------
    model : Model
        The arm (its flange placement on the last link).

    Returns
    -------
    ndarray, shape (10, 10)
        Maps [XX XY XZ YY YZ ZZ mX mY mZ m] about the flange origin, flange axes, to the same about the
        last link's frame origin, its axes.

    Examples
    --------
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> model = load_model("generic6")
    >>> A = dynamics.flange_to_link_matrix(model)
    >>> A.shape, float((A @ payload_parameters(1.5, [0, 0, 0]))[9])      # the mass stays the mass
    ((10, 10), 1.5)
    """
    return spatial.body_transform_matrix(np.asarray(model.flange_R), np.asarray(model.flange_p))


def load_regressor(model: Model, q, qd, qdd, *, gravity: bool = True) -> np.ndarray:
    """Payload regressor: the joint torques a payload adds are linear in its 10 parameters.

    tau_load = Y_load @ chi_load, with chi_load = [XX XY XZ YY YZ ZZ mX mY mZ m] about the flange origin,
    in flange axes (ident.payload.payload_parameters).

    Parameters
    ----------
    model : Model
        The arm.
    q, qd, qdd : array_like, shape (N, n) or (n,)
        Joint positions, velocities and accelerations (rad, rad/s, rad/s^2).
    gravity : bool
        False leaves out gravity.

    Returns
    -------
    ndarray, shape (N, n, 10) or (n, 10)

    Raises
    ------
    ValueError
        Inputs of the wrong shape or non-finite.

    Examples
    --------
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> model = load_model("generic6")
    >>> load = payload_parameters(2.0, [0.0, 0.0, 0.05])
    >>> q, qd, qdd = np.random.default_rng(2).uniform(-1, 1, (3, 4, 6))
    >>> added = dynamics.rnea(dynamics.merge_payload(model, load), q, qd, qdd) - dynamics.rnea(model, q, qd, qdd)
    >>> bool(np.allclose(dynamics.load_regressor(model, q, qd, qdd) @ load, added))
    True
    """
    (Q, QD, QDD), single = _samples(model, q=q, qd=qd, qdd=qdd)
    out = np.empty((Q.shape[0], model.n, 10))
    kernels.load_regressor(*_chain(model), _gravity(model, gravity), _read_only(flange_to_link_matrix(model)), Q, QD,
                           QDD, out)
    return out[0] if single else out


def merge_payload(model: Model, chi_load) -> Model:
    """The model with a payload rigidly merged into its last link.

    Parameters
    ----------
    model : Model
        The arm.
    chi_load : array_like, shape (10,)
        The payload's [XX XY XZ YY YZ ZZ mX mY mZ m] about the flange origin, flange axes
        (ident.payload.payload_parameters).

    Returns
    -------
    Model
        A new model; `model` is not changed.

    Examples
    --------
    >>> from ident.model import dynamics
    >>> from ident.model import load_model
    >>> from ident.payload import payload_parameters
    >>> model = load_model("generic6")
    >>> loaded = dynamics.merge_payload(model, payload_parameters(2.0, [0, 0, 0.05]))
    >>> round(float(loaded.standard_parameters()[-5] - model.standard_parameters()[-5]), 12)   # m6
    2.0
    """
    chi = model.standard_parameters()
    n = model.n
    chi[14 * (n - 1): 14 * (n - 1) + 10] += flange_to_link_matrix(model) @ np.asarray(chi_load, dtype=float)
    return model.with_parameters(chi)
