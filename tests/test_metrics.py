"""The driver's health as Prometheus metrics: scraped over HTTP on loopback and parsed with prometheus_client's
own text parser (as a Prometheus server would), the values checked against the driver's counters."""
from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from driver.config import load_config
from driver.daemon import Metrics
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from local_driver import local_driver
from waiting import wait_until


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(address: str) -> dict[str, list]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


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
        assert {s.labels["quantile"] for s in m["armid_lateness_seconds"]} == {"0.5", "0.99", "1"}
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
