"""A logger that stamps entries late or early by its latency while the drives sample on their own clock: the
samples are placed back on that clock (ident.fit.resample.on_clock), not resampled at the stamps' times, which
would put the positions at the wrong times and bias the inertial parameters; a log whose intervals really
wander is still resampled."""
from __future__ import annotations

import numpy as np

from ident.fit.preprocess import Recording
from ident.fit.resample import mend_sampling, on_clock


def _logged(jitter: float, seed: int = 0, n: int = 3000, drift: float = 50e-6):
    rng = np.random.default_rng(seed)
    true = np.arange(n) * 1e-3
    t = true * (1.0 + drift) + rng.uniform(-jitter, jitter, n) * 1e-3
    q = np.column_stack([np.sin(2 * np.pi * 0.5 * true), np.cos(2 * np.pi * 0.3 * true)])
    tau = 3.0 * q + rng.normal(0, 0.01, q.shape)
    return true, Recording(t, q, tau, None, None, "logger")


def test_stamps_scattered_about_the_drives_clock_are_placed_on_it():
    true, rec = _logged(0.2)
    drop = np.zeros(rec.N, dtype=bool)
    drop[[100, 101, 2000]] = True                            # entries lost: their ticks stay empty
    rec = Recording(rec.t[~drop], rec.q[~drop], rec.tau[~drop], None, None, "logger")
    mended, done = mend_sampling(rec)
    assert done.on_clock_s is not None and 0.15e-3 < done.on_clock_s < 0.21e-3
    assert "samples placed on it" in done.note() and not done.resampled
    np.testing.assert_allclose(mended.t - mended.t[0], (true[~drop] - true[0]) * (1 + 50e-6), atol=2e-5)
    np.testing.assert_array_equal(mended.q, rec.q)           # the samples themselves are untouched


def test_stamps_that_wander_beyond_half_a_period_are_resampled_as_before():
    _, rec = _logged(0.45, seed=1)
    assert on_clock(rec.t, 1e-3) is None
    _, done = mend_sampling(rec)
    assert done.on_clock_s is None and done.resampled
