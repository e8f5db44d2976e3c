"""A recording of the simulated arm split into its sensor noise and the rest, sample by sample.

The simulator's current noise is a function of its seed and the cycle of each sample (sim.simulator.current_noise),
and a recording carries each sample's device time, the simulator's own time. So whatever carried the samples (a
transport, the driver, the recorder, the conversion), the noise of every recorded sample can be drawn again and
subtracted. What is left is the arm's own motion and effort as the chain delivered it: identified, it shows the
bias the chain adds (timing, pairing, dropped or moved samples, held targets), free of the noise that hides it in
any one run (benchmarks/bench_chain_bias.py, tests/test_e2e.py).
"""
from __future__ import annotations

import numpy as np

from firmware_bridge import stream
from sim.simulator import current_noise


def fresh_samples(states: np.ndarray) -> np.ndarray:
    """The STATE messages identification uses (firmware_bridge.recording.identification_arrays): fresh ones whose
    device time increases."""
    s = states[(states["flags"] & stream.FLAG_STALE) == 0]
    dev = s["device_time_ns"]
    later = np.ones(len(s), dtype=bool)
    later[1:] = dev[1:] > np.maximum.accumulate(dev)[:-1]
    return s[later]


def sample_cycles(device_time_ns: np.ndarray, rate_hz: float) -> np.ndarray:
    """The simulator cycle of each sample from its device time (ns) at rate_hz (Hz)."""
    return np.rint(np.asarray(device_time_ns, dtype=float) * 1e-9 * rate_hz).astype(np.int64)


def window(states: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The consecutive fresh samples of `states` whose positions are q (N, n) rad, the rows of an identification
    file made from them (LookupError if none are)."""
    s = fresh_samples(states)
    for start in np.flatnonzero(np.all(s["q"] == q[0], axis=1)):
        block = s[start:start + len(q)]
        if len(block) == len(q) and np.array_equal(block["q"], q):
            return block
    raise LookupError("no run of consecutive fresh samples has these positions")


def noise_torques(samples: np.ndarray, *, seed: int, current_std: float, rate_hz: float,
                  torque_per_amp: np.ndarray) -> np.ndarray:
    """(N, n) N m: the current noise of each of the samples (STATE messages of a simulator with this seed and
    current_std A, at rate_hz Hz) times the drives' torque per ampere."""
    cycles = sample_cycles(samples["device_time_ns"], rate_hz)
    if len(cycles) and cycles.min() < 0:
        raise ValueError("a sample's device time is before the simulator's start")
    n = samples["current"].shape[1]
    noise = current_noise(seed, int(cycles.max()) + 1 if len(cycles) else 0, n, current_std)
    return noise[cycles] * np.asarray(torque_per_amp, dtype=float)
