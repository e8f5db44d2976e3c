"""Synthetic recordings degraded as real logs are: a slow excitation logged at 1 kHz by a logger that is not
the drives' clock (jittered time stamps, stale repeats of the previous entry, dropped samples and a long
stall), with sensor noise. The torques are the model's exact inverse dynamics at the true sample times, so
the model's base parameters are the truth to identify."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ident.model import dynamics
from ident.fit.excitation import FourierTrajectory

RATE = 1000.0
TORQUE_NOISE = 0.05      # N m
POSITION_NOISE = 2e-5    # rad (about a 2^18-count encoder)


@dataclass(frozen=True)
class Degraded:
    """t, q, tau as logged; repeats, dropped: how many entries are stale repeats, how many samples were lost."""

    t: np.ndarray
    q: np.ndarray
    tau: np.ndarray
    repeats: int
    dropped: int


def degraded_log(model, traj: FourierTrajectory, seed: int, *, periods: float = 1.0, jitter: float = 0.3,
                 repeat_share: float = 0.05, drop_share: float = 0.02, stall_s: float = 0.05) -> Degraded:
    """One log of traj at a nominal RATE: each time stamp off its nominal tick by up to +-jitter of a period
    (uniform), repeat_share of the entries a stale copy of the entry before (values and all, a new time stamp),
    drop_share of the samples lost one at a time, and one stall of stall_s seconds in the middle."""
    rng = np.random.default_rng(seed)
    N = int(round(periods * traj.period * RATE))
    t = (np.arange(N) + rng.uniform(-jitter, jitter, N)) / RATE
    t[0] = 0.0
    q, qd, qdd = traj.evaluate(t)
    tau = dynamics.rnea(model, q, qd, qdd) + rng.normal(0.0, TORQUE_NOISE, q.shape)
    q = q + rng.normal(0.0, POSITION_NOISE, q.shape)
    keep = rng.random(N) >= drop_share
    keep[0] = keep[-1] = True
    middle = t[N // 2]
    keep &= ~((t > middle) & (t < middle + stall_s))
    t, q, tau = t[keep], q[keep], tau[keep]
    stale = rng.random(len(t)) < repeat_share
    stale[0] = False
    for k in np.flatnonzero(stale):          # a stale entry repeats what the logger last wrote
        q[k], tau[k] = q[k - 1], tau[k - 1]
    return Degraded(t, q, tau, int(stale.sum()), int(N - keep.sum()))


def write_csv(path, t, q, y, prefix: str = "tau", fields: dict[str, float] | None = None):
    """A recording CSV (docs/reference/data-files.md) with the stated fields as comment lines before the header."""
    n = q.shape[1]
    header = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"{prefix}{j + 1}" for j in range(n)])
    lead = "".join(f"# {k} = {v!r}\n" for k, v in (fields or {}).items())
    np.savetxt(path, np.column_stack([t, q, y]), delimiter=",", header=lead + header, comments="", fmt="%.17g")
    return path
