"""The driver's health as Prometheus metrics (prometheus-client), served over HTTP on loopback by default.

The collector reads the newest health message (driver.daemon.Driver.health, made once a second by the health
thread) when Prometheus scrapes: nothing is added to the cycle. Counters are the driver's own totals since it
started; gauges are the state at the last health message.

    [metrics]
    address = "127.0.0.1:9464"     # host:port; beyond loopback only with allow_remote = true
"""
from __future__ import annotations

import ipaddress
from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from firmware_bridge.errors import InputError

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

    def __init__(self, health: Callable[[], dict | None], joints: tuple[str, ...]):
        self._health, self._joints = health, joints

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
        late = GaugeMetricFamily("armid_lateness_seconds", "cycle lateness over the recent cycles, by percentile",
                                 labels=["quantile"])
        for key, quantile in (("p50_us", "0.5"), ("p99_us", "0.99"), ("max_us", "1")):
            value = (h.get("lateness") or {}).get(key)
            if isinstance(value, (int, float)):
                late.add_metric([quantile], float(value) * 1e-6)
        yield late
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
        link = h.get("link") or {}
        for key, value in link.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield GaugeMetricFamily(f"armid_link_{key}", f"the transport's link counter {key}", value=float(value))


def serve(address: str, health: Callable[[], dict | None], joints: tuple[str, ...], allow_remote: bool = False):
    """Serve the metrics at address ("host:port"); returns the HTTP server (shutdown() stops it)."""
    host, port = parse_address(address, allow_remote)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HealthCollector(health, joints))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise InputError(f"metrics.address {address!r}: cannot serve there: {exc}") from None
    return server
