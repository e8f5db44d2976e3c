"""The driver's health as Prometheus metrics (prometheus-client's exposition), served over HTTP on loopback by
default.

The collector reads the newest health message (driver.daemon.Driver.health, made once a second by the health
thread) when Prometheus scrapes: nothing is added to the cycle and no lock of the cycle is taken. Counters are
the driver's own totals since it started (`_total`); gauges are the state at the last health message; times are
in seconds; the cycle's lateness is a histogram (LatenessHistogram, filled by the health thread).

The HTTP server is one thread (`armid-metrics`) running an asyncio loop: however many connections are open (a
scraper, a port scan, clients that connect and never send), the driver's thread count does not grow. A
connection has REQUEST_TIMEOUT_S to send its request head (at most MAX_HEAD_BYTES); at most MAX_CONNECTIONS are
open, and a new one beyond that closes the oldest.

    [metrics]
    address = "127.0.0.1:9464"     # host:port; beyond loopback only with allow_remote = true
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
from collections.abc import Callable

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from firmware_bridge.runtime.errors import InputError

DEFAULT_ADDRESS = "127.0.0.1:9464"
# (health key, metric name, help) of the driver's counters
COUNTERS = (("cycles", "armid_cycles", "cycles the driver ran"),
            ("fresh_samples", "armid_fresh_samples", "cycles that read a new device sample"),
            ("stale_cycles", "armid_stale_cycles", "cycles without a new device sample"),
            ("overruns", "armid_overruns", "cycles whose work outlasted their period"),
            ("caught_up", "armid_caught_up_samples", "samples published without a cycle of their own"),
            ("samples_lost", "armid_samples_lost", "device samples the driver never received"))


def parse_address(text: str, allow_remote: bool = False) -> tuple[str, int]:
    """(host, port) from "host:port"; InputError naming what is wrong, or a non-loopback host without
    allow_remote."""
    host, sep, port = str(text).rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"metrics.address {text!r}: expected host:port")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not allow_remote:
        raise InputError(f"metrics.address {text!r}: not a loopback address; set metrics.allow_remote = true to "
                         f"serve the metrics beyond this machine")
    return host, int(port)


class HealthCollector(Collector):
    """Metrics from health(), the newest health message (None before the first)."""

    def __init__(self, health: Callable[[], dict | None], joints: tuple[str, ...],
                 lateness: "LatenessHistogram | None" = None):
        self._health, self._joints, self._lateness = health, joints, lateness

    def collect(self):
        h = self._health()
        if h is None:
            return
        for key, name, text in COUNTERS:
            yield CounterMetricFamily(name, text, value=float(h.get(key) or 0))
        yield GaugeMetricFamily("armid_cycle_rate_hz", "cycles per second over the last health period",
                                value=float(h["cycle_rate_hz"]))
        yield GaugeMetricFamily("armid_sample_rate_hz", "new device samples per second over the last health period",
                                value=float(h["sample_rate_hz"]))
        for key, text in (("enabled", "1 when every drive is OPERATION ENABLED"), ("moving", "1 while a motion runs")):
            yield GaugeMetricFamily(f"armid_{key}", text, value=float(bool(h[key])))
        yield GaugeMetricFamily("armid_fault", "1 while the driver is in its fault state", value=float(h["fault"] is not None))
        yield GaugeMetricFamily("armid_uptime_seconds", "seconds since the driver started", value=float(h["uptime_s"]))
        if self._lateness is not None:
            yield self._lateness.family()
        states = GaugeMetricFamily("armid_drive_state", "1 for each drive's CiA 402 state", labels=["joint", "state"])
        for joint, state in zip(self._joints, h.get("drive_states", ())):
            states.add_metric([joint, str(state)], 1.0)
        yield states
        commands = h.get("commands") or {}
        for key, value in commands.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family = GaugeMetricFamily if key == "waiting" else CounterMetricFamily
                yield family(f"armid_commands_{key}", f"command server: {key}", value=float(value))
        for key, value in (h.get("servo_totals") or {}).items():
            yield CounterMetricFamily(f"armid_servo_{key}", f"servo setpoints {key.replace('_', ' ')}, all sessions",
                                      value=float(value))
        for key, value in (h.get("link") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield link_metric(key, float(value))
        yield from collision_metrics(h.get("collision"), self._joints)


def collision_metrics(c: dict | None, joints: tuple[str, ...]):
    """The external-torque estimate's peaks per joint over the last health period (N m), the thresholds, and
    the collisions counted (driver.collision)."""
    if not c:
        return
    yield CounterMetricFamily("armid_collisions", "collisions detected (a reaction each)", value=float(c["collisions"]))
    yield GaugeMetricFamily("armid_collision_detection", "1 while collision detection is on", value=float(c["enabled"]))
    for key, name, text in (("peak_tau_ext", "armid_tau_ext_peak_newton_metres",
                             "largest |external torque estimate| over the last health period, N m"),
                            ("contact", "armid_contact_threshold_newton_metres", "contact threshold, N m"),
                            ("collision", "armid_collision_threshold_newton_metres", "collision threshold, N m")):
        family = GaugeMetricFamily(name, text, labels=["joint"])
        for joint, value in zip(joints, c.get(key) or ()):
            family.add_metric([joint], float(value))
        yield family


# the link counters' keys that are levels, not counts (the rest of the numbers in link_stats are counts)
LINK_GAUGES = frozenset({"sync_lag", "device_cycle"})
# unit suffixes of link_stats keys: (suffix in the metric name, factor to the base unit); each is a gauge
LINK_UNITS = {"_us": ("_seconds", 1e-6), "_ms": ("_seconds", 1e-3), "_s": ("_seconds", 1.0), "_hz": ("_hz", 1.0),
              "_bytes": ("_bytes", 1.0)}


def link_metric(key: str, value: float):
    """The metric of one numeric link_stats entry: armid_link_<key> without a repeated "link", times in seconds,
    a gauge for a level or a quantity with a unit, else a counter (exposed with `_total`)."""
    base = key.removeprefix("link_")
    for suffix, (unit, factor) in LINK_UNITS.items():
        if base.endswith(suffix):
            return GaugeMetricFamily(f"armid_link_{base[:-len(suffix)]}{unit}", f"the transport's {key}",
                                     value=value * factor)
    family = GaugeMetricFamily if base in LINK_GAUGES else CounterMetricFamily
    return family(f"armid_link_{base}", f"the transport's link counter {key}", value=value)


# upper bounds (s) of the lateness histogram's buckets (and +Inf)
LATENESS_BUCKETS_S = (10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 50e-3)


class LatenessHistogram:
    """The cycle's wake-up lateness as a cumulative histogram (seconds). update(ring, cycles) adds the cycles
    since the last update from the cycle's lateness ring (driver.cycle: lateness_ns[c % len(ring)] of cycle c);
    cycles that the ring no longer holds (updates further apart than its length) are left out."""

    def __init__(self):
        self._bounds_ns = np.array(LATENESS_BUCKETS_S) * 1e9
        self._counts = np.zeros(len(LATENESS_BUCKETS_S) + 1, np.int64)
        self._sum_s = 0.0
        self._seen = 0
        self._lock = threading.Lock()

    def update(self, ring: np.ndarray, cycles: int) -> None:
        k = min(max(cycles - self._seen, 0), len(ring))
        late = ring[np.arange(cycles - k, cycles) % len(ring)]
        counts = np.bincount(np.searchsorted(self._bounds_ns, late, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum_s += float(late.sum()) * 1e-9
            self._seen = cycles

    def family(self) -> HistogramMetricFamily:
        with self._lock:
            cumulative, total = np.cumsum(self._counts), self._sum_s
        buckets = [(f"{b:g}", float(c)) for b, c in zip(LATENESS_BUCKETS_S, cumulative)]
        return HistogramMetricFamily("armid_lateness_seconds", "how late the cycle woke against its deadline",
                                     buckets=[*buckets, ("+Inf", float(cumulative[-1]))], sum_value=total)


REQUEST_TIMEOUT_S = 5.0       # a connection's time to send its request head
MAX_HEAD_BYTES = 8192          # the longest request head read
MAX_CONNECTIONS = 64           # open connections; one more closes the oldest


class MetricsServer:
    """An HTTP server of `registry` at (host, port) in one thread; close() stops it and closes the socket."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int):
        self.registry = registry
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
            self._sock.listen(128)
            self._sock.setblocking(False)
        except OSError:
            self._sock.close()
            raise
        self.address = self._sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        self._open: dict[asyncio.StreamWriter, None] = {}     # the open connections, oldest first
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="armid-metrics", daemon=True)
        self._thread.start()
        self._started.wait(5.0)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._connection, sock=self._sock,
                                                                    limit=MAX_HEAD_BYTES))
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            for writer in list(self._open):
                writer.transport.abort()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            next(iter(self._open)).transport.abort()
        self._open[writer] = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT_S)
            method, path = (head.split(b"\r\n", 1)[0].split(b" ") + [b"", b""])[:2]
            if method != b"GET":
                status, body, kind = "405 Method Not Allowed", b"GET /metrics only\n", "text/plain"
            elif path.split(b"?", 1)[0] not in (b"/metrics", b"/"):
                status, body, kind = "404 Not Found", b"GET /metrics\n", "text/plain"
            else:
                status, body, kind = "200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT_S)
            writer.close()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.transport.abort()           # a silent, slow or oversized client: dropped
        finally:
            self._open.pop(writer, None)

    def close(self) -> None:
        """Stop serving: every open connection is closed, the thread ends."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


def serve(address: str, health: Callable[[], dict | None], joints: tuple[str, ...], allow_remote: bool = False,
          lateness: LatenessHistogram | None = None) -> MetricsServer:
    """Serve the metrics at address ("host:port"); returns the server (close() stops it)."""
    host, port = parse_address(address, allow_remote)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(health, joints, lateness))
    try:
        return MetricsServer(registry, host, port)
    except OSError as exc:
        raise InputError(f"metrics.address {address!r}: cannot serve there: {exc}") from None
