"""Many short simulated recordings of one arm, identified, against the simulator's truth: the calibration of
the reported standard deviations (benchmarks/bench_uncertainty.py, tests/test_uncertainty.py).

Recording k of an ensemble varies with k: the sensor noise (NOISE_LEVELS), a payload or none, the transport it
was recorded through (serial, CAN, gateway: their cycle rates, wire encodings and clocking, lockstep or
free-running; sim.transport_recording). Recordings k and k + CONFIGS have the same configuration and different
noise (pairs of an unchanged arm, for the fleet's drift flag).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from sim.transport_recording import CLOCKINGS, TRANSPORTS

NOISE_LEVELS = (0.005, 0.01, 0.02)     # A, current sensor standard deviation
PAYLOAD = (1.0, (0.0, 0.02, 0.05), (0.004, 0.0, 0.0, 0.004, 0.0, 0.002))   # kg, m, kg m^2 about the com
CONFIGS = len(NOISE_LEVELS) * 2 * len(CLOCKINGS) * len(TRANSPORTS)


@dataclass(frozen=True)
class Config:
    noise: float
    payload: bool
    clocking: str
    transport: str = "serial"


def config(k: int) -> Config:
    """Recording k's configuration: the transport varies fastest, then the clocking, the payload, the noise."""
    c = k % CONFIGS
    ways = len(TRANSPORTS) * len(CLOCKINGS)
    return Config(NOISE_LEVELS[c // (2 * ways)], bool((c // ways) % 2),
                  CLOCKINGS[(c // len(TRANSPORTS)) % len(CLOCKINGS)], TRANSPORTS[c % len(TRANSPORTS)])


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


@lru_cache(maxsize=2)
def _setup(model_name: str):
    from ident.fit import excitation
    from ident.model import load_model
    from ident.model.base_params import base_parameters

    model = load_model(model_name)
    return model, base_parameters(model), excitation.preset("seed000")


def recording(k: int, seconds: float = 6.0, model_name: str = "generic6"):
    """Recording k of the ensemble (sim.transport_recording.record of the seed000 excitation) and its truth, the
    base parameters (with the payload's when it carries one)."""
    from ident.payload import payload_parameters
    from ident.payload.dynamic import payload_map
    from sim.transport_recording import record

    cfg = config(k)
    model, base, traj = _setup(model_name)
    rec = record(model, traj, seconds, cfg.transport, cfg.clocking, seed=1000 + k, current_noise=cfg.noise,
                 payload=PAYLOAD if cfg.payload else None)
    truth = base.from_standard(model.standard_parameters())
    if cfg.payload:
        truth = truth + payload_map(model, base) @ payload_parameters(*PAYLOAD)
    return rec, truth


def run(k: int, seconds: float = 6.0, model_name: str = "generic6") -> Outcome:
    """Simulate recording k of the ensemble, identify it (ident.fit.batch.identify) and return its Outcome."""
    from ident.fit.batch import identify

    model, base, traj = _setup(model_name)
    rec, truth = recording(k, seconds, model_name)
    fit = identify(model, rec, trajectory=traj, base=base).fit
    sd = fit.std
    corr = fit.covariance / np.outer(sd, sd)
    return Outcome(config(k), fit.beta, sd, np.sqrt(np.diag(fit.covariance_textbook)), truth,
                   fit.relative_std_pct, corr)


def spread_band(outcomes: list[Outcome], sigmas: float) -> float:
    """Half-width of the band about 1 within which the mean of z^2 over every parameter of every outcome lies
    with probability of a normal deviate within `sigmas` when the covariance is right: the variance of a
    recording's sum of z^2 is 2 ||corr||_F^2 (z normal with correlation corr), so the standard error of the mean
    is sqrt(2 sum ||corr_r||_F^2) / (number of z)."""
    count = sum(o.beta.size for o in outcomes)
    var = sum(2.0 * float(np.sum(o.correlation ** 2)) for o in outcomes)
    return sigmas * np.sqrt(var) / count


def run_online(k: int, seconds: float = 6.0, model_name: str = "generic6") -> Outcome:
    """Stream recording k of the ensemble through the online estimator (ident.online.OnlineIdentifier, its
    defaults: no forgetting, per-joint weights from its first pass) and return its final estimate and reported
    std as an Outcome; std_textbook is the std without the filter's row correlation (independent rows). The
    recording's stamps are mended first (ident.fit.resample.mend_sampling), as a driver's stream is regular."""
    from ident.fit.resample import mend_sampling
    from ident.online.identifier import OnlineIdentifier

    model, base, _ = _setup(model_name)
    rec, truth = recording(k, seconds, model_name)
    rec = mend_sampling(rec)[0]
    rate = 1.0 / float(np.median(np.diff(rec.t)))
    seq = np.round((rec.t - rec.t[0]) * rate).astype(np.int64)
    online = OnlineIdentifier(model, rate_hz=rate, base=base, effort_delay=rec.effort_delay)
    online.push(seq, rec.q, rec.tau)
    report = online.report()
    cov = online.rls.covariance()
    sd = np.sqrt(np.diag(cov))
    return Outcome(config(k), report.theta, sd, sd / np.sqrt(online.rls.row_correlation), truth,
                   report.sigma_percent, cov / np.outer(sd, sd))
