"""The driver's command set: one JSON request in, one JSON reply out (docs/reference/stream.md, "Commands").

Request: {"cmd": NAME, ...arguments}. Reply: {"ok": true, ...} or {"ok": false, "error": "what was wrong"}.
Every motion is planned and checked against the limits (driver/motion.py) as a whole before the cycle is
asked to start it; the reply says so or names the joint, quantity and time.

  status                                      driver and drive states, position, fault, payload
  enable | disable | quick_stop | fault_reset
  move_to        q: [n] rad, speed: 0..1 (default 1)
  run_trajectory file: a trajectory file in the trajectory folder, periods (default 1)
                 | samples: {"t": [N] s, "q": [[n] x N] rad}
  servo          mode: "position" | "torque", timeout_cycles (default 50): take streamed setpoints from the
                 servo socket (driver.servo); the reply's token goes in every setpoint; servo_stop ends it;
                 torque: compensate ["gravity", "friction"] adds the model's (default: [model] compensate)
  set_payload    mass kg, com [3] m (flange frame), inertia [XX XY XZ YY YZ ZZ] kg m^2 about the CoM;
                 mass 0 clears it. Checked against the model's rated payload and reach, and the holding
                 torque it needs against the torque limits; planning checks and the feed-forward include it.
  collision      the collision settings (thresholds, reaction, on or off), counters and the last collision
  set_collision  contact, collision: N m (one number or one per joint), reaction: "quick_stop" | "stop_and_hold",
                 enabled: true | false; any subset. While the arm moves only stricter settings are taken
                 (lower thresholds); the rest is refused (driver.collision.check_change).

Requests are decoded with bounds (driver.requests). The motion commands are planned in the planner process
(driver.planner) when the daemon's command server runs them; `handle` and `handle_bytes` plan in the
calling thread (in-process use and tests).
"""
from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from driver import plan_requests
from driver.plan_requests import CommandError, number, number_list, only_keys
from driver.planner import PlanBounds, PlanJob
from driver.requests import RequestError, decode_request
from ident.errors import InputError

__all__ = ["Commands", "CommandError", "URGENT", "PLANNING"]

URGENT = ("quick_stop", "disable")          # answered before anything else waiting (driver.command_server)
PLANNING = ("move_to", "run_trajectory")    # planned in the planner process by the command server
FIELDS = {"set_payload": ("mass", "com", "inertia"), "servo": ("mode", "timeout_cycles", "buffer_cycles", "compensate"),
          "set_collision": ("contact", "collision", "reaction", "enabled", "back_off_distance",
                            "back_off_speed")}   # the rest take none
SMALL_REQUEST_BYTES = 64 * 1024             # larger requests can only be motions: decoded by the planner


class Commands:
    """Carries out requests on a driver (driver.daemon.Driver: model, cycle, payload)."""

    def __init__(self, driver, bounds: PlanBounds = PlanBounds()):
        self.driver = driver
        self.bounds = bounds
        self.table: dict[str, Callable[[dict], dict]] = {
            "status": self.status, "enable": self.enable, "disable": self.disable,
            "quick_stop": self.quick_stop, "stop": self.stop, "fault_reset": self.fault_reset, "set_payload": self.set_payload,
            "servo": self.servo, "servo_stop": self.servo_stop, "collision": self.collision,
            "set_collision": self.set_collision,
        }
        self.known = sorted([*self.table, *PLANNING])

    # -- synchronous use (tests, in-process callers) ---------------------------------------------------
    def handle_bytes(self, raw: bytes) -> bytes:
        """Decode, execute (planning in this thread), encode. Never raises."""
        try:
            req = decode_request(raw)
        except RequestError as exc:
            return encode({"ok": False, "error": str(exc)})
        return encode(self.handle(req))

    def handle(self, req: Any) -> dict:
        """Execute one decoded request; motions are planned in this thread. Never raises."""
        if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
            return {"ok": False, "error": 'request: expected a JSON object with a "cmd" string'}
        if req["cmd"] in PLANNING:
            return self.guarded(req["cmd"], lambda: self._plan_here(req))
        return self.run(req)

    def _plan_here(self, req: dict) -> dict:
        job = self.plan_job(encode(req))
        plan = plan_requests.plan_request(job.raw, job.model, job.q_now, job.rate_hz, job.bounds)
        return self.start(plan)

    # -- used by the command server --------------------------------------------------------------------
    def run(self, req: dict) -> dict:
        """Execute a decoded request that is not a motion (those go through plan_job and start)."""
        cmd = req["cmd"]
        fn = self.table.get(cmd)
        if fn is None:
            if cmd in PLANNING:
                return {"ok": False, "error": f"{cmd}: a motion command must be planned"}
            return {"ok": False, "error": f"unknown command {cmd[:60]!r} (known: {', '.join(self.known)})"}
        def call() -> dict:
            only_keys(req, FIELDS.get(cmd, ()))
            return fn(req)

        return self.guarded(cmd, call)

    @staticmethod
    def guarded(cmd: str, fn: Callable[[], dict | None]) -> dict:
        """{"ok": true, **fn()}, or the error reply of what it raised (a driver refusal or bad input)."""
        from driver.cycle import DriverFault

        try:
            return {"ok": True, **(fn() or {})}
        except (InputError, DriverFault, TimeoutError) as exc:
            return {"ok": False, "error": named(cmd, str(exc))}

    def plan_job(self, raw: bytes) -> PlanJob:
        """What the planner needs for the motion request `raw`: the planning model (with the payload), the
        pose the motion starts from, the cycle's rate and the bounds."""
        d = self.driver
        return PlanJob(raw, d.planning_model, d.cycle.hold.copy(), d.cycle.rate_hz, self.bounds)

    def start(self, plan) -> dict:
        """Hand a planned motion to the cycle; the reply's fields. A plan asked to preempt blends the running motion
        into it (driver.blending); with none running, it starts as any plan if it starts at rest."""
        if plan.preempt:
            blended = self._preempt(plan)
            if blended is not None:
                return {"duration": blended.duration, "preempted": True,
                        "segments": [{"name": n, "start": k / plan.rate_hz} for n, k in blended.segments]}
            start = dict(plan.segments).get("run_trajectory", 0)
            if np.abs(plan.qd[start]).max() > 1e-6:
                raise CommandError("run_trajectory: preempt: no motion is running to blend from, and the trajectory "
                                   "does not start at rest")
        self.driver.cycle.submit(lambda: self.driver.cycle.start_motion(plan))
        return {"duration": plan.duration, "segments": [{"name": n, "start": k / plan.rate_hz} for n, k in plan.segments],
                "goal": plan.q[-1].tolist()}

    def _preempt(self, plan):
        """The running motion blended into `plan` from a setpoint just ahead; None when no motion runs."""
        from driver import blending
        from driver.cycle import DriverFault
        c = self.driver.cycle
        for factor in (1.0, 4.0):
            m, k = c.motion, c._k
            if m is None:
                return None
            at = min(k + blending.lead_cycles(c.rate_hz, factor), m.samples - 1)
            successor = blending.plan_blend(self.driver.planning_model, m, at, plan)
            try:
                if c.submit(lambda: c.replace_motion(m, at, successor)):
                    return successor
                return None                     # the running motion ended meanwhile
            except DriverFault:
                continue
        raise CommandError("run_trajectory: preempt: the cycle outran the blend's planning twice; send it again")

    # -- commands ------------------------------------------------------------------------------------
    def status(self, req: dict) -> dict:
        return self.driver.status()

    def enable(self, req: dict) -> dict:
        self.driver.cycle.submit(self.driver.cycle.enable)
        return {}

    def disable(self, req: dict) -> dict:
        return self._urgent(self.driver.cycle.disable)

    def quick_stop(self, req: dict) -> dict:
        return self._urgent(self.driver.cycle.request_quick_stop)

    def _urgent(self, fn) -> dict:
        """Ahead of everything the cycle has queued (driver.cycle.Cycle.urgent): read_seq, the state messages
        published when the driver read the request; seq, the first message that carries its effect."""
        cycle = self.driver.cycle
        read_seq = cycle.seq
        return {"seq": cycle.urgent(fn), "read_seq": read_seq}

    def stop(self, req: dict) -> dict:
        """A controlled stop along the running motion's path, the drives staying enabled (driver.stopping);
        refused (nothing changed: quick_stop then) when the stop would break a limit."""
        from driver import stopping
        from driver.cycle import DriverFault

        c = self.driver.cycle
        for lead in (stopping.LEAD_S, 4 * stopping.LEAD_S):
            m, k = c.motion, c._k
            if m is None:
                return {"stopped": False, "duration": 0.0}
            at = min(k + max(1, int(round(lead * c.rate_hz))), m.samples - 1)
            plan = stopping.plan_stop(self.driver.planning_model, m, at)
            try:
                replaced = c.submit(lambda: c.replace_motion(m, at, plan))
            except DriverFault:
                continue                        # the cycle passed the planned start: again, further ahead
            return {"stopped": replaced, "duration": plan.duration if replaced else 0.0}
        raise CommandError("stop: the cycle outran the stop's planning twice; use quick_stop")

    def fault_reset(self, req: dict) -> dict:
        self.driver.cycle.submit(self.driver.cycle.fault_reset)
        return {}

    def servo(self, req: dict) -> dict:
        from driver.servo import DEFAULT_BUFFER_CYCLES, DEFAULT_TIMEOUT_CYCLES, MAX_DEPTH, MAX_TIMEOUT_CYCLES
        from firmware_bridge.servo_wire import MODES

        mode = req.get("mode", "position")
        if mode not in MODES:
            raise CommandError(f"servo: mode {str(mode)[:40]!r}: expected one of {', '.join(MODES)}")
        timeout = number(req, "timeout_cycles", DEFAULT_TIMEOUT_CYCLES)
        if timeout != int(timeout) or not 1 <= timeout <= MAX_TIMEOUT_CYCLES:
            raise CommandError(f"servo: timeout_cycles {timeout!r}: expected a whole number 1..{MAX_TIMEOUT_CYCLES}")
        depth = number(req, "buffer_cycles", DEFAULT_BUFFER_CYCLES)
        if depth != int(depth) or not 0 <= depth <= MAX_DEPTH:
            raise CommandError(f"servo: buffer_cycles {depth!r}: expected a whole number 0..{MAX_DEPTH}")
        compensate = req.get("compensate")
        if compensate is not None and mode != "torque":
            raise CommandError("servo: compensate: only a torque session adds the model's torque")
        return self.driver.start_servo(mode, int(timeout), int(depth), compensate)

    def servo_stop(self, req: dict) -> dict:
        cycle = self.driver.cycle
        cycle.submit(lambda: cycle.end_servo("servo_stop requested"))
        return {"servo": self.driver.servo_status()}

    def set_payload(self, req: dict) -> dict:
        if "mass" not in req:
            raise CommandError("set_payload: mass: expected a number of kg (0 clears the payload)")
        mass = number(req, "mass", 0.0)
        com = number_list(req, "com", 3) if "com" in req else [0.0, 0.0, 0.0]
        inertia = number_list(req, "inertia", 6) if "inertia" in req else [0.0] * 6
        self.driver.set_payload(mass, com, inertia)
        return {"payload": {"mass": mass, "com": com, "inertia": inertia}}


    def collision(self, req: dict) -> dict:
        return {"collision": self.driver.cycle.monitor.status()}

    def set_collision(self, req: dict) -> dict:
        if len(req) == 1:
            raise CommandError("set_collision: expected at least one of contact, collision, reaction, enabled, "
                               "back_off_distance, back_off_speed")
        levels = {}
        for key in ("contact", "collision"):
            if key in req:
                levels[key] = number_list(req, key, self.driver.model.n) if isinstance(req[key], list) \
                    else number(req, key, 0.0)
        reaction = req.get("reaction")
        if reaction is not None and not isinstance(reaction, str):
            raise CommandError("set_collision: reaction: expected a string")
        enabled = req.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise CommandError("set_collision: enabled: expected true or false")
        for key in ("back_off_distance", "back_off_speed"):
            if key in req:
                levels[key] = number(req, key, 0.0)
        return {"collision": self.driver.set_collision(reaction=reaction, enabled=enabled, **levels)}


def named(cmd: str, text: str) -> str:
    """An error text that begins with the command it refuses: as it is when it does, else "cmd: text"."""
    return text if text.startswith((f"{cmd}:", f"{cmd} ")) else f"{cmd}: {text}"


def encode(obj: dict) -> bytes:
    """A reply as JSON bytes (numpy values as plain numbers)."""
    return json.dumps(obj, allow_nan=False, default=_plain).encode()


def _plain(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
