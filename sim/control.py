"""The running simulator's control socket: payload changes from outside (`armid sim --control ENDPOINT`).

A ZeroMQ REP socket takes one JSON object per request and answers one:

    {"cmd": "attach", "mass": 1.5, "com": [0.0, 0.0, 0.08], "inertia": [XX, XY, XZ, YY, YZ, ZZ]}
    {"cmd": "swap", ...the same fields...}       replace the payload attached
    {"cmd": "detach"}
    {"cmd": "status"}                            the payload attached (or null), the push acting, the cycle and time
    {"cmd": "push", "link": 3, "force": [0.0, 40.0, 0.0], "point": [0.1, 0.0, 0.0], "moment": [0, 0, 0],
     "duration": 0.2}                            an external wrench on a link (Simulator.apply_wrench)
    {"cmd": "release"}                           end the push

mass in kg, com in m (flange frame, default the flange origin), inertia about the centre of mass in flange
axes, kg m^2 (default 0: a point mass). `attach` needs the flange free and `swap` a payload on it, so a
script that lost track of the arm gets an error rather than a silent replacement. The answer is
{"ok": true, "payload": ...} once the change is applied (between two cycles), or {"ok": false, "error":
"..."} naming the field that was wrong; a malformed request never reaches the simulator and never stops it.

Requests are bounded before they are parsed (MAX_REQUEST_BYTES of UTF-8 JSON, finite numbers only) and
checked field by field: a payload must be a body that can exist (ident.payload.payload_parameters), of at
most MAX_MASS_FACTOR times the model's rated payload (MAX_MASS_KG when it has none), with its centre of mass
within MAX_COM_M of the flange. A push names the link (1..n, the one joint k moves), the force (N) and moment
(N m, default 0) in base axes, the point (m, in the link's frame, default its origin, within MAX_COM_M) and the
duration (s, default until `release`, at most MAX_PUSH_S); forces up to MAX_FORCE_N, moments up to
MAX_MOMENT_NM.
"""
from __future__ import annotations

import json
import math
import threading

import numpy as np
import zmq

from firmware_bridge.runtime.errors import InputError
from firmware_bridge.runtime.json_requests import decode_bounded
from ident.payload import payload_parameters

MAX_REQUEST_BYTES = 4096
MAX_MESSAGE_BYTES = 1 << 20  # ZeroMQ drops the peer beyond this (memory); up to it, requests get an error
MAX_MASS_FACTOR = 10.0      # times the model's rated payload
MAX_MASS_KG = 100.0         # without a rated payload
MAX_COM_M = 1.0
MAX_FORCE_N = 5000.0
MAX_MOMENT_NM = 1000.0
MAX_PUSH_S = 3600.0
DEFAULT_ENDPOINT = "tcp://127.0.0.1:*"   # a free loopback port: `bound` (and `armid sim`) name it
_FIELDS = {"attach": {"cmd", "mass", "com", "inertia"}, "swap": {"cmd", "mass", "com", "inertia"},
           "detach": {"cmd"}, "status": {"cmd"}, "push": {"cmd", "link", "force", "point", "moment", "duration"},
           "release": {"cmd"}}


class ControlError(InputError):
    """A control request that cannot be carried out; the message names the field."""


def decode(raw: bytes) -> dict:
    """The request object of one message, or ControlError naming the fault (never anything else)."""
    req = decode_bounded(raw, MAX_REQUEST_BYTES, ControlError)
    if req["cmd"] not in _FIELDS:
        raise ControlError(f"cmd: unknown {req['cmd'][:40]!r} (known: {', '.join(sorted(_FIELDS))})")
    extra = sorted(set(req) - _FIELDS[req["cmd"]])
    if extra:
        raise ControlError(f"{req['cmd']}: unknown field(s) {', '.join(repr(k[:40]) for k in extra)} "
                           f"(known: {', '.join(sorted(_FIELDS[req['cmd']] - {'cmd'}) or ['none'])})")
    return req


def _numbers(req: dict, name: str, count: int, default: tuple) -> np.ndarray:
    value = req[name] if name in req else list(default)
    if (not isinstance(value, list) or len(value) != count
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
        raise ControlError(f"{req['cmd']}: {name}: expected a list of {count} numbers")
    return np.asarray(value, dtype=float)


def payload_of(req: dict, max_mass: float) -> tuple[float, np.ndarray, np.ndarray]:
    """(mass kg, com (3,) m, inertia (6,) kg m^2) of an attach or swap request; ControlError when a field is
    missing, of the wrong kind, out of bounds, or not a body that can exist."""
    mass = req.get("mass")
    if isinstance(mass, bool) or not isinstance(mass, (int, float)):
        raise ControlError(f"{req['cmd']}: mass: expected a number of kg")
    if not 0.0 < mass <= max_mass:
        raise ControlError(f"{req['cmd']}: mass: expected more than 0 and at most {max_mass:g} kg, got {mass:g}")
    com = _numbers(req, "com", 3, (0.0, 0.0, 0.0))
    if np.linalg.norm(com) > MAX_COM_M:
        raise ControlError(f"{req['cmd']}: com: {np.linalg.norm(com):g} m from the flange; expected at most {MAX_COM_M:g} m")
    inertia = _numbers(req, "inertia", 6, (0.0,) * 6)
    try:
        payload_parameters(float(mass), com, inertia)
    except InputError as exc:
        raise ControlError(f"{req['cmd']}: {exc}") from None
    return float(mass), com, inertia


def push_of(req: dict, n: int) -> dict:
    """The arguments of Simulator.apply_wrench from a push request; ControlError naming the field that is missing,
    of the wrong kind or out of bounds."""
    link = req.get("link")
    if isinstance(link, bool) or not isinstance(link, int) or not 1 <= link <= n:
        raise ControlError(f"push: link: expected an integer 1..{n} (the link joint k moves)")
    if "force" not in req:
        raise ControlError("push: force: expected a list of 3 numbers (N, base axes)")
    out = {"link": link}
    for name, bound, unit in (("force", MAX_FORCE_N, "N"), ("moment", MAX_MOMENT_NM, "N m"), ("point", MAX_COM_M, "m")):
        v = _numbers(req, name, 3, (0.0, 0.0, 0.0))
        if np.linalg.norm(v) > bound:
            raise ControlError(f"push: {name}: {np.linalg.norm(v):g} {unit}; expected at most {bound:g} {unit}")
        out[name] = v
    duration = req.get("duration")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, (int, float))
                                 or not 0.0 < duration <= MAX_PUSH_S):
        raise ControlError(f"push: duration: expected a number of s, more than 0 and at most {MAX_PUSH_S:g}")
    out["duration"] = None if duration is None else float(duration)
    return out


class ControlServer:
    """The control socket of a Simulator: `ControlServer(sim, endpoint).start()`, `stop()`; `bound` is the
    endpoint bound (with the port chosen for "tcp://127.0.0.1:*"). attached: the payload the simulator
    carries already (mass, com, inertia as a request gives them), None for a free flange."""

    def __init__(self, sim, endpoint: str = DEFAULT_ENDPOINT, *, attached: dict | None = None,
                 context: zmq.Context | None = None):
        self.sim = sim
        self.endpoint = endpoint
        rated = float(getattr(sim.model, "rated_payload", 0.0) or 0.0)
        self.max_mass = MAX_MASS_FACTOR * rated if 0 < rated < math.inf else MAX_MASS_KG
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bound: str | None = None
        self.payload = attached               # {"mass", "com", "inertia"} on the flange (attach, swap, or at start)
        self.requests = self.refused = 0
        self.push: dict | None = None        # the last push request carried out (until release)

    def start(self) -> None:
        """Bind the socket (InputError when the endpoint cannot be bound) and serve in a thread."""
        sock = self._ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)      # a peer sending more is cut off by ZeroMQ
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as exc:
            sock.close(0)
            raise InputError(f"--control {self.endpoint}: cannot bind: {exc}") from None
        self._sock, self.bound = sock, sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._thread = threading.Thread(target=self._serve, name="armid-sim-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _serve(self) -> None:
        sock = self._sock
        try:
            while not self._stop.is_set():
                if not sock.poll(100):
                    continue
                frames = sock.recv_multipart()
                reply = (self.handle(frames[0]) if len(frames) == 1 else
                         {"ok": False, "error": f"request: expected one message frame, got {len(frames)}"})
                sock.send(json.dumps(reply).encode())
        finally:
            sock.close(0)

    def handle(self, raw: bytes) -> dict:
        """One request (bytes) -> its answer; never raises."""
        self.requests += 1
        try:
            reply = self._carry_out(decode(raw))
        except InputError as exc:
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - the simulator failed to apply it: say so, keep serving
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.refused += not reply["ok"]
        return reply

    def _carry_out(self, req: dict) -> dict:
        cmd = req["cmd"]
        if cmd == "status":
            s = self.sim.read_state()
            pushing = self.push if self.sim.plant.wrench_link >= 0 else None
            return {"ok": True, "payload": self.payload, "push": pushing, "cycle": s.cycle, "time": s.time}
        if cmd == "push":
            args = push_of(req, self.sim.n)
            self.sim.apply_wrench(**args)
            self.push = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
            return {"ok": True, "push": self.push}
        if cmd == "release":
            self.sim.clear_wrench()
            self.push = None
            return {"ok": True, "push": None}
        if cmd == "detach":
            if self.payload is None:
                raise ControlError("detach: no payload is attached")
            self.sim.detach_payload()
            self.payload = None
            return {"ok": True, "payload": None}
        mass, com, inertia = payload_of(req, self.max_mass)
        if cmd == "attach" and self.payload is not None:
            raise ControlError("attach: a payload is attached already (swap replaces it, detach removes it)")
        if cmd == "swap" and self.payload is None:
            raise ControlError("swap: no payload is attached (attach one)")
        self.sim.attach_payload(mass, com, inertia)
        self.payload = {"mass": mass, "com": com.tolist(), "inertia": inertia.tolist()}
        return {"ok": True, "payload": self.payload}
