"""`armid demo`: the in-process path (sim.Simulator stepped here, short excitation) end to end, the
reference motion, a failing step that names itself, and the process chain's behaviour under Ctrl-C and a
dying child (the chain's identification on each transport is in test_e2e.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from armid import cli
from armid.commands import demo
from ident.fit import excitation
from ident.model.base_params import base_parameters
from ident.model import load_model


def test_demo_runs_end_to_end_and_recovers_the_well_excited_parameters(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--in-process", "-o", str(out), "--periods", "0.5", "--quiet"]) == 0
    printed = capsys.readouterr().out
    for name in ("result.json", "model.toml", "report.html", "torque.png", "excitation.npz", "validation.npz"):
        assert (out / name).is_file(), name
    assert "generic6" in printed and "within 3 sigma of generic6" in printed and "report.html" in printed
    assert "validation RMS per joint" in printed
    doc = json.loads((out / "result.json").read_text())
    model = load_model("generic6")
    base = base_parameters(model)
    truth = base.from_standard(model.standard_parameters())
    values = np.array([p["value"] for p in doc["base_parameters"]])
    pct = np.array([p["relative_std_pct"] or np.inf for p in doc["base_parameters"]])
    # the well-identified ones (friction, gravity, Ia): 15 of 58 at half a period, with the std that accounts for
    # the filters' correlation and without the rows whose filter window reaches rest (docs/design/science.md)
    good = pct < 2.0
    assert good.sum() >= 12
    np.testing.assert_allclose(values[good], truth[good], rtol=0.05)
    assert max(doc["validation"]["relative"]) < 0.05
    reloaded = load_model(out / "model.toml")          # the identified model is a loadable, consistent model
    assert reloaded.n == 6


def test_demo_simulates_and_identifies_the_model_it_is_given(tmp_path, capsys):
    """--model FILE: the simulator runs that arm (its viscous friction on joint 2 is not generic6's) and the
    identification fits and compares with it, labelled with the file's name."""
    import tomli_w

    from ident.outputs import results

    doc = results.model_document(load_model("generic6"))
    doc["joint"][1]["drive"]["fv"] += 1.5
    variant = tmp_path / "heavy_fv2.toml"
    variant.write_text(tomli_w.dumps(doc))
    out = tmp_path / "demo"
    assert cli.main(["demo", "--in-process", "--model", str(variant), "-o", str(out), "--periods", "0.5",
                     "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "within 3 sigma of heavy_fv2.toml" in printed
    fv2 = next(p for p in json.loads((out / "result.json").read_text())["base_parameters"] if p["name"] == "fv2")
    want, generic = load_model(variant).params_matrix()[1, 12], load_model("generic6").params_matrix()[1, 12]
    assert abs(fv2["value"] - want) < 5 * fv2["std"] < abs(generic - want), (fv2, want, generic)


def test_demo_refuses_a_model_the_excitation_does_not_fit_naming_it(tmp_path, capsys):
    assert cli.main(["demo", "--in-process", "--model", "puma560", "-o", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("armid: demo step 1 (check the excitation against the limits) failed: ") and "\n" not in err
    missing = tmp_path / "none.toml"
    assert cli.main(["demo", "--in-process", "--model", str(missing), "-o", str(tmp_path / "o"), "--quiet"]) == 2
    assert "none.toml" in capsys.readouterr().err


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


def test_the_excitation_samples_start_and_end_at_rest_at_the_mean_pose_and_follow_the_trajectory_between():
    traj = excitation.preset("seed000")
    t, q = demo.excitation_samples(traj, 0.5, rate_hz=1000.0)
    end = 0.5 * traj.period
    assert t[0] == 0.0 and t[-1] == pytest.approx(end + 2 * demo.LEAD_IN)
    np.testing.assert_allclose(q[0], traj.q0, atol=1e-12)
    np.testing.assert_allclose(q[-1], traj.q0, atol=1e-12)
    v = np.diff(q, axis=0) * 1000.0
    assert np.abs(v[:3]).max() < 1e-3 and np.abs(v[-3:]).max() < 1e-3
    inside = (t >= demo.LEAD_IN) & (t <= demo.LEAD_IN + end - demo.LEAD_IN)
    np.testing.assert_allclose(q[inside], traj.evaluate(t[inside] - demo.LEAD_IN)[0], atol=1e-12)


def test_a_time_scaled_excitation_is_the_same_path_k_times_slower():
    traj = excitation.preset("seed000")
    slow = demo.time_scaled(traj, 3.0)
    t = np.linspace(0.0, traj.period, 50)
    q, qd, qdd = traj.evaluate(t)
    qs, qds, qdds = slow.evaluate(3.0 * t)
    np.testing.assert_allclose(qs, q, atol=1e-12)
    np.testing.assert_allclose(3.0 * qds, qd, atol=1e-12)
    np.testing.assert_allclose(9.0 * qdds, qdd, atol=1e-10)


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
    assert cli.main(["demo", "--in-process", "-o", str(out), "--periods", "0.5", "--currents", "--quiet"]) == 0
    assert "drive gains (N m/A): identified" in capsys.readouterr().out
    doc = json.loads((out / "result.json").read_text())
    assert doc["data"]["kind"] == "current" and doc["drive_gains"]["identified"] is True
    true_gains = load_model("generic6").joint_torque_per_amp()
    np.testing.assert_allclose(doc["drive_gains"]["values"], true_gains, rtol=0.02)
    assert np.all(np.abs(np.array(doc["drive_gains"]["values"]) - true_gains) < 4 * np.array(doc["drive_gains"]["std"]))
    with np.load(out / "payload.npz") as run:
        assert set(run.files) == {"t", "q", "current", "effort_delay"}
        assert float(run["effort_delay"]) == pytest.approx(0.5e-3)   # the simulator's: half of its 1 ms period


# -- the process chain: Ctrl-C and a dying child ------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _descendants(pid: int) -> set[int]:
    """Every process below pid (from /proc/PID/task/*/children)."""
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
            for k in kids:
                if k not in found:
                    found.add(k)
                    todo.append(k)
    return found


def _gone(pid: int) -> bool:
    """True once pid no longer runs (absent, or a zombie awaiting its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _start_demo(tmp_path: Path, until: str, timeout_s: float = 180.0) -> tuple[subprocess.Popen, Path, set[int]]:
    """`python -m armid.cli demo` (serial) in a subprocess, running until its stderr shows `until`;
    returns it, its stderr file and the processes it started."""
    err = tmp_path / "demo.err"
    with open(err, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "armid.cli", "demo", "-o", str(tmp_path / "out"),
                                 "--periods", "0.5"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=f)
    deadline = time.monotonic() + timeout_s
    while until not in err.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"the demo did not reach {until!r}: {err.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)
    return proc, err, _descendants(proc.pid)


def _wait_gone(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if not _gone(p)}


def test_ctrl_c_while_the_arm_moves_stops_the_demo_and_every_process_it_started(tmp_path):
    proc, err, children = _start_demo(tmp_path, "move to the start pose")
    try:
        assert len(children) >= 3                       # simulator, driver, recorder
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130
        assert _wait_gone(children) == set()
        assert "armid: interrupted" in err.read_text()
    finally:
        for p in _descendants(proc.pid) | children:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_simulator_that_dies_mid_run_fails_the_running_step_naming_it_and_what_to_check(tmp_path):
    proc, err, children = _start_demo(tmp_path, "move to the start pose")
    try:
        sims = [p for p in children if " sim " in Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")]
        assert len(sims) == 1
        os.kill(sims[0], signal.SIGKILL)
        assert proc.wait(90) == 2
        last = err.read_text(errors="replace").strip().splitlines()[-1]
        assert last.startswith("armid: demo step 5 (enable the drives and move to the start pose) failed: "), last
        assert "the sim process exited with status -9" in last and "check " in last   # which, why, where to look
        assert _wait_gone(children) == set()
    finally:
        for p in children:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
