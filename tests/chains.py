"""Modified-DH test chains built in code (shipped models cover only all-revolute arms)."""
from __future__ import annotations

import numpy as np

from ident.model import spatial
from ident.model import PRISMATIC, REVOLUTE, JointSpec, build_model

H = np.pi / 2

# (type, alpha, d, theta, r)
CHAINS = {
    "stanford_RRPRRR": [("R", 0, 0, 0, 0), ("R", -H, 0, 0, 0.15), ("P", H, 0, 0, 0.3),
                        ("R", 0, 0, 0, 0), ("R", -H, 0, 0, 0), ("R", H, 0, 0, 0)],
    "scara_RRPR": [("R", 0, 0, 0, 0), ("R", 0, 0.35, 0, 0), ("P", 0, 0.3, 0, 0.1), ("R", 0, 0, 0, 0)],
    "track_PRRRRRR": [("P", -H, 0, 0, 0), ("R", H, 0, 0, 0.4), ("R", -H, 0, -H, 0), ("R", 0, 0.25, 0, 0),
                      ("R", -H, 0, 0, 0.25), ("R", H, 0, 0, 0), ("R", -H, 0, 0, 0)],
    "cartesian_PPPRRR": [("P", -H, 0, 0, 0), ("P", H, 0, H, 0), ("P", -H, 0, 0, 0),
                         ("R", 0, 0, 0, 0.1), ("R", -H, 0, 0, 0), ("R", H, 0, 0, 0)],
    "cylindrical_RPPR": [("R", 0, 0, 0, 0), ("P", 0, 0, 0, 0.2), ("P", -H, 0, 0, 0), ("R", 0, 0, 0, 0)],
    "skew_RRR": [("R", 0, 0, 0, 0), ("R", 0.7, 0.2, 0.3, 0.1), ("R", -1.1, 0.3, 0.2, 0.05)],
}


def mdh_chain(name: str, seed: int = 0):
    """A model of the named chain with random (physically consistent) inertias and drive parameters."""
    rng = np.random.default_rng(seed)
    specs = []
    for j, (kind, alpha, d, theta, r) in enumerate(CHAINS[name]):
        R, p = spatial.mdh_placement(alpha, d, theta, r)
        A = rng.normal(size=(3, 3))
        inertia_com = A @ A.T * 0.01 + np.eye(3) * 0.001
        mass = rng.uniform(0.5, 5.0)
        chi = spatial.body_parameters(mass, rng.normal(0, 0.1, 3), inertia_com)
        spec = JointSpec(f"j{j + 1}", PRISMATIC if kind == "P" else REVOLUTE, R, p, np.array([0.0, 0.0, 1.0]), chi,
                         drive=np.array([rng.uniform(0.01, 0.3), rng.uniform(0.1, 3), rng.uniform(0.1, 3), rng.normal()]),
                         q_limits=(-1.0, 1.0) if kind == "P" else (-np.pi, np.pi), dh=(alpha, d, theta, r))
        specs.append(spec)
    return build_model(name, f"<test chain {name}>", specs, [0.0, 0.0, -9.81], np.eye(3), np.zeros(3))
