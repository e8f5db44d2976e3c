"""`armid payload identify --tip`: the payload is expressed in the frame the user names, and every result
says which frame that is. The arm is the UR5 of example-robot-data, whose `tool0` sits on a fixed joint
beyond its last moving link (turned -90 deg about x and 82.3 mm off); the rest torques come from
Pinocchio, the independent oracle, with the payload appended in tool0."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pin = pytest.importorskip("pinocchio")

MASS, COM = 2.0, np.array([0.03, -0.02, 0.08])           # kg, m in tool0
INERTIA_COM = np.diag([0.004, 0.005, 0.003])                # kg m^2 about the CoM, tool0 axes
RATE, HOLD, POSES = 100.0, 1.2, 10                         # Hz, s per pose, poses


def _ur5_with_tool0(folder: Path) -> Path:
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    source = prefix / "share" / "example-robot-data" / "robots" / "ur_description" / "urdf" / "ur5_robot.urdf"
    if not source.exists():
        pytest.skip(f"{source} not shipped by this example-robot-data")
    text = source.read_text()
    assert '<child link="tool0"/>' in text
    path = folder / "ur5.urdf"
    path.write_text(text)
    return path


def _write_csv(path: Path, t, q, tau) -> None:
    n = q.shape[1]
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"tau{j + 1}" for j in range(n)])
    np.savetxt(path, np.column_stack([t, q, tau]), delimiter=",", header=header, comments="", fmt="%.17g")


def _rest_runs(urdf: Path, folder: Path) -> None:
    """U.csv and L.csv: the arm held at POSES random poses, HOLD s each, gravity torques by Pinocchio,
    the loaded arm carrying the payload at COM in tool0."""
    arm = pin.buildModelFromUrdf(str(urdf))
    loaded = arm.copy()
    tool0 = loaded.frames[loaded.getFrameId("tool0")]
    loaded.appendBodyToJoint(tool0.parentJoint, pin.Inertia(MASS, COM, INERTIA_COM), tool0.placement)
    rng = np.random.default_rng(7)
    poses = rng.uniform(-np.pi, np.pi, (POSES, arm.nq))
    per = int(HOLD * RATE)
    q = np.repeat(poses, per, axis=0)
    t = np.arange(len(q)) / RATE
    for name, m in (("U.csv", arm), ("L.csv", loaded)):
        data = m.createData()
        tau = np.array([pin.computeGeneralizedGravity(m, data, p) for p in poses])
        _write_csv(folder / name, t, q, np.repeat(tau, per, axis=0))


def _identify(folder: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = folder / ("out" + "".join(extra).replace("-", "_"))
    run = subprocess.run([sys.executable, "-m", "armid.cli", "payload", "identify", "--method", "static",
                          "--loaded", "L.csv", "--unloaded", "U.csv", "--model", "ur5.urdf", "-o", str(out), *extra],
                         cwd=folder, capture_output=True, text=True, timeout=300)
    doc = json.loads((out / "payload.json").read_text()) if run.returncode == 0 else None
    return run, doc


def test_the_com_comes_out_in_tool0_with_tip_and_every_result_names_its_frame(tmp_path):
    urdf = _ur5_with_tool0(tmp_path)
    _rest_runs(urdf, tmp_path)

    run, doc = _identify(tmp_path, "--tip", "tool0")
    assert run.returncode == 0, run.stderr
    assert "in frame tool0 (ur5)" in run.stdout
    (est,) = doc["estimates"]
    assert doc["frame"] == "tool0" and est["frame"] == "tool0"
    assert est["mass_kg"] == pytest.approx(MASS, rel=1e-6)
    np.testing.assert_allclose(est["com_m"], COM, atol=1e-6)
    np.testing.assert_allclose(est["set_payload"]["com"], COM, atol=1e-6)

    # without --tip the frame is the end of the movable chain, wrist_3_link, and the result says so; the
    # CoM is the same point, placed by Pinocchio's frames
    run, doc = _identify(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "in frame wrist_3_link (ur5)" in run.stdout
    (est,) = doc["estimates"]
    assert doc["frame"] == "wrist_3_link" and est["frame"] == "wrist_3_link"
    model = pin.buildModelFromUrdf(str(urdf))
    link = model.frames[model.getFrameId("wrist_3_link")].placement
    tool0 = model.frames[model.getFrameId("tool0")].placement
    expected = (link.inverse() * tool0).act(COM)
    np.testing.assert_allclose(est["com_m"], expected, atol=1e-6)
    assert np.linalg.norm(expected - COM) > 0.05                  # the two frames really differ


def test_a_tip_on_a_model_without_a_urdf_is_refused_not_ignored(tmp_path):
    (tmp_path / "U.csv").write_text("t,q1\n0,0\n")
    run = subprocess.run([sys.executable, "-m", "armid.cli", "payload", "identify", "--method", "static",
                          "--loaded", "U.csv", "--unloaded", "U.csv", "--model", "generic6", "--tip", "tool0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "tip" in run.stderr and "tool0" in run.stderr
    _ur5_with_tool0(tmp_path)
    run = subprocess.run([sys.executable, "-m", "armid.cli", "payload", "plan", "--method", "static",
                          "--model", "ur5.urdf", "--tip", "no_such_link", "-o", "s.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no_such_link" in run.stderr
