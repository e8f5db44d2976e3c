"""Drift between an arm's runs in the fleet table: a base parameter whose value moved from the arm's previous
successful run by more than DRIFT_SIGMA combined standard deviations is flagged.

At 3 sigma an unchanged parameter is flagged with probability 0.27 % (two-sided normal); an arm of 58
parameters then raises at least one flag in about 15 % of its runs. `family_wise_sigma` gives the threshold at
which a whole fleet of comparisons raises a false flag with a chosen probability (Sidak); `flag_drift(rows,
family_wise=p)` sets it from the comparisons the table holds (`armid identify MANIFEST --family-wise P`)."""
from __future__ import annotations

import math
import re
from datetime import datetime
from statistics import NormalDist

DRIFT_SIGMA = 3.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def family_wise_sigma(probability: float, comparisons: int) -> float:
    """The threshold (in combined standard deviations) at which `comparisons` independent comparisons of
    unchanged parameters raise at least one flag with `probability` (Sidak: each flags with
    1 - (1 - probability)^(1/comparisons)). For a fleet of N arms x 58 base parameters compared once,
    comparisons = 58 N; e.g. 1 % over 10 arms: 4.30 sigma."""
    if not (0.0 < probability < 1.0):
        raise ValueError(f"probability: expected a number between 0 and 1, got {probability}")
    if comparisons < 1:
        raise ValueError(f"comparisons: expected at least 1, got {comparisons}")
    each = -math.expm1(math.log1p(-probability) / comparisons)
    return NormalDist().inv_cdf(1.0 - each / 2.0)


def safe_name(text: str) -> str:
    """text with every run of characters other than letters, digits, '.', '_' and '-' made one '_' (a file name)."""
    return _UNSAFE.sub("_", text)


def _order_key(rows: list[dict]):
    """Runs of an arm by date when every one has a date, else as listed."""
    dated = all(r.get("date") for r in rows)
    return (lambda ir: datetime.fromisoformat(ir[1]["date"])) if dated else (lambda ir: ir[0])


def parameter_names(rows: list[dict]) -> list[str]:
    """The base parameters in the table's rows (columns NAME with a NAME_std beside them), in first-seen order."""
    names: dict[str, None] = {}
    for r in rows:
        for k in r:
            if f"{k}_std" in r:
                names[k] = None
    return list(names)


def _runs_by_arm(rows: list[dict]) -> list[list[dict]]:
    """Each arm's successful runs in order (by date when every run of the arm has one, else as listed)."""
    by_arm: dict[str, list[tuple[int, dict]]] = {}
    for i, r in enumerate(rows):
        by_arm.setdefault(r["arm_id"], []).append((i, r))
    return [[r for _, r in sorted(arm_rows, key=_order_key([r for _, r in arm_rows])) if r["status"] == "ok"]
            for arm_rows in by_arm.values()]


def comparisons(rows: list[dict]) -> int:
    """How many (run, base parameter) comparisons flag_drift makes on the table's rows: each successful run with
    its arm's previous successful run, over the parameters both have."""
    names = parameter_names(rows)
    return sum(sum(1 for n in names if n in r and n in prev)
               for runs in _runs_by_arm(rows) for prev, r in zip(runs, runs[1:]))


def check_threshold(sigma: float | None = None, family_wise: float | None = None) -> None:
    """Raises ValueError unless at most one of the thresholds is given and it is valid: sigma a positive number of
    standard deviations, family_wise a probability between 0 and 1."""
    if sigma is not None and family_wise is not None:
        raise ValueError("give one drift threshold, a number of sigma or a family-wise probability, not both")
    if sigma is not None and not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma: expected a positive number of standard deviations, got {sigma!r}")
    if family_wise is not None and not (isinstance(family_wise, (int, float)) and 0.0 < family_wise < 1.0):
        raise ValueError(f"family-wise probability: expected a number between 0 and 1, got {family_wise!r}")


def drift_sigma(rows: list[dict], sigma: float | None = None, family_wise: float | None = None) -> float:
    """The threshold flag_drift applies (combined standard deviations): sigma when given, else the family-wise
    one for the probability family_wise over the table's comparisons (family_wise_sigma), else DRIFT_SIGMA.
    Raises ValueError as check_threshold does."""
    check_threshold(sigma, family_wise)
    if family_wise is not None:
        return family_wise_sigma(family_wise, max(comparisons(rows), 1))
    return DRIFT_SIGMA if sigma is None else float(sigma)


def flag_drift(rows: list[dict], sigma: float | None = None, *, family_wise: float | None = None) -> list[dict]:
    """The rows with drift columns: previous_run (the arm's previous successful run, None for its first),
    NAME_drift per base parameter (True when it moved by more than the threshold in combined standard deviations
    from previous_run, None without a previous run) and drifted (the flagged names, ";"-separated: "" when none
    moved, None when the run was compared with none: an arm's first run, or a failed run). The threshold:
    drift_sigma(rows, sigma, family_wise) (default DRIFT_SIGMA)."""
    rows = [dict(r) for r in rows]
    sigma = drift_sigma(rows, sigma, family_wise)
    names = parameter_names(rows)
    for runs in _runs_by_arm(rows):
        previous = None
        for r in runs:
            r["previous_run"] = None if previous is None else previous["run"]
            flagged = []
            for name in names:
                comparable = previous is not None and name in r and name in previous
                if not comparable:
                    r[f"{name}_drift"] = None
                    continue
                moved = abs(r[name] - previous[name])
                bound = sigma * math.hypot(r[f"{name}_std"], previous[f"{name}_std"])
                r[f"{name}_drift"] = bool(moved > bound)
                if moved > bound:
                    flagged.append(name)
            r["drifted"] = None if previous is None else ";".join(flagged)
            previous = r
    return rows
