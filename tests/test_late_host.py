"""Samples whose targets reached the drives too late (a late host) are cut out of identification like a gap.

In process: the free-running serial board's drives (sim.late_host) along the demo's excitation, noise off, with a
host that is silent for 29 ms and then sends every target it owes; z in the sigmas of the same motion with the
host on time and the simulator's noise on. Bounded: every run is a fixed number of simulated cycles."""
from __future__ import annotations

import numpy as np
import pytest

from firmware_bridge import stream
from ident.fit.preprocess import (LATE_SETTLE_S, PreprocessError, Recording, cut_windows, load_recording,
                                  split_at_gaps)

RATE = 1000.0
REST_S = 0.3
PERIODS = 0.25


@pytest.fixture(scope="module")
def setup():
    from armid.commands import demo
    from ident.fit import excitation
    from ident.fit.batch import identify
    from ident.model import load_model
    from ident.model.base_params import base_parameters
    from sim import NoiseConfig
    from sim.late_host import late_host_recording

    model = load_model("generic6")
    base = base_parameters(model)
    traj = excitation.preset("seed000")
    truth = base.from_standard(model.standard_parameters())
    q_ref = demo.excitation_targets(traj, PERIODS, RATE, REST_S)

    def run(stall_ms=0.0, mark=True, noise=0.0):
        rec = late_host_recording(model, q_ref, rate_hz=RATE, stall_at=int((REST_S + 3.0) * RATE),
                                  stall=int(round(stall_ms)), current_std=noise, seed=1, mark=mark)
        return rec, identify(model, rec, trajectory=traj, base=base)

    _, noisy = run(noise=NoiseConfig().current_std)
    return run, truth, noisy.fit.std, noisy.fit.relative_std_pct <= 10


def _max_z(result, truth, std, ok):
    return float(np.abs(((result.fit.beta - truth) / std)[ok]).max())


def test_a_29_ms_late_host_biases_the_fit_unless_its_marked_window_is_cut(setup):
    run, truth, std, ok = setup
    rec, kept = run(29.0, mark=False)
    assert rec.late is not None and not rec.late.any()
    # before: the drives' hold and the burst's reversal become data: several sigma (6.2 on this motion)
    assert _max_z(kept, truth, std, ok) > 3.0
    rec, cut = run(29.0, mark=True)
    assert rec.late.sum() == 30                     # the 29 silent cycles and the one that ends the silence
    assert _max_z(cut, truth, std, ok) < 1.0        # on time, noise off: 0.28 sigma
    late = cut.rows.late_cut
    assert len(late.windows) == 1
    t0, t1 = late.windows[0]
    assert t0 == pytest.approx(REST_S + 3.0 - 1.0 / RATE + 0.0, abs=1.5 / RATE)
    assert t1 - t0 == pytest.approx(29 / RATE + LATE_SETTLE_S, abs=1.5 / RATE)
    assert cut.rows.segments == 2
    from ident.outputs.results import result_document

    data = result_document(cut)["data"]
    assert data["late_cut_samples"] == 60 and data["late_windows_s"] == [[pytest.approx(t0), pytest.approx(t1)]]
    note = cut.rows.gaps_note()
    assert "1 window, " in note and "targets late" in note and "in 2 uniformly sampled segments" in note


def test_a_host_on_time_or_within_the_drives_slack_loses_nothing(setup):
    from ident.outputs.results import result_document
    from sim.late_host import drive_slack
    from sim import Simulator
    from ident.model import load_model

    run, truth, std, ok = setup
    slack = drive_slack(Simulator(load_model("generic6")))
    assert slack == 7                                  # setpoint buffer 3 + extrapolation 4
    for stall in (0.0, float(slack)):
        rec, result = run(stall)
        assert not rec.late.any()
        assert result.rows.late_cut.windows == () and result.rows.segments == 1
        assert "targets late" not in result.rows.gaps_note()
        assert result_document(result)["data"]["late_windows_s"] == []
        assert _max_z(result, truth, std, ok) < 1.0


def _rec(late, N=2000):
    t = np.arange(N) / RATE
    q = np.column_stack([np.sin(2 * np.pi * 0.5 * t), np.cos(2 * np.pi * 0.3 * t)])
    return Recording(t, q, q * 2.0, None, None, "synthetic", late=late)


def test_cut_windows_merge_overlapping_runs_and_split_like_a_gap():
    late = np.zeros(2000, dtype=bool)
    late[500:510] = True
    late[520:525] = True          # within the settle time of the first: one window
    late[1500:1502] = True
    rec = _rec(late)
    cut = cut_windows(rec)
    assert len(cut.windows) == 2
    assert cut.windows[0] == pytest.approx((0.5, 0.524 + LATE_SETTLE_S))
    assert cut.windows[1] == pytest.approx((1.5, 1.501 + LATE_SETTLE_S))
    settle = int(round(LATE_SETTLE_S * RATE))
    assert cut.samples == (525 + settle - 500) + (1502 + settle - 1500)
    pieces = split_at_gaps(rec, cut.windows)
    assert [(p.start, p.stop) for p in pieces] == [(0, 500), (525 + settle, 1500), (1502 + settle, 2000)]
    assert cut_windows(_rec(None)).windows == () and cut_windows(_rec(np.zeros(2000, bool))).windows == ()
    assert [(p.start, p.stop) for p in split_at_gaps(rec)] == [(0, 2000)]
    from ident.fit.batch import StepError, identify
    from ident.model import load_model

    t = np.arange(2000) / RATE
    q = np.sin(2 * np.pi * 0.5 * t[:, None] + np.arange(6))
    with pytest.raises(StepError, match="synthetic: every sample lies in a window the recording marks late"):
        identify(load_model("generic6"), Recording(t, q, q, None, None, "synthetic", late=np.ones(2000, dtype=bool)))


def test_late_marks_are_checked_and_kept_in_npz_and_csv(tmp_path):
    with pytest.raises(PreprocessError, match=r"synthetic: late: expected one mark per sample \(2000,\)"):
        _rec(np.zeros(10, dtype=bool))
    with pytest.raises(PreprocessError, match="synthetic: late: expected 0 or 1"):
        _rec(np.full(2000, 2))
    from firmware_bridge.recording import write_identification

    late = np.zeros(2000, dtype=bool)
    late[100:120] = True
    rec = _rec(late)
    arrays = {"t": rec.t, "q": rec.q, "tau": rec.tau, "qd": rec.q, "effort_delay": np.array(0.0), "late": late}
    for name in ("r.npz", "r.csv"):
        write_identification(arrays, tmp_path / name)
        back = load_recording(tmp_path / name)
        assert np.array_equal(back.late, late), name
    assert (tmp_path / "r.csv").read_text().splitlines()[0].endswith(",qd2,late")
    del arrays["late"]                               # no marks: no column, and the reader says none
    write_identification(arrays, tmp_path / "plain.csv")
    assert load_recording(tmp_path / "plain.csv").late is None
    lines = (tmp_path / "r.csv").read_text().splitlines()
    lines[3] = lines[3][:-1] + "0.5"                 # the third data row (line 4): a mark that is neither 0 nor 1
    (tmp_path / "bad.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(PreprocessError, match=r"bad\.csv: line 4, column late: expected 0 or 1, got 0\.5"):
        load_recording(tmp_path / "bad.csv")


def test_the_recording_reader_carries_the_late_flag_past_the_samples_it_leaves_out():
    from firmware_bridge.recording import StateLog, identification_arrays

    N = 8
    s = np.zeros(N, dtype=stream.state_dtype(6))
    s["seq"] = np.arange(N)
    s["device_time_ns"] = np.arange(N) * 1_000_000
    s["flags"][2] = stream.FLAG_LATE
    s["flags"][4] = stream.FLAG_LATE | stream.FLAG_STALE       # left out: its mark goes to the next fresh one
    s["device_time_ns"][4] = s["device_time_ns"][3]
    log = StateLog("x.mcap", tuple(f"j{k}" for k in range(1, 7)), s, True, 0, "", {})
    arrays, notes = identification_arrays(log)
    assert len(arrays["t"]) == N - 1
    assert arrays["late"].tolist() == [False, False, True, False, True, False, False]
    assert any("2 samples marked LATE" in n for n in notes)
    s["flags"] = 0
    arrays, _ = identification_arrays(StateLog("x.mcap", log.joint_names, s, True, 0, "", {}))
    assert "late" not in arrays


def test_the_late_flag_is_a_driver_flag_bit_in_the_c_header():
    from firmware_bridge import c_header

    assert stream.FLAG_LATE < 1 << stream.LOST_SHIFT
    bits = {v for k, v in vars(stream).items() if k.startswith("FLAG_") and k != "FLAG_DOCS"}
    assert len(bits) == len(stream.FLAG_DOCS)
    assert "#define ARMID_STREAM_FLAG_LATE 0x100 " in c_header.HEADER_PATH.read_text()


def test_the_driver_flags_late_every_sample_of_a_burst_longer_than_the_drives_slack():
    """The cycle's own arm (tests/test_cycle_intake.py's LockstepArm: samples handed over by the test, kept until
    read): a burst of at most LATE_AFTER_CYCLES waiting samples is published plain; a longer one (the cycle was
    not scheduled while the device went on) is published with FLAG_LATE on each of its samples, and the next
    ordinary cycle is not."""
    from driver.cycle import LATE_AFTER_CYCLES, Cycle
    from sim import Simulator
    from sim.late_host import drive_slack
    from ident.model import load_model
    from test_cycle_intake import LockstepArm

    assert LATE_AFTER_CYCLES == drive_slack(Simulator(load_model("generic6")))
    arm, sent = LockstepArm(), []
    cycle = Cycle(arm, rate_hz=100.0, watchdog_s=60.0, clock="device",
                  publish=lambda topic, payload: topic == stream.TOPIC_STATE and sent.append(
                      int(stream.decode_state(bytes(payload))["flags"])))
    late = lambda: [bool(f & stream.FLAG_LATE) for f in sent if not f & stream.FLAG_STALE]   # noqa: E731
    arm.push(1)
    cycle.step()
    arm.push(LATE_AFTER_CYCLES)               # a host silent for the drives' slack: they did not hold
    cycle.step()
    assert late() == [False] * (LATE_AFTER_CYCLES + 1) and cycle.late_samples == 0
    sent.clear()
    arm.push(LATE_AFTER_CYCLES + 1)           # one cycle more: they held a stale target
    cycle.step()
    arm.push(1)
    cycle.step()
    assert late() == [True] * (LATE_AFTER_CYCLES + 1) + [False]
    assert cycle.late_samples == LATE_AFTER_CYCLES + 1


def test_the_drives_slack_comes_from_the_config_and_a_bad_one_is_refused_naming_the_key(tmp_path):
    """Real drives buffer and extrapolate for as many cycles as their firmware does: `[driver] late_after_cycles`
    sets the backlog beyond which the cycle flags LATE (a burst of 3 is late for drives that ride through 2)."""
    from driver.config import ConfigError, load_config
    from driver.cycle import LATE_AFTER_CYCLES, Cycle
    from test_cycle_intake import LockstepArm

    path = tmp_path / "driver.toml"
    path.write_text('[driver]\nlate_after_cycles = 2\n[transport]\nname = "sim"\n')
    cfg = load_config(path)
    assert cfg.late_after_cycles == 2
    arm, sent = LockstepArm(), []
    cycle = Cycle(arm, rate_hz=100.0, watchdog_s=60.0, clock="device", late_after=cfg.late_after_cycles,
                  publish=lambda topic, payload: topic == stream.TOPIC_STATE and sent.append(
                      int(stream.decode_state(bytes(payload))["flags"])))
    arm.push(1)
    cycle.step()
    arm.push(3)
    cycle.step()
    assert cycle.late_samples == 3
    path.write_text('[driver]\n[transport]\nname = "sim"\n')
    assert load_config(path).late_after_cycles == LATE_AFTER_CYCLES
    for bad in ("0", "1001", "2.5", "true", '"seven"'):
        path.write_text(f'[driver]\nlate_after_cycles = {bad}\n[transport]\nname = "sim"\n')
        with pytest.raises(ConfigError, match=r"driver\.late_after_cycles: expected a whole number of cycles 1\.\.1000"):
            load_config(path)
    with pytest.raises(ValueError, match="late_after"):
        Cycle(LockstepArm(), clock="device", late_after=0)


def test_the_online_service_leaves_late_samples_and_their_settle_time_out():
    """The live service (real ZeroMQ on 127.0.0.1): 200 samples at 1 kHz, 20..29 flagged LATE; those and the
    LATE_SETTLE_S after them never reach the identifier, and the gap they leave is counted as one."""
    import time

    import zmq

    from ident.model import load_model
    from ident.online.service import IdentService
    from waiting import wait_until

    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    svc = IdentService(load_model("generic6"), state_endpoint=f"tcp://127.0.0.1:{port}",
                       publish_endpoint="tcp://127.0.0.1:*", command_endpoint="tcp://127.0.0.1:*")
    svc.start()
    try:
        msg = stream.StateMessage(6)
        time.sleep(0.3)                                  # let the subscription reach the publisher
        for k in range(200):
            msg.set_header(k, stream.FLAG_LATE if 20 <= k < 30 else 0, k * 1_000_000, time.time_ns())
            msg.q[:] = 0.001 * k
            pub.send_multipart((stream.TOPIC_STATE, bytes(msg.buffer)))
        settle = int(round(LATE_SETTLE_S * RATE))
        assert wait_until(lambda: svc.messages == 200, 10)
        assert svc.late == 10 + settle
        assert wait_until(lambda: svc.identifier.counters.samples == 200 - 10 - settle, 10)
        assert wait_until(lambda: svc.identifier.counters.gaps == 1, 10)    # set after samples, in the same push
        assert svc.identifier.counters.lost == 10 + settle
    finally:
        svc.stop()
        pub.close(0)
