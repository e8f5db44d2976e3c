"""One row of the payload benchmark table (benchmarks/bench_payload.py): a method on a seed scenario.

The scenario modules (payload_seed000.py, payload_seed001.py) each have `rows() -> list[Row]`, and each
prints its own rows when run alone. Errors are absolute: mass in kg (and % of the true mass), centre of
mass as the Euclidean distance in mm; `published` holds the seed's figure for the same cell, as text.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    method: str            # "difference", "torque", "global", "torque-balance", "static", ...
    scenario: str          # e.g. "seed000 1.5 kg", "seed001 sim 0.3 N m noise", "seed001 experiment"
    mass_error_kg: float   # mean over the scenario's cases when it has several
    mass_error_pct: float
    com_error_mm: float    # NaN when the method does not give a centre of mass
    seconds: float         # identification time per case (not the simulation)
    published: str = ""    # the seed's number for this cell, e.g. "1.1 %" or "0.032 kg / 4.14 mm"
    max_mass_error_kg: float = float("nan")
    max_com_error_mm: float = float("nan")

    def line(self) -> str:
        return (f"payload {self.method} [{self.scenario}]: mass error {self.mass_error_kg:.4f} kg "
                f"({self.mass_error_pct:.2f} %), max {self.max_mass_error_kg:.4f} kg, CoM error {self.com_error_mm:.3f} mm, "
                f"max {self.max_com_error_mm:.3f} mm, {self.seconds * 1e3:.1f} ms"
                + (f" (published: {self.published})" if self.published else ""))
