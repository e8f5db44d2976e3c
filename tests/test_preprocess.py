"""ident.fit.preprocess: strict loading, zero-phase filtering, central differences, parallel decimation."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings, strategies as st

from ident.fit import preprocess as pp
from firmware_bridge.runtime.errors import InputError
from ident.fit.preprocess import PreprocessError, Recording

RATE = 1000.0


def fourier_motion(N: int, n: int = 3, f0: float = 0.2, H: int = 3, rate: float = RATE, seed: int = 0):
    """t, q, qd, qdd of a sum of H harmonics of f0 per joint, and their analytic derivatives."""
    rng = np.random.default_rng(seed)
    t = np.arange(N) / rate
    amp = rng.uniform(0.1, 0.5, (H, n))
    phase = rng.uniform(0, 2 * np.pi, (H, n))
    w = 2 * np.pi * f0 * np.arange(1, H + 1)[:, None, None]                  # (H, 1, 1)
    arg = w * t[None, :, None] + phase[:, None, :]                           # (H, N, n)
    q = (amp[:, None, :] * np.sin(arg)).sum(0)
    qd = (amp[:, None, :] * w * np.cos(arg)).sum(0)
    qdd = -(amp[:, None, :] * w ** 2 * np.sin(arg)).sum(0)
    return t, q, qd, qdd


def recording(t, q, y, kind="torque", qd=None, source="synthetic") -> Recording:
    return Recording(t, q, y if kind == "torque" else None, y if kind == "current" else None, qd, source)


def write_csv(path, columns: dict[str, np.ndarray], fmt="%.17g"):
    header = ",".join(columns)
    np.savetxt(path, np.column_stack(list(columns.values())), delimiter=",", header=header, comments="", fmt=fmt)


def csv_columns(t, q, y, prefix="tau", qd=None) -> dict[str, np.ndarray]:
    cols = {"t": t, **{f"q{j + 1}": q[:, j] for j in range(q.shape[1])},
            **{f"{prefix}{j + 1}": y[:, j] for j in range(q.shape[1])}}
    if qd is not None:
        cols.update({f"qd{j + 1}": qd[:, j] for j in range(q.shape[1])})
    return cols


# ---------------------------------------------------------------------------------------------------
# Loading

def test_csv_and_npz_round_trip_the_recorded_arrays_exactly(tmp_path):
    t, q, qd, _ = fourier_motion(200)
    tau = np.cos(q)
    write_csv(tmp_path / "r.csv", csv_columns(t, q, tau, qd=qd))
    np.savez(tmp_path / "r.npz", t=t, q=q, tau=tau, qd=qd)
    for name in ("r.csv", "r.npz"):
        rec = pp.load_recording(tmp_path / name, n=3)
        assert (rec.N, rec.n, rec.kind) == (200, 3, "torque")
        np.testing.assert_array_equal(rec.t, t)
        np.testing.assert_array_equal(rec.q, q)
        np.testing.assert_array_equal(rec.tau, tau)
        np.testing.assert_array_equal(rec.qd, qd)
        assert rec.current is None and rec.source.endswith(name)


def test_csv_columns_in_any_order_with_comments_and_currents(tmp_path):
    t, q, _, _ = fourier_motion(100, n=2)
    current = np.sin(q) * 2
    cols = csv_columns(t, q, current, prefix="i")
    shuffled = {k: cols[k] for k in ("i2", "q2", "t", "i1", "q1")}
    path = tmp_path / "r.csv"
    write_csv(path, shuffled)
    path.write_text("# recorded on the bench\n\n" + path.read_text())
    rec = pp.load_recording(path)
    assert rec.kind == "current" and rec.tau is None and rec.qd is None
    np.testing.assert_array_equal(rec.q, q)
    np.testing.assert_array_equal(rec.current, current)
    np.testing.assert_array_equal(rec.y, current)


def test_spreadsheet_csv_with_byte_order_mark_and_crlf_loads(tmp_path):
    t, q, _, _ = fourier_motion(50, n=2)
    path = tmp_path / "excel.csv"
    write_csv(path, csv_columns(t, q, 2 * q, prefix="i"))
    path.write_bytes(b"\xef\xbb\xbf" + path.read_text().replace("\n", "\r\n").encode())
    rec = pp.load_recording(path)
    np.testing.assert_array_equal(rec.current, 2 * q)


def _good_csv_text(N=40, n=2) -> list[str]:
    t, q, _, _ = fourier_motion(N, n=n)
    head = ",".join(["t"] + [f"q{j + 1}" for j in range(n)] + [f"tau{j + 1}" for j in range(n)])
    rows = [",".join(f"{v:.9g}" for v in [t[k], *q[k], *np.cos(q[k])]) for k in range(N)]
    return [head, *rows]


def _edit(lines: list[str], line: int, column: int, value: str) -> list[str]:
    """Replace the value at 1-based file line `line`, 0-based column."""
    out = list(lines)
    cells = out[line - 1].split(",")
    cells[column] = value
    out[line - 1] = ",".join(cells)
    return out


@pytest.mark.parametrize("case, edit, expected", [
    ("nan", lambda L: _edit(L, 7, 2, "nan"), ["line 7", "column q2", "not a finite number"]),
    ("inf torque", lambda L: _edit(L, 12, 3, "inf"), ["line 12", "column tau1", "not a finite"]),
    ("not a number", lambda L: _edit(L, 5, 1, "1.2.3"), ["line 5", "column q1", "not a number", "1.2.3"]),
    ("empty cell", lambda L: _edit(L, 9, 4, ""), ["line 9", "column tau2", "not a number"]),
    ("time goes back", lambda L: _edit(L, 20, 0, "0.001"), ["line 20", "column t", "does not increase"]),
    ("repeated time", lambda L: _edit(L, 3, 0, L[1].split(",")[0]), ["line 3", "does not increase"]),
    ("ragged row", lambda L: L[:10] + [L[10] + ",0.5"] + L[11:], ["line 11", "6 values", "5 columns"]),
    ("short row", lambda L: L[:10] + [L[10].rsplit(",", 1)[0]] + L[11:], ["line 11", "4 values"]),
    ("missing torque column", lambda L: [",".join(r.split(",")[:4]) for r in L], ["missing column", "tau2"]),
    ("missing efforts", lambda L: [",".join(r.split(",")[:3]) for r in L], ["missing columns tau1..tau2", "i1..i2"]),
    ("missing time", lambda L: [",".join(r.split(",")[1:]) for r in L], ["missing column 't'"]),
    ("missing positions", lambda L: [",".join(r.split(",")[:1] + r.split(",")[3:]) for r in L], ["missing columns q1..qn"]),
    ("unknown column", lambda L: [L[0].replace("tau2", "torque2")] + L[1:], ["line 1", "column 5", "'torque2'"]),
    ("both efforts", lambda L: [L[0] + ",i1,i2"] + [r + ",0,0" for r in L[1:]], ["both torque", "current"]),
    ("duplicate column", lambda L: [L[0].replace("tau2", "tau1")] + L[1:], ["'tau1' appears twice"]),
    ("gap in joints", lambda L: [L[0].replace("q2", "q3")] + L[1:], ["missing column(s) q2"]),
    ("too short", lambda L: L[:11], ["10 samples are too few", str(pp.MIN_SAMPLES)]),
    ("header only", lambda L: L[:1], ["no data rows"]),
    ("empty", lambda L: [], ["empty"]),
    ("1e300 position", lambda L: _edit(L, 8, 2, "1e300"), ["line 8", "column q2", "out of range", "1000 rad or m"]),
    ("1e300 torque", lambda L: _edit(L, 6, 3, "-1e300"), ["line 6", "column tau1", "out of range", "N m"]),
    ("1e308 time", lambda L: _edit(L, 30, 0, "1e308"), ["line 30", "column t", "out of range"]),
])
def test_every_bad_csv_gets_one_error_naming_the_problem(tmp_path, case, edit, expected):
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(edit(_good_csv_text())) + "\n")
    with pytest.raises(PreprocessError) as info:
        pp.load_recording(path)
    message = str(info.value)
    assert str(path) in message
    for part in expected:
        assert part in message, (case, message)
    assert isinstance(info.value, InputError)


def test_joint_count_is_checked_against_the_expected_model(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("\n".join(_good_csv_text()) + "\n")
    with pytest.raises(PreprocessError, match="2 joints recorded, expected 6"):
        pp.load_recording(path, n=6)


@pytest.mark.parametrize("arrays, expected", [
    ({"q": "q", "tau": "tau"}, "missing array 't'"),
    ({"t": "t", "q": "q"}, "exactly one of joint torques (tau) and motor currents (i), got neither"),
    ({"t": "t", "q": "q", "tau": "tau", "current": "tau"}, "got both"),
    ({"t": "t", "q": "q", "tau": "tau", "extra": "t"}, "unknown array(s) extra"),
    ({"t": "t", "q": "q", "tau": "short"}, "tau: expected shape (40, 2) like q"),
    ({"t": "t2d", "q": "q", "tau": "tau"}, "t: expected one time per sample"),
    ({"t": "t", "q": "qnan", "tau": "tau"}, "sample 17, column q2: not a finite number"),
    ({"t": "t", "q": "q", "tau": "huge"}, "sample 3, column tau2: 1e+300 is out of range"),
    ({"t": "t", "q": "q", "tau": "text"}, "array 'tau': expected real numbers"),
    ({"t": "t", "q": "q", "tau": "tau", "effort_delay": "t"}, "array 'effort_delay': expected one number (s)"),
    ({"t": "t", "q": "q", "tau": "tau", "effort_delay": "nan"}, "effort_delay: expected a finite number of seconds"),
    ({"t": "t", "q": "q", "tau": "tau", "effort_delay": "second"}, "within +-0.1 s, got 1.0"),
])
def test_every_bad_npz_gets_one_error_naming_the_array(tmp_path, arrays, expected):
    t, q, _, _ = fourier_motion(40, n=2)
    qnan = q.copy()
    qnan[17, 1] = np.nan
    pool = {"t": t, "q": q, "tau": np.cos(q), "short": np.cos(q)[:-1], "t2d": t[:, None], "qnan": qnan,
            "text": np.full(q.shape, "x"), "nan": np.array(np.nan), "second": np.array(1.0),
            "huge": np.where(np.arange(q.size).reshape(q.shape) == 7, 1e300, np.cos(q))}
    path = tmp_path / "bad.npz"
    np.savez(path, **{name: pool[key] for name, key in arrays.items()})
    with pytest.raises(PreprocessError) as info:
        pp.load_recording(path)
    assert str(path) in str(info.value) and expected in str(info.value)


@pytest.mark.parametrize("name, content, expected", [
    ("r.npz", b"not a zip file", "not a readable NPZ file"),
    ("r.parquet", b"", "unknown recording format '.parquet'"),
    ("r.csv", b"\xff\xfe\x00garbage", "line 1: a NUL byte at column 3"),
    ("r.csv", b"\xff\xfegarbage\n", "line 1: not UTF-8 text"),
])
def test_unreadable_files_are_named(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PreprocessError, match=expected.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        pp.load_recording(path)
    with pytest.raises(PreprocessError, match="no such file"):
        pp.load_recording(tmp_path / "missing.csv")


# ---------------------------------------------------------------------------------------------------
# Differentiation

@settings(max_examples=25, deadline=None)
@given(coef=st.tuples(*[st.floats(-5, 5)] * 3), jitter=st.floats(0, 0.4), seed=st.integers(0, 2**16))
def test_central_differences_are_exact_on_quadratics_even_with_uneven_intervals(coef, jitter, seed):
    a, b, c = coef
    rng = np.random.default_rng(seed)
    t = np.cumsum(1e-3 * (1 + jitter * rng.uniform(-1, 1, 50)))
    x = (a + b * t + c * t ** 2)[:, None] * np.array([1.0, -2.0])
    xd, xdd = pp.central_differences(t, x)
    scale = 1 + abs(a) + abs(b) + abs(c)
    np.testing.assert_allclose(xd, (b + 2 * c * t[1:-1])[:, None] * np.array([1.0, -2.0]), atol=1e-9 * scale / 1e-3)
    np.testing.assert_allclose(xdd, np.full((48, 2), 2 * c) * np.array([1.0, -2.0]), atol=1e-6 * scale / 1e-3 ** 2)


def test_central_differences_are_the_textbook_stencils_on_a_uniform_grid():
    rng = np.random.default_rng(3)
    h = 0.004
    t = np.arange(30) * h
    x = rng.normal(size=(30, 4))
    xd, xdd = pp.central_differences(t, x)
    np.testing.assert_allclose(xd, (x[2:] - x[:-2]) / (2 * h), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(xdd, (x[2:] - 2 * x[1:-1] + x[:-2]) / h ** 2, rtol=1e-10, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# Filtering

def _amplitude_phase(t, x, f):
    """Least-squares amplitude and phase of the f-Hz sinusoid in x (plus a constant)."""
    A = np.column_stack([np.sin(2 * np.pi * f * t), np.cos(2 * np.pi * f * t), np.ones_like(t)])
    s, c, _ = np.linalg.lstsq(A, x, rcond=None)[0]
    return math.hypot(s, c), math.atan2(c, s)


def test_filter_has_zero_phase_and_unit_gain_below_the_cutoff():
    N, f = 6000, 0.7
    t = np.arange(N) / RATE
    q = 0.8 * np.sin(2 * np.pi * f * t + 0.3)[:, None]
    rec = recording(t, q, 20 * np.cos(2 * np.pi * f * t)[:, None])
    s = pp.prepare(rec, cutoff_hz=pp.CUTOFF_PER_BANDWIDTH * f)      # the excitation at 1/5 of the cut-off
    amp_in, ph_in = _amplitude_phase(t, q[:, 0], f)
    amp_out, ph_out = _amplitude_phase(s.t, s.q[:, 0], f)
    # one sample of delay would be a phase lag of 2 pi f / RATE = 4.4e-3 rad
    assert abs(ph_out - ph_in) < 1e-6
    assert amp_out / amp_in == pytest.approx(1.0, abs=1e-5)
    # sample by sample, the kept samples equal the input (edges trimmed, no start-up transient left)
    np.testing.assert_allclose(s.q, q[pp.edge_samples(scipy.signal.butter(4, s.cutoff_hz, fs=RATE, output="sos")):][:s.N],
                               atol=2e-4 * 0.8)
    amp_y, ph_y = _amplitude_phase(s.t, s.y[:, 0], f)
    assert amp_y == pytest.approx(20, rel=1e-5) and abs(ph_y - math.pi / 2) < 1e-6


@pytest.mark.parametrize("ratio", [1.0, 2.0, 4.0])
def test_filter_attenuates_as_a_forward_backward_butterworth(ratio):
    """Gain at f of sosfiltfilt(butter(m, fc)) is |H|^2 = 1 / (1 + (tan(pi f/fs) / tan(pi fc/fs))^(2m))."""
    cutoff, N = 5.0, 8000
    f = ratio * cutoff
    t = np.arange(N) / RATE
    q = np.column_stack([np.sin(2 * np.pi * f * t), 0.5 * np.sin(2 * np.pi * 0.5 * t)])
    s = pp.prepare(recording(t, q, q), cutoff_hz=cutoff)
    expected = 1 / (1 + (math.tan(math.pi * f / RATE) / math.tan(math.pi * cutoff / RATE)) ** 8)
    amp, _ = _amplitude_phase(s.t, s.q[:, 0], f)
    assert amp == pytest.approx(expected, rel=1e-3, abs=1e-7)


def test_prepared_derivatives_match_the_analytic_ones():
    t, q, qd, qdd = fourier_motion(12000, n=3, f0=0.2, H=4)
    rec = recording(t, q, np.sin(q))
    s = pp.prepare(rec, bandwidth_hz=0.8)
    k = np.searchsorted(t, s.t)
    np.testing.assert_array_equal(t[k], s.t)
    assert s.rate_hz == pytest.approx(RATE)
    np.testing.assert_allclose(s.q, q[k], atol=1e-5 * np.abs(q).max())
    np.testing.assert_allclose(s.qd, qd[k], atol=1e-4 * np.abs(qd).max())
    np.testing.assert_allclose(s.qdd, qdd[k], atol=1e-3 * np.abs(qdd).max())
    for a in (s.t, s.q, s.qd, s.qdd, s.y):
        assert a.flags.c_contiguous and a.dtype == np.float64 and len(a) == s.N


@pytest.mark.parametrize("delay", [0.5e-3, 2.3e-3, -0.7e-3])
def test_an_effort_that_lags_the_motion_is_aligned_with_it(delay):
    """y recorded late by `delay` (y[k] = g(t[k] - delay), g the effort of the motion at t) comes out of
    prepare as g(t): the alignment interpolates the filtered effort, off the grid when the delay is not a
    whole number of samples. Without the alignment the same data are off by ~delay * dg/dt."""
    t, q, _, _ = fourier_motion(6000, n=2, f0=0.5, H=3)
    f0, amp = 0.5, np.array([1.0, 2.0])
    g = lambda tt: amp * np.sin(2 * np.pi * 3 * f0 * tt[:, None] + np.array([0.3, 1.1]))   # noqa: E731
    late = recording(t, q, g(t - delay))
    aligned = pp.prepare(Recording(late.t, late.q, late.tau, None, None, "late", delay), bandwidth_hz=1.5)
    np.testing.assert_allclose(aligned.y, g(aligned.t), atol=1e-6 * amp.max())
    assert aligned.effort_delay == delay and aligned.t[0] > t[0] and aligned.t[-1] < t[-1]
    unaligned = pp.prepare(late, bandwidth_hz=1.5)
    assert np.abs(unaligned.y - g(unaligned.t)).max() > 0.5 * abs(delay) * 2 * np.pi * 1.5 * amp.max()


def test_noise_is_removed_and_derivatives_stay_usable():
    t, q, qd, qdd = fourier_motion(20000, n=2, f0=0.1, H=5)
    rng = np.random.default_rng(1)
    noisy = np.round(q / 1e-5) * 1e-5 + rng.normal(0, 2e-5, q.shape)     # encoder quantisation + noise
    s = pp.prepare(recording(t, noisy, q), cutoff_hz=2.5)
    k = np.searchsorted(t, s.t)
    raw_qdd = pp.central_differences(t, noisy)[1][k - 1]
    err_raw = np.sqrt(np.mean((raw_qdd - qdd[k]) ** 2))
    err = np.sqrt(np.mean((s.qdd - qdd[k]) ** 2))
    assert err < 0.01 * np.abs(qdd).max() and err < err_raw / 100


def test_bandwidth_estimate_finds_the_highest_harmonic():
    for H, f0 in ((3, 0.2), (6, 0.1)):
        t, q, _, _ = fourier_motion(int(RATE * 20), n=3, f0=f0, H=H)     # a whole number of periods
        assert pp.estimate_bandwidth(q, RATE) == pytest.approx(H * f0, abs=0.5 * f0)
    s = pp.prepare(recording(t, q, q))
    assert s.cutoff_hz == pp.cutoff_for_bandwidth(pp.estimate_bandwidth(q, RATE), RATE)


def test_cutoff_rule_is_five_bandwidths_above_the_noise_floor_below_nyquist():
    assert pp.cutoff_for_bandwidth(0.6, 1000.0) == 40.0             # the noise floor
    assert pp.cutoff_for_bandwidth(10.0, 1000.0) == 50.0            # 5 x bandwidth
    assert pp.cutoff_for_bandwidth(100.0, 200.0) == pytest.approx(80.0)   # 0.8 x Nyquist
    with pytest.raises(PreprocessError, match="bandwidth"):
        pp.cutoff_for_bandwidth(0.0, 1000.0)


def test_edges_are_trimmed_where_the_filter_has_not_settled():
    sos = scipy.signal.butter(4, 2.0, fs=RATE, output="sos")
    edge = pp.edge_samples(sos)
    impulse = scipy.signal.sosfilt(sos, np.r_[1.0, np.zeros(20 * edge)])
    envelope = np.abs(impulse)
    assert envelope[edge:].max() < 3 * pp.EDGE_DECAY * envelope.max()
    assert envelope[edge // 2:].max() > 3 * pp.EDGE_DECAY * envelope.max()


@pytest.mark.parametrize("make, expected", [
    (lambda t, q: recording(np.r_[t[:50], t[50:] + 0.01], q, q), "sampling interval 0.011 s at t = 0.0490 s"),
    (lambda t, q: recording(t[:100], q[:100], q[:100]), "100 samples at 1000 Hz are too few for a cut-off"),
])
def test_prepare_refuses_gaps_and_recordings_too_short_for_the_filter(make, expected):
    t, q, _, _ = fourier_motion(400, n=2)
    with pytest.raises(PreprocessError, match=expected):
        pp.prepare(make(t, q), cutoff_hz=2.0)
    with pytest.raises(PreprocessError, match="Nyquist"):
        pp.prepare(recording(t, q, q), cutoff_hz=600.0)


def test_recordings_built_in_code_are_checked_like_files():
    t, q, _, _ = fourier_motion(50, n=2)
    with pytest.raises(PreprocessError, match="demo: sample 3, column t: time"):
        recording(np.r_[t[:3], t[1:-2]], q, q, source="demo")
    bad = q.copy()
    bad[4, 0] = np.inf
    with pytest.raises(PreprocessError, match="demo: sample 4, column i1"):
        recording(t, q, bad, kind="current", source="demo")


# ---------------------------------------------------------------------------------------------------
# Decimation and slow rows

@pytest.mark.parametrize("factor", [2, 5, 10])
def test_parallel_decimation_equals_decimating_each_column_alone(factor):
    rng = np.random.default_rng(factor)
    N, n, b = 900, 3, 4
    W = rng.normal(size=(N, n, b)).cumsum(axis=0)
    W[:, 1:, 0] = 0.0                                   # structural zeros, as in a regressor
    y = rng.normal(size=(N, n))
    Wd, yd = pp.decimate_parallel(W, y, factor)
    h = pp.decimation_filter(factor)
    index = pp.decimation_index(N, factor)
    assert Wd.shape == (len(index), n, b) and yd.shape == (len(index), n)
    for j in range(n):
        np.testing.assert_allclose(yd[:, j], np.convolve(y[:, j], h, mode="valid")[::factor], rtol=1e-12, atol=1e-12)
        for c in range(b):
            column = np.convolve(W[:, j, c], h, mode="valid")[::factor]
            np.testing.assert_allclose(Wd[:, j, c], column, rtol=1e-12, atol=1e-9)


def test_parallel_decimation_keeps_the_linear_model_exact_and_passes_slow_signals():
    """y = W beta before decimation implies yd = Wd beta after it (the reason for decimating in parallel)."""
    rng = np.random.default_rng(7)
    N, factor = 2000, 10
    t = np.arange(N) / RATE
    W = np.stack([np.sin(2 * np.pi * 0.5 * t), np.cos(2 * np.pi * 3 * t), rng.normal(size=N)], axis=1)[:, None, :]
    beta = np.array([2.0, -1.0, 0.5])
    Wd, yd = pp.decimate_parallel(W, W @ beta, factor)
    np.testing.assert_allclose(yd, Wd @ beta, rtol=1e-12, atol=1e-12)
    index = pp.decimation_index(N, factor)
    # a sinusoid comes out scaled by the filter's real, zero-phase frequency response (scipy.signal.freqz),
    # at the times of the kept rows: no delay, no edge effect
    h = pp.decimation_filter(factor)
    for c, (f, wave) in enumerate(((0.5, np.sin), (3.0, np.cos))):
        gain = np.abs(scipy.signal.freqz(h, worN=[f], fs=RATE)[1][0])
        assert gain == pytest.approx(1.0, abs=3e-3)
        np.testing.assert_allclose(Wd[:, 0, c], gain * wave(2 * np.pi * f * t[index]), atol=1e-12)
    # white noise is cut to the new band: about 1/factor of its power is left
    assert np.var(Wd[:, 0, 2]) < 2.0 / factor


def test_decimation_refuses_bad_shapes_and_factors():
    W, y = np.zeros((300, 2, 3)), np.zeros((300, 2))
    with pytest.raises(PreprocessError, match="expected W"):
        pp.decimate_parallel(W, y[:, :1], 2)
    with pytest.raises(PreprocessError, match="positive integer"):
        pp.decimate_parallel(W, y, 0)
    with pytest.raises(PreprocessError, match="too few to decimate by 20"):
        pp.decimate_parallel(W, y, 20)
    Wd, yd = pp.decimate_parallel(W, y, 1)
    assert Wd.shape == W.shape and yd.shape == y.shape


def test_slow_rows_mark_each_joint_below_the_threshold():
    qd = np.array([[0.0, 0.2], [-0.04, -0.06], [0.05, 1.0]])
    np.testing.assert_array_equal(pp.slow_rows(qd, 0.05), [[True, False], [True, False], [False, False]])
    with pytest.raises(PreprocessError, match="threshold"):
        pp.slow_rows(qd, -1.0)


@pytest.mark.parametrize("shape, expected", [
    ((2 ** 40,), "array 't': its header gives shape (1099511627776,) (8796093022208 bytes), the file holds 64 bytes"),
    ((2 ** 62,), "array 't': its header gives shape (4611686018427387904,)"),
    ((9, 2 ** 61), "array 't': its header gives shape (9, 2305843009213693952)"),
])
def test_an_npz_header_that_claims_more_than_its_data_is_refused_before_numpy_allocates_it(tmp_path, shape, expected):
    import io
    import zipfile

    from numpy.lib import format as npy

    head = io.BytesIO()
    npy.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": shape})
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("t.npy", head.getvalue() + bytes(64))
    with pytest.raises(PreprocessError) as info:
        pp.load_recording(path)
    assert str(info.value) == f"{path}: {expected}" or str(info.value).startswith(f"{path}: {expected}")
