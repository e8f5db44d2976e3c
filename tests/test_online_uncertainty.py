"""The online estimate's reported std is right on the simulated arm: a few of sim.ensemble's configurations
(transports, clockings, noise levels, payload), each streamed through the online estimator
(sim.ensemble.run_online), its final estimate against the simulator's truth. Over every base parameter of those
recordings z = (estimate - truth) / std has its spread within 0.9-1.1 and its mean within +-0.2, and the mean of
z^2 lies within 4 standard errors of 1 (sim.ensemble.spread_band). The same std without the filter's row
correlation (rows taken as independent) lies far outside: the test can tell."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from sim import ensemble

# serial / CAN / gateway, lockstep and free-running, the three noise levels, with and without a payload
RECORDINGS = (0, 4, 8, 15, 19, 26, 30, 35)
SPREAD_BAND = (0.9, 1.1)
MEAN_BAND = 0.2


@pytest.fixture(scope="module")
def outcomes():
    with mp.get_context("spawn").Pool(2) as pool:
        return pool.map(ensemble.run_online, RECORDINGS)


def test_the_online_std_gives_z_spread_within_the_band_and_mean_near_zero(outcomes):
    z = np.concatenate([o.z() for o in outcomes])
    assert SPREAD_BAND[0] <= z.std() <= SPREAD_BAND[1], f"online z spread {z.std():.3f} over {z.size}"
    assert abs(z.mean()) <= MEAN_BAND, f"online z mean {z.mean():+.3f}"


def test_the_online_std_gives_mean_z_squared_within_its_band(outcomes):
    band = ensemble.spread_band(outcomes, 4.0)
    z2 = float(np.mean([np.mean(o.z() ** 2) for o in outcomes]))
    assert abs(z2 - 1.0) < band, f"online mean z^2 {z2:.3f}, band 1 +- {band:.3f}"


def test_the_std_of_independent_rows_leaves_the_band(outcomes):
    z = np.concatenate([o.z(textbook=True) for o in outcomes])
    assert z.std() > SPREAD_BAND[1], f"independent-rows z spread {z.std():.3f}"


def test_run_online_streams_every_recording(outcomes):
    assert [o.config for o in outcomes] == [ensemble.config(k) for k in RECORDINGS]
    assert all(np.all(np.isfinite(o.std)) and np.all(o.std > 0) for o in outcomes)
