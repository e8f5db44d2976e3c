"""The driver's health as Prometheus metrics: scraped over HTTP on loopback and parsed with prometheus_client's
own text parser (as a Prometheus server would), the values checked against the driver's counters."""
from __future__ import annotations

import os
import re
import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from driver.config import load_config
from driver.daemon import Metrics
from driver.metrics import HealthCollector
from driver.transports.can import CanArm
from driver.transports.gateway import GatewayArm
from driver.transports.serial_link import SerialArm
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from local_driver import local_driver
from waiting import wait_until


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _text(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        return reply.read().decode()


def _scrape(address: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(_text(address))}


def _threads() -> int:
    """The process's native threads (every one the kernel sees, not only Python's)."""
    return len(os.listdir("/proc/self/task"))


_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_NOT_BASE_UNIT = re.compile(r"_(us|ms|ns|microseconds|milliseconds|minutes|hours|percent)(_|$)")


def naming_problems(text: str) -> list[str]:
    """What breaks Prometheus's naming conventions in an exposition (parsed with prometheus_client's own parser):
    counters end in _total, gauges do not, base units (seconds, not us or ms), no repeated word ("link_link"),
    quantiles only in a summary, a help text for each metric."""
    out = []
    for f in text_string_to_metric_families(text):
        if not _NAME.match(f.name) or not f.name.startswith("armid_"):
            out.append(f"{f.name}: not an armid_ metric name")
        if _NOT_BASE_UNIT.search(f.name):
            out.append(f"{f.name}: not in a base unit")
        words = f.name.split("_")
        if any(a == b for a, b in zip(words, words[1:])):
            out.append(f"{f.name}: a repeated word")
        if not f.documentation:
            out.append(f"{f.name}: no help text")
        for sample in f.samples:
            if f.type == "counter" and not sample.name.endswith(("_total", "_created")):
                out.append(f"{sample.name}: a counter without _total")
            if f.type == "gauge" and sample.name.endswith("_total"):
                out.append(f"{sample.name}: a gauge named as a counter")
            if "quantile" in sample.labels and f.type != "summary":
                out.append(f"{sample.name}: quantiles in a {f.type}")
    return out


def test_a_scrape_reports_the_drivers_counters_state_and_lateness(tmp_path):
    model = load_model("generic6")
    address = f"127.0.0.1:{_port()}"
    with local_driver(model, seed=2, metrics=Metrics(address)) as (d, _):
        assert wait_until(lambda: d.last_health is not None and d.last_health["cycle_rate_hz"] > 0, 10)  # a rate: 2nd
        m = _scrape(address)
        cycles = m["armid_cycles"][0].value
        assert 0 < cycles <= d.cycle.cycles
        assert m["armid_enabled"][0].value == 0.0 and m["armid_fault"][0].value == 0.0
        assert m["armid_cycle_rate_hz"][0].value > 100
        late = {s.name: s for s in m["armid_lateness_seconds"]}
        assert late["armid_lateness_seconds_count"].value >= 500             # about a health period of cycles
        assert {s.labels["le"] for s in m["armid_lateness_seconds"] if "le" in s.labels} >= {"0.001", "+Inf"}
        states = {(s.labels["joint"], s.labels["state"]) for s in m["armid_drive_state"]}
        assert {j for j, _ in states} == set(model.joint_names)
        d.cycle.submit(d.cycle.enable)
        assert wait_until(d.cycle.enabled, 10)
        assert wait_until(lambda: _scrape(address)["armid_enabled"][0].value == 1.0, 5)
        assert _scrape(address)["armid_cycles"][0].value > cycles         # counters grow scrape to scrape
    with pytest.raises(OSError):
        _scrape(address)                                                    # stopped with the driver


@pytest.mark.parametrize("table, error", [('address = "0.0.0.0:9464"', "not a loopback address"),
                                          ('address = "127.0.0.1"', "expected host:port"),
                                          ('address = "127.0.0.1:99999"', "expected host:port"),
                                          ('allow_remote = "yes"', "metrics.allow_remote")])
def test_a_metrics_section_that_cannot_be_served_safely_is_refused_naming_it(tmp_path, table, error):
    cfg = tmp_path / "driver.toml"
    cfg.write_text(f'[driver]\nmodel = "generic6"\n[transport]\nname = "sim"\n[metrics]\n{table}\n')
    with pytest.raises(InputError, match=error):
        load_config(cfg)


def test_a_remote_address_is_accepted_when_asked_for(tmp_path):
    cfg = tmp_path / "driver.toml"
    cfg.write_text('[driver]\nmodel = "generic6"\n[transport]\nname = "sim"\n[metrics]\n'
                   'address = "0.0.0.0:9464"\nallow_remote = true\n')
    assert load_config(cfg).metrics == Metrics("0.0.0.0:9464", True)


def test_the_exposition_follows_prometheus_naming_conventions():
    model = load_model("generic6")
    address = f"127.0.0.1:{_port()}"
    with local_driver(model, seed=2, metrics=Metrics(address)) as (d, _):
        assert wait_until(lambda: d.last_health is not None, 10)
        text = _text(address)
        assert naming_problems(text) == []
    # every transport's link counters, as each reports them before it opens
    for arm in (SerialArm(model, "/dev/null"), GatewayArm(model, host="127.0.0.1", port=1),
                CanArm(model, interface="virtual", channel="armid-metrics")):
        health = {**d.last_health, "link": arm.link_stats()}
        registry = CollectorRegistry(auto_describe=False)
        registry.register(HealthCollector(lambda: health, tuple(model.joint_names)))
        text = generate_latest(registry).decode()
        assert naming_problems(text) == [], type(arm).__name__
        assert "armid_link_" in text


def test_hundreds_of_silent_connections_leave_the_thread_count_bounded_and_a_scrape_answers():
    model = load_model("generic6")
    address = f"127.0.0.1:{_port()}"
    host, port = address.split(":")
    with local_driver(model, seed=2, metrics=Metrics(address)) as (d, _):
        assert wait_until(lambda: d.last_health is not None, 10)
        before = _threads()
        silent = []
        try:
            for _ in range(400):                   # connect, then never send a byte
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex((host, int(port)))
                silent.append(s)
            time.sleep(1.0)                        # time for a server to accept them (and start what it starts)
            during = _threads()
            assert during <= before + 2, f"{during - before} threads more with 400 silent connections"
            m = _scrape(address)                   # a scrape still answers meanwhile
            assert m["armid_cycles"][0].value > 0
            assert wait_until(lambda: _threads() <= before + 2, 5)
        finally:
            for s in silent:
                s.close()
        assert _threads() <= before + 2
