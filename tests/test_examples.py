"""The runnable examples in docs/examples run as a user runs them: each as its own process with the installed
package, from an empty temporary folder, and prints the result it promises (an identity that holds, an
estimate within its uncertainty of the truth it was simulated from)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
TIMEOUT_S = 600          # s: a fresh install compiles the numba kernels on the first run (minutes on 2 cores)


def run_example(name: str, tmp_path: Path, *args: str) -> str:
    """Run docs/examples/NAME in tmp_path; its stdout (the test fails on a non-zero exit, with its stderr)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(EXAMPLES / name), *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=TIMEOUT_S, env=env)
    assert out.returncode == 0, f"{name} exited with {out.returncode}:\n{out.stderr[-3000:]}"
    return out.stdout


def numbers(pattern: str, text: str) -> list[float]:
    """The numbers the groups of pattern captured, as floats (the test fails when pattern is not printed)."""
    found = re.search(pattern, text)
    assert found, f"{pattern!r} not in the output:\n{text}"
    return [float(g) for g in found.groups()]


def test_every_example_has_a_header_saying_what_it_shows_and_how_to_run_it():
    for path in sorted(EXAMPLES.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert text.startswith('"""') and "usage: python" in text.split('"""')[1], path.name
        assert len(text.splitlines()) <= 50, f"{path.name}: an example is short"


def test_rnea_regressor_example_prints_identities_that_hold_to_round_off(tmp_path):
    out = run_example("rnea_regressor.py", tmp_path)
    (tau_max,) = numbers(r"of max \|tau\| ([\d.]+) N m", out)
    assert tau_max > 1.0                                                # the motion loads the joints
    residuals = [float(x) for x in re.findall(r"= ([\d.e+-]+) (?:N m|rad/s\^2)", out)]
    assert len(residuals) == 4, out
    assert max(residuals) < 1e-10 * max(tau_max, 1.0), out


def test_design_excitation_example_improves_the_condition_number_and_saves_a_trajectory_within_limits(tmp_path):
    from ident.fit import excitation
    from ident.model import load_model

    out = run_example("design_excitation.py", tmp_path, "designed.toml")
    start, designed = numbers(r"condition number: ([\d.]+) at the random start, ([\d.]+) designed", out)
    assert designed < start
    assert "starts at rest: True" in out and "reloads the same: True" in out
    traj = excitation.load(tmp_path / "designed.toml")                # the file is there and is what it says
    excitation.check(load_model("generic6"), traj, rate_hz=1000.0)
    assert excitation.at_rest(traj)


def test_identify_example_finds_every_base_parameter_within_3_sigma_of_the_simulated_truth(tmp_path):
    from ident.model.base_params import base_parameters
    from ident.model import load_model

    out = run_example("identify_simulated.py", tmp_path)
    within, count = numbers(r"(\d+) of (\d+) base parameters within 3 sigma of the truth", out)
    assert count == base_parameters(load_model("generic6")).count
    assert within == count
    rms = numbers(r"residual RMS per joint: " + " ".join([r"([\d.]+)"] * 6), out)
    (noise,) = numbers(r"\(noise ([\d.]+) N m\)", out)
    assert 0 < max(rms) < noise                                         # filtered rows: below the raw noise


def test_payload_example_finds_mass_and_centre_of_mass_within_3_sigma(tmp_path):
    out = run_example("identify_payload.py", tmp_path)
    mass, sigma, true = numbers(r"mass ([\d.]+) \+- ([\d.]+) kg \(true ([\d.]+)\)", out)
    assert sigma > 0 and abs(mass - true) < 3 * sigma
    assert "within 3 sigma of the truth: True; a body that can exist: True" in out
    assert "'cmd': 'set_payload'" in out


def test_calibration_example_recovers_the_geometric_errors_within_3_sigma(tmp_path):
    out = run_example("calibrate.py", tmp_path)
    before, after = numbers(r"RMS position error ([\d.]+) mm with the nominal model, ([\d.]+) mm calibrated", out)
    assert after < before / 10
    (terms,) = numbers(r"(\d+) identifiable terms", out)
    within, count = numbers(r"(\d+) of (\d+) within 3 sigma", out)
    assert within == count == terms


def test_client_example_moves_the_simulated_arm_to_its_target_and_is_refused_beyond_the_limits(tmp_path):
    out = run_example("client_move.py", tmp_path)
    assert "enabled: True" in out and "samples in order: True" in out
    (error,) = numbers(r"largest error from the target: ([\d.]+) rad", out)
    assert error < 2e-3
    assert "refused: CommandRefused" in out


def test_read_recording_example_converts_the_drivers_recording_without_losing_a_sample(tmp_path):
    from ident.fit.preprocess import load_recording

    out = run_example("read_recording.py", tmp_path)
    messages, n = numbers(r"run.mcap: (\d+) messages of (\d+) joints", out)
    assert n == 6 and "complete: True, 0 missing in 0 gaps" in out
    samples, _ = numbers(r"run.csv: (\d+) samples over ([\d.]+) s", out)
    assert 0 < samples <= messages
    (first, last) = numbers(r"joint 1 from ([-\d.]+) to ([-\d.]+) rad", out)
    assert abs(first) < 2e-3 and abs(last - 0.3) < 2e-3                 # from rest at 0 to the move's goal
    assert "same positions: True" in out
    rec = load_recording(tmp_path / "run.csv", n=6)                   # the file the example wrote
    assert len(rec.t) == samples
    np.testing.assert_allclose(rec.q[-1], [0.3, 0, 0, 0, 0, 0], atol=2e-3)
