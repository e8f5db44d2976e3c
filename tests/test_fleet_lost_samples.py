"""The fleet table's lost_device_samples and dropped_samples are exact: an MCAP recording whose messages report
known device-sample losses (stream v2's lost-sample count) gives their sum, so do its CSV and NPZ conversions
(the CSV states it in a comment line), a CSV that states nothing gives null; a CSV with known stale repeats gives
their count as dropped samples; result.json holds the same counts."""
from __future__ import annotations

import json

import numpy as np
import pytest

from degraded import write_csv
from driver.recorder import McapStateWriter
from firmware_bridge.recording import convert
from firmware_bridge import stream
from ident.model import dynamics
from ident.fit import excitation
from ident.outputs import fleet
from ident.errors import InputError
from ident.model import load_model
from ident.fit.preprocess import load_recording

RATE = 200.0
NOISE = 0.02
LOST = {150: 2, 700: 1, 1100: 3}     # device sample index -> how many samples before it the driver lost
STALE_MESSAGES = (300, 301)          # STALE-flagged repeats the driver published (no new device data)
REPEATS = (400, 820, 1500, 1777)     # samples a logger wrote again with the previous values (stale repeats)


@pytest.fixture(scope="module")
def motion():
    model = load_model("generic6")
    t, q, qd, qdd = excitation.preset("seed000").sample(RATE)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(4).normal(0, NOISE, q.shape)
    return t, q, qd, tau


def write_mcap(path, t, q, qd, tau, version=stream.STREAM_VERSION):
    """A recording as the recorder writes it: the device samples in LOST's gaps never reached the driver (its
    next message reports how many), STALE_MESSAGES are published twice (flagged STALE). version 1: as an older
    driver wrote it, without the lost-sample counts."""
    n = q.shape[1]
    gone = {k - 1 - i for k, count in LOST.items() for i in range(count)}
    writer = McapStateWriter(path, rate_hz=RATE)
    seq = 0
    for k in range(len(t)):
        if k in gone:
            continue
        copies = [0, stream.FLAG_STALE] if k in STALE_MESSAGES else [0]
        for flags in copies:
            m = stream.StateMessage(n)
            m.q[:], m.qd[:], m.torque[:] = q[k], qd[k], tau[k]
            device_ns = round(t[k] * 1e9) + 1_000
            lost = stream.lost_flags(LOST.get(k, 0)) if flags == 0 and version >= 2 else 0
            m.set_header(seq, flags | lost, device_ns, 1_700_000_000_000_000_000 + device_ns + 50_000 * (flags != 0))
            m.record["version"] = version
            writer.write_state(bytes(m.buffer), n, seq, 1_700_000_000_000_000_000 + device_ns)
            seq += 1
    writer.close({"messages": str(seq)})
    return path


@pytest.fixture(scope="module")
def fleet_out(tmp_path_factory, motion):
    d = tmp_path_factory.mktemp("lost")
    t, q, qd, tau = motion
    write_mcap(d / "run.mcap", t, q, qd, tau)
    write_mcap(d / "old.mcap", t, q, qd, tau, version=1)
    convert(d / "old.mcap", d / "oldconverted.csv")
    convert(d / "run.mcap", d / "converted.csv")
    convert(d / "run.mcap", d / "npzrun.npz")
    write_csv(d / "plain.csv", t, q, tau)
    qs, taus = q.copy(), tau.copy()
    for k in REPEATS:
        qs[k], taus[k] = qs[k - 1], taus[k - 1]
    write_csv(d / "stale.csv", t, qs, taus, fields={"lost_samples": 0})
    jobs = [fleet.Job("A", "generic6", str(d / name)) for name in
            ("run.mcap", "converted.csv", "npzrun.npz", "plain.csv", "stale.csv", "old.mcap", "oldconverted.csv")]
    result = fleet.identify_many(jobs, d / "out", scheduler="serial", progress=False, report=False)
    assert not result.failures
    return d, {r["run"]: r for r in result.rows}


def test_lost_device_samples_are_the_sum_the_recordings_messages_report(fleet_out):
    _, rows = fleet_out
    expected = sum(LOST.values())
    assert rows["run"]["lost_device_samples"] == expected
    assert rows["run"]["dropped_samples"] == 0          # STALE messages are no samples; short gaps are bridged
    assert rows["run"]["bridged_samples"] == expected


def test_conversions_keep_the_lost_count_and_a_silent_recording_gives_null(fleet_out):
    d, rows = fleet_out
    assert rows["converted"]["lost_device_samples"] == sum(LOST.values())
    assert "# lost_samples = 6" in (d / "converted.csv").read_text().splitlines()[0]
    assert rows["npzrun"]["lost_device_samples"] == load_recording(d / "npzrun.npz").lost_samples == sum(LOST.values())
    assert rows["plain"]["lost_device_samples"] is None and rows["plain"]["dropped_samples"] == 0


def test_a_version_1_recording_says_nothing_of_lost_samples_and_gives_null_not_zero(fleet_out):
    d, rows = fleet_out
    assert rows["old"]["lost_device_samples"] is None and rows["oldconverted"]["lost_device_samples"] is None
    assert not (d / "oldconverted.csv").read_text().startswith("# lost_samples")
    assert rows["old"]["bridged_samples"] == sum(LOST.values())        # the gaps in device time are still seen


def test_dropped_samples_count_the_stale_repeats(fleet_out):
    _, rows = fleet_out
    assert rows["stale"]["stale_repeats"] == len(REPEATS)
    assert rows["stale"]["dropped_samples"] == len(REPEATS) + rows["stale"]["unused_samples"]
    assert rows["stale"]["lost_device_samples"] == 0


def test_result_json_holds_the_same_counts(fleet_out):
    d, rows = fleet_out
    for run in ("run", "stale", "plain"):
        data = json.loads((d / "out" / rows[run]["result"]).read_text())["data"]
        assert data["lost_device_samples"] == rows[run]["lost_device_samples"]
        assert data["dropped_samples"] == rows[run]["dropped_samples"]


@pytest.mark.parametrize("value", ["-1", "2.5", "many", "nan"])
def test_a_bad_lost_count_is_refused_naming_the_field(tmp_path, motion, value):
    t, q, _, tau = motion
    path = tmp_path / "bad.csv"
    write_csv(path, t[:64], q[:64], tau[:64])
    path.write_text(f"# lost_samples = {value}\n" + path.read_text())
    with pytest.raises(InputError, match="lost_samples"):
        load_recording(path)


def test_identify_prints_and_reports_the_losses(fleet_out, tmp_path, capsys):
    from armid import cli

    d, _ = fleet_out
    assert cli.main(["identify", str(d / "stale.csv"), "--model", "generic6", "-o", str(tmp_path / "o"),
                     "--quiet"]) == 0
    said = f"{len(REPEATS)} of its samples dropped (stale repeats, segments too short)"
    assert f"data: {said}" in capsys.readouterr().out.splitlines()
    assert said in (tmp_path / "o" / "report.html").read_text()
    assert cli.main(["identify", str(d / "converted.csv"), "--model", "generic6", "-o", str(tmp_path / "c"),
                     "--quiet", "--no-report"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"data: the recording reports {sum(LOST.values())} device samples lost before it" in lines
