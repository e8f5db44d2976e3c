"""A Python client for a running armid driver: its state stream and its commands (docs/reference/stream.md).

    from armid.client import ArmClient

    with ArmClient("tcp://127.0.0.1:5555", "tcp://127.0.0.1:5556") as arm:
        arm.enable()
        print(arm.latest().q)                               # the newest sample, numpy arrays in SI units
        arm.run_trajectory(preset="seed000", wait=True)     # blocks until the motion ends (MotionFailed on a fault)
        for sample in arm.samples(count=1000):              # every sample, in order
            ...

Every call is bounded in time; none waits forever. A command is sent only on a connection whose handshake
has completed, within `timeout_s` (a refused or unfinished handshake gets a new socket within that limit);
its reply then comes within `timeout_s` (`plan_timeout_s` for a motion); a sample or a health message within
the timeout given; close() discards what is unsent (LINGER 0). Running out raises NoReply naming the endpoint
and what was waited for. ServoStream.send never blocks.

Commands follow ZeroMQ's "lazy pirate" pattern: a request without a reply within `timeout_s` closes the REQ
socket, builds a new one and sends again (`retries` times), so a client outlives a daemon restart; after the
last try it raises NoReply. Only `status` is retried: a command that may move the arm is never sent twice, and
NoReply then says so. An error reply raises CommandRefused with the driver's message. The stream's
subscriber counts what was lost: `seq_gaps` (messages dropped between the driver and this client) and
`lost_samples` (device samples the driver never received, the stream's flags); `last_sample` is the last one
read, without reading another, and `health()` the driver's newest health message. Every method may be called
from any thread (one lock per socket); a notebook can keep one client open and call it from cells.

In the examples of the docstrings, `driver` is a driver.daemon.Driver running on the simulated generic6 arm,
started in the same process as docs/examples/client_move.py starts one, and `arm` a client connected to it.

CurveZMQ: a driver whose command endpoint is beyond loopback requires it. Give the server's public
certificate and the client's secret certificate, as `zmq.auth.create_certificates` writes them
(`curve_server_public`, `curve_client_secret`); the client's public certificate must be in the driver's
authorized_clients_dir.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zmq

from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError

DEFAULT_STATE = "tcp://127.0.0.1:5555"
DEFAULT_COMMANDS = "tcp://127.0.0.1:5556"
MOTION_MARGIN_S = 20.0      # s a motion may outlast its planned duration when waited for
PLANNING = ("move_to", "run_trajectory")
PLAN_REPLY_S = 90.0         # s to wait for a motion's reply: the driver plans it first (its planner's bound is
                            # 60 s; the first plan of a fresh install also compiles the planner's kernels)
POLL_S = 0.05               # s between status polls while waiting
ARRIVED_TOLERANCE = 2e-3    # rad (m for prismatic joints): a waited-for motion has arrived when every measured
                            # joint is this close to the motion's goal
SETTLE_S = 2.0              # s after the last target a waited-for motion has to arrive, else MotionFailed
FIRST_HANDSHAKE_WAIT_S = 0.25   # s a new command socket may take to complete its handshake before it is replaced
MAX_HANDSHAKE_WAIT_S = 2.0      # (the wait doubles with each new socket, up to this, within the client's timeout)


class ClientError(InputError):
    """Something the client could not do; the message says what and where."""


class NoReply(ClientError):
    """The driver did not answer (after the retries, for status)."""


class CommandRefused(ClientError):
    """The driver answered with an error: the message is the driver's."""


class MotionFailed(ClientError):
    """A waited-for motion or enable did not complete: the driver faulted, it took too long, or the arm did not
    arrive at the motion's goal (the message names the joint and its error)."""


@dataclass(frozen=True)
class Sample:
    """One state message, decoded (docs/reference/stream.md): (n,) arrays in SI units, the flags as properties."""

    seq: int
    flags: int
    device_time_ns: int
    host_time_ns: int
    q: np.ndarray
    qd: np.ndarray
    current: np.ndarray
    torque: np.ndarray
    statusword: np.ndarray
    error_code: np.ndarray
    mode: np.ndarray

    @classmethod
    def decode(cls, payload: bytes) -> "Sample":
        """A Sample from a state payload (StreamDecodeError naming what is wrong with it)."""
        r = stream.decode_state(payload)
        return cls(int(r["seq"]), int(r["flags"]), int(r["device_time_ns"]), int(r["host_time_ns"]),
                   *(np.array(r[k]) for k in ("q", "qd", "current", "torque", "statusword", "error_code", "mode")))

    enabled = property(lambda self: bool(self.flags & stream.FLAG_ENABLED))
    moving = property(lambda self: bool(self.flags & stream.FLAG_MOVING))
    fault = property(lambda self: bool(self.flags & stream.FLAG_FAULT))
    stale = property(lambda self: bool(self.flags & stream.FLAG_STALE))
    lost = property(lambda self: stream.lost_samples(self.flags))


class ArmClient:
    """The state stream and the commands of one running driver.

    Parameters
    ----------
    state, commands : str
        The driver's endpoints (its config's [zmq] state and commands).
    timeout_s : float
        Seconds to wait for a connection to the driver to complete its handshake before a command is sent,
        for each reply but a motion's, and, by default, for a sample (0 < s <= 3600).
    retries : int
        Times `status` is sent again on a new socket when no reply comes (lazy pirate), >= 0.
    plan_timeout_s : float
        Seconds to wait for a motion's reply (move_to, run_trajectory): the driver plans it first
        (0 < s <= 3600).
    curve_server_public, curve_client_secret : str or Path, optional
        CurveZMQ certificate files (both or neither).
    context : zmq.Context, optional
        The ZeroMQ context (default: the process's shared one).

    Raises
    ------
    ClientError
        A timeout or retries out of range, one CurveZMQ certificate without the other, or a certificate
        that cannot be read.

    See Also
    --------
    armid.testing : The `armid_hil` pytest fixture, a simulator and a driver with a connected client.

    Examples
    --------
    In these examples `driver` is a driver.daemon.Driver running on the simulated generic6 arm, started
    in this process as docs/examples/client_move.py starts one, and `arm` a client connected to it.

    >>> from armid.client import ArmClient
    >>> with ArmClient(driver.bound["state"], driver.bound["commands"]) as client:
    ...     client.status()["ok"], client.latest().q.shape
    (True, (6,))
    >>> ArmClient(timeout_s=0)
    Traceback (most recent call last):
    ...
    armid.client.ClientError: timeout_s: expected 0 < seconds <= 3600, got 0
    """

    def __init__(self, state: str = DEFAULT_STATE, commands: str = DEFAULT_COMMANDS, *, timeout_s: float = 5.0,
                 retries: int = 3, plan_timeout_s: float = PLAN_REPLY_S, curve_server_public: str | Path | None = None,
                 curve_client_secret: str | Path | None = None, context: zmq.Context | None = None):
        for name, value in (("timeout_s", timeout_s), ("plan_timeout_s", plan_timeout_s)):
            if not (isinstance(value, (int, float)) and 0 < value <= 3600):
                raise ClientError(f"{name}: expected 0 < seconds <= 3600, got {value!r}")
        if not (isinstance(retries, int) and retries >= 0):
            raise ClientError(f"retries: expected an integer >= 0, got {retries!r}")
        if (curve_server_public is None) != (curve_client_secret is None):
            raise ClientError("curve: give both curve_server_public and curve_client_secret, or neither")
        self.state_endpoint, self.commands_endpoint = state, commands
        self.timeout_s, self.retries, self.plan_timeout_s = float(timeout_s), int(retries), float(plan_timeout_s)
        self.ctx = context or zmq.Context.instance()
        self._curve = None if curve_server_public is None else _curve_keys(curve_server_public, curve_client_secret)
        self._req: zmq.Socket | None = None
        self._sub: zmq.Socket | None = None
        self._health_sub: zmq.Socket | None = None
        self._req_lock, self._sub_lock, self._health_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self._last_sample: Sample | None = None
        self._last_seq: int | None = None
        self.seq_gaps = 0           # messages dropped between the driver and this client
        self.lost_samples = 0       # device samples the driver reported lost
        self.bad_messages = 0       # messages that did not decode (counted, never returned)
        self._callbacks: list[threading.Thread] = []
        self._closing = threading.Event()

    # -- commands -----------------------------------------------------------------------------------------
    def request(self, cmd: str, **fields) -> dict:
        """Send one command and return the driver's reply (docs/reference/stream.md lists the commands).

        The command is sent once a connection's handshake completes (within the client's timeout_s; a
        socket whose handshake was refused is replaced within that limit), and its reply awaited for timeout_s
        (plan_timeout_s for a motion). Only `status` is retried, on a new socket, when no reply comes: a
        command that may move the arm is never sent twice.

        Parameters
        ----------
        cmd : str
            The command's name.
        **fields
            Its fields (JSON-serialisable).

        Returns
        -------
        dict
            The reply; "ok" is True.

        Raises
        ------
        CommandRefused
            The driver answered with an error (its message).
        NoReply
            Not sent within the timeout (no driver there, or its handshake refused), or no reply within the
            timeout (after the retries, for status); the message names the endpoint and what was waited for.
        ClientError
            An endpoint ZeroMQ cannot connect to.

        Examples
        --------
        >>> arm.request("status")["ok"]
        True
        >>> arm.request("no_such_command")
        Traceback (most recent call last):
        ...
        armid.client.CommandRefused: unknown command 'no_such_command' ...
        """
        message = json.dumps({"cmd": cmd, **fields}).encode()
        tries = 1 + (self.retries if cmd == "status" else 0)
        timeout_s = self.plan_timeout_s if cmd in PLANNING else self.timeout_s
        with self._req_lock:
            for attempt in range(tries):
                self._send_request(cmd, message)
                if self._req.poll(int(timeout_s * 1000)):
                    reply = json.loads(self._req.recv(zmq.NOBLOCK))
                    break
                self._drop_req()                    # lazy pirate: a REQ socket without its reply is stuck
            else:
                again = "" if tries > 1 else f" ({cmd} is not sent twice: it may have been carried out)"
                raise NoReply(f"{self.commands_endpoint}: no reply to {cmd} within {timeout_s:g} s"
                              f"{f' x {tries}' if tries > 1 else ''}{again} (is the driver running there?)")
        if not reply.get("ok"):
            raise CommandRefused(str(reply.get("error", reply)))     # the driver's words name the command
        return reply

    def status(self) -> dict:
        """The driver's status (docs/reference/stream.md): enabled, moving, fault, counters.

        Returns
        -------
        dict

        Raises
        ------
        NoReply
            No reply after the retries.

        Examples
        --------
        >>> status = arm.status()
        >>> status["ok"], sorted({"enabled", "moving", "fault"} - set(status))
        (True, [])
        """
        return self.request("status")

    def enable(self, *, wait: bool = True, timeout_s: float = 10.0) -> None:
        """Enable every drive (CiA 402 OPERATION ENABLED).

        Parameters
        ----------
        wait : bool
            Block until every drive is enabled.
        timeout_s : float
            Seconds to wait for that.

        Returns
        -------
        None

        Raises
        ------
        MotionFailed
            With wait: the driver faulted, or the drives did not all enable within timeout_s.
        CommandRefused
            The driver refused the command.

        Examples
        --------
        >>> arm.enable()
        >>> arm.status()["enabled"], arm.latest().enabled
        (True, True)
        """
        self.request("enable")
        if wait:
            self.wait_enabled(timeout_s)

    def wait_enabled(self, timeout_s: float) -> dict:
        """Block until every drive is enabled.

        Parameters
        ----------
        timeout_s : float
            Seconds to wait at most.

        Returns
        -------
        dict
            The last status.

        Raises
        ------
        MotionFailed
            The driver faulted, or timeout_s passed.

        Examples
        --------
        >>> arm.enable(wait=False)
        >>> arm.wait_enabled(10.0)["enabled"]
        True
        """
        return self._await(lambda s: s["enabled"], timeout_s, "the drives did not all enable")

    def disable(self) -> None:
        """Disable every drive (the brakes hold the arm); a running motion stops.

        Raises
        ------
        CommandRefused, NoReply
            As `request`.

        Examples
        --------
        >>> arm.enable()
        >>> arm.disable()
        >>> arm.enable()                                    # and on again
        >>> arm.status()["enabled"]
        True
        """
        self.request("disable")

    def quick_stop(self) -> None:
        """Quick-stop every drive (CiA 402 QUICK STOP ACTIVE): the arm decelerates to rest; `enable` resumes.

        Raises
        ------
        CommandRefused, NoReply
            As `request`.

        Examples
        --------
        >>> arm.enable()
        >>> arm.quick_stop()
        >>> arm.enable()
        >>> arm.status()["enabled"]
        True
        """
        self.request("quick_stop")

    def fault_reset(self) -> None:
        """Reset the drives' faults and the driver's (the cause must be gone); `enable` afterwards.

        Raises
        ------
        CommandRefused, NoReply
            As `request`.

        Examples
        --------
        >>> arm.fault_reset()
        >>> arm.status()["fault"] is None
        True
        """
        self.request("fault_reset")

    def move_to(self, q, *, speed: float = 1.0, wait: bool = False) -> dict:
        """A rest-to-rest move to a joint position, checked against the limits before it starts.

        Parameters
        ----------
        q : array_like, shape (n,)
            The goal, rad (m for prismatic joints).
        speed : float
            Fraction of the limits the planner may use, (0, 1].
        wait : bool
            Block until the arm has arrived: every measured joint within ARRIVED_TOLERANCE (2 mrad) of the
            goal, at most SETTLE_S (2 s) after the motion's last target (`wait_arrived`).

        Returns
        -------
        dict
            The driver's reply; "duration" is the planned motion's length (s), "goal" its last sample.

        Raises
        ------
        CommandRefused
            A goal beyond the limits, drives not enabled, a motion already running (the driver's message).
        MotionFailed
            With wait: the driver faulted, or the motion outlasted its plan by far.

        Examples
        --------
        >>> import numpy as np
        >>> arm.enable()
        >>> reply = arm.move_to([0.2, -0.1, 0.1, 0.0, 0.0, 0.3], speed=0.5, wait=True)
        >>> reply["duration"] > 0, bool(np.allclose(arm.latest().q, [0.2, -0.1, 0.1, 0.0, 0.0, 0.3], atol=2e-3))
        (True, True)
        >>> arm.move_to([0.0, 0.0, 9.0, 0.0, 0.0, 0.0])
        Traceback (most recent call last):
        ...
        armid.client.CommandRefused: move_to refused: joint j3: goal 9...
        """
        return self._motion(wait, "move_to", q=[float(x) for x in np.asarray(q, dtype=float).reshape(-1)],
                            speed=float(speed))

    def run_trajectory(self, *, file: str | None = None, preset: str | None = None, samples=None,
                       periods: float | None = None, blend_s: float | None = None, preempt: bool = False,
                       wait: bool = False) -> dict:
        """Run a trajectory: a file in the driver's trajectory folder, a shipped preset, or samples.

        The driver checks the whole motion against the limits and moves to its start first.

        Parameters
        ----------
        file : str, optional
            A trajectory file name in the driver's trajectory folder (docs/reference/trajectory-file.md).
        preset : str, optional
            A shipped trajectory (ident.fit.excitation.presets()).
        samples : tuple of array_like, optional
            (t (N,) s, q (N, n) rad): a sampled motion, through its waypoints on a cubic spline at rest at both
            ends; (t, q, qd (N, n) rad/s): with the velocity at each waypoint (a cubic Hermite spline); (t, q, qd,
            qdd (N, n) rad/s^2): with the accelerations too (a quintic one).
        periods : float, optional
            Periods of a Fourier trajectory to run.
        blend_s : float, optional
            Seconds over which a preset is blended in from rest and out.
        preempt : bool
            With samples: take over from the running motion while it moves (a quintic blend from its state into the
            samples, whose time 0 is the hand-over); with none running, the samples must start at rest.
        wait : bool
            Block until the arm has arrived at the trajectory's last sample (as move_to's wait).

        Returns
        -------
        dict
            The driver's reply, with the motion's "duration" (s).

        Raises
        ------
        CommandRefused
            A motion beyond the limits or a trajectory the driver cannot read (its message).
        MotionFailed
            With wait: the driver faulted, or the motion outlasted its plan by far.

        Examples
        --------
        >>> import numpy as np
        >>> arm.enable()
        >>> t = np.linspace(0.0, 1.0, 101)
        >>> q = np.outer(0.1 * np.sin(np.pi * t) ** 2, np.ones(6))     # out and back to rest at 0
        >>> _ = arm.move_to(q[0], wait=True)
        >>> reply = arm.run_trajectory(samples=(t, q), wait=True)
        >>> reply["ok"], bool(np.allclose(arm.latest().q, q[-1], atol=2e-3))
        (True, True)
        """
        fields: dict = {}
        if file is not None:
            fields["file"] = str(file)
        if preset is not None:
            fields["preset"] = str(preset)
        if samples is not None:
            if not 2 <= len(samples) <= 4:
                raise ClientError(f"samples: expected (t, q), (t, q, qd) or (t, q, qd, qdd), got {len(samples)} arrays")
            fields["samples"] = {key: np.asarray(value, dtype=float).tolist()
                                 for key, value in zip(("t", "q", "qd", "qdd"), samples) if value is not None}
        if periods is not None:
            fields["periods"] = float(periods)
        if blend_s is not None:
            fields["blend_s"] = float(blend_s)
        if preempt:
            fields["preempt"] = True
        return self._motion(wait, "run_trajectory", **fields)

    def set_payload(self, mass: float, com=(0.0, 0.0, 0.0), inertia=(0.0,) * 6) -> None:
        """Tell the driver the payload at the flange (its feed-forward and limit checks use it).

        Parameters
        ----------
        mass : float
            kg.
        com : array_like, shape (3,)
            Centre of mass in the flange frame, m.
        inertia : array_like, shape (6,)
            XX XY XZ YY YZ ZZ about the centre of mass, kg m^2.

        Returns
        -------
        None

        Raises
        ------
        CommandRefused
            A payload that is not a body or that the arm is not rated for (the driver's message).

        Examples
        --------
        >>> arm.set_payload(1.0, com=(0.0, 0.0, 0.05))
        >>> arm.set_payload(0.0)                            # no payload
        """
        self.request("set_payload", mass=float(mass), com=[float(x) for x in com],
                     inertia=[float(x) for x in inertia])

    def servo(self, mode: str = "position", *, timeout_cycles: int | None = None,
              buffer_cycles: int | None = None, compensate: list[str] | None = None) -> "ServoStream":
        """Begin servo mode: stream position or torque setpoints, each checked against the limits on arrival.

        The driver's reply carries this session's token; the returned stream puts it in every setpoint, and the
        driver uses no setpoint without it.

        Parameters
        ----------
        mode : {"position", "torque"}
            Setpoints in rad or in N m.
        timeout_cycles : int, optional
            Cycles without a setpoint after which the drives quick-stop.
        buffer_cycles : int, optional
            The driver's setpoint buffer (default 2; 0: the newest setpoint each cycle).
        compensate : list of {"gravity", "friction"}, optional
            Torque mode: the model's terms the driver adds to each setpoint (default: the driver config's
            ``[model] compensate``; ``[]`` for none). With both, a setpoint of zeros holds the arm.

        Returns
        -------
        ServoStream
            A context manager whose exit sends servo_stop; `send` one setpoint per cycle at most (after a
            pause, the one for now rather than the missed ones).

        Raises
        ------
        CommandRefused
            Drives not enabled, a motion running, or an unknown mode.
        ClientError
            The driver gave no session token (a driver older than this client); servo mode is stopped again.

        Examples
        --------
        A smooth 0.05 rad move of every joint over one second, each setpoint computed for the time it carries:

        >>> import time
        >>> import numpy as np
        >>> from ident.fit.excitation import smooth_ramp
        >>> arm.enable()
        >>> start, t0 = arm.latest().q, time.time_ns()
        >>> with arm.servo("position", timeout_cycles=500) as stream:
        ...     while (now := time.time_ns()) < t0 + 1_200_000_000:
        ...         _ = stream.send(start + 0.05 * smooth_ramp((now - t0) / 1e9)[0], t_ns=now)
        ...         time.sleep(0.001)
        >>> ended = arm.status()["servo"]
        >>> ended["accepted"] > 0, ended["last_error"], bool(np.allclose(arm.latest().q, start + 0.05, atol=2e-3))
        (True, '', True)
        """
        fields = {"mode": mode} | ({} if timeout_cycles is None else {"timeout_cycles": int(timeout_cycles)}) \
            | ({} if buffer_cycles is None else {"buffer_cycles": int(buffer_cycles)}) \
            | ({} if compensate is None else {"compensate": list(compensate)})
        reply = self.request("servo", **fields)
        token = reply.get("token")
        if isinstance(token, bool) or not isinstance(token, int) or not 0 < token < 2 ** 64:
            self.request("servo_stop")
            raise ClientError(f"servo: the driver's reply has no session token ({str(token)[:40]!r}): it is older "
                              f"than this client, which streams servo setpoints of version 2")
        return ServoStream(self, reply["endpoint"], mode, token)

    def wait_motion(self, timeout_s: float, progress: Callable[[float], object] | None = None) -> dict:
        """Block until no motion runs.

        Parameters
        ----------
        timeout_s : float
            Seconds to wait at most.
        progress : callable, optional
            progress(seconds waited), called between the status polls.

        Returns
        -------
        dict
            The last status.

        Raises
        ------
        MotionFailed
            The driver faulted, or timeout_s passed.

        Examples
        --------
        >>> arm.enable()
        >>> reply = arm.move_to([0.0] * 6)
        >>> arm.wait_motion(reply["duration"] + 10.0)["moving"]
        False
        """
        return self._await(lambda s: not s["moving"], timeout_s, "the motion did not end", progress)

    def _motion(self, wait: bool, cmd: str, **fields) -> dict:
        reply = self.request(cmd, **fields)
        if wait:
            self.wait_motion(float(reply.get("duration", 0.0)) + MOTION_MARGIN_S)
            if "goal" in reply:
                self.wait_arrived(reply["goal"])
        return reply

    def wait_arrived(self, goal, *, tolerance: float = ARRIVED_TOLERANCE, settle_s: float = SETTLE_S) -> dict:
        """Block until every measured joint is within `tolerance` of `goal` (the arm has arrived, not only its
        targets: the drives' setpoint buffer and tracking run a few cycles behind them). The driver is asked
        (`status`: the angles it measured last), so the answer does not depend on how fast this client reads the
        stream: a client starved of CPU time gets it as soon as it asks.

        Parameters
        ----------
        goal : array_like, shape (n,)
            rad (m for prismatic joints), e.g. a motion reply's "goal".
        tolerance : float
            rad (m), per joint.
        settle_s : float
            Seconds to wait at most.

        Returns
        -------
        dict
            The first status reply whose "q" is within the tolerance.

        Raises
        ------
        MotionFailed
            The driver faulted, or after settle_s a joint is still farther away (named, with its error).
        """
        goal = np.asarray(goal, dtype=float)
        deadline = time.monotonic() + settle_s
        while True:
            status = self.status()
            if status.get("fault"):
                raise MotionFailed(f"the driver faulted: {status['fault']}")
            error = np.asarray(status["q"], dtype=float) - goal
            if not (np.abs(error) > tolerance).any():
                return status
            if time.monotonic() > deadline:
                j = int(np.argmax(np.abs(error)))
                raise MotionFailed(f"the arm did not arrive within {settle_s:g} s of the motion's end: joint "
                                   f"{j + 1} is {error[j]:+.4g} from its goal {goal[j]:.6g} (tolerance "
                                   f"{tolerance:g})")
            time.sleep(0.002)

    def _await(self, done: Callable[[dict], bool], timeout_s: float, what: str,
               progress: Callable[[float], object] | None = None) -> dict:
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            status = self.status()
            if status.get("fault"):
                raise MotionFailed(f"the driver faulted: {status['fault']}")
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise MotionFailed(f"{what} within {timeout_s:.1f} s")
            if progress is not None:
                progress(time.monotonic() - started)
            time.sleep(POLL_S)

    def _send_request(self, cmd: str, message: bytes) -> None:
        """Hand `message` to a connection whose handshake has completed, within the client's timeout.

        The REQ socket queues only on completed connections (IMMEDIATE): until one is ready, nothing is sent.
        A handshake the driver refused (CURVE keys, an authenticator not yet serving) ends that connection for
        good, so a socket that stays unwritable is replaced by a new one, within the same time limit. Nothing
        has left this client when this runs out, so it is safe for any command."""
        deadline = time.monotonic() + self.timeout_s
        wait_s = FIRST_HANDSHAKE_WAIT_S
        while True:
            sock = self._req_socket()
            left = deadline - time.monotonic()
            if sock.poll(int(max(0.0, min(wait_s, left)) * 1000), zmq.POLLOUT):
                try:
                    sock.send(message, zmq.NOBLOCK)
                    return
                except zmq.Again:
                    pass
            self._drop_req()
            if time.monotonic() >= deadline:
                keys = "this client's CURVE keys" if self._curve is not None else "a client without CURVE keys"
                raise NoReply(f"{self.commands_endpoint}: {cmd} not sent: no connection to a driver completed its "
                              f"handshake within {self.timeout_s:g} s (is the driver running there, and does it "
                              f"accept {keys}?)")
            wait_s = min(2.0 * wait_s, MAX_HANDSHAKE_WAIT_S)

    def _req_socket(self) -> zmq.Socket:
        if self._req is None:
            sock = self.ctx.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)       # writable only once a connection's handshake completed
            if self._curve is not None:
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self._curve
            _connect(sock, self.commands_endpoint)
            self._req = sock
        return self._req

    def _drop_req(self) -> None:
        if self._req is not None:
            self._req.close(0)
            self._req = None

    # -- the stream ---------------------------------------------------------------------------------------
    def latest(self, timeout_s: float | None = None) -> Sample:
        """The newest sample: what has arrived is read and the last one returned.

        Parameters
        ----------
        timeout_s : float, optional
            Seconds to wait for a sample when none has arrived (default: the client's timeout).

        Returns
        -------
        Sample
            (n,) arrays in SI units (q rad, qd rad/s, current A, torque N m) and the flags.

        Raises
        ------
        NoReply
            No sample came within the timeout.

        Examples
        --------
        >>> sample = arm.latest()
        >>> sample.q.shape, sample.fault
        ((6,), False)
        """
        called_ns = time.time_ns()
        with self._sub_lock:
            newest = self._next(timeout_s)
            stop = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
            # what has arrived, up to a sample the driver read after this call (new enough: a reader slower than
            # the stream returns too), within the timeout
            while newest.host_time_ns < called_ns and time.monotonic() < stop:
                more = self._next(0.0, raise_on_timeout=False)
                if more is None:
                    return newest
                newest = more
            return newest

    def samples(self, count: int | None = None, timeout_s: float | None = None) -> Iterator[Sample]:
        """Every sample not read yet, in order: first those queued since the last read (up to the stream's queue
        bound), then each as it comes. latest() skips to the newest.

        Parameters
        ----------
        count : int, optional
            How many (default: until the client closes).
        timeout_s : float, optional
            Seconds to wait for each (default: the client's timeout).

        Yields
        ------
        Sample

        Raises
        ------
        NoReply
            A sample did not come within the timeout.

        Examples
        --------
        >>> seqs = [s.seq for s in arm.samples(count=50)]
        >>> seqs == list(range(seqs[0], seqs[0] + 50)) or arm.seq_gaps > 0
        True
        """
        k = 0
        while (count is None or k < count) and not self._closing.is_set():
            with self._sub_lock:
                sample = self._next(timeout_s)
            k += 1
            yield sample

    def on_sample(self, callback: Callable[[Sample], object], timeout_s: float = 0.5) -> threading.Thread:
        """Call a function for every sample, in a thread of its own, until close().

        Parameters
        ----------
        callback : callable
            callback(sample); one that raises stops the thread (the exception is kept in its `error`).
        timeout_s : float
            Seconds between checks whether the client is closing.

        Returns
        -------
        threading.Thread
            The thread, started.

        Examples
        --------
        >>> import threading, time
        >>> from armid.client import ArmClient
        >>> got = threading.Event()
        >>> listener = ArmClient(driver.bound["state"], driver.bound["commands"])
        >>> thread = listener.on_sample(lambda sample: got.set())
        >>> got.wait(10.0)
        True
        >>> listener.close(); thread.is_alive()
        False
        """
        def run():
            while not self._closing.is_set():
                with self._sub_lock:
                    sample = self._next(timeout_s, raise_on_timeout=False)
                if sample is None:
                    continue
                try:
                    callback(sample)
                except Exception as exc:  # noqa: BLE001 - kept for the caller
                    thread.error = exc
                    return
        thread = threading.Thread(target=run, name="armid-client-callback", daemon=True)
        thread.error = None
        self._callbacks.append(thread)
        thread.start()
        return thread

    def _next(self, timeout_s: float | None, raise_on_timeout: bool = True) -> Sample | None:
        sub = self._sub_socket()
        wait = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        while True:
            left = max(0.0, deadline - time.monotonic())
            if not sub.poll(int(left * 1000)):
                if raise_on_timeout:
                    raise NoReply(f"{self.state_endpoint}: no state message within {wait:g} s "
                                  f"(is the driver running there?)")
                return None
            frames = sub.recv_multipart(zmq.NOBLOCK)
            try:
                sample = Sample.decode(frames[1]) if len(frames) == 2 else None
            except stream.StreamDecodeError:
                sample = None
            if sample is None:
                self.bad_messages += 1
                continue
            if self._last_seq is not None and sample.seq > self._last_seq + 1:
                self.seq_gaps += sample.seq - self._last_seq - 1
            self._last_seq = sample.seq
            self.lost_samples += sample.lost
            self._last_sample = sample
            return sample

    @property
    def last_sample(self) -> Sample | None:
        """The sample that latest(), samples() or an on_sample thread read last (None before the first).

        Reading it consumes nothing: while an on_sample thread reads the stream, other threads (an action
        server's feedback, a notebook cell) look at the arm's state here instead of taking messages from it."""
        return self._last_sample

    def health(self, timeout_s: float | None = None) -> dict:
        """The driver's newest health message (docs/reference/stream.md), read on a subscriber of its own.

        Parameters
        ----------
        timeout_s : float, optional
            Seconds to wait when no health message has arrived since the last call (the driver publishes one
            per second); default the client's timeout, at least 2 s.

        Returns
        -------
        dict
            The newest health message that arrived since the last call, or the next one.

        Raises
        ------
        NoReply
            When none comes within timeout_s. Messages that are not a JSON object are counted in
            `bad_messages` and skipped.
        """
        wait = max(self.timeout_s, 2.0) if timeout_s is None else timeout_s
        with self._health_lock:
            if self._health_sub is None:
                sock = self.ctx.socket(zmq.SUB)
                sock.setsockopt(zmq.LINGER, 0)
                _connect(sock, self.state_endpoint)
                sock.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_HEALTH)
                self._health_sub = sock
            newest, deadline = None, time.monotonic() + wait
            while True:
                left = 0.0 if newest is not None else max(0.0, deadline - time.monotonic())
                if not self._health_sub.poll(int(left * 1000)):
                    break
                frames = self._health_sub.recv_multipart(zmq.NOBLOCK)
                try:
                    message = json.loads(frames[1]) if len(frames) == 2 and frames[0] == stream.TOPIC_HEALTH else None
                except (UnicodeDecodeError, ValueError):
                    message = None
                if isinstance(message, dict):
                    newest = message
                else:
                    self.bad_messages += 1
            if newest is None:
                raise NoReply(f"{self.state_endpoint}: no health message within {wait:g} s "
                              f"(is the driver running there?)")
            return newest

    def _sub_socket(self) -> zmq.Socket:
        if self._sub is None:
            sock = self.ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            _connect(sock, self.state_endpoint)
            sock.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
            self._sub = sock
        return self._sub

    # -- life cycle ---------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the callbacks and close the sockets (idempotent; `with ArmClient(...)` does it on exit).

        Returns
        -------
        None

        Examples
        --------
        >>> from armid.client import ArmClient
        >>> client = ArmClient(driver.bound["state"], driver.bound["commands"])
        >>> client.close(); client.close()
        """
        self._closing.set()
        for thread in self._callbacks:
            thread.join(5.0)
        with self._req_lock:
            self._drop_req()
        with self._sub_lock:
            if self._sub is not None:
                self._sub.close(0)
                self._sub = None
        with self._health_lock:
            if self._health_sub is not None:
                self._health_sub.close(0)
                self._health_sub = None

    def __enter__(self) -> "ArmClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ServoStream:
    """Setpoints to the driver's servo socket (firmware_bridge.servo_wire), from ArmClient.servo, each carrying the
    session's token. send() never blocks: at most QUEUE setpoints wait in this client; one the socket cannot
    queue (the driver is gone or far behind) is counted in `dropped` and never sent later. stop() is bounded as
    ArmClient.request is, and closes the socket without waiting (LINGER 0)."""

    QUEUE = 16                  # setpoints this client holds for the driver at most

    def __init__(self, client: ArmClient, endpoint: str, mode: str, token: int):
        from firmware_bridge import servo_wire

        self.client, self.endpoint, self.mode_name, self.token = client, endpoint, mode, token
        self._mode = servo_wire.MODES[mode]
        self._encode = servo_wire.encode
        self._push = client.ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, self.QUEUE)
        if client._curve is not None:
            self._push.curve_serverkey, self._push.curve_publickey, self._push.curve_secretkey = client._curve
        _connect(self._push, endpoint)
        self.seq = 0
        self.sent = 0
        self.dropped = 0

    def send(self, values, t_ns: int | None = None) -> bool:
        """Send one setpoint; never blocks.

        The driver judges velocity and acceleration between setpoints by the times they carry (held to its own
        clock), so a setpoint computed for time t should carry t. After a pause, send the setpoint for now,
        not the ones missed: the driver keeps a few cycles of setpoints at most, and its drives cross a gap on
        a straight line at no more than the velocity limit.

        Parameters
        ----------
        values : array_like, shape (n,)
            Joint positions (rad) or torques (N m), as the servo mode says.
        t_ns : int, optional
            The time the setpoint is for: this client's UNIX time in ns (default: now).

        Returns
        -------
        bool
            False when the socket could not queue it (the driver is gone or far behind; counted in
            `dropped`).

        Examples
        --------
        See `ArmClient.servo`.
        """
        self.seq += 1
        stamp = time.time_ns() if t_ns is None else int(t_ns)
        try:
            self._push.send(self._encode(self._mode, self.token, self.seq, stamp, values), zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def stop(self) -> dict:
        """End servo mode (servo_stop): the drives hold where the last setpoint put them.

        Returns
        -------
        dict
            The driver's reply, with the session's counters (setpoints received, accepted, why it ended).

        Raises
        ------
        CommandRefused, NoReply
            As `ArmClient.request`.

        Examples
        --------
        >>> arm.enable()
        >>> stream = arm.servo("position")
        >>> stream.send(arm.latest().q)
        True
        >>> stream.stop()["ok"]
        True
        """
        try:
            return self.client.request("servo_stop")
        finally:
            self._push.close(0)

    def __enter__(self) -> "ServoStream":
        return self

    def __exit__(self, *exc) -> None:
        if not self._push.closed:
            self.stop()


def _connect(sock: zmq.Socket, endpoint: str) -> None:
    """sock.connect(endpoint), ClientError naming an endpoint ZeroMQ cannot connect to (the socket closed)."""
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise ClientError(f"{endpoint}: cannot connect: {exc}") from None


def _curve_keys(server_public: str | Path, client_secret: str | Path) -> tuple[bytes, bytes, bytes]:
    """(server public, client public, client secret) keys from certificate files, ClientError naming a bad one."""
    import zmq.auth

    try:
        server, _ = zmq.auth.load_certificate(str(server_public))
        public, secret = zmq.auth.load_certificate(str(client_secret))
    except (OSError, ValueError) as exc:
        raise ClientError(f"curve certificate: {exc}") from None
    if secret is None:
        raise ClientError(f"curve_client_secret: {client_secret} holds no secret key")
    return server, public, secret
