"""`armid identify` end to end on recordings written as CSV/NPZ: result.json, the model file (round trip
to 1e-9), the report, currents with and without a payload run, and one-line errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from armid import cli
from ident.fit import batch, excitation
from ident.model import dynamics
from ident.outputs import results
from ident.model.base_params import base_parameters, random_states
from ident.fit.excitation import FourierTrajectory
from ident.model import load_model
from sim.plant import payload_parameters

RATE = 200.0
NOISE = 0.02   # N m


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def reversed_seed000() -> FourierTrajectory:
    t = excitation.preset("seed000")
    return FourierTrajectory(t.base_frequency, t.q0, -t.a, t.b)


def write_csv(path: Path, t, q, y, prefix: str) -> Path:
    n = q.shape[1]
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"{prefix}{j + 1}" for j in range(n)])
    np.savetxt(path, np.column_stack([t, q, y]), delimiter=",", header=header, comments="", fmt="%.17g")
    return path


def recording(model, traj, seed, *, chi=None, payload=None):
    t, q, qd, qdd = traj.sample(RATE)
    m = model if payload is None else dynamics.merge_payload(model, payload)
    tau = dynamics.rnea(m, q, qd, qdd, params=chi)
    return t, q, tau + np.random.default_rng(seed).normal(0, NOISE, tau.shape)


@pytest.fixture(scope="module")
def identified(tmp_path_factory, model):
    d = tmp_path_factory.mktemp("identify")
    data = write_csv(d / "run.csv", *recording(model, excitation.preset("seed000"), 0), "tau")
    t, q, tau = recording(model, reversed_seed000(), 1)
    np.savez(d / "val.npz", t=t, q=q, tau=tau)
    code = cli.main([ "identify", str(data), "--model", "generic6", "-o", str(d / "out"), "--validate",
                      str(d / "val.npz"), "--trajectory", "seed000", "--consistent", "--quiet"])
    assert code == 0
    return d / "out"


def test_result_json_holds_the_base_parameters_close_to_the_truth(identified, model):
    doc = json.loads((identified / "result.json").read_text())
    base = base_parameters(model)
    assert [p["name"] for p in doc["base_parameters"]] == base.names
    assert [p["expression"] for p in doc["base_parameters"]] == base.expressions
    truth = base.from_standard(model.standard_parameters())
    values = np.array([p["value"] for p in doc["base_parameters"]])
    std = np.array([p["std"] for p in doc["base_parameters"]])
    assert np.median(np.abs(values - truth) / std) < 1.5          # errors of the size the fit states
    assert np.all(np.abs(values - truth) < 5 * std)
    fit = doc["fit"]
    assert fit["cond"] > 1 and len(fit["sigma_joint"]) == 6
    # filtering keeps the motion and removes nothing of the noise floor below the decimation band
    assert np.all(np.array(fit["residual_rms"]) < NOISE)
    assert doc["data"]["decimation"] >= 1 and doc["data"]["cutoff_hz"] > 0
    assert len(doc["validation"]["rms"]) == 6 and max(doc["validation"]["relative"]) < 0.02
    assert len(doc["standard_parameters"]["values"]) == 84
    assert min(doc["standard_parameters"]["min_pseudo_inertia_eigenvalue"]) >= -1e-9
    flagged = {p["name"] for p in doc["base_parameters"] if p["badly_identified"]}
    big = {p["name"] for p in doc["base_parameters"] if not p["relative_std_pct"] or p["relative_std_pct"] > 10}
    assert flagged == big


def test_model_file_round_trips_to_1e_9(identified, model):
    doc = json.loads((identified / "result.json").read_text())
    chi = np.array(doc["standard_parameters"]["values"])
    reloaded = load_model(identified / "model.toml")
    q, qd, qdd = random_states(model, 200, seed=5)
    np.testing.assert_allclose(dynamics.rnea(reloaded, q, qd, qdd), dynamics.rnea(model, q, qd, qdd, params=chi),
                               rtol=0, atol=1e-9)
    np.testing.assert_array_equal(reloaded.gear_ratio, model.gear_ratio)


def test_model_file_round_trips_a_urdf_model_with_origins_and_axes(tmp_path):
    import pinocchio as pin

    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    ur5 = load_model(prefix / "share/example-robot-data/robots/ur_description/urdf/ur5_robot.urdf")
    assert not ur5.is_dh
    again = load_model(results.write_model(ur5, tmp_path / "ur5.toml"))
    q, qd, qdd = random_states(ur5, 200, seed=6)
    np.testing.assert_allclose(dynamics.rnea(again, q, qd, qdd), dynamics.rnea(ur5, q, qd, qdd), rtol=0, atol=1e-9)


def test_report_has_the_plots_and_the_parameter_table(identified, model):
    from matplotlib.image import imread

    page = (identified / "report.html").read_text()
    for png in ("torque", "residuals", "trajectory", "sigma", "validation"):
        assert f'src="{png}.png"' in page
        image = imread(identified / f"{png}.png")
        assert image.shape[0] > 200 and image.shape[1] > 400 and image.std() > 0.01   # not blank
    for name in base_parameters(model).names:
        assert f"<td>{name}</td>" in page
    assert 'class="bad"' in page and "sigma %" in page


def test_currents_without_a_payload_use_the_nominal_gains_and_say_so(tmp_path, model):
    t, q, tau = recording(model, excitation.preset("seed000"), 2)
    data = write_csv(tmp_path / "i.csv", t, q, tau / model.joint_torque_per_amp(), "i")
    doc = results.result_document(batch.identify(model, data, trajectory=excitation.preset("seed000")))
    assert doc["data"]["kind"] == "current"
    assert doc["drive_gains"]["identified"] is False and "up to one common scale" in doc["drive_gains"]["scale"]
    truth = base_parameters(model).from_standard(model.standard_parameters())
    values = np.array([p["value"] for p in doc["base_parameters"]])
    std = np.array([p["std"] for p in doc["base_parameters"]])
    assert np.all(np.abs(values - truth) < 5 * std)      # the nominal gains are the true ones here


def test_currents_with_a_payload_run_identify_the_drive_gains(tmp_path, model):
    gains = model.joint_torque_per_amp() * np.array([1.1, 0.9, 1.05, 0.95, 1.2, 0.8])
    t, q, tau = recording(model, excitation.preset("seed000"), 3)
    data = write_csv(tmp_path / "i.csv", t, q, tau / gains, "i")
    payload = payload_parameters(3.0, [0.0, 0.02, 0.05], [0.005, 0, 0, 0.005, 0, 0.004])
    t, q, tau = recording(model, reversed_seed000(), 4, payload=payload)
    loaded = write_csv(tmp_path / "loaded.csv", t, q, tau / gains, "i")
    ident = batch.identify(model, data, payload_run=loaded, payload_mass=3.0, trajectory=excitation.preset("seed000"),
                           consistent=True)
    g = results.result_document(ident)["drive_gains"]
    assert g["identified"] is True
    np.testing.assert_allclose(g["values"], gains, rtol=0.01)
    assert np.all(np.abs(np.array(g["values"]) - gains) < 5 * np.array(g["std"]))
    # the model file carries them as torque constants
    reloaded = load_model(results.write_model(ident.identified_model(), tmp_path / "model.toml"))
    np.testing.assert_allclose(reloaded.joint_torque_per_amp(), g["values"], rtol=1e-12)


def test_compare_prints_a_models_values_beside_the_identified_ones_and_counts_them(identified, model, capsys,
                                                                                    tmp_path):
    """--compare generic6 on data made from generic6: its values as the reference column, and the count within
    3 sigma agrees with result.json; compared with puma560 (another arm) far fewer are."""
    data = identified.parent / "run.csv"
    counts = {}
    for reference in ("generic6", "puma560"):
        assert cli.main(["identify", str(data), "--model", "generic6", "-o", str(tmp_path / reference),
                         "--trajectory", "seed000", "--compare", reference, "--quiet"]) == 0
        printed = capsys.readouterr().out
        assert printed.splitlines()[0].split()[-2:] == [reference, "error"]
        line = next(x for x in printed.splitlines() if "base parameters within 3 sigma of" in x)
        counts[reference] = int(line.split()[0])
        assert line.endswith(f"of {base_parameters(model).count} base parameters within 3 sigma of {reference}")
    doc = json.loads((tmp_path / "generic6" / "result.json").read_text())
    truth = base_parameters(model).from_standard(model.standard_parameters())
    within = sum(abs(p["value"] - v) <= 3 * p["std"] for p, v in zip(doc["base_parameters"], truth))
    assert counts["generic6"] == within >= 0.9 * len(truth)
    assert counts["puma560"] < 0.5 * len(truth)


def _error(capsys, argv) -> str:
    assert cli.main(argv + ["--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("armid: ")
    return err


def test_cli_errors_are_one_line_naming_the_problem(tmp_path, model, capsys):
    out = str(tmp_path / "o")
    assert "nothere.csv: no such file" in _error(capsys, ["identify", str(tmp_path / "nothere.csv"), "--model",
                                                           "generic6", "-o", out])
    t, q, tau = recording(model, excitation.preset("seed000"), 5)
    tau[100, 2] = np.nan
    bad = write_csv(tmp_path / "nan.csv", t, q, tau, "tau")
    msg = _error(capsys, ["identify", str(bad), "--model", "generic6", "-o", out])
    assert "nan.csv" in msg and "tau3" in msg and "line 102" in msg
    short = write_csv(tmp_path / "short.csv", t[:40], q[:40], tau[:40] * 0 + 1, "tau")
    assert "short.csv" in _error(capsys, ["identify", str(short), "--model", "generic6", "-o", out])
    good = write_csv(tmp_path / "good.csv", t, q, np.nan_to_num(tau), "tau")
    assert "--payload-run and --payload-mass go together" in _error(
        capsys, ["identify", str(good), "--model", "generic6", "-o", out, "--payload-mass", "2"])
    assert "holds torques" in _error(capsys, ["identify", str(good), "--model", "generic6", "-o", out,
                                              "--payload-run", str(good), "--payload-mass", "2"])
    assert "puma560" in _error(capsys, ["identify", str(good), "--model", "nosuchmodel", "-o", out])
    five = write_csv(tmp_path / "five.csv", t, q[:, :5], np.nan_to_num(tau)[:, :5], "tau")
    assert "5 joints recorded, expected 6" in _error(capsys, ["identify", str(five), "--model", "generic6", "-o", out])
    assert "no such preset" in _error(capsys, ["identify", str(good), "--model", "generic6", "-o", out,
                                               "--trajectory", "nope"])
    still = write_csv(tmp_path / "still.csv", t, np.tile(q[:1], (len(t), 1)) + np.outer(t, [1, 0, 0, 0, 0, 0]),
                      np.nan_to_num(tau), "tau")
    assert "least excited" in _error(capsys, ["identify", str(still), "--model", "generic6", "-o", out,
                                              "--trajectory", "seed000"])


def test_console_command_runs_in_a_subprocess(tmp_path):
    """The real entry point (python -m armid.cli) ends with one error line and exits 2 on bad input; the
    progress lines before it name the step that failed."""
    proc = subprocess.run([sys.executable, "-m", "armid.cli", "identify", str(tmp_path / "missing.npz"), "--model",
                           "generic6", "-o", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("armid: read the recording: ") and lines[-1].endswith("missing.npz: no such file")
    assert "Traceback" not in proc.stderr


def test_a_short_recording_is_decimated_less(model):
    """3 s at 1 kHz: the default decimation (33 for seed 000's bandwidth) would leave too few rows; it is
    capped so that at least about two samples per base parameter remain. (In 2 s joint 5 turns only once, and
    its only rows of the other sign lie within a decimation window of that reversal, left out: fc5 and offset5
    cannot be told apart.)"""
    from ident.fit.preprocess import Recording

    t, q, qd, qdd = excitation.preset("seed000").sample(1000.0, periods=0.3)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(7).normal(0, NOISE, q.shape)
    ident = batch.identify(model, Recording(t, q, tau, None, None, "short"), trajectory=excitation.preset("seed000"))
    assert ident.rows.factor < batch.decimation_factor(1000.0, 0.6)
    assert len(ident.rows.t) >= 2 * ident.base.count
