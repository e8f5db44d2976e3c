"""Minutes of mixed arm motion on the simulator, stepped synchronously (much faster than real time): rests,
point-to-point moves (move_to, quintic, some joints only), and Fourier excitations that start and end at
rest, with payload changes at given times. For the payload-tracking tests."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from firmware_bridge import cia402
from sim_helpers import enable, fourier_at_rest


@dataclass
class Run:
    """seq (N,) sample indices, q (rad) and tau (N m) (N, n) as the drives report them; changes: the sample
    index of each payload change; segments: (kind, first sample, last sample)."""

    seq: np.ndarray
    q: np.ndarray
    tau: np.ndarray
    changes: list[int]
    segments: list[tuple[str, int, int]]


def plan(model, seconds: float, rate: float, seed: int) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """Targets (N, n) of a random sequence of rests, moves and excitations, every one starting and ending at
    rest, inside the middle half of the joint range."""
    rng = np.random.default_rng(seed)
    n = model.n
    lo = np.where(np.isfinite(model.q_min), model.q_min, -np.pi)
    hi = np.where(np.isfinite(model.q_max), model.q_max, np.pi)
    mid, half = (lo + hi) / 2, np.minimum((hi - lo) / 4, 1.0)
    q = mid.copy()
    parts, segments, count = [], [], 0
    kinds = ["rest", "move", "excite"]
    while count < seconds * rate:
        first = len(parts) < 3              # rest, then a move of the first three joints only, then an excitation
        kind = kinds[len(parts)] if first else rng.choice(kinds, p=[0.25, 0.35, 0.4])
        if kind == "rest":
            block = np.repeat(q[None], int(rng.uniform(0.5, 2.0) * rate), axis=0)
        elif kind == "move":                       # quintic point-to-point, a random subset of joints
            goal = q.copy()
            moving = np.arange(n) < 3 if first else rng.random(n) < 0.6
            moving[rng.integers(n)] |= not first
            goal[moving] = mid[moving] + (rng.choice([-0.8, 0.8], moving.sum()) if first else
                                          rng.uniform(-0.8, 0.8, moving.sum())) * half[moving]
            T = max(1.0, 2.0 * np.max(np.abs(goal - q)) / 0.6)
            s = np.arange(1, int(T * rate) + 1) / (T * rate)
            blend = 10 * s ** 3 - 15 * s ** 4 + 6 * s ** 5
            block = q + blend[:, None] * (goal - q)
        else:                                      # Fourier excitation from rest to rest (whole periods)
            wf = 2 * np.pi * rng.uniform(0.15, 0.3)
            a, b = fourier_at_rest(rng, n, 4, 0.25)
            t = np.arange(1, int(round(2 * np.pi / wf * rng.integers(1, 3) * rate)) + 1) / rate
            w = wf * np.arange(1, a.shape[1] + 1)                     # as sim_helpers.fourier, all t at once
            block = q + (np.sin(np.outer(t, w)) / w) @ a.T - ((np.cos(np.outer(t, w)) - 1.0) / w) @ b.T
            block = np.clip(block, lo + 0.05, hi - 0.05)
        segments.append((str(kind), count, count + block.shape[0] - 1))
        parts.append(block)
        count += block.shape[0]
        q = block[-1].copy()
    return np.concatenate(parts)[:int(seconds * rate)], segments


def run(model, seconds: float, *, payloads: dict[float, tuple | None] | None = None, rate: float = 1000.0,
        seed: int = 0) -> Run:
    """Run the planned motion on a Simulator in CSP; payloads: {time s: (mass, com, inertia) or None
    (detach)} applied at those times."""
    from sim import Simulator

    targets, segments = plan(model, seconds, rate, seed)
    sim = Simulator(model, seed=seed, q0=targets[0], rate_hz=rate)
    enable(sim, cia402.Mode.CSP)
    at = {int(round(t * rate)): p for t, p in (payloads or {}).items()}
    N = targets.shape[0]
    q, tau = np.empty((N, model.n)), np.empty((N, model.n))
    for k in range(N):
        if k in at:
            p = at[k]
            sim.detach_payload() if p is None else sim.attach_payload(*p)
        sim.set_commands(target_position=targets[k])
        s = sim.step(1)
        q[k], tau[k] = s.position, s.torque
    return Run(np.arange(N), q, tau, sorted(at), segments)
