"""Drift between an arm's runs in the fleet table: a base parameter whose value moved from the arm's previous
successful run by more than DRIFT_SIGMA combined standard deviations is flagged."""
from __future__ import annotations

import math
import re
from datetime import datetime

DRIFT_SIGMA = 3.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


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


def flag_drift(rows: list[dict], sigma: float = DRIFT_SIGMA) -> list[dict]:
    """The rows with drift columns: previous_run (the arm's previous successful run, None for its first),
    NAME_drift per base parameter (True when it moved by more than sigma combined standard deviations from
    previous_run, None without a previous run) and drifted (the flagged names, ";"-separated: "" when none
    moved, None when the run was compared with none: an arm's first run, or a failed run)."""
    rows = [dict(r) for r in rows]
    names = parameter_names(rows)
    by_arm: dict[str, list[tuple[int, dict]]] = {}
    for i, r in enumerate(rows):
        by_arm.setdefault(r["arm_id"], []).append((i, r))
    for arm_rows in by_arm.values():
        previous = None
        for _, r in sorted(arm_rows, key=_order_key([r for _, r in arm_rows])):
            if r["status"] != "ok":
                continue
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
