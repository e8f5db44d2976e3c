"""An excitation for payload identification: the Fourier design of ident.fit.excitation with the payload
regressor's condition number as its criterion.

    traj = plan(model, joints="wrist")      # joints 4-6 move, the others hold the start pose
    traj = plan(model, joints="all")

With only the wrist moving, the fits keep the wrist joints' torques (the held joints' rows are slow rows,
where friction is not modelled), and those do not determine every payload parameter: the criterion is the
condition number over the combinations they do determine, found numerically (ident.payload.dynamic.
identifiable) from random wrist motions. The torque limits are checked with a nominal payload merged into
the last link (`payload`), so that the motion stays within the limits once the payload is on.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ident.model import dynamics
from ident.model.base_params import random_states
from firmware_bridge.runtime.errors import InputError
from ident.fit.excitation import Criterion, FourierTrajectory, design, start_pose_or_mid_range
from ident.model import PARAMS_PER_JOINT, Model
from ident.payload.body import payload_parameters
from ident.payload.identifiability import identifiable

WRIST_JOINTS = 3          # "wrist": the last three joints
CRITERION_SAMPLES = 200   # random wrist states that decide which payload combinations the wrist determines


def payload_columns(model: Model) -> np.ndarray:
    """(14n, 10): Y @ payload_columns(model) is the payload regressor (flange frame) from the standard one."""
    S = np.zeros((PARAMS_PER_JOINT * model.n, 10))
    last = PARAMS_PER_JOINT * (model.n - 1)
    S[last:last + 10] = dynamics.flange_to_link_matrix(model)
    return S


def moving_joints(model: Model, joints: str) -> np.ndarray:
    """Indices of the joints that move: the last WRIST_JOINTS for "wrist", all for "all"."""
    if joints == "all":
        return np.arange(model.n)
    if joints == "wrist":
        if model.n < WRIST_JOINTS:
            raise InputError(f"joints: the model {model.name} has {model.n} joints, fewer than a wrist's {WRIST_JOINTS}")
        return np.arange(model.n - WRIST_JOINTS, model.n)
    raise InputError(f"joints: expected 'wrist' or 'all', got {joints!r}")


def payload_criterion(model: Model, moving: np.ndarray, pose: np.ndarray, seed: int = 0) -> Criterion:
    """The payload regressor restricted to the moving joints' rows and to the payload combinations those
    rows determine (an orthonormal basis, found from random motions of the moving joints about `pose`)."""
    q, qd, qdd = random_states(model, CRITERION_SAMPLES, seed)
    held = np.setdiff1d(np.arange(model.n), moving)
    q[:, held], qd[:, held], qdd[:, held] = pose[held], 0.0, 0.0
    S = payload_columns(model)
    Y = dynamics.regressor(model, q, qd, qdd) @ S
    basis = identifiable(Y[:, moving, :].reshape(-1, 10), slice(0, 10)).payload      # (k, 10)
    return Criterion(S @ basis.T, None if len(moving) == model.n else moving)


def plan(model: Model, joints: str = "wrist", *, payload: tuple | None = None, start_pose=None,
         harmonics: int = 5, base_frequency: float = 0.1, criterion: str = "cond", floor_z: float | None = None,
         seed: int = 0, max_iter: int = 100, restarts: int = 1, progress: bool = False) -> FourierTrajectory:
    """A payload excitation (Fourier series, at rest at start_pose at t = 0 and every period end) that
    minimises the condition number (criterion "cond", or maximises log det, "logdet") of the payload
    regressor over one period, moving the wrist joints only or all joints, within the model's limits.
    payload: (mass kg, com (3,) m, inertia (6,) kg m^2 about the CoM) of the heaviest payload expected,
    merged into the model for the torque limits (default: none). start_pose (rad): default mid-range.
    harmonics, base_frequency (Hz), floor_z (m), seed, max_iter, restarts: as ident.fit.excitation.design."""
    moving = moving_joints(model, joints)
    limits_model = model if payload is None else dynamics.merge_payload(model, payload_parameters(*payload))
    pose = start_pose_or_mid_range(model, start_pose)
    target = payload_criterion(model, moving, pose, seed)
    traj = design(limits_model, harmonics=harmonics, base_frequency=base_frequency, start_pose=pose,
                  criterion=criterion, floor_z=floor_z, seed=seed, max_iter=max_iter, restarts=restarts,
                  progress=progress, target=target, moving=moving)
    info = dict(traj.info, model=model.name, target=f"payload regressor ({joints} joints)",
                identifiable_combinations=int(target.columns.shape[1]),
                payload_mass_for_limits=None if payload is None else float(payload[0]))
    return dataclasses.replace(traj, info=info)
