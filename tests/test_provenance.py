"""Provenance in result.json: the SHA-256 of each input and of the model equal hashlib's of the files' bytes,
paths are relative to the output directory (the directory can be moved), the command line, arm id, version
and UTC time are stored."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from armid import cli
from ident.model import dynamics
from ident.fit import excitation
from ident.model import load_model
from ident.outputs.provenance import provenance, relative_path, sha256_file
from degraded import write_csv


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("prov")
    model = load_model("generic6")
    rng = np.random.default_rng(3)
    traj = excitation.preset("seed000")
    t, q, qd, qdd = traj.sample(200.0)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(0, 0.02, q.shape)
    (d / "data").mkdir()
    data = write_csv(d / "data" / "run.csv", t, q, tau)
    np.savez(d / "data" / "val.npz", t=t, q=q, tau=tau + rng.normal(0, 0.02, q.shape))
    out = d / "results" / "arm7"
    argv = ["identify", str(data), "--model", "generic6", "-o", str(out), "--validate", str(d / "data" / "val.npz"),
            "--arm-id", "arm-7", "--no-report", "--quiet"]
    before = datetime.now(timezone.utc).replace(microsecond=0)
    assert cli.main(argv) == 0
    after = datetime.now(timezone.utc)
    return d, out, argv, before, after


def test_result_json_names_inputs_relative_to_the_output_with_their_sha256(run):
    d, out, argv, *_ = run
    doc = json.loads((out / "result.json").read_text())
    prov = doc["provenance"]
    assert prov["inputs"]["recording"] == {"path": "../../data/run.csv", "sha256": digest(d / "data" / "run.csv")}
    assert prov["inputs"]["validation"] == {"path": "../../data/val.npz", "sha256": digest(d / "data" / "val.npz")}
    assert set(prov["inputs"]) == {"recording", "validation"}
    assert doc["data"]["source"] == "../../data/run.csv"
    assert doc["validation"]["source"] == "../../data/val.npz"
    assert (out / prov["inputs"]["recording"]["path"]).resolve() == (d / "data" / "run.csv").resolve()


def test_result_json_holds_the_shipped_models_hash_version_arm_command_and_utc_time(run):
    d, out, argv, before, after = run
    prov = json.loads((out / "result.json").read_text())["provenance"]
    from importlib import resources
    with resources.as_file(resources.files("ident") / "models" / "generic6.toml") as f:
        assert prov["model"] == {"shipped": "generic6", "sha256": digest(Path(f))}
    assert prov["armid_version"] == metadata.version("armid")
    assert prov["arm_id"] == "arm-7"
    assert prov["command_line"] == ["armid", *argv]
    assert prov["created_utc"].endswith("Z")
    when = datetime.fromisoformat(prov["created_utc"].replace("Z", "+00:00"))
    assert before <= when <= after


def test_model_file_hash_and_relative_path(tmp_path):
    model = tmp_path / "models" / "arm.toml"
    model.parent.mkdir()
    model.write_bytes(b"# not read, only hashed\n")
    out = tmp_path / "out"
    prov = provenance(out, {"recording": model, "none": None}, model, argv=["x"], arm_id=None)
    assert prov["model"] == {"path": "../models/arm.toml", "sha256": digest(model)}
    assert prov["arm_id"] is None and "none" not in prov["inputs"]
    assert prov["command_line"] == ["x"]


def test_sha256_reads_large_files_in_pieces(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(3 * (1 << 20) + 17))
    assert sha256_file(big) == digest(big)


def test_relative_path_survives_moving_the_tree(tmp_path):
    (tmp_path / "a" / "data").mkdir(parents=True)
    (tmp_path / "a" / "data" / "r.csv").write_text("x")
    rel = relative_path(tmp_path / "a" / "data" / "r.csv", tmp_path / "a" / "out")
    shutil.move(tmp_path / "a", tmp_path / "b")
    assert (tmp_path / "b" / "out" / rel).resolve().read_text() == "x"


def test_payload_json_and_calibration_toml_carry_their_provenance(tmp_path):
    """payload.json's "provenance" and calibration.toml's [provenance]: the inputs' SHA-256 equal hashlib's of
    the files, paths relative to the output folder lead back to them, the model's hash, command line, version."""
    import tomllib

    from ident.calibration.model import from_model, tool_pose
    from ident.calibration.synthesis import random_configurations
    from sim.plant import payload_parameters

    model = load_model("generic6")
    rng = np.random.default_rng(7)
    poses = rng.uniform(-2.0, 2.0, (12, model.n))
    q = np.repeat(poses, 50, axis=0)
    t = np.arange(len(q)) / 100.0
    loaded = dynamics.merge_payload(model, payload_parameters(1.5, (0.0, 0.0, 0.05), (0.01, 0, 0, 0.01, 0, 0.005)))
    zero = np.zeros_like(q)
    (tmp_path / "runs").mkdir()
    write_csv(tmp_path / "runs" / "U.csv", t, q, dynamics.rnea(model, q, zero, zero))
    write_csv(tmp_path / "runs" / "L.csv", t, q, dynamics.rnea(loaded, q, zero, zero))
    out = tmp_path / "results" / "payload"
    argv = ["payload", "identify", "--method", "static", "--loaded", str(tmp_path / "runs" / "L.csv"), "--unloaded",
            str(tmp_path / "runs" / "U.csv"), "--model", "generic6", "-o", str(out), "--quiet"]
    assert cli.main(argv) == 0
    prov = json.loads((out / "payload.json").read_text())["provenance"]
    assert prov["inputs"] == {"loaded": {"path": "../../runs/L.csv", "sha256": digest(tmp_path / "runs" / "L.csv")},
                              "unloaded": {"path": "../../runs/U.csv", "sha256": digest(tmp_path / "runs" / "U.csv")}}
    assert (out / prov["inputs"]["loaded"]["path"]).resolve() == (tmp_path / "runs" / "L.csv").resolve()
    assert prov["command_line"] == ["armid", *argv] and prov["model"]["shipped"] == "generic6"
    assert prov["armid_version"] == metadata.version("armid") and prov["created_utc"].endswith("Z")
    assert not (out / "provenance.json").exists()
    _report_names(out / "report.html", prov)

    cm = from_model(model, (0.1, 0.0, 0.0))
    qc = random_configurations(cm, 30, seed=0)
    points = tool_pose(cm, qc, cm.nominal)[:, :3, 3]
    meas = tmp_path / "runs" / "meas.csv"
    np.savetxt(meas, np.hstack([qc, points]), delimiter=",", header="j1,j2,j3,j4,j5,j6,x,y,z", comments="")
    model_file = tmp_path / "arm.toml"
    from ident.outputs.results import write_model
    write_model(model, model_file)
    argv = ["calibrate", "identify", str(meas), "--model", str(model_file), "--tool", "0.1", "0", "0",
            "-o", str(tmp_path / "cal")]
    assert cli.main(argv) == 0
    prov = tomllib.loads((tmp_path / "cal" / "calibration.toml").read_text())["provenance"]
    assert prov["inputs"] == {"measurements": {"path": "../runs/meas.csv", "sha256": digest(meas)}}
    assert prov["model"] == {"path": "../arm.toml", "sha256": digest(model_file)}
    assert prov["command_line"] == ["armid", *argv] and "arm_id" not in prov     # TOML has no null: left out
    _report_names(tmp_path / "cal" / "report.html", prov)
    assert prov["armid_version"] == metadata.version("armid")
    assert not (tmp_path / "cal" / "provenance.json").exists()


def _report_names(page_path, prov: dict) -> None:
    """The report's provenance section lists every input of the record, its relative path and its hash, the
    model's hash and the command line."""
    import html as html_module
    import shlex

    page = page_path.read_text()
    assert page.count('id="provenance-inputs"') == 1
    section = page[page.index("<h2>Provenance</h2>"):]
    rows = re.findall(r"<tr><td>(.*?)</td><td>(.*?)</td><td><code>([0-9a-f]{64})</code></td></tr>", section)
    got = {re.sub("<[^>]+>", "", role): (re.sub("<[^>]+>", "", path), sha) for role, path, sha in rows}
    want = {role: (e["path"], e["sha256"]) for role, e in prov["inputs"].items()}
    assert {k: got[k] for k in want} == want
    assert got["model"][1] == prov["model"]["sha256"]
    assert html_module.escape(shlex.join(prov["command_line"])) in section
