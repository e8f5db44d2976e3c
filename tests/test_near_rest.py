"""The friction near rest (ident.fit.near_rest): a Stribeck excess recovered from the residual of the samples
the fit leaves out, nothing where there is none, and the identification's result carrying it."""
from __future__ import annotations

import numpy as np

from ident.fit.near_rest import MIN_SPEED_RATIO, SMOOTHING, near_rest_friction

SLOW = 0.2


def velocities(n_samples, n, seed):
    """Velocities through reversals: sines of 1 rad/s amplitude, so that some samples fall in every band."""
    t = np.linspace(0.0, 30.0, n_samples)
    return np.column_stack([np.sin(2 * np.pi * (0.2 + 0.05 * j) * t + j) for j in range(n)])


def test_a_stribeck_excess_is_recovered_with_its_velocity():
    qd = velocities(30000, 3, 0)
    fs, vs = np.array([0.6, 0.1, 0.25]), np.array([0.05, 0.03, 0.08])
    noise = 0.01
    e = fs * np.exp(-(qd / vs) ** 2) * np.sign(qd) + np.random.default_rng(1).normal(0.0, noise, qd.shape)
    got_fs, got_vs = near_rest_friction(qd, e, SLOW)
    # some thousand samples in the band: the excess to about noise / sqrt(samples) ~ 3e-4 N m, the velocity to
    # the grid's step (geometric, 40 points over a factor 40: 10 %)
    np.testing.assert_allclose(got_fs, fs, rtol=0.1)
    np.testing.assert_allclose(got_vs, vs, rtol=0.1)


def test_no_excess_where_the_residual_has_none():
    qd = velocities(30000, 2, 2)
    rng = np.random.default_rng(3)
    e = rng.normal(0.0, 0.02, qd.shape)
    e[:, 1] -= 0.1 * np.exp(-(qd[:, 1] / 0.05) ** 2) * np.sign(qd[:, 1])    # less friction near rest: not an excess
    fs, vs = near_rest_friction(qd, e, SLOW)
    assert np.all(fs == 0.0) and np.all(vs > 0)


def test_too_few_samples_near_rest_give_no_excess():
    qd = np.full((1000, 2), 1.0)                 # always fast: nothing in the band
    qd[:10] = 0.05
    fs, _ = near_rest_friction(qd, np.ones_like(qd), SLOW)
    assert np.all(fs == 0.0)
    # the band starts above the observer's tanh width: samples slower than that are not read
    qd = np.full((1000, 1), 0.5 * MIN_SPEED_RATIO * SMOOTHING)
    fs, _ = near_rest_friction(qd, np.ones_like(qd), SLOW)
    assert fs[0] == 0.0


def test_the_identification_finds_the_simulated_arms_stribeck_excess(tmp_path):
    """The simulated arm's friction near rest (0.25 fc over 0.05 rad/s, sim/plant.py) from 10 s of seed000: the
    identification's near_rest and result.json's fit.near_rest_friction. The bias left: the rigid-body errors of a
    short fit that correlate with sign(qd) in the band, some percent of the excess (measured 5-15 % at 20 s)."""
    from ident.fit import excitation
    from ident.fit.batch import identify
    from ident.model import load_model
    from ident.outputs.output_folder import write_identification
    from sim.recording import simulate

    model = load_model("generic6")
    traj = excitation.preset("seed000")
    result = identify(model, simulate(model, traj, 10.0, seed=2), trajectory=traj)
    fs, vs = result.near_rest
    expected = 0.25 * model.drive[:, 1]
    np.testing.assert_allclose(fs, expected, rtol=0.3)
    np.testing.assert_allclose(vs, 0.05, rtol=0.3)
    import json
    written = write_identification(result, tmp_path, "test", with_report=False)
    entry = json.loads(written["result"].read_text())["fit"]["near_rest_friction"]
    np.testing.assert_allclose(entry["excess"], fs, rtol=1e-6)
    assert entry["units"] == ["N m", "rad/s"]
