"""End to end on the simulated arm, hardware in the loop: `armid demo --transport T` starts `armid sim`
behind transport T, `armid driver` connected to it and `armid record` on its stream, as processes on
loopback (armid.chain); runs enable, move_to and two run_trajectory commands through the driver's command
channel; converts the recording and identifies it. One test per transport (serial over a pty, CAN on
python-can's udp_multicast, the Modbus TCP gateway).

Fast mode (FAST): half a period of the seed000 excitation (at the transport's slowdown, docs/demo.md),
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
from ident.model import load_model
from ident.results import BADLY_IDENTIFIED_PCT

FAST = ["--periods", "0.5"]
MIN_MEANINGFUL = 3     # fewer well-identified parameters than this: the excitation reached nothing


@pytest.fixture(scope="module")
def truth():
    model = load_model("generic6")
    base = base_parameters(model)
    return base.names, base.from_standard(model.standard_parameters())


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
