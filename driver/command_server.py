"""The daemon's command socket: a loop that no request can end, stall or starve.

One thread owns a ZeroMQ ROUTER socket (REQ clients talk to it as to a REP socket; its replies go to the
client that asked, in any order). Each turn of the loop:
  1. reads what has arrived (at most READ_BATCH messages and about READ_BATCH_BYTES), answering `quick_stop`
     and `disable` at once, before anything read earlier: they reach the cycle at its next cycle boundary
     whatever else is in flight;
  2. answers one other request (status, enable, set_payload, ...) or sends a motion request to the planner
     process (driver.planner), which answers later; a second motion while one is being planned is refused;
  3. collects the planner's answer when it is ready and starts the motion.
Whatever a request raises becomes an error reply naming the request, counted in `stats` (the health topic's
`commands`), and the loop goes on.

What a client can make the driver hold is bounded: ZeroMQ queues at most RECEIVE_QUEUE requests of each
connection (RCVHWM; beyond, it stops reading that connection and TCP holds the sender back) and REPLY_QUEUE
replies to it (SNDHWM; a reply beyond, to a client that does not read, is dropped and counted in
`unsent_replies`; a client with at most PER_CLIENT + RECEIVE_QUEUE requests in flight loses none), each
request at most MAX_REQUEST_BYTES (twice that: ZeroMQ drops the connection). Of the requests read, at most
PER_CLIENT of one client wait (and BACKLOG of all), at most WAITING_BYTES in all; beyond that a request is
refused unread. Waiting requests are answered one client after the other (round robin over the clients'
ROUTER identities), so that a client flooding the socket delays only itself: another client's request waits
for at most one request of each other waiting client. A plain `status` is answered as it is read, with a
reply made at most once per turn, so a flood of them from many connections delays no one. A turn reads about
READ_BATCH_BYTES at most, so that waiting requests are answered between large ones. Idle, the server hands
what bursts left freed in the heap back to the OS (driver.allocator).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import deque

import zmq

from driver.allocator import trim
from driver.commands import PLANNING, SMALL_REQUEST_BYTES, URGENT, Commands, encode
from driver.planner import Planner, PlannerError
from driver.requests import RequestError, decode_request
from firmware_bridge.runtime.log_throttle import Throttle

POLL_MS = 50
READ_BATCH = 256
READ_BATCH_BYTES = 4 * 1024 * 1024    # and at most about this many bytes per turn
BACKLOG = 256                      # requests waiting, all clients: another client's waits behind at most these
PER_CLIENT = 64
WAITING_BYTES = 16 * 1024 * 1024     # bytes of the requests waiting, all clients
RECEIVE_QUEUE = 8                  # requests ZeroMQ queues per connection before the server reads them (RCVHWM)
REPLY_QUEUE = 2 * (PER_CLIENT + RECEIVE_QUEUE)   # replies ZeroMQ queues per connection for a client that has
                                   # not read them: twice what a client with that many requests in flight is owed
                                   # (ZeroMQ frees a pipe's room in batches of half its bound)
TRIM_INTERVAL_S = 5.0              # idle, the freed heap goes back to the OS (driver.allocator.trim) this often
_URGENT_MARKS = tuple(name.encode() for name in URGENT)
REFUSAL_LOG_INTERVAL_S = 1.0   # refused requests: the first logged, then one line per interval with a count
_log = logging.getLogger(__name__)


class CommandServer:
    """Serves `commands` on the bound ROUTER socket `sock` until `stop` is set (run() in its own thread)."""

    def __init__(self, sock: zmq.Socket, commands: Commands, planner: Planner, stop: threading.Event):
        self.sock, self.commands, self.planner, self._stop = sock, commands, planner, stop
        self._refusals = Throttle(_log, logging.WARNING, REFUSAL_LOG_INTERVAL_S)
        # requests waiting, by the client's ROUTER identity, in the order the clients are served (round robin)
        self._waiting: dict[bytes, deque[tuple[list, bytes]]] = {}
        self._queued = 0
        self._waiting_bytes = 0                     # their bodies' bytes
        self._planning: list | None = None          # the envelope of the motion request being planned
        self._status: tuple[dict, bytes] | None = None   # this turn's status reply, once made
        self.received = 0
        self.answered = 0
        self.errors = 0              # error replies (bad requests, refusals)
        self.internal_errors = 0     # requests whose handling raised what it should not have
        self.refused_busy = 0        # refused unread: more than BACKLOG waiting
        self.unsent = 0              # replies the socket could not take (client gone)
        self.malformed_envelopes = 0
        self.urgent = 0
        self.last_internal_error: str | None = None
        self.trims = 0                    # times freed heap memory went back to the OS after a burst
        self._next_trim = 0.0

    def stats(self) -> dict:
        return {"received": self.received, "answered": self.answered, "errors": self.errors,
                "internal_errors": self.internal_errors, "refused_busy": self.refused_busy,
                "unsent_replies": self.unsent, "malformed_envelopes": self.malformed_envelopes,
                "urgent": self.urgent, "trims": self.trims, "waiting": self._queued,
                "waiting_bytes": self._waiting_bytes, "last_internal_error": self.last_internal_error,
                "planner": self.planner.stats()}

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until stop is set; a failure of the loop itself (not of a request) is counted, logged, and the
        loop starts again."""
        while not self._stop.is_set():
            try:
                self._serve()
            except Exception as exc:  # noqa: BLE001 - the command plane never ends on its own
                self._internal(f"loop: {type(exc).__name__}: {exc}")
                self._stop.wait(0.05)
        self._refusals.flush()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.planner.fileno(), zmq.POLLIN)
        planner_fd = self.planner.fileno()
        while not self._stop.is_set():
            self._status = None                    # a status reply is made at most once per turn
            busy = bool(self._waiting)
            try:
                poller.poll(0 if busy else (10 if self.planner.busy else POLL_MS))
            except zmq.ZMQError as exc:
                if self._stop.is_set():
                    return
                _log.error("commands: poll: %s", exc)
                time.sleep(0.01)
                continue
            self._guard("read", self._read)
            if self._waiting:
                self._guard_request(*self._next_waiting(), self._answer)
            self._guard("planner", self._planner_turn)
            if not self._waiting and self._planning is None:
                self._trim()
            fd = self.planner.fileno()
            if fd != planner_fd:               # the planner was restarted: a new pipe
                poller.unregister(planner_fd)
                poller.register(fd, zmq.POLLIN)
                planner_fd = fd

    def _trim(self) -> None:
        """Idle, at most once per TRIM_INTERVAL_S: what bursts of requests and connections left freed in the heap
        goes back to the OS."""
        now = time.monotonic()
        if now >= self._next_trim:
            self._next_trim = now + TRIM_INTERVAL_S
            self.trims += trim()

    def _guard(self, what: str, fn) -> None:
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the loop must go on
            self._internal(f"{what}: {type(exc).__name__}: {exc}")

    def _guard_request(self, envelope: list, body: bytes, fn) -> None:
        try:
            fn(envelope, body)
        except Exception as exc:  # noqa: BLE001 - any failure becomes an error reply, the loop goes on
            self._internal(f"{type(exc).__name__}: {exc}")
            self._reply(envelope, {"ok": False, "error": f"{_describe(body)}: internal error while handling it "
                                                         f"({type(exc).__name__}); the driver goes on"})

    def _internal(self, text: str) -> None:
        self.internal_errors += 1
        self.last_internal_error = text[:500]
        _log.error("commands: internal error: %s", text[:500])

    # -- reading -------------------------------------------------------------------------------------
    def _read(self) -> None:
        read = 0
        for _ in range(READ_BATCH):
            if read >= READ_BATCH_BYTES:        # large requests: a waiting one is answered between the batches
                return
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            read += sum(len(f) for f in frames)
            # a large part stays ZeroMQ's (no copy) until it is kept: most large ones of a flood are refused
            frames = [f.bytes if len(f) <= SMALL_REQUEST_BYTES else f for f in frames]
            self.received += 1
            split = _split(frames)
            if split is None:
                self.malformed_envelopes += 1
                if len(frames) >= 2:         # a reply to a malformed envelope, to the sender it names
                    self._reply(frames[:1], {"ok": False, "error": "request: expected one message part"})
                continue
            envelope, body = split
            if len(body) < 256 and any(mark in body for mark in _URGENT_MARKS):
                self._guard_request(envelope, body, self._answer)   # before anything that waits
            elif len(body) < 64 and b"status" in body and _is_status(body):
                self._guard_request(envelope, body, self._answer_status)   # never behind other requests
            elif (self._queued >= BACKLOG or len(self._waiting.get(envelope[0], ())) >= PER_CLIENT
                  or self._waiting_bytes + len(body) > WAITING_BYTES):
                self.refused_busy += 1
                self._reply(envelope, {"ok": False, "error": "request refused unread: too many requests are "
                                                             "waiting; wait for the replies before sending more"})
            else:
                body = body if isinstance(body, bytes) else body.bytes
                self._waiting.setdefault(envelope[0], deque()).append((envelope, body))
                self._queued += 1
                self._waiting_bytes += len(body)

    def _next_waiting(self) -> tuple[list, bytes]:
        """The next waiting request: the oldest of the client served longest ago, which then goes last."""
        client = next(iter(self._waiting))
        queue = self._waiting.pop(client)
        request = queue.popleft()
        if queue:
            self._waiting[client] = queue
        self._queued -= 1
        self._waiting_bytes -= len(request[1])
        return request

    # -- answering -----------------------------------------------------------------------------------
    def _answer(self, envelope: list, body: bytes) -> None:
        if len(body) > SMALL_REQUEST_BYTES:
            self._plan(envelope, body, "request")     # only a motion may be this large: the planner decodes it
            return
        try:
            req = decode_request(body)
        except RequestError as exc:
            self._reply(envelope, {"ok": False, "error": str(exc)})
            return
        cmd = req["cmd"]
        if cmd in URGENT:
            self.urgent += 1
        if cmd in PLANNING:
            self._plan(envelope, body, cmd)
            return
        self._reply(envelope, self.commands.run(req))

    def _plan(self, envelope: list, body: bytes, cmd: str) -> None:
        try:
            self.planner.submit(cmd, self.commands.plan_job(body))
        except PlannerError as exc:
            self._reply(envelope, {"ok": False, "error": str(exc)})
            return
        self._planning = envelope

    def _planner_turn(self) -> None:
        if self._planning is None:
            return
        answer = self.planner.collect()
        if answer is None:
            answer = self.planner.overdue()
        if answer is None:
            return
        envelope, self._planning = self._planning, None
        if isinstance(answer, str):
            self._reply(envelope, {"ok": False, "error": answer})
            return
        plan = answer
        self._reply(envelope, self.commands.guarded(plan.name, lambda: self.commands.start(plan)))

    def _answer_status(self, envelope: list, body: bytes) -> None:
        """A plain status request, answered as it is read with this turn's status (made once per turn: a flood
        of status requests from many connections costs a send each, and delays no one)."""
        if self._status is None:
            reply = self.commands.run({"cmd": "status"})
            self._status = (reply, encode(reply))
        self._reply(envelope, *self._status)

    def _reply(self, envelope: list, reply: dict, raw: bytes | None = None) -> None:
        self.answered += 1
        if not reply.get("ok"):
            self.errors += 1
            self._refusals.hit("command refused: %s", reply.get("error"), error=reply.get("error"))
        try:
            self.sock.send_multipart([*envelope, encode(reply) if raw is None else raw], zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError):
            self.unsent += 1


def _is_status(body: bytes) -> bool:
    """The request is exactly {"cmd": "status"} (any spacing). Never raises: whatever fails here is left to the
    ordinary path, which answers it."""
    try:
        return decode_request(body) == {"cmd": "status"}
    except Exception:  # noqa: BLE001 - only a test for the fast path
        return False


def _split(frames: list) -> tuple[list, bytes] | None:
    """(envelope, body) of a ROUTER message: [id, b"", body] from REQ, [id, body] from DEALER; None otherwise."""
    if len(frames) == 3 and frames[1] == b"":
        return frames[:2], frames[2]
    if len(frames) == 2:
        return frames[:1], frames[1]
    return None


def _describe(body: bytes) -> str:
    """A short name of a request for an error reply: its command when it has one."""
    if len(body) <= SMALL_REQUEST_BYTES:
        try:
            return f"request {decode_request(body)['cmd'][:60]!r}"
        except Exception:  # noqa: BLE001 - only a name for a reply
            pass
    return f"request of {len(body)} bytes"
