"""Identification on recordings as real loggers write them: stale repeats, jittered and bursty time stamps,
dropped samples and a stall, a slow excitation at 1 kHz. The defaults must mend them (ident.fit.resample), pick a
cut-off and decimation that fit the motion (the spectrum of q), identify within 3 reported sigma of the truth,
report error figures against the measured torque, and warn (exit 3 with --strict) on a fit that is no result."""
from __future__ import annotations

import json

import numpy as np
import pytest

from armid import cli
from armid.commands.identify import STRICT_EXIT
from degraded import TORQUE_NOISE, degraded_log, write_csv
from ident.fit import batch, excitation, preprocess, resample
from ident.model import dynamics
from ident.model.base_params import base_parameters
from ident.fit.excitation import FourierTrajectory
from ident.fit.checks import COND_WARN, fit_warnings
from ident.model import load_model
from ident.fit.preprocess import PreprocessError, Recording
from ident.outputs.results import BADLY_IDENTIFIED_PCT


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.fixture(scope="module")
def truth(model):
    return base_parameters(model).from_standard(model.standard_parameters())


def scaled(traj: FourierTrajectory, k: float) -> FourierTrajectory:
    return FourierTrajectory(traj.base_frequency, traj.q0, k * traj.a, k * traj.b)


# -- mending the sampling -------------------------------------------------------------------------------------

def test_stale_repeats_are_exactly_the_entries_that_copy_the_one_before():
    rng = np.random.default_rng(3)
    t = np.arange(200) / 1000.0
    q, tau = rng.normal(size=(200, 2)), rng.normal(size=(200, 2))
    stale = np.zeros(200, bool)
    stale[[5, 6, 40, 199]] = True                    # a run of two, one alone, the last sample
    for k in np.flatnonzero(stale):
        q[k], tau[k] = q[k - 1], tau[k - 1]
    q[100, 0] = q[99, 0]                               # one joint alike is no repeat: the others moved
    rec = Recording(t, q, tau, None, None, "r")
    assert np.array_equal(resample.stale_repeats(rec), stale)
    mended, done = resample.mend_sampling(rec)
    assert done.repeats == 4 and mended.N == 196 and not done.resampled   # the gaps left are whole samples
    assert np.array_equal(mended.t, t[~stale])


@pytest.mark.parametrize("intervals, uneven", [
    ([1.0, 1.2, 0.8, 1.0, 1.1], False),                # jitter within 25 %
    ([1.0, 1.0, 3.0, 1.0, 1.0], False),                # two samples lost: a clean gap
    ([1.0, 1.0, 0.6, 1.0, 1.0], True),                 # a burst
    ([1.0, 1.0, 1.6, 1.0, 1.0], True),                 # a late sample: no whole number of periods
])
def test_uneven_sampling_is_what_no_whole_number_of_periods_explains(intervals, uneven):
    assert resample.is_uneven(np.concatenate([[0.0], np.cumsum(intervals)])) is uneven


def test_resampling_a_bursty_log_reproduces_the_motion_and_averages_the_effort_band_limited():
    """A log at about 2 kHz with time stamps wandering by +-35 % of a period, resampled to 500 Hz. Oracle: the
    exact signals at the uniform times. Positions (1.3 and 0.7 Hz) by the spline to 1e-6 of their amplitude. The
    effort, a 20 Hz sine plus white noise: band-limited to the new Nyquist frequency, every recorded sample
    contributes and the noise falls to about half (1/4 of the band, times linear interpolation's 2/3), where
    reading the effort at the new times by linear interpolation keeps about 0.8 of it."""
    rng = np.random.default_rng(0)
    raw, rate, noise = 2000.0, 500.0, 0.1
    t = np.arange(12000) / raw + rng.uniform(-0.35, 0.35, 12000) / raw
    t -= t[0]
    motion = (lambda x: np.column_stack([np.sin(2 * np.pi * 1.3 * x), np.cos(2 * np.pi * 0.7 * x)]))  # noqa: E731
    effort = (lambda x: np.column_stack([np.sin(2 * np.pi * 20 * x), np.cos(2 * np.pi * 20 * x)]))    # noqa: E731
    rec = Recording(t, motion(t), effort(t) + rng.normal(0, noise, (len(t), 2)), None, None, "bursty")
    assert resample.is_uneven(t)
    out, done = resample.mend_sampling(rec, rate_hz=rate)
    assert done.resampled and done.pieces == 1 and done.rate_hz == rate
    assert np.allclose(np.diff(out.t), 1 / rate, rtol=0, atol=1e-12)
    inner = slice(20, -20)
    assert np.abs(out.q - motion(out.t))[inner].max() < 1e-6
    band = np.sqrt(((out.tau - effort(out.t))[inner] ** 2).mean())
    linear = np.column_stack([np.interp(out.t, t, c) for c in rec.tau.T])
    pointwise = np.sqrt(((linear - effort(out.t))[inner] ** 2).mean())
    assert band < 0.55 * noise and pointwise > 0.7 * noise


def test_a_long_stall_is_cut_not_interpolated_and_the_pieces_keep_their_times():
    t = np.concatenate([np.arange(100), 160 + np.arange(100)]) / 1000.0 + 1e-4 * np.tile([0, 3, -2, 1], 50)
    q = np.column_stack([np.sin(t), np.cos(t)])
    out, pieces = resample.resample_uniform(Recording(t, q, q.copy(), None, None, "s"), 1000.0)
    assert pieces == 2
    assert out.t[0] == t[0] and t[100] in out.t and not ((out.t > t[99]) & (out.t < t[100])).any()


# -- defaults that fit the data ---------------------------------------------------------------------------------

def test_the_bandwidth_of_a_slow_excitation_with_noisy_positions_is_its_harmonics():
    """A 0.075 Hz, 5-harmonic excitation at 1 kHz with encoder noise: the spectrum of q gives about its 0.375 Hz;
    the velocity's energy (the estimate it replaces) puts the bandwidth in the noise, hundreds of Hz."""
    rng = np.random.default_rng(1)
    traj = FourierTrajectory(0.075, np.zeros(3), 0.2 * rng.normal(size=(3, 5)), 0.2 * rng.normal(size=(3, 5)))
    t, q, _, _ = traj.sample(1000.0)
    q = q + rng.normal(0, 1e-4, q.shape)
    bw = preprocess.estimate_bandwidth(q, 1000.0)
    assert 0.375 <= bw <= 0.6
    v = np.diff(q, axis=0)
    power = (np.abs(np.fft.rfft(v - v.mean(axis=0), axis=0)) ** 2).sum(axis=1)
    f = np.fft.rfftfreq(len(v), 1e-3)
    assert f[np.searchsorted(np.cumsum(power) / power.sum(), 0.999)] > 100 * bw


@pytest.mark.parametrize("seed", [0, 1])
def test_the_defaults_identify_a_degraded_1khz_log_within_3_sigma_of_the_truth(tmp_path, model, truth, seed):
    """The criterion of tests/test_e2e.py: of the well-identified parameters at most one outside 3 sigma, none
    outside 4. No trajectory, cut-off or decimation given; the file states no clock."""
    log = degraded_log(model, excitation.preset("seed000"), seed)
    data = write_csv(tmp_path / "log.csv", log.t, log.q, log.tau)
    assert resample.is_uneven(log.t) and log.repeats > 100
    code = cli.main(["identify", str(data), "--model", "generic6", "-o", str(tmp_path / "out"), "--quiet",
                     "--no-report", "--strict"])
    assert code == 0
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert not (tmp_path / "out" / "report.html").exists()
    assert doc["warnings"] == []
    assert doc["data"]["resampling"]["stale_repeats"] == log.repeats and doc["data"]["resampling"]["resampled"]
    assert doc["data"]["bandwidth_from"] == "estimated" and doc["data"]["decimation"] >= 10
    value = np.array([r["value"] for r in doc["base_parameters"]])
    std = np.array([r["std"] for r in doc["base_parameters"]])
    pct = np.array([np.inf if r["relative_std_pct"] is None else r["relative_std_pct"] for r in doc["base_parameters"]])
    meaningful = pct <= BADLY_IDENTIFIED_PCT
    z = np.abs(value - truth)[meaningful] / std[meaningful]
    assert meaningful.sum() >= 25
    assert (z > 3.0).sum() <= 1 and z.max() <= 4.0, f"max |z| {z.max():.1f} over {meaningful.sum()}"


def test_an_unidentifiable_recording_warns_and_strict_exits_3(tmp_path, model, capsys):
    """A tenth of the excitation's amplitude: the base parameters are nearly dependent in the data (condition
    number above COND_WARN). The result is written, the warning is printed, in result.json and the report.
    (--slow 0.05: at this amplitude some joints never reach the default 0.2 rad/s, and a joint without rows is
    refused outright, a different error.)"""
    log = degraded_log(model, scaled(excitation.preset("seed000"), 0.1), 0)
    data = write_csv(tmp_path / "small.csv", log.t, log.q, log.tau, fields={"clock_hz": 1000.0})
    argv = ["identify", str(data), "--model", "generic6", "-o", str(tmp_path / "out"), "--quiet", "--slow", "0.05"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    doc = json.loads((tmp_path / "out" / "result.json").read_text())
    assert doc["fit"]["cond"] > COND_WARN
    assert any(w.startswith("condition number") for w in doc["warnings"])
    assert "warning: condition number" in printed
    assert "Warnings: this result may be wrong" in (tmp_path / "out" / "report.html").read_text()
    assert cli.main(argv + ["--strict", "--no-report"]) == STRICT_EXIT
    assert doc["data"]["resampling"]["rate_hz"] == 1000.0          # the file's stated clock


def test_a_cut_off_in_the_noise_without_decimation_is_warned_about_not_passed_quietly(tmp_path, model, capsys):
    """What a real arm's log got from the bandwidth of its velocity noise: a 400 Hz cut-off and no decimation, so
    the accelerations are noise. The same settings on a degraded log: warnings, and exit 3 with --strict."""
    paths = []
    for seed in (0, 1):
        log = degraded_log(model, excitation.preset("seed000"), seed)
        paths.append(write_csv(tmp_path / f"log{seed}.csv", log.t, log.q, log.tau))
    argv = ["identify", str(paths[0]), "--validate", str(paths[1]), "--model", "generic6", "-o", str(tmp_path / "o"),
            "--cutoff", "400", "--decimate", "1", "--quiet", "--no-report", "--strict"]
    assert cli.main(argv) == STRICT_EXIT
    doc = json.loads((tmp_path / "o" / "result.json").read_text())
    assert any(w.startswith("validation error above 20 %") for w in doc["warnings"])
    assert max(doc["validation"]["relative"]) > 0.2 and doc["data"]["cutoff_hz"] == 400.0
    assert "warning: validation error above 20 %" in capsys.readouterr().out


def test_implausible_drive_parameters_are_warned_about():
    names = ["ZZR1", "fc1", "fv1", "offset1", "fc2", "offset2"]
    std = np.full(6, 0.1)
    limits, fast = np.array([10.0, 5.0]), np.array([2.0, 2.0])
    assert fit_warnings(names, np.array([1, 3, 2, 0.5, 1, -4.9]), std, 100.0, limits, fast) == []
    found = fit_warnings(names, np.array([1, 3, 6, 0.5, -1, -5.5]), std, 100.0, limits, fast)
    assert len(found) == 3
    assert found[0].startswith("fv1 = 6") and "exceeds joint 1's torque limit 10 N m" in found[0]
    assert found[1].startswith("fc2 = -1") and "negative" in found[1]
    assert found[2].startswith("offset2 = -5.5") and "torque limit 5 N m" in found[2]
    assert fit_warnings(names, np.ones(6), std, 100.0, limits, fast, np.array([0.1, 0.35]))[0].startswith(
        "validation error above 20 % of the torque on joint 2 35 %")


# -- honest error figures ---------------------------------------------------------------------------------------

def test_error_figures_against_the_measured_torque_show_the_noise_the_filtered_ones_hide(model):
    """Exact inverse dynamics plus white noise of TORQUE_NOISE, sampled uniformly: against the measured torque
    the residual and the validation error are the noise (within 15 %); against the filtered, decimated rows a
    fraction of it."""
    t, q, qd, qdd = excitation.preset("seed000").sample(1000.0)
    tau = dynamics.rnea(model, q, qd, qdd)
    noisy = [tau + np.random.default_rng(seed).normal(0, TORQUE_NOISE, tau.shape) for seed in (5, 6)]
    ident = batch.identify(model, Recording(t, q, noisy[0], None, None, "n"),
                           validate=Recording(t, q, noisy[1], None, None, "v"))
    v = ident.validation
    for measured, filtered in [(ident.residual_rms_measured, ident.fit.residual_rms), (v.rms_measured, v.rms)]:
        assert np.all(np.abs(measured / TORQUE_NOISE - 1) < 0.15)
        assert np.all(filtered < 0.5 * TORQUE_NOISE)


# -- memory and timings -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("factor", [1, 7])
def test_the_chunked_base_regressor_is_the_whole_one_decimated(model, monkeypatch, factor):
    """Oracle: the full standard regressor's base columns, decimated by preprocess.decimate_parallel."""
    t, q, qd, qdd = excitation.preset("seed000").sample(200.0, periods=0.3)
    rec = Recording(t, q, dynamics.rnea(model, q, qd, qdd), None, None, "c")
    base = base_parameters(model)
    s = preprocess.prepare(rec, cutoff_hz=40.0)
    W = np.take(dynamics.regressor(model, s.q, s.qd, s.qdd), base.indices, axis=2)
    W = np.concatenate([W, dynamics.load_regressor(model, s.q, s.qd, s.qdd)], axis=2)
    Wd, yd = preprocess.decimate_parallel(W, s.y, factor)
    monkeypatch.setattr(batch, "CHUNK_BYTES", 50_000)     # a few hundred rows per chunk: many chunks
    rows = batch.recording_rows(model, base, rec, cutoff_hz=40.0, decimate=factor, with_load=True)
    assert np.allclose(rows.W, Wd[:, :, :base.count], rtol=1e-12, atol=1e-12)
    assert np.allclose(rows.Yl, Wd[:, :, base.count:], rtol=1e-12, atol=1e-12)
    assert np.allclose(rows.y, yd, rtol=1e-12, atol=1e-12)


def test_each_recordings_steps_are_timed_apart(model):
    t, q, qd, qdd = excitation.preset("seed000").sample(200.0)
    tau = dynamics.rnea(model, q, qd, qdd)
    ident = batch.identify(model, Recording(t, q, tau, None, None, "a"), validate=Recording(t, q, tau, None, None, "b"))
    for role in ("identification data", "validation recording"):
        for step in ("resample", "filter and differentiate", "regressor", "parallel decimation"):
            assert ident.seconds[f"{step} ({role})"] >= 0.0
    assert "regressor" not in ident.seconds


# -- what the files state ---------------------------------------------------------------------------------------

def test_a_csv_states_its_effort_delay_and_clock_in_comment_lines(tmp_path):
    t = np.arange(64) / 500.0
    q = np.column_stack([np.sin(t), np.cos(t)])
    path = write_csv(tmp_path / "r.csv", t, q, 2 * q, fields={"effort_delay": 0.0005, "clock_hz": 500.0})
    rec = preprocess.load_recording(path)
    assert (rec.effort_delay, rec.clock_hz) == (0.0005, 500.0)
    assert np.array_equal(rec.q, q) and np.array_equal(rec.tau, 2 * q)
    np.savez(tmp_path / "r.npz", t=t, q=q, tau=q, clock_hz=250.0)
    assert preprocess.load_recording(tmp_path / "r.npz").clock_hz == 250.0
    for fields, message in [({"clock_hz": -1.0}, r"r2.csv: clock_hz: clock_hz: expected a sampling rate"),
                            ({"effort_delay": 0.5}, r"r2.csv: effort_delay: effort_delay: expected a finite")]:
        write_csv(tmp_path / "r2.csv", t, q, q, fields=fields)
        with pytest.raises(PreprocessError, match=message):
            preprocess.load_recording(tmp_path / "r2.csv")


def test_the_fast_csv_reader_reads_what_numpy_reads_and_falls_back_without_pyarrow(tmp_path, monkeypatch):
    """Oracle: numpy's loadtxt on the same file, bit for bit; a comment line among the rows is skipped by both,
    and without pyarrow the same arrays come from loadtxt."""
    rng = np.random.default_rng(2)
    t = np.arange(500) / 1000.0
    q, tau = rng.normal(size=(500, 3)), rng.normal(size=(500, 3)) * 1e3
    path = write_csv(tmp_path / "f.csv", t, q, tau)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:100] + ["# a note in the middle", ""] + lines[100:]) + "\n")
    oracle = np.loadtxt(path, delimiter=",", skiprows=1, comments="#")
    fast = preprocess.load_recording(path)
    assert np.array_equal(fast.q, oracle[:, 1:4]) and np.array_equal(fast.tau, oracle[:, 4:7])
    monkeypatch.setattr(preprocess, "_read_body_arrow", lambda *a: None)
    slow = preprocess.load_recording(path)
    assert np.array_equal(slow.q, fast.q) and np.array_equal(slow.tau, fast.tau)


def test_a_bad_cell_is_named_by_line_and_column_on_the_fast_path_too(tmp_path):
    t = np.arange(40) / 100.0
    q = np.column_stack([np.sin(t), np.cos(t)])
    path = write_csv(tmp_path / "b.csv", t, q, q)
    lines = path.read_text().splitlines()
    lines[7] = lines[7].replace(lines[7].split(",")[2], "NA", 1)
    lines[20] = lines[20].replace(lines[20].split(",")[1], "nan", 1)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PreprocessError, match=r"b.csv: line 8, column q2: not a number: 'NA'"):
        preprocess.load_recording(path)
    lines[7] = ",".join(["0.07"] + lines[7].split(",")[1:2] + ["0.5"] + lines[7].split(",")[3:])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PreprocessError, match=r"b.csv: line 21, column q1: not a finite number \(nan\)"):
        preprocess.load_recording(path)


def test_resample_sets_the_rate_of_every_recording_and_refuses_a_rate_that_is_none(tmp_path, model, capsys):
    t, q, qd, qdd = excitation.preset("seed000").sample(1000.0, periods=0.5)
    rec = Recording(t, q, dynamics.rnea(model, q, qd, qdd), None, None, "r")
    rows = batch.recording_rows(model, base_parameters(model), rec, resample_hz=500.0, decimate=5)
    assert rows.mended.resampled and rows.rate_hz == pytest.approx(500.0)
    assert np.allclose(np.diff(rows.t), 5 / 500.0)
    np.savez(tmp_path / "r.npz", t=t, q=q, tau=rec.tau)
    assert cli.main(["identify", str(tmp_path / "r.npz"), "--model", "generic6", "-o", str(tmp_path / "o"),
                     "--resample", "-5", "--quiet"]) == 2
    assert "--resample: expected a sampling rate > 0 Hz, got -5.0" in capsys.readouterr().err


def test_the_cli_caps_blas_threads_at_one_while_it_identifies():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from armid.commands.identify import blas_threads

    def blas() -> list[int]:
        return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]

    before = blas()
    with blas_threads(1):
        inside = blas()
    assert inside and all(k == 1 for k in inside)
    assert blas() == before                                  # restored afterwards
