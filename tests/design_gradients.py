"""The excitation designer's gradients against a fourth-order central difference, shared by the arm's
and the payload's design tests.

Why fourth order at h = 1e-4: the objective goes through the smallest eigenvalue of W^T W, whose rounding
error is about eps * cond(W)^2 relative, so a second-order difference with a small h measures that noise
(~1e-4 at h = 1e-6), not the gradient. At h = 1e-4 the stencil's truncation and rounding errors are both
near 1e-6, and a gradient error of 1e-5 fails."""
from __future__ import annotations

import numpy as np
import pytest

from ident.fit import excitation

H = 1e-4


def assert_design_gradients_exact(p: "excitation._Problem", seed: int = 0) -> np.ndarray:
    """Move p's time grid off the rest samples (where sign(qd) of Coulomb friction jumps), then check
    objective_grad and nonlinear_jac at a random design z against the stencil; returns z."""
    p.t = p.t + 0.0137
    p.B = excitation.basis(p.t, p.f0, p.H)
    p.BN = [Bx @ p.Nul for Bx in p.B]
    z = np.random.default_rng(seed).uniform(-0.3, 0.3, p.size)
    g, J = p.objective_grad(z).copy(), p.nonlinear_jac(z).copy()
    for i in range(p.size):
        e = np.zeros(p.size)
        e[i] = H
        f = {k: p.objective(z + k * e) for k in (-2, -1, 1, 2)}            # one evaluation per point
        c = {k: p.nonlinear(z + k * e).copy() for k in (-2, -1, 1, 2)}
        fd = (8 * (f[1] - f[-1]) - (f[2] - f[-2])) / (12 * H)
        fd_c = (8 * (c[1] - c[-1]) - (c[2] - c[-2])) / (12 * H)
        assert g[i] == pytest.approx(fd, rel=1e-5, abs=1e-7 * np.abs(g).max())
        np.testing.assert_allclose(J[:, i], fd_c, atol=1e-7 * np.abs(J).max())
    return z
