"""The robot model and its mathematics: the description (`robot`), its files (`model_file`, `urdf`,
`urdf_export`), the numba kernels (`kernels`, `spatial`) behind `dynamics`, base parameters (`base_params`,
`gautier_khalil`), frames, limits and the payload's separated terms (`load_separated`).

`from ident.model import Model, load_model` gives the description and its loader.
"""
from ident.model.model_file import load_model, shipped_models
from ident.model.robot import (DRIVE_NAMES, INERTIAL_NAMES, MAX_ABS, MAX_JOINTS, MAX_MODEL_BYTES, PARAMS_PER_JOINT,
                               PRISMATIC, REVOLUTE, SHIPPED_DIR, JointSpec, Model, ModelError, build_model)

__all__ = ["load_model", "shipped_models", "Model", "ModelError", "JointSpec", "build_model", "DRIVE_NAMES",
           "INERTIAL_NAMES", "MAX_ABS", "MAX_JOINTS", "MAX_MODEL_BYTES", "PARAMS_PER_JOINT", "PRISMATIC", "REVOLUTE",
           "SHIPPED_DIR"]
