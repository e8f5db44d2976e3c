"""The identified model as URDF: Pinocchio loads model.urdf, and its RNEA plus the sidecar's drive terms
(rotor inertia as Pinocchio's armature, Coulomb and viscous friction from <dynamics>, offsets) equals armid's RNEA
with the identified parameters on random states; armid's own URDF reader reads it back to the same torques."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pin = pytest.importorskip("pinocchio")

from armid import cli  # noqa: E402
from degraded import write_csv  # noqa: E402
from ident.model import dynamics  # noqa: E402
from ident.fit import excitation
from ident.model import load_model  # noqa: E402
from ident.model.urdf_export import link_inertial, write_urdf  # noqa: E402

TOL = 1e-10


@pytest.fixture(scope="module")
def identified_dir(tmp_path_factory):
    """`armid identify --consistent` on a simulated recording of generic6 with friction and offsets."""
    d = tmp_path_factory.mktemp("urdf")
    model = load_model("generic6")
    t, q, qd, qdd = excitation.preset("seed000").sample(200.0)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(5).normal(0, 0.02, q.shape)
    data = write_csv(d / "run.csv", t, q, tau)
    assert cli.main(["identify", str(data), "--model", "generic6", "-o", str(d / "out"), "--trajectory", "seed000",
                     "--consistent", "--no-report", "--quiet"]) == 0
    return d / "out"


def random_states(model, seed: int, count: int = 40):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-np.pi, np.pi, (count, model.n))
    qd, qdd = rng.normal(0, 2, (2, count, model.n))
    return q, qd, qdd


def pinocchio_torques(urdf: Path, q, qd, qdd) -> np.ndarray:
    """Pinocchio's RNEA on the URDF with the sidecar's gravity and armature, plus the URDF's friction and damping
    and the sidecar's offsets, as the sidecar's "torque" says."""
    side = json.loads(urdf.with_suffix(".sidecar.json").read_text())
    pm = pin.buildModelFromUrdf(str(urdf))
    pm.gravity.linear = np.array(side["gravity"])
    pm.armature = np.array([j["rotor_inertia"] for j in side["joints"]])
    offset = np.array([j["torque_offset"] for j in side["joints"]])
    data = pm.createData()
    out = np.empty_like(q)
    for s in range(len(q)):
        out[s] = (pin.rnea(pm, data, q[s], qd[s], qdd[s]) + pm.friction * np.sign(qd[s]) + pm.damping * qd[s]
                  + offset)
    return out


def test_identified_urdf_rnea_in_pinocchio_equals_armids_with_the_identified_parameters(identified_dir):
    urdf = identified_dir / "model.urdf"
    identified = load_model(identified_dir / "model.toml")
    chi = np.array(json.loads((identified_dir / "result.json").read_text())["standard_parameters"]["values"])
    np.testing.assert_allclose(identified.standard_parameters(), chi, rtol=1e-12, atol=1e-12)
    assert np.any(identified.drive[:, 1:3] != load_model("generic6").drive[:, 1:3])   # identified, not the prior
    q, qd, qdd = random_states(identified, 0)
    ours = dynamics.rnea(identified, q, qd, qdd)
    scale = max(1.0, np.abs(ours).max())
    np.testing.assert_allclose(pinocchio_torques(urdf, q, qd, qdd), ours, rtol=0, atol=TOL * scale)


@pytest.mark.parametrize("name", ["generic6", "puma560"])
def test_shipped_models_through_urdf_match_in_pinocchio_and_read_back(tmp_path, name):
    model = load_model(name)
    rng = np.random.default_rng(1)
    drive = np.column_stack([rng.uniform(0.01, 0.5, model.n), rng.uniform(0.5, 3, model.n),
                             rng.uniform(0.1, 2, model.n), rng.normal(0, 0.3, model.n)])
    chi = model.params_matrix().copy()
    chi[:, 10:] = drive
    model = model.with_parameters(chi.ravel())
    urdf, _ = write_urdf(model, tmp_path / "m.urdf")
    q, qd, qdd = random_states(model, 2)
    ours = dynamics.rnea(model, q, qd, qdd)
    scale = max(1.0, np.abs(ours).max())
    np.testing.assert_allclose(pinocchio_torques(urdf, q, qd, qdd), ours, rtol=0, atol=TOL * scale)
    back = load_model(urdf, tip=model.flange_frame)
    assert list(back.joint_names) == list(model.joint_names)
    np.testing.assert_allclose(dynamics.rnea(back, q, qd, qdd, drive=False),
                               dynamics.rnea(model, q, qd, qdd, drive=False), rtol=0, atol=TOL * scale)
    np.testing.assert_allclose(back.flange_p, model.flange_p, atol=1e-12)


def test_link_inertial_recovers_the_parameters_about_the_origin():
    from ident.model import spatial

    rng = np.random.default_rng(4)
    A = rng.normal(size=(3, 3))
    chi = spatial.body_parameters(2.5, rng.normal(size=3), A @ A.T)
    m, c, Jc = link_inertial(chi)
    np.testing.assert_allclose(spatial.body_parameters(m, c, Jc), chi, rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="first moments"):
        link_inertial(np.array([1, 0, 0, 1, 0, 1, 0.1, 0, 0, 0.0]))
