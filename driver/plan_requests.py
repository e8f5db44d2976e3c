"""The motion commands' arguments, checked, and planned (driver.motion): the planner process runs this.

  move_to        q: [n] rad, speed: (0, 1] (default 1)
  run_trajectory file: a trajectory file's name inside the trajectory folder | preset: a shipped trajectory's
                 name (ident/presets: "seed000"); periods (default 1); blend_s (default: 2 s when the
                 trajectory does not start and end at rest, else 0)
                 | samples: {"t": [N] s, "q": [[n] x N] rad, optional "qd": [[n] x N] rad/s and "qdd":
                 [[n] x N] rad/s^2 at each waypoint (driver.waypoints)}; preempt: true (samples only) blends a
                 running motion into it (driver.blending), the samples' time 0 being the handover

A trajectory file is read only when it is a regular file inside the configured trajectory folder (after
symbolic links are followed) and at most MAX_TRAJECTORY_FILE_BYTES long. A refusal never tells whether a
path outside the folder exists.
"""
from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path

import numpy as np

from driver import motion
from driver.requests import decode_request
from ident.errors import InputError

MAX_TRAJECTORY_FILE_BYTES = 1024 * 1024
MAX_PERIODS = 1000.0


class CommandError(InputError):
    """A request that cannot be carried out; the message goes back to the client."""


def number_list(req: dict, key: str, length: int | None = None, max_length: int | None = None) -> list[float]:
    """req[key] as a list of finite numbers (of `length`, or at most `max_length`), else CommandError."""
    value = req.get(key)
    if not isinstance(value, list):
        raise CommandError(f"{req.get('cmd')}: {key}: expected a list of numbers")
    if length is not None and len(value) != length:
        raise CommandError(f"{req.get('cmd')}: {key}: expected {length} numbers, got {len(value)}")
    if max_length is not None and len(value) > max_length:
        raise CommandError(f"{req.get('cmd')}: {key}: {len(value)} numbers, over the bound of {max_length}")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise CommandError(f"{req.get('cmd')}: {key}: expected a list of numbers")
    out = [float(x) for x in value]
    if not all(math.isfinite(x) for x in out):
        raise CommandError(f"{req.get('cmd')}: {key}: every value must be finite")
    return out


def number(req: dict, key: str, default: float) -> float:
    """req.get(key, default) as a finite float, else CommandError."""
    value = req.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(f"{req.get('cmd')}: {key}: expected a finite number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise CommandError(f"{req.get('cmd')}: {key}: expected a finite number, got {value!r}")
    return value


def only_keys(req: dict, allowed: tuple[str, ...]) -> None:
    extra = sorted(set(req) - {"cmd", *allowed})
    if extra:
        raise CommandError(f"{req['cmd']}: unknown field {extra[0][:40]!r} (known: {', '.join(allowed)})")


def plan_request(raw: bytes, model, q_now, rate_hz: float, bounds) -> motion.PlannedMotion:
    """The motion a request asks for, planned and checked, its feed-forward with the model's friction or without
    (bounds.friction)."""
    return motion.with_feed_forward(_plan_request(raw, model, q_now, rate_hz, bounds), model,
                                    bounds.friction)


def _plan_request(raw: bytes, model, q_now, rate_hz: float, bounds) -> motion.PlannedMotion:
    """Decode `raw`, check its arguments, plan it against the model from q_now (bounds: planner.PlanBounds)."""
    req = decode_request(raw)
    cmd = req["cmd"]
    if cmd == "move_to":
        only_keys(req, ("q", "speed"))
        q = number_list(req, "q", model.n)
        speed = number(req, "speed", 1.0)
        return motion.plan_move(model, q_now, q, rate_hz, speed=speed, max_s=bounds.max_motion_s)
    if cmd == "run_trajectory":
        return _run_trajectory(req, model, q_now, rate_hz, bounds)
    raise CommandError(f"{cmd[:40]!r} is not a motion command (a request of this size must be one)")


def _run_trajectory(req: dict, model, q_now, rate_hz: float, bounds) -> motion.PlannedMotion:
    sources = [k for k in ("file", "preset", "samples") if k in req]
    if len(sources) != 1:
        raise CommandError('run_trajectory: expected exactly one of "file", "preset" or "samples"')
    if sources[0] in ("file", "preset"):
        only_keys(req, (sources[0], "periods", "blend_s"))
        from ident.fit import excitation

        periods = number(req, "periods", 1.0)
        if not 0 < periods <= MAX_PERIODS:
            raise CommandError(f"run_trajectory: periods {periods!r}: expected 0 < periods <= {MAX_PERIODS:g}")
        blend_s = None if "blend_s" not in req else number(req, "blend_s", 0.0)
        if "file" in req:
            traj = excitation.load(trajectory_path(req["file"], bounds.trajectory_dir))
        else:
            traj = shipped_trajectory(req["preset"])
        return motion.plan_trajectory(model, q_now, traj, rate_hz, periods=periods, max_s=bounds.max_motion_s,
                                      blend_s=blend_s)
    only_keys(req, ("samples", "preempt"))
    preempt = req.get("preempt", False)
    if not isinstance(preempt, bool):
        raise CommandError(f"run_trajectory: preempt: expected true or false, got {str(preempt)[:40]!r}")
    s = req["samples"]
    if not isinstance(s, dict) or not {"t", "q"} <= set(s) or not set(s) <= {"t", "q", "qd", "qdd"}:
        raise CommandError('run_trajectory: samples: expected {"t": [...], "q": [[...], ...]} and optionally '
                           '"qd" and "qdd" (one row per time)')
    t = number_list({"cmd": "run_trajectory", "samples.t": s["t"]}, "samples.t", max_length=motion.MAX_SAMPLES_IN)
    rows = {key: _rows(s[key], f"samples.{key}", len(t), model.n) for key in ("q", "qd", "qdd") if key in s}
    plan = motion.plan_samples(model, q_now, t, rows["q"], rate_hz, max_s=bounds.max_motion_s,
                               qd=rows.get("qd"), qdd=rows.get("qdd"), preempt=preempt)
    return dataclasses.replace(plan, preempt=True) if preempt else plan


def _rows(value, name: str, count: int, n: int) -> np.ndarray:
    """A list of `count` rows of n finite numbers as a (count, n) array, else CommandError naming the row."""
    if not isinstance(value, list) or len(value) != count:
        raise CommandError(f"run_trajectory: {name}: expected a list with one row per time")
    rows = [number_list({"cmd": "run_trajectory", f"{name}[{k}]": row}, f"{name}[{k}]", n)
            for k, row in enumerate(value)]
    return np.array(rows, dtype=float).reshape(count, n)


def shipped_trajectory(name):
    """The shipped trajectory `name` (ident/presets), CommandError naming the shipped ones otherwise."""
    from ident.fit import excitation

    shipped = excitation.presets()
    if not isinstance(name, str) or name not in shipped:
        shown = repr(name[:40]) if isinstance(name, str) else type(name).__name__
        raise CommandError(f"run_trajectory: preset {shown}: no such shipped trajectory (shipped: {', '.join(shipped)})")
    return excitation.preset(name)


def trajectory_path(name, folder: str | None) -> Path:
    """The trajectory file `name` (relative to `folder`, or absolute inside it), checked: a regular file inside
    the folder, at most MAX_TRAJECTORY_FILE_BYTES. CommandError otherwise, saying nothing of what exists
    outside the folder."""
    if folder is None:
        raise CommandError('run_trajectory: file: no trajectory folder is configured ([driver] trajectory_dir); '
                           'send the trajectory inline ("samples")')
    if not isinstance(name, str) or not name or "\x00" in name or len(name) > 4096:
        raise CommandError("run_trajectory: file: expected the name of a trajectory file")
    root = Path(folder).resolve()
    try:
        path = (root / name).resolve()
    except (OSError, RuntimeError, ValueError):
        path = None
    if path is None or not path.is_relative_to(root) or path == root:
        raise CommandError(f"run_trajectory: file {name[:200]!r}: not a file inside the trajectory folder")
    try:
        st = os.stat(path)
    except OSError:
        raise CommandError(f"run_trajectory: file {name[:200]!r}: no such file in the trajectory folder") from None
    if not stat.S_ISREG(st.st_mode):
        raise CommandError(f"run_trajectory: file {name[:200]!r}: not a regular file")
    if st.st_size > MAX_TRAJECTORY_FILE_BYTES:
        raise CommandError(f"run_trajectory: file {name[:200]!r}: {st.st_size} bytes, over the bound of "
                           f"{MAX_TRAJECTORY_FILE_BYTES}")
    return path
