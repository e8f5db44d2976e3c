"""Many short simulated recordings of one arm, identified, against the simulator's truth: the calibration of
the reported standard deviations (benchmarks/bench_uncertainty.py, tests/test_uncertainty.py).

Recording k of an ensemble varies with k: the sensor noise (NOISE_LEVELS), a payload or none, and how the
samples were logged ("lockstep": one sample per simulator cycle, as `simulate` returns it; "free": a logger on
its own clock, its time stamps drifting by CLOCK_DRIFT and jittered by up to JITTER of a period, with a share
STALE of stale repeats, as ident.fit.resample mends real logs). Recordings k and k + CONFIGS have the same
configuration and different noise (pairs of an unchanged arm, for the fleet's drift flag).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

NOISE_LEVELS = (0.005, 0.01, 0.02)     # A, current sensor standard deviation
PAYLOAD = (1.0, (0.0, 0.02, 0.05), (0.004, 0.0, 0.0, 0.004, 0.0, 0.002))   # kg, m, kg m^2 about the com
CLOCKINGS = ("lockstep", "free")
CONFIGS = len(NOISE_LEVELS) * 2 * len(CLOCKINGS)
CLOCK_DRIFT = 50e-6
JITTER = 0.2
STALE = 0.02


@dataclass(frozen=True)
class Config:
    noise: float
    payload: bool
    clocking: str


def config(k: int) -> Config:
    c = k % CONFIGS
    return Config(NOISE_LEVELS[c % len(NOISE_LEVELS)], bool((c // len(NOISE_LEVELS)) % 2),
                  CLOCKINGS[c // (2 * len(NOISE_LEVELS))])


@dataclass(frozen=True)
class Outcome:
    """One recording's fit: beta (b,), std and std_textbook (b,), truth (b,), relative std % (b,) and the
    correlation matrix (b, b) of the reported covariance."""

    config: Config
    beta: np.ndarray
    std: np.ndarray
    std_textbook: np.ndarray
    truth: np.ndarray
    relative_std_pct: np.ndarray
    correlation: np.ndarray

    def z(self, textbook: bool = False) -> np.ndarray:
        return (self.beta - self.truth) / (self.std_textbook if textbook else self.std)


def free_running(rec, seed: int):
    """The recording as a logger on its own clock writes it (see the module docstring)."""
    import dataclasses

    rng = np.random.default_rng(seed + 7919)
    dt = np.median(np.diff(rec.t))
    t = rec.t * (1.0 + CLOCK_DRIFT) + rng.uniform(-JITTER, JITTER, rec.t.size) * dt
    t[0] = rec.t[0]
    q, y = rec.q.copy(), rec.y.copy()
    stale = rng.random(t.size) < STALE
    stale[0] = False
    for i in np.flatnonzero(stale):          # a stale entry repeats the last one written
        q[i], y[i] = q[i - 1], y[i - 1]
    kind = dict(tau=y) if rec.kind == "torque" else dict(current=y)
    return dataclasses.replace(rec, t=t, q=q, **kind)


@lru_cache(maxsize=2)
def _setup(model_name: str):
    from ident.fit import excitation
    from ident.model import load_model
    from ident.model.base_params import base_parameters

    model = load_model(model_name)
    return model, base_parameters(model), excitation.preset("seed000")


def run(k: int, seconds: float = 6.0, model_name: str = "generic6") -> Outcome:
    """Simulate recording k of the ensemble (sim.recording.simulate on the seed000 excitation), identify it
    (ident.fit.batch.identify) and return its Outcome."""
    from ident.fit.batch import identify
    from ident.payload import payload_parameters
    from ident.payload.dynamic import payload_map
    from sim.recording import simulate

    cfg = config(k)
    model, base, traj = _setup(model_name)
    rec = simulate(model, traj, seconds, seed=1000 + k, current_noise=cfg.noise,
                   payload=PAYLOAD if cfg.payload else None)
    if cfg.clocking == "free":
        rec = free_running(rec, k)
    truth = base.from_standard(model.standard_parameters())
    if cfg.payload:
        truth = truth + payload_map(model, base) @ payload_parameters(*PAYLOAD)
    fit = identify(model, rec, trajectory=traj, base=base).fit
    sd = fit.std
    corr = fit.covariance / np.outer(sd, sd)
    return Outcome(cfg, fit.beta, sd, np.sqrt(np.diag(fit.covariance_textbook)), truth, fit.relative_std_pct, corr)


def spread_band(outcomes: list[Outcome], sigmas: float) -> float:
    """Half-width of the band about 1 within which the mean of z^2 over every parameter of every outcome lies
    with probability of a normal deviate within `sigmas` when the covariance is right: the variance of a
    recording's sum of z^2 is 2 ||corr||_F^2 (z normal with correlation corr), so the standard error of the mean
    is sqrt(2 sum ||corr_r||_F^2) / (number of z)."""
    count = sum(o.beta.size for o in outcomes)
    var = sum(2.0 * float(np.sum(o.correlation ** 2)) for o in outcomes)
    return sigmas * np.sqrt(var) / count
