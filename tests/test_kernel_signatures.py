"""Each dynamics kernel compiles once: ident.model.dynamics hands its numba kernels read-only views, so a caller's
writable arrays and frozen ones (a planned motion's samples, a model's own vectors) reach the same compiled
version. numba types a writable and a read-only array apart, and a second version of a kernel costs a compile as
long as the first (about a minute for rnea on a loaded 2-core machine)."""
import numpy as np
import pytest

from ident.model import dynamics, kernels, load_model

KERNELS = ("rnea", "regressor", "mass_matrix", "forward_dynamics", "flange_kinematics", "wrench_torques",
           "load_regressor")


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _frozen(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.setflags(write=False)
    return a


def test_each_dynamics_kernel_has_one_compiled_version_for_writable_and_frozen_inputs(model):
    """The frozen inputs add no version to those the writable ones reached (other callers in the same process may
    have compiled versions of their own, for other types: those are not this test's)."""
    rng = np.random.default_rng(0)
    q, qd, qdd = (rng.uniform(-1.0, 1.0, (4, model.n)) for _ in range(3))
    seen = []
    for make in (np.copy, _frozen):
        Q, QD, QDD = make(q), make(qd), make(qdd)
        tau = dynamics.rnea(model, Q, QD, QDD)
        dynamics.rnea(model, Q, QD, QDD, gravity=False)
        dynamics.rnea(model, Q, QD, QDD, make(model.standard_parameters()))
        dynamics.regressor(model, Q, QD, QDD)
        dynamics.mass_matrix(model, Q)
        dynamics.forward_dynamics(model, Q, QD, make(tau))
        dynamics.flange_kinematics(model, Q)
        dynamics.wrench_torques(model, Q, model.n, make(np.asarray(model.flange_p)), make(np.array([0.0, 1.0, 0.0])))
        dynamics.load_regressor(model, Q, QD, QDD)
        dynamics.load_regressor(model, Q, QD, QDD, gravity=False)
        seen.append({name: list(getattr(kernels, name).signatures) for name in KERNELS})
    writable, frozen = seen
    assert frozen == writable, {name: frozen[name][len(writable[name]):] for name in KERNELS}
