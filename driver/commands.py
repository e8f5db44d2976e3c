"""The driver's command set: one JSON request in, one JSON reply out (docs/stream.md, "Commands").

Request: {"cmd": NAME, ...arguments}. Reply: {"ok": true, ...} or {"ok": false, "error": "what was wrong"}.
Every motion is planned and checked against the limits (driver/motion.py) in the requesting thread, as a
whole, before the cycle is asked to start it; the reply says so or names the joint, quantity and time.

  status                                      driver and drive states, position, fault, payload
  enable | disable | quick_stop | fault_reset
  move_to        q: [n] rad, speed: 0..1 (default 1)
  run_trajectory file: path of a Fourier trajectory file (ident.excitation), periods (default 1)
                 | samples: {"t": [N] s, "q": [[n] x N] rad}
  set_payload    mass kg, com [3] m (flange frame), inertia [XX XY XZ YY YZ ZZ] kg m^2 about the CoM;
                 mass 0 clears it. Planning checks and the feed-forward include it.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable

import numpy as np

from driver import motion
from ident.errors import InputError

MAX_REQUEST_BYTES = 16 * 1024 * 1024


class CommandError(InputError):
    """A request that cannot be carried out; the message goes back to the client."""


def _number_list(req: dict, key: str, length: int | None = None) -> list[float]:
    value = req.get(key)
    if not isinstance(value, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
        raise CommandError(f"{req.get('cmd')}: {key}: expected a list of numbers")
    if length is not None and len(value) != length:
        raise CommandError(f"{req.get('cmd')}: {key}: expected {length} numbers, got {len(value)}")
    if not all(math.isfinite(x) for x in value):
        raise CommandError(f"{req.get('cmd')}: {key}: every value must be finite")
    return [float(x) for x in value]


def _number(req: dict, key: str, default: float) -> float:
    value = req.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CommandError(f"{req.get('cmd')}: {key}: expected a finite number, got {value!r}")
    return float(value)


class Commands:
    """Carries out requests on a driver (driver.daemon.Driver: model, cycle, payload)."""

    def __init__(self, driver):
        self.driver = driver
        self.table: dict[str, Callable[[dict], dict]] = {
            "status": self.status, "enable": self.enable, "disable": self.disable,
            "quick_stop": self.quick_stop, "fault_reset": self.fault_reset, "move_to": self.move_to,
            "run_trajectory": self.run_trajectory, "set_payload": self.set_payload,
        }

    def handle_bytes(self, raw: bytes) -> bytes:
        """Decode, execute, encode. Never raises: every failure becomes {"ok": false, "error": ...}."""
        if len(raw) > MAX_REQUEST_BYTES:
            return self._reply({"ok": False, "error": f"request of {len(raw)} bytes is over {MAX_REQUEST_BYTES}"})
        try:
            req = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return self._reply({"ok": False, "error": f"request is not JSON: {exc}"})
        return self._reply(self.handle(req))

    def handle(self, req: Any) -> dict:
        if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
            return {"ok": False, "error": 'request: expected a JSON object with a "cmd" string'}
        fn = self.table.get(req["cmd"])
        if fn is None:
            return {"ok": False, "error": f"unknown command {req['cmd']!r} (known: {', '.join(sorted(self.table))})"}
        try:
            return {"ok": True, **(fn(req) or {})}
        except InputError as exc:
            return {"ok": False, "error": str(exc)}
        except (RuntimeError, TimeoutError) as exc:
            return {"ok": False, "error": f"{req['cmd']}: {exc}"}

    @staticmethod
    def _reply(obj: dict) -> bytes:
        return json.dumps(obj, allow_nan=False, default=_plain).encode()

    # -- commands ------------------------------------------------------------------------------------
    def status(self, req: dict) -> dict:
        return self.driver.status()

    def enable(self, req: dict) -> dict:
        self.driver.cycle.submit(self.driver.cycle.enable)
        return {}

    def disable(self, req: dict) -> dict:
        self.driver.cycle.submit(self.driver.cycle.disable)
        return {}

    def quick_stop(self, req: dict) -> dict:
        self.driver.cycle.submit(self.driver.cycle.request_quick_stop)
        return {}

    def fault_reset(self, req: dict) -> dict:
        self.driver.cycle.submit(self.driver.cycle.fault_reset)
        return {}

    def move_to(self, req: dict) -> dict:
        model = self.driver.planning_model
        q = _number_list(req, "q", model.n)
        plan = motion.plan_move(model, self.driver.cycle.hold.copy(), q, self.driver.cycle.rate_hz,
                                speed=_number(req, "speed", 1.0))
        return self._start(plan)

    def run_trajectory(self, req: dict) -> dict:
        model, cycle = self.driver.planning_model, self.driver.cycle
        if "file" in req:
            from ident import excitation

            if not isinstance(req["file"], str):
                raise CommandError("run_trajectory: file: expected a path")
            traj = excitation.load(req["file"])
            plan = motion.plan_trajectory(model, cycle.hold.copy(), traj, cycle.rate_hz,
                                          periods=_number(req, "periods", 1.0))
        elif "samples" in req:
            s = req["samples"]
            if not isinstance(s, dict):
                raise CommandError('run_trajectory: samples: expected {"t": [...], "q": [[...], ...]}')
            t = _number_list(s | {"cmd": "run_trajectory"}, "t")
            q = s.get("q")
            if not isinstance(q, list) or len(q) != len(t):
                raise CommandError("run_trajectory: samples: q must be a list with one row per time")
            rows = [_number_list({"cmd": "run_trajectory", f"q[{k}]": row}, f"q[{k}]", model.n) for k, row in enumerate(q)]
            plan = motion.plan_samples(model, cycle.hold.copy(), t, np.array(rows), cycle.rate_hz)
        else:
            raise CommandError('run_trajectory: expected "file" or "samples"')
        return self._start(plan)

    def set_payload(self, req: dict) -> dict:
        mass = _number(req, "mass", math.nan)
        com = _number_list(req, "com", 3) if "com" in req else [0.0, 0.0, 0.0]
        inertia = _number_list(req, "inertia", 6) if "inertia" in req else [0.0] * 6
        self.driver.set_payload(mass, com, inertia)
        return {"payload": {"mass": mass, "com": com, "inertia": inertia}}

    def _start(self, plan: motion.PlannedMotion) -> dict:
        self.driver.cycle.submit(lambda: self.driver.cycle.start_motion(plan))
        return {"duration": plan.duration, "segments": [{"name": n, "start": k / plan.rate_hz} for n, k in plan.segments]}


def _plain(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
