"""The identification service: online RLS on the driver's live state stream (docs/guides/ident-service.md).

One thread polls two sockets:
  SUB  the driver's state stream (firmware_bridge.stream, version 1): read at most every drain_s seconds,
       all queued messages at once, checked and decoded as one numpy record array into a preallocated
       block; the block goes to ident.online.OnlineIdentifier when `block` samples wait and before each
       estimate is published (every 1/publish_hz seconds);
  ROUTER  JSON commands from REQ clients: status, reset, freeze, unfreeze, save, load, answered at once;
       and identify_now: the batch pipeline (ident.fit.batch: filtering, parallel decimation, WLS) over a copy
       of the buffered window, run in a worker process (spawned at the first call, kept) while the loop
       goes on reading the stream and answering other commands; its answer, the content of result.json,
       comes when the worker is done. One identify_now runs at a time (another meanwhile is refused).
and publishes on its own PUB socket:
  topic b"estimate"  JSON: names, theta, sigma %, torque prediction RMS per joint, samples, converged, ...
  topic b"health"    JSON: the stream's state ("ok", "stopped", "resumed"), counters of dropped messages.
  topic b"payload"   JSON (with payload tracking, ident.online.payload_tracking): the payload estimate, at the same rate;
  topic b"event"     JSON, once per detected payload change.

A message that is not a version-1 state message of this model's joint count is counted and dropped.
Samples are indexed by the drives' clock, round(device_time * rate_hz): a message repeating the previous
device sample (the driver republishes the last sample when no new one arrived in a cycle) is counted
(`repeated`) and dropped; a device sample missing between two messages is a gap for the identifier.
When no message arrives for stale_s, the service says so once (health "stopped") and says "resumed"
when the stream comes back; the sequence numbers tell the identifier to restart its window.

The effort delay (how late the drives' torques are against their positions, ident.fit.preprocess.Recording):
a number of seconds given, or "driver": the service reads it from the driver's own health messages
(`effort_delay_s`, topic health on the same endpoint, once per second). Until the first one arrives the
samples are buffered for identify_now but not fed to the filter (counted `waiting`); with no health message
within DELAY_WAIT_S of the first state message, the delay is taken as 0, the service says so in its log and
its status names the source "none"; a health message that comes later still sets the delay (source "driver").
"""
from __future__ import annotations

import json
import logging
import multiprocessing
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import zmq

from firmware_bridge import stream
from ident.model import dynamics
from firmware_bridge.runtime.errors import InputError
from ident.model import Model
from ident.online import OnlineIdentifier
from ident.fit.batch import identify
from ident.fit.preprocess import LATE_SETTLE_S, Recording, check_effort_delay
from ident.online.payload_tracking import OnlinePayload, cusum
from ident.outputs.results import result_document

_log = logging.getLogger(__name__)

TOPIC_ESTIMATE = b"estimate"
TOPIC_HEALTH = b"health"
TOPIC_PAYLOAD = b"payload"
TOPIC_EVENT = b"event"
PAYLOAD_ARMS = ("model", "estimate")
DELAY_FROM_DRIVER = "driver"
DELAY_WAIT_S = 10.0      # s after the first state message: no driver health with the effort delay -> 0
#                          (the driver sends health once a second; a loaded machine delays its first one)


@dataclass
class Timing:
    """Where the service's CPU time goes (s of process CPU time; the status command reports it): reading
    and decoding the stream (`receive`), the filter (`flush`: window,
    regressor, RLS, payload), building and sending the estimates (`publish`), and the longest flush."""

    receive_cpu_s: float = 0.0
    flush_cpu_s: float = 0.0
    publish_cpu_s: float = 0.0
    flushes: int = 0
    flushed_samples: int = 0
    max_flush_ms: float = 0.0          # wall clock
    max_flush_cpu_ms: float = 0.0
    max_flush_samples: int = 0         # samples in that flush
    max_flush_at: int = 0              # samples received when it ran

    def flushed(self, samples: int, cpu_s: float, wall_s: float, at: int) -> None:
        self.flushes += 1
        self.flushed_samples += samples
        self.flush_cpu_s += cpu_s
        if wall_s * 1e3 > self.max_flush_ms:
            self.max_flush_ms, self.max_flush_cpu_ms = wall_s * 1e3, cpu_s * 1e3
            self.max_flush_samples, self.max_flush_at = samples, at


class IdentService:
    """IdentService(model, state_endpoint=..., publish_endpoint=..., command_endpoint=..., ...).

    payload: None (no payload tracking), "model" (track the payload with the model's own arm parameters)
    or "estimate" (with the service's estimate when tracking starts, held fixed: the one loaded from
    estimate_file at start, or the current one on the payload_track command).
    block: samples per filter call (window, regressor, RLS; also run at each publication); drain_s: the
    least time between two reads of the stream (s; each read takes every queued message: fewer wake-ups,
    at most drain_s more lag; commands are answered at once). effort_delay: seconds, or "driver" (the module
    docstring)."""

    def __init__(self, model: Model, *, state_endpoint: str = "tcp://127.0.0.1:5555",
                 publish_endpoint: str = "tcp://127.0.0.1:5557", command_endpoint: str = "tcp://127.0.0.1:5558",
                 publish_hz: float = 10.0, stale_s: float = 0.5, estimate_file: str | None = None,
                 buffer_s: float = 120.0, payload: str | None = None, block: int = 50, drain_s: float = 0.01,
                 context: zmq.Context | None = None, effort_delay: float | str = 0.0, **identifier_options):
        if not publish_hz > 0 or not stale_s > 0:
            raise InputError("publish_hz and stale_s: expected positive numbers")
        if payload is not None and payload not in PAYLOAD_ARMS:
            raise InputError(f"payload: expected one of {', '.join(PAYLOAD_ARMS)} (the arm's parameters), got {payload!r}")
        rate = identifier_options.get("rate_hz", 1000.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 1.0 <= rate <= 10_000.0:
            raise InputError(f"rate_hz: expected the stream's rate, 1..10000 Hz (the driver's range), got {rate!r}")
        self.model = model
        self.delay_source = DELAY_FROM_DRIVER if effort_delay == DELAY_FROM_DRIVER else "given"
        delay = 0.0 if self.delay_source == DELAY_FROM_DRIVER else check_effort_delay(effort_delay, "effort_delay")
        self._delay_known = self.delay_source == "given"
        self._delay_origin = self.delay_source     # what the status reports: given, driver, or none (timed out)
        self._first_state_at: float | None = None
        self.waiting = 0                    # samples not fed while the driver's effort delay was unknown
        self.identifier = OnlineIdentifier(model, effort_delay=delay, **identifier_options)
        self.payload_arm = payload
        self.payload: OnlinePayload | None = None
        self._events: list[dict] = []
        self.endpoints = {"state": state_endpoint, "publish": publish_endpoint, "commands": command_endpoint}
        self.publish_period = 1.0 / publish_hz
        if not 0 <= drain_s <= 0.05:
            raise InputError(f"drain_s: expected 0 to 0.05 s between reads of the stream, got {drain_s!r}")
        self.drain_s = float(drain_s)
        self.stale_s = float(stale_s)
        self.estimate_file = estimate_file
        self._ctx = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.bound: dict[str, str] = {}
        cap = 4096
        self._seq = np.zeros(cap, np.int64)
        self._q = np.zeros((cap, model.n))
        self._tau = np.zeros((cap, model.n))
        self._k = 0
        # the last buffer_s seconds of samples (device time s, seq, q, tau), for identify_now
        ring = max(int(buffer_s * identifier_options.get("rate_hz", 1000.0)), 1000)
        self._ring_t = np.zeros(ring)
        self._ring_seq = np.zeros(ring, np.int64)
        self._ring_q = np.zeros((ring, model.n))
        self._ring_tau = np.zeros((ring, model.n))
        self._ring_next = 0
        self._ring_count = 0
        self._t = np.zeros(cap)
        self._host = np.zeros(cap)          # host UNIX time (s) of each sample, as the driver stamped it
        self.newest_sample_time = None      # host time of the newest sample the estimate has seen
        self.block = int(block)
        if not 1 <= self.block <= cap:
            raise InputError(f"block: expected 1 to {cap} samples per filter call, got {block!r}")
        self.timing = Timing()
        self._dtype = stream.state_dtype(model.n)
        self._msg_size = stream.message_size(model.n)
        self._rate = float(identifier_options.get("rate_hz", 1000.0))
        self._last_index: int | None = None
        self.repeated = 0
        self.late = 0                   # samples left out: flagged LATE, or within LATE_SETTLE_S after one
        self._late_until_ns = None      # device time up to which samples are left out (after a LATE one)
        self.malformed = 0
        self.messages = 0
        self.stream_state = "waiting"
        self._last_rx = 0.0
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._worker: ProcessPoolExecutor | None = None     # runs identify_now off the loop
        self._job: tuple[bytes, Future] | None = None        # (client, job) of the identify_now running
        self.malformed_commands = 0

    # -- life cycle ----------------------------------------------------------------------------------
    def start(self, timeout: float = 5.0) -> None:
        if self.estimate_file and Path(self.estimate_file).exists():
            self.identifier.load(self.estimate_file)
            _log.info("estimate loaded from %s", self.estimate_file)
        if self.payload_arm is not None:
            self.track_payload(self.payload_arm)
        self._load_kernels()
        self._thread = threading.Thread(target=self._run, name="armid-ident-service", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("ident-service: sockets not ready")
        if self.error is not None:
            raise self.error

    def _load_kernels(self) -> None:
        """Load the compiled kernels now (numba's disk cache, or a compile on a fresh install), not at the
        first batch of samples, which would then wait behind them."""
        n, o = self.model.n, self.identifier
        z = np.zeros((1, n))
        dynamics.regressor(self.model, z, z, z)
        o.rls.update(np.zeros((0, n, o.p)), np.zeros((0, n)))
        if self.payload is not None:
            self.payload.rls.update(np.zeros((0, n, 10)), np.zeros((0, n)))
            cusum(0.0, np.zeros(0), 1.0, 1.0)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        try:
            sub = self._ctx.socket(zmq.SUB)
            pub = self._ctx.socket(zmq.PUB)
            rep = self._ctx.socket(zmq.ROUTER)     # REQ clients; replies may come later (identify_now)
            for s in (sub, pub, rep):
                s.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, 200000)
            sub.connect(self.endpoints["state"])
            sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_STATE)
            if self.delay_source == DELAY_FROM_DRIVER:
                sub.setsockopt(zmq.SUBSCRIBE, stream.TOPIC_HEALTH)
            pub.bind(self.endpoints["publish"])
            rep.bind(self.endpoints["commands"])
        except zmq.ZMQError as exc:
            self.error = InputError(f"ident-service: cannot open its sockets: {exc}")
            self._ready.set()
            return
        self.bound = {"state": self.endpoints["state"], "publish": pub.getsockopt_string(zmq.LAST_ENDPOINT),
                      "commands": rep.getsockopt_string(zmq.LAST_ENDPOINT)}
        self._ready.set()
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(rep, zmq.POLLIN)
        commands_only = zmq.Poller()
        commands_only.register(rep, zmq.POLLIN)
        next_pub = time.monotonic() + self.publish_period
        next_drain = 0.0
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                # the stream is read at most every drain_s (a block of messages per wake-up, not one);
                # commands are answered at once
                if now < next_drain:
                    wait = min(next_drain, next_pub) - now
                    events = dict(commands_only.poll(max(1, int(wait * 1000))))
                else:
                    events = dict(poller.poll(max(0, min(int((next_pub - now) * 1000), 50))))
                if sub in events:
                    next_drain = time.monotonic() + self.drain_s
                    c0 = time.process_time()
                    self._receive(sub)
                    self.timing.receive_cpu_s += time.process_time() - c0
                    if self._k >= self.block:
                        self._flush()
                while self._events:
                    pub.send_multipart((TOPIC_EVENT, json.dumps(self._events.pop(0), allow_nan=False).encode()))
                if rep in events:
                    self._command(rep)
                self._answer_finished(rep)
                now = time.monotonic()
                self._watch_stream(pub, now)
                if now >= next_pub:
                    next_pub = now + self.publish_period
                    self._flush()
                    c0 = time.process_time()
                    pub.send_multipart((TOPIC_ESTIMATE, json.dumps(self._estimate_message(), allow_nan=False).encode()))
                    if self.payload is not None:
                        pub.send_multipart((TOPIC_PAYLOAD, json.dumps(self._payload_message(), allow_nan=False).encode()))
                    self.timing.publish_cpu_s += time.process_time() - c0
        except BaseException as exc:  # noqa: BLE001 - reported
            self.error = exc
            _log.critical("stopped by %s: %s", type(exc).__name__, exc)
        finally:
            for s in (sub, pub, rep):
                s.close(0)
            self._stop_worker()

    # -- the stream ----------------------------------------------------------------------------------
    def _receive(self, sub: zmq.Socket) -> None:
        """Drain the SUB socket, then check and decode what came as one block (no per-message decoding)."""
        raw = []
        while True:
            try:
                raw.append(sub.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
        if not raw:
            return
        self._last_rx = time.monotonic()
        if self.delay_source == DELAY_FROM_DRIVER:   # subscribed to the driver's health too (once a second)
            health = [f[1] for f in raw if len(f) == 2 and f[0] == stream.TOPIC_HEALTH]
            if health:
                self._driver_health(health[-1])
                raw = [f for f in raw if not (len(f) == 2 and f[0] == stream.TOPIC_HEALTH)]
        self.messages += len(raw)
        size = self._msg_size
        good = [f[1] for f in raw if len(f) == 2 and len(f[1]) == size]
        if not good:
            self.malformed += len(raw)
            return
        if self._first_state_at is None:
            self._first_state_at = self._last_rx
        rec = np.frombuffer(b"".join(good), dtype=self._dtype)
        ok = (rec["magic"] == stream.MAGIC) & (rec["version"] == stream.STREAM_VERSION) & (rec["n"] == self.model.n)
        self.malformed += len(raw) - int(ok.sum())
        if not ok.all():
            rec = rec[ok]
        if rec.shape[0] == 0:
            return
        index = np.rint(rec["device_time_ns"] * (self._rate / 1e9)).astype(np.int64)
        new = index != np.r_[-1 if self._last_index is None else self._last_index, index[:-1]]
        self.repeated += int(rec.shape[0] - new.sum())
        self._last_index = int(index[-1])
        rec, index = rec[new], index[new]
        keep = self._not_late(rec)
        if keep is not None:
            rec, index = rec[keep], index[keep]
        cap, start = self._seq.shape[0], 0
        while start < index.shape[0]:
            if self._k == cap:
                self._flush()
            k = self._k
            c = min(cap - k, index.shape[0] - start)
            part = slice(start, start + c)
            self._t[k:k + c] = rec["device_time_ns"][part] * 1e-9
            self._host[k:k + c] = rec["host_time_ns"][part] * 1e-9
            self._seq[k:k + c] = index[part]
            self._q[k:k + c] = rec["q"][part]
            self._tau[k:k + c] = rec["torque"][part]
            self._k = k + c
            start += c

    def _not_late(self, rec: np.ndarray) -> np.ndarray | None:
        """(M,) bool: the samples to keep, None for all. Samples flagged LATE (the drives got their targets too
        late) and those up to LATE_SETTLE_S after the last of them are left out, counted in `late`, as the batch
        fit cuts them (ident.fit.preprocess.cut_windows): the gap they leave restarts the identifier's window."""
        late = (rec["flags"] & stream.FLAG_LATE) != 0
        if self._late_until_ns is None and not late.any():
            return None
        t = rec["device_time_ns"].astype(np.int64)
        settle = int(LATE_SETTLE_S * 1e9)
        until = np.maximum.accumulate(np.where(late, t + settle, np.iinfo(np.int64).min))
        if self._late_until_ns is not None:
            until = np.maximum(until, self._late_until_ns)
        drop = late | (t <= until)
        self._late_until_ns = int(until[-1]) if until[-1] > t[-1] else None
        self.late += int(drop.sum())
        return ~drop

    def _driver_health(self, payload: bytes) -> None:
        """The driver's health message: adopt its effort_delay_s (the first time, or when it changed)."""
        try:
            delay = check_effort_delay(json.loads(payload)["effort_delay_s"], "the driver's health message")
        except (KeyError, TypeError, ValueError, InputError):   # an older driver, or not one: keep waiting
            return
        if self._delay_known and delay == self.identifier.effort_delay:
            return
        self._flush()                        # what came before goes through with the delay it came with
        self.identifier.set_effort_delay(delay)
        self._delay_known = True
        self._delay_origin = DELAY_FROM_DRIVER
        _log.info("effort delay %g ms, from the driver's health message", 1e3 * delay)

    def _flush(self) -> None:
        k = self._k
        if k:
            c0, w0 = time.process_time(), time.perf_counter()
            if not self._delay_known and time.monotonic() - (self._first_state_at or time.monotonic()) > DELAY_WAIT_S:
                self._delay_known = True
                self._delay_origin = "none"
                _log.warning("no health message with the effort delay from the driver within %g s: torques taken "
                             "as simultaneous with the positions (give --effort-delay)", DELAY_WAIT_S)
            if not self._delay_known:
                self.waiting += k
            elif self.payload is None:
                self.identifier.push(self._seq[:k], self._q[:k], self._tau[:k])
            else:                  # one window and one regressor call for both estimators
                o = self.identifier
                rows = o.samples.push(self._seq[:k], self._q[:k], self._tau[:k])
                known = len(self.payload.changes)
                if rows.count:
                    Y = dynamics.regressor(self.model, rows.q, rows.qd, rows.qdd)
                    o.feed(rows, Y)
                    self.payload.feed(rows, Y)
                for change in self.payload.changes[known:]:
                    _log.info("payload change detected at sample %d", change.seq)
                    self._events.append({"time": time.time(), "model": self.model.name, **change.to_json()})
            idx = (self._ring_next + np.arange(k)) % self._ring_t.shape[0]
            self._ring_t[idx], self._ring_seq[idx] = self._t[:k], self._seq[:k]
            self._ring_q[idx], self._ring_tau[idx] = self._q[:k], self._tau[:k]
            self._ring_next = int(idx[-1] + 1) % self._ring_t.shape[0]
            self._ring_count = min(self._ring_count + k, self._ring_t.shape[0])
            self.newest_sample_time = float(self._host[k - 1])
            self._k = 0
            self.timing.flushed(k, time.process_time() - c0, time.perf_counter() - w0, self.identifier.counters.samples)

    def buffered(self):
        """The newest run of buffered samples whose device sample indices increase (a driver restart starts
        a new run), at their device times: (t s from the run's first sample, q, tau). Gaps stay: the batch
        pipeline bridges the short ones and cuts at the long ones (ident.fit.batch.recording_rows)."""
        cap, c = self._ring_t.shape[0], self._ring_count
        idx = (self._ring_next - c + np.arange(c)) % cap
        seq, q, tau = self._ring_seq[idx], self._ring_q[idx], self._ring_tau[idx]
        back = np.flatnonzero(np.diff(seq) <= 0)
        start = int(back[-1]) + 1 if back.size else 0
        seq, q, tau = seq[start:], q[start:], tau[start:]
        return (seq - (seq[0] if seq.size else 0)) / self._rate, q, tau

    def identify_now(self) -> dict:
        """Batch identification (ident.fit.batch) of the buffered window, here and now: the content of
        result.json. (The identify_now command runs the same job in the service's worker process.)"""
        return _identify_job(*self._identify_inputs())

    def _identify_inputs(self) -> tuple:
        """What the batch job needs, copied out of the ring buffer: (model, base, t, q, tau, effort delay s,
        cut-off Hz, bridged gap). InputError when too few samples are buffered."""
        self._flush()
        t, q, tau = self.buffered()
        if t.shape[0] < 2000:
            raise InputError(f"identify_now: {t.shape[0]} samples buffered; at least 2000 are needed")
        o = self.identifier
        return self.model, o.base, t, q, tau, o.effort_delay, o.samples.cutoff_hz, o.max_fill

    # -- commands on the ROUTER socket (REQ clients) --------------------------------------------------
    def _command(self, rep: zmq.Socket) -> None:
        """Answer one request at once, or (identify_now) start it in the worker and answer when it is done."""
        frames = rep.recv_multipart()
        if len(frames) != 3 or frames[1] != b"":     # not a REQ envelope: nobody to answer
            self.malformed_commands += 1
            return
        req = _parse(frames[2])
        if isinstance(req, dict) and req.get("cmd") == "identify_now":
            reply = self._start_identify(frames[0])
            if reply is None:
                return
        else:
            reply = self.handle(req)
        rep.send_multipart((frames[0], b"", json.dumps(reply, allow_nan=False, default=str).encode()))

    def _start_identify(self, client: bytes) -> dict | None:
        if self._job is not None:
            return {"ok": False, "error": "identify_now: a batch identification is running; ask again when it answered"}
        try:
            inputs = self._identify_inputs()
            if self._worker is None:
                # spawn, not fork: the service runs threads (ZeroMQ's among them)
                self._worker = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            self._job = (client, self._worker.submit(_identify_job, *inputs))
        except InputError as exc:
            return {"ok": False, "error": str(exc)}
        except (RuntimeError, OSError) as exc:      # the worker cannot start
            self._stop_worker()
            return {"ok": False, "error": f"identify_now failed: {type(exc).__name__}: {exc}"}
        return None

    def _answer_finished(self, rep: zmq.Socket) -> None:
        if self._job is None or not self._job[1].done():
            return
        client, job = self._job
        self._job = None
        exc = job.exception()
        if exc is None:
            reply = {"ok": True, "result": job.result()}
        elif isinstance(exc, InputError):
            reply = {"ok": False, "error": str(exc)}
        else:
            if isinstance(exc, BrokenProcessPool):   # the worker died: a new one next time
                self._stop_worker()
            _log.error("identify_now failed: %s: %s", type(exc).__name__, exc)
            reply = {"ok": False, "error": f"identify_now failed: {type(exc).__name__}: {exc}"}
        rep.send_multipart((client, b"", json.dumps(reply, allow_nan=False, default=str).encode()))

    def _stop_worker(self) -> None:
        """Stop the worker process (a running job is abandoned)."""
        worker, self._worker, self._job = self._worker, None, None
        if worker is None:
            return
        processes = list(getattr(worker, "_processes", {}).values())
        worker.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            proc.terminate()
            proc.join(5.0)

    def _watch_stream(self, pub: zmq.Socket, now: float) -> None:
        if self._last_rx == 0.0:
            return
        stale = now - self._last_rx > self.stale_s
        if stale and self.stream_state != "stopped":
            self.stream_state = "stopped"
            self._health(pub, f"no state message for {self.stale_s:g} s")
        elif not stale and self.stream_state != "ok":
            was = self.stream_state
            self.stream_state = "ok"
            if was == "stopped":
                self._health(pub, "the stream came back", state="resumed")

    def _health(self, pub: zmq.Socket, text: str, state: str | None = None) -> None:
        msg = {"time": time.time(), "stream": state or self.stream_state, "text": text, "messages": self.messages,
               "malformed": self.malformed, "repeated": self.repeated, "late": self.late,
               "counters": self.identifier.counters.as_dict()}
        _log.log(logging.WARNING if msg["stream"] == "stopped" else logging.INFO, "stream %s: %s", msg["stream"], text)
        pub.send_multipart((TOPIC_HEALTH, json.dumps(msg).encode()))

    def track_payload(self, arm: str) -> None:
        """Start (or restart) payload tracking with the arm's parameters from `arm`: "model" or "estimate"
        (the service's current estimate, held fixed; refused before any rows were used)."""
        if arm not in PAYLOAD_ARMS:
            raise InputError(f"arm: expected one of {', '.join(PAYLOAD_ARMS)}, got {arm!r}")
        theta = None
        if arm == "estimate":
            if self.identifier.rls.rows == 0:
                raise InputError("payload: arm \"estimate\": the service has no estimate yet (load one, or let it "
                                 "identify the arm first)")
            theta = self.identifier.rls.theta.copy()
        o = self.identifier
        self.payload = OnlinePayload(self.model, arm_theta=theta, base=o.base, rate_hz=o.rate_hz,
                                     cutoff_hz=o.samples.cutoff_hz, max_fill=o.max_fill, min_speed=o.min_speed,
                                     effort_delay=o.effort_delay)
        self.payload_arm = arm

    def _payload_message(self) -> dict:
        p = self.payload
        return {"time": time.time(), "model": self.model.name, "arm": self.payload_arm, "stream": self.stream_state,
                **p.estimate().to_json(), "cusum": p.statistic, "changes": len(p.changes), "rows": p.rows,
                "joint_sigma": None if p.fit.joint_sigma is None else p.fit.joint_sigma.tolist()}

    def _estimate_message(self) -> dict:
        rep = self.identifier.report()
        return {"time": time.time(), "model": self.model.name, "stream": self.stream_state, **rep.to_json(),
                "newest_sample_time": self.newest_sample_time,
                "messages": self.messages, "malformed": self.malformed, "repeated": self.repeated}

    # -- commands ------------------------------------------------------------------------------------
    def handle(self, req) -> dict:
        """One JSON command (docs/guides/ident-service.md); never raises."""
        if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
            return {"ok": False, "error": 'request: expected a JSON object with a "cmd" string'}
        cmd = req["cmd"]
        try:
            if cmd == "status":
                c = self.identifier.counters
                return {"ok": True, "model": self.model.name, "stream": self.stream_state, "frozen": self.identifier.frozen,
                        "counters": vars(c), "messages": self.messages, "malformed": self.malformed,
                        "repeated": self.repeated, "late": self.late,
                        "parameters": self.identifier.p, "delay_samples": self.identifier.delay,
                        "effort_delay_s": self.identifier.effort_delay if self._delay_known else None,
                        "effort_delay_source": self._delay_origin, "waiting": self.waiting,
                        "cutoff_hz": self.identifier.samples.cutoff_hz, "timing": asdict(self.timing),
                        "payload": None if self.payload is None else {"arm": self.payload_arm, "rows": self.payload.rows,
                                                                       "changes": len(self.payload.changes)}}
            if cmd == "reset":
                self._flush()
                self.identifier.reset()
                return {"ok": True}
            if cmd in ("freeze", "unfreeze"):
                self._flush()
                self.identifier.frozen = cmd == "freeze"
                return {"ok": True, "frozen": self.identifier.frozen}
            if cmd == "payload_track":
                self._flush()
                self.track_payload(req.get("arm", "model"))
                return {"ok": True, "arm": self.payload_arm}
            if cmd == "payload_reset":
                if self.payload is None:
                    return {"ok": False, "error": "payload_reset: payload tracking is off (payload_track starts it)"}
                self._flush()
                self.payload.reset()
                return {"ok": True}
            if cmd == "identify_now":             # the loop runs it in the worker (_command); here: in place
                return {"ok": True, "result": self.identify_now()}
            if cmd in ("save", "load"):
                path = req.get("path", self.estimate_file)
                if not isinstance(path, str) or not path:
                    return {"ok": False, "error": f"{cmd}: path: expected a file path (or start the service with one)"}
                self._flush()
                (self.identifier.save if cmd == "save" else self.identifier.load)(path)
                return {"ok": True, "path": path}
            return {"ok": False, "error": f"unknown command {cmd!r} (known: freeze, identify_now, load, payload_reset, payload_track, reset, save, status, unfreeze)"}
        except InputError as exc:
            return {"ok": False, "error": str(exc)}
        except OSError as exc:
            return {"ok": False, "error": f"{cmd}: {exc}"}
        except Exception as exc:  # noqa: BLE001 - a failed command must not stop the service
            _log.error("%s failed: %s: %s", cmd, type(exc).__name__, exc)
            return {"ok": False, "error": f"{cmd} failed: {type(exc).__name__}: {exc}"}


def _parse(raw: bytes):
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _identify_job(model: Model, base, t, q, tau, effort_delay: float, cutoff_hz: float, max_bridged: int) -> dict:
    """The batch pipeline (ident.fit.batch) over samples at device times t (s): result.json's content. Runs in
    the service's worker process."""

    rec = Recording(t, q, tau, None, None, "live stream", effort_delay)
    # the same low-pass as the online filter (ident.online: the batch pipeline's, causal with a delay), and
    # the same bridging of short gaps
    return result_document(identify(model, rec, base=base, cutoff_hz=cutoff_hz, max_bridged=max_bridged))
