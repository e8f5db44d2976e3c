"""`armid calibrate plan|identify` end to end: the pose list, the measurement CSV, the calibrated URDF
(checked through our URDF import and through Pinocchio), the tables and report; one clear error per
kind of bad input."""
from __future__ import annotations

import csv
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from armid.cli import main
from ident.model import dynamics
from ident.calibration.io import read_measurements, read_poses
from ident.calibration.model import from_model, tool_pose
from ident.calibration.synthesis import random_configurations
from ident.errors import InputError
from ident.model import load_model

ROOT = Path(__file__).resolve().parents[1]
TOOL = (0.12, 0.0, 0.0)


def true_values(cm, seed=0):
    rng = np.random.default_rng(seed)
    return cm.nominal + np.where(cm.is_rotation, rng.normal(0, 2e-3, cm.m), rng.normal(0, 1e-3, cm.m))


def write_csv(path, rows, header=None):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        for r in rows:
            w.writerow([repr(float(v)) if isinstance(v, (float, np.floating)) else v for v in r])


def test_plan_then_identify_gives_a_calibrated_urdf_that_reproduces_the_true_arm(tmp_path):
    poses = tmp_path / "poses.csv"
    run = subprocess.run([sys.executable, "-m", "armid.cli", "calibrate", "plan", "--model", "generic6", "--tool",
                          *map(str, TOOL), "--count", "40", "--candidates", "300", "-o", str(poses)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "27 parameters" in run.stdout and "Rz(q6)" in run.stdout
    q = read_poses(poses, 6)
    model = load_model("generic6")
    assert q.shape == (40, 6) and np.all((q >= model.q_min) & (q <= model.q_max))

    cm = from_model(model, TOOL)
    true = true_values(cm)
    P = tool_pose(cm, q, true)[:, :3, 3]
    meas = tmp_path / "meas.csv"
    write_csv(meas, np.hstack([q, P]), header=["j1", "j2", "j3", "j4", "j5", "j6", "x", "y", "z"])
    out = tmp_path / "out"
    assert main(["calibrate", "identify", str(meas), "--model", "generic6", "--tool", *map(str, TOOL),
                 "-o", str(out)]) == 0
    doc = tomllib.loads((out / "calibration.toml").read_text())
    assert doc["calibration"]["parameters"] == 27
    assert doc["calibration"]["rms_before_m"] > 1e-3 and doc["calibration"]["rms_after_m"] < 1e-9
    # noise-free measurements: no outliers, the test's floor being the stated (default) sensor noise
    assert doc["calibration"]["outliers"] == [] and doc["calibration"]["outlier_threshold_m"] == pytest.approx(1.5e-4)
    assert doc["calibration"]["tool_frame"] == "flange"
    assert len(doc["nominal_dh"]) == 6 and len(doc["term"]) == cm.m
    with open(out / "parameters.csv") as f:
        table = list(csv.DictReader(f))
    assert sum(r["status"] == "identified" for r in table) == 27
    assert all(float(r["sigma"]) == 0.0 for r in table if r["status"] != "identified")
    for png in ("residuals.png", "parameters.png", "accuracy.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png in (out / "report.html").read_text()

    # the URDF, read back by our importer, is the true arm at poses never measured
    calibrated = load_model(out / "calibrated.urdf", tip="tool")
    q_test = random_configurations(cm, 30, seed=3)
    np.testing.assert_allclose(dynamics.flange_pose(calibrated, q_test)[:, :3, 3],
                               tool_pose(cm, q_test, true)[:, :3, 3], atol=1e-9)
    pin = pytest.importorskip("pinocchio")
    pm = pin.buildModelFromUrdf(str(out / "calibrated.urdf"))
    data = pm.createData()
    fid = pm.getFrameId("tool")
    for qi in q_test[:5]:
        pin.framesForwardKinematics(pm, data, qi)
        np.testing.assert_allclose(data.oMf[fid].translation, tool_pose(cm, qi[None], true)[0, :3, 3], atol=1e-9)


def test_full_pose_measurements_with_quaternions(tmp_path):
    model = load_model("puma560")
    cm = from_model(model)
    true = true_values(cm, seed=4)
    q = random_configurations(cm, 20, seed=5)
    T = tool_pose(cm, q, true)
    quat = Rotation.from_matrix(T[:, :3, :3]).as_quat()
    meas = tmp_path / "pose.csv"
    write_csv(meas, np.hstack([q, T[:, :3, 3], quat]))
    m = read_measurements(meas, 6)
    np.testing.assert_allclose(m.orientations, T[:, :3, :3], atol=1e-12)
    assert main(["calibrate", "identify", str(meas), "--model", "puma560", "-o", str(tmp_path / "o")]) == 0
    doc = tomllib.loads((tmp_path / "o" / "calibration.toml").read_text())
    assert doc["calibration"]["measure"] == "pose" and doc["calibration"]["parameters"] == 30
    assert doc["calibration"]["rms_after_m"] < 1e-9


def test_identify_from_per_axis_experiments_ignores_a_wrong_nominal_geometry(tmp_path, capsys):
    """--axes: the chain comes from measured circles; the model (here the PUMA, not the measured arm) only
    names the joints."""
    cm = from_model(load_model("generic6"), TOOL)
    true = true_values(cm, seed=7)
    rows = [np.zeros(6)]
    for j in range(6):
        for a in (-2.0, 2.0):
            r = np.zeros(6)
            r[j] = a
            rows.append(r)
    q_axes = np.array(rows)
    write_csv(tmp_path / "axes.csv", np.hstack([q_axes, tool_pose(cm, q_axes, true)[:, :3, 3]]))
    q = random_configurations(cm, 40, seed=8)
    write_csv(tmp_path / "meas.csv", np.hstack([q, tool_pose(cm, q, true)[:, :3, 3]]))
    out = tmp_path / "o"
    assert main(["calibrate", "identify", str(tmp_path / "meas.csv"), "--model", "puma560", "--axes",
                 str(tmp_path / "axes.csv"), "-o", str(out)]) == 0
    assert "axis fit from" in capsys.readouterr().out
    doc = tomllib.loads((out / "calibration.toml").read_text())
    assert doc["calibration"]["initial"] == "axis fit" and doc["calibration"]["parameters"] == 27
    assert doc["calibration"]["rms_after_m"] < 1e-9
    calibrated = load_model(out / "calibrated.urdf", tip="tool")
    q_test = random_configurations(cm, 20, seed=9)
    np.testing.assert_allclose(dynamics.flange_pose(calibrated, q_test)[:, :3, 3],
                               tool_pose(cm, q_test, true)[:, :3, 3], atol=1e-9)


def test_axis_file_that_moves_two_joints_at_once_is_refused(tmp_path, capsys, good_rows):
    write_csv(tmp_path / "axes.csv", good_rows)
    write_csv(tmp_path / "meas.csv", good_rows)
    code = main(["calibrate", "identify", str(tmp_path / "meas.csv"), "--model", "generic6", "--axes",
                 str(tmp_path / "axes.csv"), "-o", str(tmp_path / "o")])
    assert code == 2 and "pose 0 moves more than one joint" in capsys.readouterr().err


def test_rotation_vector_columns_are_read_as_orientations(tmp_path):
    R = Rotation.from_rotvec([[0.1, -0.2, 0.3], [0.0, 0.0, 0.0]])
    write_csv(tmp_path / "m.csv", np.hstack([np.zeros((2, 6)), np.ones((2, 3)), R.as_rotvec()]))
    m = read_measurements(tmp_path / "m.csv", 6)
    np.testing.assert_allclose(m.orientations, R.as_matrix(), atol=1e-15)
    np.testing.assert_array_equal(m.lines, [1, 2])


def test_plan_from_the_seeds_per_joint_product(tmp_path, capsys):
    assert main(["calibrate", "plan", "--model", "generic6", "--tool", *map(str, TOOL), "--count", "30",
                 "--per-joint", "3", "-o", str(tmp_path / "p.csv")]) == 0
    q = read_poses(tmp_path / "p.csv", 6)
    grid = [set(np.round(v, 12)) for v in read_grid()]
    assert all(set(np.round(q[:, j], 12)) <= grid[j] for j in range(6))
    assert "cond(J)" in capsys.readouterr().out


def read_grid():
    from ident.calibration.planning import axis_angles
    m = load_model("generic6")
    return [axis_angles(3, m.q_min[j], m.q_max[j]) for j in range(6)]


@pytest.fixture(scope="module")
def good_rows():
    cm = from_model(load_model("generic6"), TOOL)
    q = random_configurations(cm, 30, seed=6)
    return np.hstack([q, tool_pose(cm, q, true_values(cm))[:, :3, 3]])


def _fails(tmp_path, capsys, rows, args=(), text=None):
    meas = tmp_path / "bad.csv"
    if text is not None:
        meas.write_text(text)
    else:
        write_csv(meas, rows)
    code = main(["calibrate", "identify", str(meas), "--model", "generic6", "--tool", *map(str, TOOL),
                 "-o", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    return err


def test_wrong_column_count_names_the_line(tmp_path, capsys, good_rows):
    err = _fails(tmp_path, capsys, good_rows[:, :8])
    assert "bad.csv: line 1: expected 9 or 12 or 13 columns" in err
    lines = "\n".join(",".join(map(str, r)) for r in good_rows[:5]) + "\n1,2,3\n"
    assert "line 6: expected 9 columns like line 1, got 3" in _fails(tmp_path, capsys, None, text=lines)


def test_nan_and_text_cells_name_line_and_column(tmp_path, capsys, good_rows):
    rows = good_rows.astype(object)
    rows[3, 7] = "nan"
    assert "line 4, column 8: not finite" in _fails(tmp_path, capsys, rows)
    rows[3, 7] = "12,5x"
    assert "not a number" in _fails(tmp_path, capsys, rows)


@pytest.mark.parametrize("row, column, value, expected", [
    (3, 7, "1e300", "line 4, column 8 (y): 1e300 is out of range"),      # finite, but no coordinate of an arm
    (0, 2, "-1e4", "line 1, column 3 (q3): -1e4 is out of range"),
])
def test_a_value_no_arm_measures_is_refused_naming_line_and_column(tmp_path, capsys, good_rows, row, column, value,
                                                                   expected):
    rows = good_rows.astype(object)
    rows[row, column] = value
    assert expected in _fails(tmp_path, capsys, rows)
    write_csv(tmp_path / "m.csv", rows)
    with pytest.raises(InputError, match=re.escape(expected)):
        read_measurements(tmp_path / "m.csv", 6)


def test_fewer_poses_than_parameters(tmp_path, capsys, good_rows):
    assert "9 poses give 27 equations for 27 parameters" in _fails(tmp_path, capsys, good_rows[:9])


def test_rank_deficient_plan_names_the_unidentifiable_parameters(tmp_path, capsys, good_rows):
    rows = good_rows.copy()
    rows[:, 5] = 0.3           # joint 6 never moves
    cm = from_model(load_model("generic6"), TOOL)
    rows[:, 6:] = tool_pose(cm, rows[:, :6])[:, :3, 3]
    err = _fails(tmp_path, capsys, rows)
    assert "not identifiable from them" in err and "Rz(q6)" in err


def test_bad_quaternion_and_missing_file(tmp_path, capsys, good_rows):
    rows = np.hstack([good_rows, np.tile([0.0, 0.0, 0.0, 2.0], (len(good_rows), 1))])
    assert "quaternion qx qy qz qw has norm 2" in _fails(tmp_path, capsys, rows)
    code = main(["calibrate", "identify", str(tmp_path / "none.csv"), "--model", "generic6", "-o", str(tmp_path)])
    assert code == 2 and "cannot read" in capsys.readouterr().err


def test_plan_refuses_too_few_poses(tmp_path, capsys):
    code = main(["calibrate", "plan", "--model", "generic6", "--count", "5", "-o", str(tmp_path / "p.csv")])
    assert code == 2 and "--count 5" in capsys.readouterr().err
