"""`armid identify` says every automatic choice and why (ident.fit.choices), on a log degraded as real ones are
(tests/degraded.py: uneven time stamps, stale repeats, lost samples, a stall, noise), and names the joint whose
validation error stands out with its likely cause (ident.fit.checks.outlier_joint_warnings)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from degraded import degraded_log
from ident.fit import excitation
from ident.fit.batch import identify
from ident.fit.checks import outlier_joint_warnings
from ident.fit.preprocess import Recording
from ident.model import load_model


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def test_every_automatic_choice_is_printed_with_its_reason_on_a_degraded_log(model, capsys):
    log = degraded_log(model, excitation.preset("seed000"), 0)
    result = identify(model, Recording(log.t, log.q, log.tau, None, None, "log.csv"), verbose=True)
    printed = [line.strip()[len("choice: "):] for line in capsys.readouterr().err.splitlines()
               if line.strip().startswith("choice: ")]
    assert printed == result.choices
    by_name = {line.split(":")[0]: line for line in printed}
    assert list(by_name) == ["resampling", "cut-off", "decimation", "slow rows", "effort delay", "covariance"]
    assert f"{log.repeats} stale repeats dropped" in by_name["resampling"] and "uneven or repeated" in by_name["resampling"]
    assert "estimated from the positions' spectrum" in by_name["cut-off"]
    assert f"decimation: {result.rows.factor} to" in by_name["decimation"]
    assert "below 0.2 rad/s" in by_name["slow rows"] and by_name["slow rows"].count("%") == model.n
    assert "effort delay: 0 ms" in by_name["effort delay"]
    assert by_name["covariance"].startswith("covariance: correlated")


def test_a_joint_whose_validation_error_stands_out_is_named_with_its_cause(model):
    traj = excitation.preset("seed000")
    log = degraded_log(model, traj, 0, jitter=0.0, repeat_share=0.0, drop_share=0.0, stall_s=0.0)
    other = degraded_log(model, traj, 1, jitter=0.0, repeat_share=0.0, drop_share=0.0, stall_s=0.0)
    tau = other.tau.copy()
    tau[:, 3] *= 1.5                                  # joint 4 read with a torque constant 50 % off
    result = identify(model, Recording(log.t, log.q, log.tau, None, None, "run"), trajectory=traj,
                      validate=dataclasses.replace(Recording(other.t, other.q, tau, None, None, "validation")))
    named = [w for w in result.warnings if "validation error" in w and "median" in w]
    assert len(named) == 1 and named[0].startswith(f"{model.joint_names[3]}:"), result.warnings
    assert "fits its own rows but not the validation motion" in named[0]


def test_the_cause_follows_the_rows_used_and_the_fit_residual():
    v = np.array([0.02, 0.03, 0.02, 0.25, 0.03, 0.02])
    fine = np.full(6, 0.02)
    assert outlier_joint_warnings(np.full(6, 0.03), np.ones(6), fine) == []
    sparse = outlier_joint_warnings(v, np.array([1, 1, 1, 0.3, 1, 1.0]), fine)
    assert len(sparse) == 1 and sparse[0].startswith("joint 4:") and "only 30 % of its rows" in sparse[0]
    misfit = outlier_joint_warnings(v, np.ones(6), np.array([0.02, 0.02, 0.02, 0.2, 0.02, 0.02]))
    assert "its own rows fit as badly" in misfit[0]
