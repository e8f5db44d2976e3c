"""Seed 000's Table 3 in the simulator: the three dynamic payload methods on the 1.5 kg and 3 kg payloads.

The arm is generic6 in sim.Simulator (CSP drives at 1 kHz, encoder quantisation, Stribeck friction the
model does not have, current sensors with noise); the runs record motor currents, turned into torques
with the nominal drive gains, as the seed's "current-based torques". The excitation is the seed's Table 1
trajectory (preset seed000, one 10 s period), the same for the unloaded and each loaded run. The payloads
are the seed's CAD references (Table 4: mass, first moments, inertia about the flange origin).
`rows()` gives one benchmarks.payload_table.Row per method and payload, with the seed's Table 3 figure
in `published`; run alone, it prints them:

    python benchmarks/payload_seed000.py
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # small linear algebra on a shared machine

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))       # payload_table when imported from elsewhere
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's ident and sim
from payload_table import Row  # noqa: E402

from ident.model import spatial  # noqa: E402
from ident.fit.excitation import FourierTrajectory, preset  # noqa: E402
from ident.model import Model, load_model  # noqa: E402
from ident.payload import dynamic  # noqa: E402
from ident.fit.preprocess import Recording  # noqa: E402

# Table 4's CAD values about the flange origin [XX XY XZ YY YZ ZZ mX mY mZ m]; XX from XX - YY = 0
CAD = {"1.5 kg": np.array([0.01420, 0, 0, 0.01420, 0, 0.001, 0, 0, 0.09397, 1.5]),
       "3 kg": np.array([0.03780, 0, 0, 0.03780, 0, 0.003, 0, 0.01, 0.10857, 3.0])}
# Table 3: identified mass (kg) and error (%)
PUBLISHED = {("difference", "1.5 kg"): "1.450 kg, 3.30 %", ("difference", "3 kg"): "2.964 kg, 1.20 %",
             ("torque", "1.5 kg"): "1.483 kg, 1.10 %", ("torque", "3 kg"): "2.960 kg, 1.33 %",
             ("global", "1.5 kg"): "1.498 kg, 0.12 %", ("global", "3 kg"): "3.009 kg, 0.33 %"}
SEED_MASS_ERROR_PCT = {"1.5 kg": 0.12, "3 kg": 0.33}   # the global method's, the bar for ours
SECONDS = 10.0              # one period of the seed000 excitation
CURRENT_NOISE = 0.01        # A, the simulated current sensors' standard deviation


def payload_body(chi: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(mass kg, com (3,) m, inertia [XX XY XZ YY YZ ZZ] about the CoM kg m^2) of 10 flange-origin
    parameters, as sim.Simulator.attach_payload takes them."""
    m, c = float(chi[9]), chi[6:9] / chi[9]
    J = spatial.inertia_matrix(chi[:6]) - m * (spatial.skew(c).T @ spatial.skew(c))
    return m, c, spatial.inertia_six(J)


def scenario(seconds: float = SECONDS, seed: int = 0,
             payloads: tuple[str, ...] = tuple(CAD)) -> tuple[Model, FourierTrajectory, Recording, dict]:
    """The simulated runs: (model, trajectory, unloaded run, {payload name: loaded run}), currents in A."""
    from sim.recording import simulate

    model, traj = load_model("generic6"), preset("seed000")
    run = dict(currents=True, current_noise=CURRENT_NOISE)
    unloaded = simulate(model, traj, seconds, seed=seed, **run)
    loaded = {name: simulate(model, traj, seconds, seed=seed + 1 + k, payload=payload_body(CAD[name]), **run)
              for k, name in enumerate(payloads)}
    return model, traj, unloaded, loaded


def errors(est, chi_true: np.ndarray) -> tuple[float, float, float]:
    """(mass error kg, mass error %, CoM error mm) of an estimate against the true parameters."""
    dm = abs(est.mass - chi_true[9])
    com_true = chi_true[6:9] / chi_true[9]
    return dm, 100.0 * dm / chi_true[9], 1e3 * float(np.linalg.norm(est.com - com_true))


def rows(seconds: float = SECONDS) -> list[Row]:
    """One Row per method (difference, torque, global) and payload (1.5 kg, 3 kg)."""
    model, traj, unloaded, loaded = scenario(seconds)
    out = []
    for name, rec in loaded.items():
        for method in dynamic.METHODS:
            est = dynamic.identify(model, rec, unloaded, method, trajectory=traj)
            dm, pct, dc = errors(est, CAD[name])
            out.append(Row(method=method, scenario=f"seed000 {name}", mass_error_kg=dm, mass_error_pct=pct,
                           com_error_mm=dc, seconds=est.seconds, published=PUBLISHED[(method, name)],
                           max_mass_error_kg=dm, max_com_error_mm=dc))
    return out


if __name__ == "__main__":
    for row in rows():
        print(row.line())
