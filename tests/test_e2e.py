"""End to end on the simulated arm, hardware in the loop: `armid demo --transport T` starts `armid sim`
behind transport T, `armid driver` connected to it and `armid record` on its stream, as processes on
loopback (armid.chain); runs enable, move_to and two run_trajectory commands through the driver's command
channel; converts the recording and identifies it. One test per transport (serial over a pty, CAN on
python-can's udp_multicast, the Modbus TCP gateway).

Fast mode (FAST): a quarter period of the seed000 excitation (at the transport's slowdown, docs/demo.md),
blended in from rest and out to rest over 2 s each, then the same motion time-reversed for validation.
Nothing else is shortened: real processes, real links, the driver's real-time cycle, the real recorder.

What is asserted, per transport:
- the demo exits 0 and its recording is complete with no state message lost (no seq gap);
- every base parameter whose reported relative standard deviation is at most the product's own
  "well identified" bound (ident.results.BADLY_IDENTIFIED_PCT, 10 %) lies within 3 reported sigma of the
  simulator's truth (the generic6 model the simulator runs), and there are at least MIN_MEANINGFUL of them.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from armid import chain, cli
from driver.recording import read_recording
from ident.base_params import base_parameters
from ident.errors import InputError
from ident.model import load_model
from ident.results import BADLY_IDENTIFIED_PCT

FAST = ["--periods", "0.25"]
MIN_MEANINGFUL = 3     # fewer well-identified parameters than this: the excitation reached nothing


@pytest.fixture(scope="module")
def truth():
    model = load_model("generic6")
    base = base_parameters(model)
    return base.names, base.from_standard(model.standard_parameters())


@pytest.mark.e2e
@pytest.mark.parametrize("transport", chain.TRANSPORTS)
def test_the_demo_chain_drops_nothing_and_finds_the_simulators_parameters_within_3_sigma(transport, truth, tmp_path,
                                                                                            capsys):
    out = tmp_path / transport
    code = cli.main(["demo", "-o", str(out), "--transport", transport, *FAST, "--quiet"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "stream: " in printed.out and "report: " in printed.out

    log = read_recording(out / "run.mcap")
    assert log.complete
    assert log.seq_gaps() == (0, 0)

    names, true_values = truth
    doc = json.loads((out / "result.json").read_text())
    rows = doc["base_parameters"]
    assert [r["name"] for r in rows] == names
    value = np.array([r["value"] for r in rows])
    std = np.array([r["std"] for r in rows])
    pct = np.array([np.inf if r["relative_std_pct"] is None else r["relative_std_pct"] for r in rows])
    meaningful = pct <= BADLY_IDENTIFIED_PCT
    assert meaningful.sum() >= MIN_MEANINGFUL, f"only {[n for n, m in zip(names, meaningful) if m]} identified"
    off = meaningful & (np.abs(value - true_values) > 3 * std)
    assert not off.any(), [(n, v, t, s) for n, v, t, s, o in zip(names, value, true_values, std, off) if o]


# -- the chain's own pieces (fast) ----------------------------------------------------------------------------
def test_the_sims_ready_line_becomes_a_driver_config_that_the_driver_reads_back(tmp_path):
    from driver.config import load_config

    options = chain.transport_options("serial", "armid sim: serial ready: port=/dev/pts/7 baudrate=3000000")
    assert options == {"port": "/dev/pts/7", "baudrate": 3000000}
    plan = chain.plan_for("serial")
    path = tmp_path / "driver.toml"
    path.write_text(chain.driver_config("serial", {**options, **dict(plan.driver_options)}, rate_hz=plan.rate_hz,
                                       watchdog_ms=plan.watchdog_ms, state="ipc:///tmp/x-state",
                                       commands="ipc:///tmp/x-commands"))
    cfg = load_config(path)
    assert cfg.transport == "serial" and cfg.rate_hz == plan.rate_hz
    assert cfg.transport_options == {"port": "/dev/pts/7", "baudrate": 3000000, "device_watchdog_ms": 2000}
    assert cfg.endpoints.state == "ipc:///tmp/x-state" and cfg.endpoints.commands == "ipc:///tmp/x-commands"
    with pytest.raises(chain.ChainError, match="printed no address"):
        chain.transport_options("gateway", "something else")


def test_every_transport_runs_the_simulator_at_the_drivers_rate_because_the_host_clocks_it():
    """CAN's drives step on each SYNC, serial's boards on each COMMAND, the gateway on each exchange: the
    simulator's dt is the driver's period, at the default rate and at any other."""
    for name in chain.TRANSPORTS:
        p = chain.plan_for(name)
        assert p.lockstep and p.sim_rate_hz == p.rate_hz
        for rate in (100.0, 400.0):
            p = chain.plan_for(name, rate)
            assert p.rate_hz == p.sim_rate_hz == rate
    assert "step_on_command=true" in chain.plan_for("serial").sim_args
    assert "step_on_exchange=true" in chain.plan_for("gateway").sim_args
    assert chain.plan_for("gateway").clock == chain.plan_for("serial").clock == "host"
    with pytest.raises(InputError, match="unknown"):
        chain.plan_for("ethercat")


def test_uniform_samples_are_exact_for_a_cubic_path_and_linear_torques_from_irregular_times():
    rng = np.random.default_rng(3)
    t = np.cumsum(rng.choice([0.001, 0.002, 0.004], size=400))      # irregular, as a free-running link delivers
    t -= t[0]
    q = np.column_stack([1 + 2 * t - 3 * t ** 2 + 0.5 * t ** 3, np.full_like(t, 0.2)])
    tau = np.column_stack([4 - 2 * t, 3 * t])
    out, bridged = chain.uniform_samples({"t": t, "q": q, "tau": tau}, rate_hz=1000.0)
    g = out["t"]
    np.testing.assert_allclose(np.diff(g), 0.001, rtol=0, atol=1e-12)
    assert g[-1] <= t[-1] + 1e-12 and bridged == pytest.approx(np.diff(t).max())
    np.testing.assert_allclose(out["q"][:, 0], 1 + 2 * g - 3 * g ** 2 + 0.5 * g ** 3, atol=1e-9)
    np.testing.assert_allclose(out["tau"], np.column_stack([4 - 2 * g, 3 * g]), atol=1e-12)
    with pytest.raises(chain.ChainError, match="too few"):
        chain.uniform_samples({"t": t[:3], "q": q[:3], "tau": tau[:3]})


def _log(seq, flags, host_ns):
    from driver.recording import StateLog
    from firmware_bridge import stream

    s = np.zeros(len(seq), dtype=stream.state_dtype(6))
    s["seq"], s["flags"], s["host_time_ns"], s["device_time_ns"] = seq, flags, host_ns, host_ns
    return StateLog("x.mcap", tuple(f"j{k}" for k in range(1, 7)), s, True, 0, "", {})


def test_stream_figures_count_seq_gaps_and_stale_messages_and_the_motion_window_keeps_moving_ones():
    from firmware_bridge import stream

    seq = np.array([10, 11, 12, 15, 16, 20])
    flags = np.array([0, stream.FLAG_MOVING, stream.FLAG_MOVING | stream.FLAG_STALE, stream.FLAG_MOVING, 0,
                      stream.FLAG_MOVING])
    log = _log(seq, flags, np.arange(6) * 1_000_000)
    f = chain.stream_figures(log)
    assert (f.messages, f.dropped, f.gaps, f.stale) == (6, 5, 2, 1)
    assert f.rate_hz == pytest.approx(1000.0) and f.seconds == pytest.approx(0.005)
    window = chain.motion_window(log, 11, 16)
    assert list(window.states["seq"]) == [11, 12, 15]
    with pytest.raises(chain.ChainError, match="no MOVING"):
        chain.motion_window(log, 16, 19)
