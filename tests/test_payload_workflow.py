"""The payload workflow of docs/guides/payload.md, run as the page writes it: `armid payload plan --method
dynamic` and `armid payload identify --method dynamic` on runs of that plan recorded from the simulator
(sim.recording.simulate: CSP drives at 1 kHz, encoder quantisation, Stribeck friction, torque noise).
Each method runs on its own: a wrist-only excitation, which the difference method cannot use, still gives
the other methods' estimates, the difference method's reason, and exit status 1."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ident.fit import excitation
from ident.model import load_model
from ident.payload import payload_parameters
from ident.payload.excitation import plan as payload_plan
from ident.fit.preprocess import Recording
from sim.recording import simulate

DOCS = Path(__file__).parents[1] / "docs" / "guides" / "payload.md"
MASS, COM, INERTIA = 2.0, (0.03, -0.02, 0.08), (0.006, 0.0002, -0.0001, 0.007, 0.0003, 0.004)


def _documented(prefix: str) -> list[str]:
    """The one command line of docs/guides/payload.md that starts with `prefix`, as argv for `python -m armid.cli`."""
    lines = [ln.strip() for ln in DOCS.read_text().splitlines() if ln.strip().startswith(prefix)]
    assert len(lines) == 1, (prefix, lines)
    argv = shlex.split(lines[0], comments=True)
    assert argv[0] == "armid"
    return [sys.executable, "-m", "armid.cli", *argv[1:]]


def _write_csv(path: Path, rec: Recording) -> None:
    """A recording in the CSV layout of docs/reference/data-files.md (t, q1..qn, tau1..taun)."""
    n = rec.n
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"tau{j + 1}" for j in range(n)])
    np.savetxt(path, np.column_stack([rec.t, rec.q, rec.tau]), delimiter=",", header=header, comments="",
               fmt="%.9g")


def _record(traj, folder: Path, seconds: float) -> None:
    """U.csv and L.csv: the trajectory run on the simulated generic6 without and with the payload."""
    model = load_model("generic6")
    _write_csv(folder / "U.csv", simulate(model, traj, seconds, seed=3))
    _write_csv(folder / "L.csv", simulate(model, traj, seconds, seed=4, payload=(MASS, np.array(COM), np.array(INERTIA))))


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_documented_dynamic_workflow_runs_as_written_and_every_method_finds_the_payload(tmp_path):
    plan = _documented("armid payload plan --method dynamic")
    out = _run(plan, tmp_path)
    assert out.returncode == 0, out.stderr
    written = [Path(a) for a in plan if a.endswith(".toml")]
    assert len(written) == 1 and (tmp_path / written[0]).is_file()
    traj = excitation.load(tmp_path / written[0])
    moving = np.flatnonzero(np.ptp(traj.evaluate(np.linspace(0, traj.period, 400))[0], axis=0) > 1e-3)
    assert moving.tolist() == list(range(6))          # the default plan moves every joint
    _record(traj, tmp_path, traj.period)

    out = _run(_documented("armid payload identify --method dynamic"), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no estimate" not in out.stderr
    assert re.search(r"in frame flange \(generic6\)", out.stdout)
    doc = json.loads((tmp_path / "armid-payload" / "payload.json").read_text())
    assert doc["failed"] == [] and doc["frame"] == "flange"
    truth = payload_parameters(MASS, COM, INERTIA)
    by_method = {e["method"]: e for e in doc["estimates"]}
    assert sorted(by_method) == ["difference", "global", "torque"]
    for name, e in by_method.items():
        assert e["frame"] == "flange"
        assert e["mass_kg"] == pytest.approx(MASS, rel=0.01), name
        assert np.linalg.norm(np.array(e["com_m"]) - COM) < 2e-3, (name, e["com_m"])
    assert by_method["global"]["mass_kg"] == pytest.approx(truth[9], rel=2e-3)


def test_a_method_that_cannot_use_the_runs_is_reported_and_the_others_are_kept(tmp_path):
    """A wrist-only excitation: the difference method needs each run to determine every base parameter of
    the arm, so it fails with its reason; global and torque still give the mass combinations, exit 1."""
    model = load_model("generic6")
    traj = payload_plan(model, "wrist", payload=(3.0, (0.0, 0.0, 0.05), (0.01, 0, 0, 0.01, 0, 0.003)),
                        start_pose=np.array([0.3, -0.2, 0.4, 0.0, 0.0, 0.0]), max_iter=15)
    excitation.save(traj, tmp_path / "wrist.toml")
    _record(traj, tmp_path, traj.period)
    out = _run([sys.executable, "-m", "armid.cli", "payload", "identify", "--method", "dynamic",
                "--loaded", "L.csv", "--unloaded", "U.csv", "--model", "generic6", "--trajectory", "wrist.toml",
                "-o", "out"], tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"^difference: no estimate: .+", out.stderr, re.M), out.stderr
    doc = json.loads((tmp_path / "out" / "payload.json").read_text())
    assert [f["method"] for f in doc["failed"]] == ["difference"] and doc["failed"][0]["reason"]
    assert sorted(e["method"] for e in doc["estimates"]) == ["global", "torque"]
    truth = payload_parameters(MASS, COM, INERTIA)
    for e in doc["estimates"]:
        # the wrist sees the mass only in combinations with the first moments (the flange offset's lever)
        massive = [c for c in e["combinations"] if c["coefficients"][9] != 0 and not any(c["coefficients"][:6])]
        assert massive, (e["method"], [c["expression"] for c in e["combinations"]])
        for c in massive:
            assert c["value"] == pytest.approx(np.dot(c["coefficients"], truth), rel=0.02), (e["method"], c)
    page = (tmp_path / "out" / "report.html").read_text()
    assert "gave no estimate" in page and "difference" in page
    # asked alone, the method that cannot work is a failure of the whole command: exit 2, its reason
    alone = _run([sys.executable, "-m", "armid.cli", "payload", "identify", "--method", "difference",
                  "--loaded", "L.csv", "--unloaded", "U.csv", "--model", "generic6", "-o", "out2"], tmp_path)
    assert alone.returncode == 2 and "difference" in alone.stderr and not (tmp_path / "out2" / "payload.json").exists()
