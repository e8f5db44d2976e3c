"""ident.fit.excitation and `armid excite`: the seed-000 preset, Fourier series, optimal design, limits, files."""
from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from armid.cli import main as armid_main
from ident.model import dynamics
from ident.fit import excitation
from ident.model.base_params import base_parameters
from firmware_bridge.runtime.errors import InputError
from ident.fit.excitation import FourierTrajectory, TrajectoryFileError
from ident.model.limits import LimitError
from ident.model import load_model
from design_gradients import assert_design_gradients_exact  # noqa: E402  (tests/ is on sys.path)

SEED_TEXT = Path("/work/shared/seeds/000_0aec04ad16a5fa9c.txt")

# Seed 000 (Zhang, Qin, Zou 2017), Table 1, as printed: per joint q0, a1 b1 a2 b2 a3 b3 | a4 b4 a5 b5 a6 b6.
TABLE_1 = """
1 -0.001  0.092 -1.071  0.062  0.096 -0.273  0.839 |  0.011 -0.050  0.411 -0.290  0.326 -0.064
2 -1.504 -0.027 -0.383 -0.051 -0.222  0.387 -0.931 | -0.375 -0.572 -0.434  0.577  0.461  0.811
3 -1.303 -0.026  0.795 -0.122 -0.429  0.246  0.598 | -0.096  0.838 -0.236 -0.320  0.076 -0.498
4 -0.231 -0.250 -0.661  0.111  0.183  0.492 -1.501 | -0.514 -0.179  0.107  0.919  0.838  0.138
5 -0.136 -0.173  0.616 -0.129  0.873  0.430 -0.678 | -0.133  0.017  0.239 -0.895 -0.328  0.848
6 -0.300 -0.667 -0.916 -0.044  0.132 -1.158 -0.898 | -0.467 -0.682 -0.234 -1.190 -0.351  0.245
"""


def table_1() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.array([[float(v) for v in line.replace("|", " ").split()[1:]] for line in TABLE_1.strip().splitlines()])
    pairs = rows[:, 1:].reshape(6, 6, 2)
    return rows[:, 0], pairs[:, :, 0], pairs[:, :, 1]


def eq14(traj: FourierTrajectory, t: np.ndarray):
    """Seed 000 eq. 14 term by term, independently of the library's basis matrices."""
    wf = 2 * math.pi * traj.base_frequency
    q = np.tile(traj.q0, (len(t), 1))
    qd = np.zeros_like(q)
    qdd = np.zeros_like(q)
    for i in range(traj.n):
        for l in range(1, traj.harmonics + 1):
            a, b = traj.a[i, l - 1], traj.b[i, l - 1]
            q[:, i] += a / (wf * l) * np.sin(wf * l * t) - b / (wf * l) * np.cos(wf * l * t)
            qd[:, i] += a * np.cos(wf * l * t) + b * np.sin(wf * l * t)
            qdd[:, i] += -a * wf * l * np.sin(wf * l * t) + b * wf * l * np.cos(wf * l * t)
    return q, qd, qdd


@pytest.fixture(scope="module")
def generic6():
    return load_model("generic6")


@pytest.fixture(scope="module")
def arm3(tmp_path_factory):
    """The first three joints of generic6 (a small arm keeps the design tests fast)."""
    text = (resources.files("ident") / "models" / "generic6.toml").read_text()
    blocks = text.split("[[joint]]")
    path = tmp_path_factory.mktemp("arm3") / "arm3.toml"
    path.write_text(blocks[0].replace('name = "generic6"', 'name = "arm3"') + "[[joint]]" + "[[joint]]".join(blocks[1:4]))
    return load_model(path)


@pytest.fixture(scope="module")
def designed(arm3):
    base = base_parameters(arm3)
    traj = excitation.design(arm3, harmonics=3, base_frequency=0.2, seed=7, max_iter=25, grid=40,
                             start_pose=[0.3, -0.5, 0.8], base=base)
    return traj, base


# ---------------------------------------------------------------------------------------------------
# The seed-000 preset

def test_preset_holds_table_1_of_seed_000_exactly():
    q0, a, b = table_1()
    traj = excitation.preset("seed000")
    assert (traj.n, traj.harmonics) == (6, 6)
    np.testing.assert_array_equal(traj.q0, q0)
    np.testing.assert_array_equal(traj.a, a)
    np.testing.assert_array_equal(traj.b, b)


@pytest.mark.skipif(not SEED_TEXT.exists(), reason="the seed papers are not in this checkout")
def test_table_1_transcription_matches_the_paper_text():
    """The second OCR copy in the seed file prints Table 1 as '- 0. 001' etc.; its 78 numbers in order."""
    line = SEED_TEXT.read_text().splitlines()[7]
    body = line[line.index("Table 1 Optimized excitation trajectory parameters"):line.index("数的角频率")]
    numbers = [float(m.replace(" ", "")) for m in re.findall(r"-?\s?\d\.\s?\d{3}", body)]
    q0, a, b = table_1()
    first = np.column_stack([q0, np.stack([a[:, :3], b[:, :3]], axis=2).reshape(6, 6)])
    second = np.stack([a[:, 3:], b[:, 3:]], axis=2).reshape(6, 6)
    assert numbers == first.ravel().tolist() + second.ravel().tolist()


def test_preset_reproduces_its_trajectory_by_eq_14():
    traj = excitation.preset("seed000")
    t = np.linspace(0, traj.period, 997)
    for mine, theirs in zip(traj.evaluate(t), eq14(traj, t)):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)


def test_velocity_and_acceleration_are_the_exact_derivatives_of_the_position():
    traj = excitation.preset("seed000")
    t = np.linspace(0.3, 9.7, 41)
    h = 1e-5
    q_p, qd_p, _ = traj.evaluate(t + h)
    q_m, qd_m, _ = traj.evaluate(t - h)
    _, qd, qdd = traj.evaluate(t)
    np.testing.assert_allclose((q_p - q_m) / (2 * h), qd, atol=1e-8)
    np.testing.assert_allclose((qd_p - qd_m) / (2 * h), qdd, atol=1e-7)


def test_preset_is_periodic_and_not_at_rest_as_the_paper_notes():
    traj = excitation.preset("seed000")
    start, end = traj.evaluate([0.0]), traj.evaluate([traj.period])
    for x0, x1 in zip(start, end):
        np.testing.assert_allclose(x0, x1, atol=1e-12)
    np.testing.assert_allclose(start[1][0], traj.a.sum(axis=1), atol=1e-12)   # qd(0) = sum_l a_l, not 0
    assert not excitation.at_rest(traj)
    assert excitation.excitation_bandwidth(traj) == pytest.approx(0.6)


def test_preset_base_frequency_is_the_only_one_of_three_that_keeps_generic6_limits(generic6):
    preset = excitation.preset("seed000")
    assert preset.base_frequency == 0.1
    excitation.check(generic6, preset)
    slow, fast = (FourierTrajectory(f0, preset.q0, preset.a, preset.b) for f0 in (0.05, 0.2))
    with pytest.raises(LimitError, match="joint j3: position"):
        excitation.check(generic6, slow)
    with pytest.raises(LimitError, match="joint j2: acceleration"):
        excitation.check(generic6, fast)


# ---------------------------------------------------------------------------------------------------
# Optimal design

def test_designed_trajectory_starts_and_ends_at_rest_at_the_pose(designed):
    traj, _ = designed
    q, qd, qdd = traj.evaluate([0.0, traj.period])
    np.testing.assert_allclose(q, [[0.3, -0.5, 0.8]] * 2, atol=1e-12)
    np.testing.assert_allclose(qd, 0, atol=1e-12)
    np.testing.assert_allclose(qdd, 0, atol=1e-12)
    assert excitation.at_rest(traj)


def test_designed_trajectory_keeps_every_limit(designed, arm3):
    traj, _ = designed
    excitation.check(arm3, traj, rate_hz=1000.0)
    # independently of check(): sampled at 2 kHz, every quantity within its bound
    _, q, qd, qdd = traj.sample(2000.0)
    tau = dynamics.rnea(arm3, q, qd, qdd)
    assert np.all(q >= arm3.q_min) and np.all(q <= arm3.q_max)
    assert np.all(np.abs(qd) <= arm3.qd_max) and np.all(np.abs(qdd) <= arm3.qdd_max)
    assert np.all(np.abs(tau) <= arm3.tau_max)


def test_design_lowers_cond_well_below_the_random_feasible_start(designed, arm3):
    traj, base = designed
    W = excitation.stacked_base_regressor(arm3, base, traj)
    cond = np.linalg.cond(W)                                # SVD, independent of criteria()
    assert traj.info["cond"] == pytest.approx(cond, rel=1e-6)
    assert cond < 0.5 * traj.info["start_cond"]
    assert traj.info["logdet"] == pytest.approx(np.linalg.slogdet(W.T @ W)[1], rel=1e-9)


def test_same_seed_gives_the_same_trajectory_and_another_seed_another(designed, arm3):
    traj, base = designed
    again = excitation.design(arm3, harmonics=3, base_frequency=0.2, seed=7, max_iter=25, grid=40,
                              start_pose=[0.3, -0.5, 0.8], base=base)
    np.testing.assert_array_equal(again.a, traj.a)
    np.testing.assert_array_equal(again.b, traj.b)
    np.testing.assert_array_equal(again.q0, traj.q0)
    other = excitation.design(arm3, harmonics=3, base_frequency=0.2, seed=8, max_iter=2, grid=40,
                              start_pose=[0.3, -0.5, 0.8], base=base)
    assert not np.allclose(other.a, traj.a)


def test_logdet_design_raises_log_det_and_floor_keeps_the_flange_up(arm3):
    base = base_parameters(arm3)
    floor = -0.05
    traj = excitation.design(arm3, harmonics=3, base_frequency=0.2, seed=1, max_iter=15, grid=40,
                             criterion="logdet", floor_z=floor, base=base)
    assert traj.info["logdet"] > traj.info["start_logdet"] + 1.0
    _, q, _, _ = traj.sample(500.0)
    assert dynamics.flange_pose(arm3, q)[:, 2, 3].min() >= floor


@pytest.mark.parametrize("criterion", ["cond", "logdet"])
def test_design_gradients_are_exact(arm3, criterion):
    """The objective's and constraints' gradients (chain rule through the Fourier basis) against finite
    differences, on a grid that avoids the rest samples (where sign(qd) of Coulomb friction jumps).

    The oracle is tests/design_gradients.py's fourth-order central difference."""
    p = excitation._Problem(arm3, base_parameters(arm3), 0.2, 3, np.zeros(3), criterion, -0.2, 24)
    assert_design_gradients_exact(p)


@pytest.mark.parametrize("kwargs, expected", [
    ({"criterion": "trace"}, "criterion"),
    ({"harmonics": 1}, "harmonics"),
    ({"base_frequency": -1.0}, "base_frequency"),
    ({"start_pose": [0.0, 0.0]}, "start_pose"),
    ({"start_pose": [0.0, 0.0, 9.0]}, "joint j3: position 9 rad outside the limit 3.05 rad at t = 0.0000 s"),
])
def test_impossible_design_settings_are_refused(arm3, kwargs, expected):
    with pytest.raises(InputError, match=re.escape(expected)):
        excitation.design(arm3, max_iter=1, grid=8, **kwargs)


# ---------------------------------------------------------------------------------------------------
# Limit checks

def _single(n: int, joint: int, f0: float, q0=0.0, a=0.0, b=0.0) -> FourierTrajectory:
    """One harmonic on one joint; the others at rest at 0."""
    A, B, Q0 = np.zeros((n, 1)), np.zeros((n, 1)), np.zeros(n)
    A[joint, 0], B[joint, 0], Q0[joint] = a, b, q0
    return FourierTrajectory(f0, Q0, A, B, ())


def test_a_velocity_violation_names_the_joint_the_quantity_and_the_first_time(arm3):
    f0, limit = 0.25, arm3.qd_max[1]
    b = 1.1 * limit                                           # qd_2 = b sin(w t): over the limit near T/4
    traj = _single(3, 1, f0, b=b)
    t = np.arange(int(1000 / f0) + 1) / 1000.0
    first = t[np.flatnonzero(np.abs(b * np.sin(2 * np.pi * f0 * t)) > limit)[0]]
    with pytest.raises(LimitError) as info:
        excitation.check(arm3, traj)
    err = info.value
    assert (err.joint, err.quantity, err.time) == ("joint j2", "velocity", pytest.approx(first, abs=1e-12))
    assert str(err).startswith(f"joint j2: velocity {b * math.sin(2 * math.pi * f0 * first):.4g} rad/s outside the "
                               f"limit {limit:.4g} rad/s at t = {first:.4f} s")


@pytest.mark.parametrize("make, quantity, joint", [
    (lambda m: _single(3, 2, 0.1, q0=3.2), "position", "joint j3"),
    (lambda m: _single(3, 0, 2.0, a=1.2 * m.qdd_max[0] / (2 * math.pi * 2.0)), "acceleration", "joint j1"),
])
def test_position_and_acceleration_violations_are_named(arm3, make, quantity, joint):
    with pytest.raises(LimitError) as info:
        excitation.check(arm3, make(arm3))
    assert (info.value.joint, info.value.quantity) == (joint, quantity)


def test_a_torque_violation_and_a_floor_violation_are_named(arm3):
    weak = dataclasses.replace(arm3, tau_max=np.array([80.0, 5.0, 60.0]))   # j2 cannot hold the arm up
    held = _single(3, 1, 0.1, q0=1.0)                                         # standing still, tilted 1 rad
    gravity = dynamics.rnea(arm3, [0, 1.0, 0], np.zeros(3), np.zeros(3))[1]
    assert abs(gravity) > 5.0
    with pytest.raises(LimitError, match=rf"^joint j2: torque {gravity:.4g} N m outside the limit -?5 N m at t = 0.0000 s"):
        excitation.check(weak, held)
    height = dynamics.flange_pose(arm3, [0, 1.0, 0])[2, 3]
    with pytest.raises(LimitError, match=rf"^flange: height {height:.4g} m is below the floor plane z = "
                                         rf"{height + 0.01:.4g} m at t = 0.0000 s"):
        excitation.check(arm3, held, floor_z=height + 0.01)
    with pytest.raises(InputError, match="trajectory has 6 joints, model arm3 has 3"):
        excitation.check(arm3, excitation.preset("seed000"))


# ---------------------------------------------------------------------------------------------------
# Trajectory files

def test_file_round_trip_keeps_coefficients_and_provenance(designed, tmp_path):
    traj, _ = designed
    path = tmp_path / "traj.toml"
    excitation.save(traj, path)
    back = excitation.load(path)
    assert back.base_frequency == traj.base_frequency and back.joint_names == ("j1", "j2", "j3")
    for x, y in ((back.q0, traj.q0), (back.a, traj.a), (back.b, traj.b)):
        np.testing.assert_array_equal(x, y)
    assert back.info["seed"] == 7 and back.info["criterion"] == "cond" and back.info["cond"] == traj.info["cond"]
    for x, y in zip(back.sample(200.0), traj.sample(200.0)):
        np.testing.assert_array_equal(x, y)


GOOD = """[trajectory]
kind = "fourier"
base_frequency = 0.2
harmonics = 2
period = 5.0

[[joint]]
name = "j1"
q0 = 0.1
a = [0.1, -0.2]
b = [0.0, 0.3]

[[joint]]
name = "j2"
q0 = -0.1
a = [0.05, 0.0]
b = [0.2, -0.1]
"""


@pytest.mark.parametrize("old, new, field", [
    ('kind = "fourier"', 'kind = "spline"', 'trajectory.kind: expected "fourier", got \'spline\''),
    ("base_frequency = 0.2", "base_frequency = -0.2", "trajectory.base_frequency: expected a number of Hz in (0, 100]"),
    ("base_frequency = 0.2", "base_frequency = 1e308", "trajectory.base_frequency: expected a number of Hz in (0, 100]"),
    ("base_frequency = 0.2", 'base_frequency = "0.2"', "trajectory.base_frequency"),
    ("base_frequency = 0.2", "base_frequency = true", "trajectory.base_frequency"),
    ("base_frequency = 0.2\n", "", "trajectory.base_frequency"),
    ("harmonics = 2", "harmonics = 3", "trajectory.harmonics: expected 2"),
    ("period = 5.0", "period = 10.0", "trajectory.period: expected 1 / base_frequency"),
    ("q0 = 0.1", 'q0 = "0.1"', "joint[1].q0: expected a finite number in rad"),
    ("q0 = 0.1", "q0 = nan", "joint[1].q0: expected a finite number"),
    ("q0 = -0.1\n", "", "joint[2].q0: expected a value (missing)"),
    ("a = [0.05, 0.0]", "a = [0.05]", "joint[2].a: expected 2 coefficients"),
    ("b = [0.0, 0.3]", "b = [0.0, 0.3, 0.1]", "joint[1].b: expected 2 coefficients"),
    ("a = [0.1, -0.2]", 'a = [0.1, "x"]', "joint[1].a: expected a non-empty list of finite numbers"),
    ("a = [0.1, -0.2]", "a = [0.1, inf]", "joint[1].a: expected a non-empty list of finite numbers"),
    ('name = "j2"', 'name = "j1"', "joint[2].name: expected a non-empty name, unique"),
    ('name = "j2"', 'name = "j2"\nbb = 1', "joint[2].bb: expected only the fields name, q0, a, b"),
    ("[trajectory]", "[trajectori]", "trajectori: expected only the tables"),
    ("base_frequency = 0.2", "base_frequency = 0.2 0.3", "not valid TOML"),
])
def test_every_broken_trajectory_file_names_the_file_and_the_field(tmp_path, old, new, field):
    path = tmp_path / "bad.toml"
    assert old in GOOD
    path.write_text(GOOD.replace(old, new, 1))
    with pytest.raises(TrajectoryFileError) as info:
        excitation.load(path)
    assert str(info.value).startswith(f"{path}: ") and field in str(info.value), str(info.value)


def test_a_good_hand_written_file_loads(tmp_path):
    path = tmp_path / "good.toml"
    path.write_text(GOOD)
    traj = excitation.load(path)
    assert (traj.n, traj.harmonics, traj.period) == (2, 2, 5.0)
    np.testing.assert_array_equal(traj.b, [[0.0, 0.3], [0.2, -0.1]])
    with pytest.raises(TrajectoryFileError, match="no such preset; shipped: seed000"):
        excitation.preset("seed001")
    with pytest.raises(TrajectoryFileError, match="cannot read"):
        excitation.load(tmp_path / "missing.toml")


# ---------------------------------------------------------------------------------------------------
# armid excite

def test_cli_design_check_and_sample(arm3, tmp_path, capsys):
    out = tmp_path / "t.toml"
    model = arm3.source
    assert armid_main(["excite", "design", "--model", model, "--harmonics", "2", "--base-frequency", "0.25",
                       "--seed", "3", "--max-iter", "5", "--grid", "24", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    traj = excitation.load(out)
    assert f"cond {traj.info['cond']:.1f}" in text and f"cond {traj.info['start_cond']:.1f}" in text
    assert "preset seed000" not in text                     # 6 joints: it does not apply to a 3-joint arm
    assert armid_main(["excite", "check", str(out), "--model", model]) == 0
    assert "keeps every limit of arm3" in capsys.readouterr().out
    assert armid_main(["excite", "check", "seed00", "--model", model]) == 2
    assert capsys.readouterr().err == "armid: seed00: neither a trajectory file nor a shipped preset (seed000)\n"
    csv = tmp_path / "t.csv"
    assert armid_main(["excite", "sample", str(out), "--rate", "50", "-o", str(csv)]) == 0
    data = np.loadtxt(csv, delimiter=",", skiprows=1)
    header = csv.read_text().splitlines()[0].split(",")
    assert header == ["t", "q1", "q2", "q3", "qd1", "qd2", "qd3", "qdd1", "qdd2", "qdd3"]
    assert data.shape == (201, 10)
    q, qd, qdd = traj.evaluate(data[:, 0])
    np.testing.assert_allclose(data[:, 1:], np.hstack([q, qd, qdd]), rtol=1e-9, atol=1e-9)


def test_cli_design_prints_the_preset_cond_next_to_the_optimum(generic6, tmp_path, capsys):
    out = tmp_path / "g6.toml"
    assert armid_main(["excite", "design", "--model", "generic6", "--harmonics", "2", "--max-iter", "3",
                       "--grid", "16", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    preset_cond = np.linalg.cond(excitation.stacked_base_regressor(generic6, base_parameters(generic6),
                                                                   excitation.preset("seed000")))
    assert f"preset seed000 (Zhang, Qin, Zou 2017, Table 1, 6 harmonics of 0.1 Hz) on generic6: cond {preset_cond:.1f}" in text
    assert "it keeps the limits" in text


def test_cli_check_rejects_a_violating_file_in_one_line(tmp_path):
    path = tmp_path / "fast.toml"
    path.write_text(GOOD.replace("base_frequency = 0.2", "base_frequency = 20.0").replace("period = 5.0", "period = 0.05"))
    model = tmp_path / "m.toml"
    text = (resources.files("ident") / "models" / "generic6.toml").read_text()
    blocks = text.split("[[joint]]")
    model.write_text(blocks[0] + "[[joint]]" + "[[joint]]".join(blocks[1:3]))
    run = subprocess.run([sys.executable, "-m", "armid.cli", "excite", "check", str(path), "--model", str(model)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert re.fullmatch(r"armid: joint j\d: acceleration \S+ rad/s\^2 outside the limit \S+ rad/s\^2 at t = "
                        r"\d\.\d{4} s\n", run.stderr), run.stderr


@pytest.mark.parametrize("f0, rate, periods, expected", [
    (1e-9, 1000.0, 1.0, "1e+12 samples; expected at most 1000000 (a base frequency of at least 0.001 Hz"),
    (0.1, 1000.0, 1e9, "fewer periods or a lower rate"),
    (0.1, float("inf"), 1.0, "rate: expected a positive number, got inf"),
    (0.1, 0.0, 1.0, "rate: expected a positive number"),
    (0.1, 1000.0, float("nan"), "periods: expected a positive number"),
])
def test_a_sampling_too_large_to_allocate_is_refused_before_allocating(f0, rate, periods, expected):
    with pytest.raises(InputError, match=re.escape(expected)):
        excitation.sample_count(f0, rate, periods)
    assert excitation.sample_count(0.1, 1000.0) == 10001


def test_a_file_whose_period_is_too_long_to_sample_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "slow.toml"
    preset = excitation.preset("seed000")
    excitation.save(dataclasses.replace(preset, base_frequency=1e-9, info={}), path)
    traj = excitation.load(path)
    with pytest.raises(InputError, match=re.escape(f"{path}: trajectory.base_frequency: 1e-09 Hz")):
        traj.sample(1000.0)
    with pytest.raises(InputError, match="base_frequency"):
        excitation.design(load_model("generic6"), base_frequency=1e-9)
