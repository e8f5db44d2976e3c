"""`armid demo` end to end (short excitation): simulate with sim.Simulator, identify, report, print the
identified base parameters beside the true ones; a failing step names itself."""
from __future__ import annotations

import json

import numpy as np

from armid import cli
from armid.commands import demo
from ident import excitation
from ident.base_params import base_parameters
from ident.model import load_model


def test_demo_runs_end_to_end_and_recovers_the_well_excited_parameters(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "-o", str(out), "--periods", "0.5", "--quiet"]) == 0
    printed = capsys.readouterr().out
    for name in ("result.json", "model.toml", "report.html", "torque.png", "excitation.npz", "validation.npz"):
        assert (out / name).is_file(), name
    assert "true" in printed and "within 3 sigma of the truth" in printed and "report.html" in printed
    assert "validation RMS per joint" in printed
    doc = json.loads((out / "result.json").read_text())
    model = load_model("generic6")
    base = base_parameters(model)
    truth = base.from_standard(model.standard_parameters())
    values = np.array([p["value"] for p in doc["base_parameters"]])
    pct = np.array([p["relative_std_pct"] or np.inf for p in doc["base_parameters"]])
    good = pct < 2.0                                   # the well-identified ones (friction, gravity, Ia)
    assert good.sum() >= 20
    np.testing.assert_allclose(values[good], truth[good], rtol=0.05)
    assert max(doc["validation"]["relative"]) < 0.05
    reloaded = load_model(out / "model.toml")          # the identified model is a loadable, consistent model
    assert reloaded.n == 6


def test_the_reference_starts_at_rest_and_joins_the_trajectory_smoothly():
    traj = excitation.preset("seed000")
    t = np.arange(-2000, 200) / 1000.0
    q = demo.reference(traj, t)
    np.testing.assert_allclose(q[0], traj.q0)
    np.testing.assert_allclose(q[-100:], traj.evaluate(t[-100:])[0], atol=1e-12)
    v = np.diff(q, axis=0) * 1000.0
    a = np.diff(v, axis=0) * 1000.0
    assert np.abs(v[:3]).max() < 1e-3                 # at rest at the start
    assert np.abs(np.diff(a, axis=0)).max() < 1.0     # no acceleration jump (continuous within 1 rad/s^2 per ms)


def test_a_failing_step_says_which_and_why(tmp_path, capsys):
    t = excitation.preset("seed000")
    fast = excitation.FourierTrajectory(t.base_frequency, t.q0, 5 * t.a, 5 * t.b, t.joint_names)
    path = tmp_path / "fast.toml"
    excitation.save(fast, path)
    assert cli.main(["demo", "-o", str(tmp_path / "o"), "--trajectory", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("armid: demo step 1 (check the excitation against the limits) failed: ")
    assert "\n" not in err and "j" in err.split("failed: ")[1]


def test_demo_with_currents_identifies_the_drive_gains(tmp_path, capsys):
    """--currents: motor currents recorded, a second run with a known payload, gains identified."""
    out = tmp_path / "demo"
    assert cli.main(["demo", "-o", str(out), "--periods", "0.5", "--currents", "--quiet"]) == 0
    assert "drive gains (N m/A): identified" in capsys.readouterr().out
    doc = json.loads((out / "result.json").read_text())
    assert doc["data"]["kind"] == "current" and doc["drive_gains"]["identified"] is True
    true_gains = load_model("generic6").joint_torque_per_amp()
    np.testing.assert_allclose(doc["drive_gains"]["values"], true_gains, rtol=0.02)
    assert np.all(np.abs(np.array(doc["drive_gains"]["values"]) - true_gains) < 4 * np.array(doc["drive_gains"]["std"]))
    with np.load(out / "payload.npz") as run:
        assert set(run.files) == {"t", "q", "current"}
