"""Batch identification of a recording, end to end (docs/guides/identification.md):

    load_recording -> mend_sampling (stale repeats dropped, uneven intervals resampled) -> split_at_gaps ->
    per uniformly sampled segment: prepare (zero-phase filter, central differences) -> base regressor and
    decimate_parallel, chunk by chunk -> the segments' rows together -> leave out slow rows -> WLS ->
    [physically consistent fit] [-> drive gains from a payload run] [-> validation on a second recording]
    -> checks (ident.fit.checks)

A recording that lost samples (a dropped frame, a stalled process): gaps of at most MAX_BRIDGED_SAMPLES lost
samples are bridged (ident.fit.preprocess.bridge_short_gaps: positions by a cubic spline, effort linearly); at
longer gaps the recording is cut, and every segment is filtered, differentiated and decimated on its own, so
that nothing is invented across a long gap. Segments too short for the filters are left out and counted.

The base regressor is built in chunks of samples (CHUNK_BYTES of standard regressor at a time) and each chunk
is decimated at once, so memory grows with the decimated rows, not with the full regressor of every sample.

Each step is a plain function; `identify` composes them and times every step, the steps of each recording
apart. Currents are turned into
joint torques with drive gains (the model's nominal ones, or gains identified with a payload run, see
ident.fit.drive_gains), so that every statistic afterwards is in N m.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ident.model import dynamics
from ident.fit import estimate, hac
from ident.model.base_params import BaseParameters, base_parameters
from ident.fit.consistent import DEFAULT_LAMBDA, ConsistentFit, consistent_fit
from ident.fit.drive_gains import SCALE_NOTE_NOMINAL, SCALE_NOTE_PAYLOAD, gains_with_payload
from firmware_bridge.runtime.errors import InputError
from ident.fit.excitation import FourierTrajectory, excitation_bandwidth
from ident.fit.checks import fit_warnings, outlier_joint_warnings
from ident.fit.choices import automatic_choices
from ident.model import Model
from ident.fit.preprocess import (DECIMATION_TAPS_PER_FACTOR, MAX_BRIDGED_SAMPLES, LateCut, PreprocessError,
                              Recording, TooFewSamples, bridge_short_gaps, check_effort_delay, cut_windows,
                              decimation_filter, decimation_index, estimate_bandwidth, load_recording, nominal_rate,
                              Samples, prepare, segment, slow_rows, split_at_gaps, _fir_decimate)
from ident.fit.near_rest import near_rest_friction
from ident.fit.resample import Mended, mend_sampling

# rad/s: rows of a joint slower than this are left out. The model's Coulomb friction is fc sign(qd); real drives
# (and the simulated ones) add a Stribeck breakaway near rest, 0.25 fc exp(-(qd/0.05)^2) in the simulator:
# 0.5 % of fc at 0.1 rad/s, which biased fc and fv by 3-4 sigma on the commissioning workflow's recording;
# at 0.2 rad/s it is 1e-7 fc, and an excitation at 1-3 rad/s loses few rows.
DEFAULT_SLOW_VELOCITY = 0.2
# A decimated row is a weighted mean of the samples in its FIR window (20 factor + 1 samples, 0.66 s at the
# default 1 kHz / factor 33): a row is left out when more than this fraction of its filter's weight falls on
# slow samples. Keeping every row whose own velocity is fast let the friction near reversals (Stribeck, the
# smooth turn of sign(qd)) into rows 0.1-0.3 s from a reversal; that was joint 3's Coulomb bias.
SLOW_WEIGHT = 1e-2
NEAR_REST = 0.5   # ... of its filter's weight falls on samples slower than this fraction of the slow threshold
DECIMATION_PER_BANDWIDTH = 20.0  # the decimation filter's cut-off is about this many excitation bandwidths
CHUNK_BYTES = 128 << 20          # the standard regressor is built this many bytes of samples at a time
MAX_REST_SAMPLES = 5000          # per segment: full-rate samples near rest kept for the friction near rest


class StepError(InputError):
    """A step of the identification failed; the message names the step and the cause."""


@dataclass
class Steps:
    """Times the named steps (s) and, when `verbose`, shows each on stderr as it starts and ends."""

    verbose: bool = False
    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, name: str):
        if self.verbose:
            print(f"  {name} ...", end="", file=sys.stderr, flush=True)
        started = time.perf_counter()
        try:
            yield
        except InputError as exc:
            if self.verbose:
                print(" failed", file=sys.stderr)
            raise StepError(f"{name}: {exc}") from exc
        elapsed = time.perf_counter() - started
        self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
        if self.verbose:
            print(f" {elapsed:.2f} s", file=sys.stderr, flush=True)

    def add(self, name: str, seconds: float) -> None:
        """Count seconds to the step `name` without a progress line (a step timed in many small pieces)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def show(self, name: str) -> None:
        """The progress line of a step timed with add."""
        if self.verbose:
            print(f"  {name} ... {self.seconds.get(name, 0.0):.2f} s", file=sys.stderr, flush=True)


@dataclass(frozen=True, eq=False)
class Rows:
    """One recording reduced to fit rows. t (N',) s; q, qd (N', n) at the rows; W (N', n, b) base
    regressor and y (N', n) (N m, or A when kind is "current") after parallel decimation; Yl (N', n, 10)
    the payload regressor when asked for; mask (N', n) the rows used (not slow); bandwidth_hz, cutoff_hz,
    rate_hz and factor (decimation) as applied; samples: samples in the recording; effort_delay (s) the lag of
    the effort behind the positions that was removed (ident.fit.preprocess.Recording); segments: the uniformly
    sampled stretches the rows come from (the recording was cut at segments - 1 long gaps, or more when
    short segments were left out); unused_samples: samples in segments too short to filter and decimate;
    bridged_samples: lost samples filled in across short gaps; y_measured (N', n): the effort as recorded (not
    filtered, not decimated) at the rows' samples, aligned by the effort delay; W_motion (N', n, b): the base
    regressor of the motion (q, qd, qdd low-passed by the decimation filter) at the rows, so that W_motion @ beta
    is the model's torque there with its friction turning where the velocity does (W @ beta, the decimated
    regressor, smooths that turn as it smooths y); mended: what
    ident.fit.resample.mend_sampling did (stale repeats, resampling); bandwidth_source: where the bandwidth came
    from ("trajectory", "given", or "estimated" from the positions; it sets the decimation, and the cut-off unless
    one is given)."""

    source: str
    kind: str
    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    W: np.ndarray
    y: np.ndarray
    Yl: np.ndarray | None
    mask: np.ndarray
    bandwidth_hz: float
    cutoff_hz: float
    rate_hz: float
    factor: int
    samples: int
    effort_delay: float = 0.0
    segments: int = 1
    unused_samples: int = 0
    bridged_samples: int = 0
    y_measured: np.ndarray | None = None
    W_motion: np.ndarray | None = None
    mended: Mended | None = None
    bandwidth_source: str = "estimated"
    lost_device_samples: int | None = None   # device samples lost before the recording, as it says (None: silent)
    segment_id: np.ndarray | None = None     # (N',) which uniformly sampled segment each row comes from
    late_cut: LateCut | None = None         # the windows cut where the drives got their targets late
    rest: tuple | None = None   # (qd (M, n), W (M, n, b), y_measured (M, n)) at full-rate samples near rest

    def near_rest(self, beta: np.ndarray, gains: np.ndarray | None, slow_velocity: float):
        """(fs, vs) (n,) N m, rad/s: the friction near rest of ident.fit.near_rest on the samples the fit left
        out, against the fitted beta; None when no samples near rest were kept."""
        if self.rest is None or len(self.rest[0]) == 0:
            return None
        qd, W, y = self.rest
        torque = y * gains if self.kind == "current" and gains is not None else y
        return near_rest_friction(qd, torque - estimate.predict(W, beta), slow_velocity)

    def gaps_note(self) -> str:
        """"in 3 uniformly sampled segments (...)" when the recording was cut at gaps, else ""."""
        parts = []
        if self.mended is not None and self.mended.note():
            parts.append(self.mended.note())
        if self.bridged_samples:
            parts.append(f"{self.bridged_samples} lost samples bridged across short gaps")
        late = self.late_cut is not None and self.late_cut.windows
        if late:
            parts.append(self.late_cut.note())
        if self.segments > 1 or self.unused_samples:
            unused = f"; {self.unused_samples} samples in shorter ones unused" if self.unused_samples else ""
            where = "more samples were lost or targets came late" if late else "more samples were lost"
            parts.append(f"in {self.segments} uniformly sampled segments (cut where {where}, each "
                         f"filtered and decimated apart{unused})")
        return ", ".join(parts)

    def noise_correlation(self) -> np.ndarray:
        """K (L,): the correlation of a joint's noise l rows apart, for white noise in the recorded effort
        (ident.fit.hac.row_noise_correlation of this low-pass and decimation)."""
        return hac.row_noise_correlation(self.rate_hz, self.cutoff_hz, self.factor)

    def in_torque(self, gains: np.ndarray | None) -> np.ndarray:
        """y as joint torques (N m): currents times the drive gains (n,) N m/A."""
        return self.y * gains if self.kind == "current" and gains is not None else self.y

    def model_regressor(self) -> np.ndarray:
        """W_motion, or W when not kept: the regressor to compare with the measured torque."""
        return self.W if self.W_motion is None else self.W_motion

    def measured_torque(self, gains: np.ndarray | None) -> np.ndarray:
        """y_measured as joint torques (N m), like in_torque."""
        y = self.y if self.y_measured is None else self.y_measured
        return y * gains if self.kind == "current" and gains is not None else y


def decimation_factor(rate_hz: float, bandwidth_hz: float) -> int:
    """Default decimation: the decimation filter's cut-off (0.8 of the new Nyquist frequency) at about
    DECIMATION_PER_BANDWIDTH times the excitation bandwidth."""
    return max(1, int(0.8 * rate_hz / (2.0 * DECIMATION_PER_BANDWIDTH * bandwidth_hz)))


def recording_rows(model: Model, base: BaseParameters, rec: Recording, *, bandwidth_hz: float | None = None,
                   cutoff_hz: float | None = None, decimate: int | None = None,
                   slow_velocity: float = DEFAULT_SLOW_VELOCITY, with_load: bool = False,
                   steps: Steps | None = None, max_bridged: int = MAX_BRIDGED_SAMPLES,
                   resample_hz: float | None = None, role: str = "identification data",
                   bandwidth_from: str = "given") -> Rows:
    """Mend the sampling (ident.fit.resample.mend_sampling: stale repeats dropped, uneven intervals resampled, to
    resample_hz when given), bridge short gaps, cut at long ones, then per segment filter, differentiate, build
    the base regressor (and the payload's when with_load) and decimate in parallel, chunk by chunk; mark the slow
    rows of one recording. role names the recording in the step timings; bandwidth_from says where a given
    bandwidth_hz came from (Rows.bandwidth_source)."""
    steps = steps or Steps()
    if rec.n != model.n:
        raise InputError(f"{rec.source}: {rec.n} joints recorded, the model {model.name} has {model.n}")
    label = f"filter and differentiate ({role})"
    source = bandwidth_from if bandwidth_hz is not None else "estimated"
    with steps(f"resample ({role})"):
        mended_rec, mended = mend_sampling(rec, rate_hz=resample_hz, max_missing=max_bridged)
    with steps(label):
        rate = nominal_rate(mended_rec.t, rec.source)
        filled, bridged = bridge_short_gaps(mended_rec, max_bridged)
        late = cut_windows(rec)
        pieces = split_at_gaps(filled, late.windows)
        if not pieces:
            raise PreprocessError(f"{rec.source}: every sample lies in a window the recording marks late (the drives "
                                  f"got their targets too late): nothing to identify; record again")
        longest = max(pieces, key=len)
        if bandwidth_hz is None:
            bandwidth_hz = estimate_bandwidth(filled.q[longest.index], rate)
    prepared, short = [], []          # filtered segments; segments too short for the filters (sample counts)
    for piece in pieces:
        try:
            with steps(label):
                part = filled if len(piece) == filled.N else segment(filled, piece)
                # the default cut-off: a noise filter
                prepared.append((len(piece), prepare(part, bandwidth_hz=bandwidth_hz, cutoff_hz=cutoff_hz)))
        except StepError as exc:
            if len(pieces) == 1 or not isinstance(exc.__cause__, TooFewSamples):   # a segment too short: left out
                raise
            short.append(len(piece))
    if decimate is None:   # the default, but never so coarse that fewer than 2 rows per parameter remain
        filtered = sum(p.N for _, p in prepared)
        factor = min(decimation_factor(rate, bandwidth_hz), max(1, filtered // (2 * base.count + 20)))
    else:
        factor = int(decimate)
    if factor < 1:
        raise InputError(f"decimation: expected a positive integer, got {decimate}")
    parts = []
    for length, s in prepared:
        try:
            parts.append(_segment_rows(model, base, s, factor, with_load, steps, role, slow_velocity))
        except StepError as exc:
            if len(pieces) == 1 or not isinstance(exc.__cause__, TooFewSamples):   # shorter than the decimation
                raise
            short.append(length)
    steps.show(f"regressor ({role})")
    steps.show(f"parallel decimation ({role})")
    if not parts:
        raise StepError(f"{label}: {rec.source}: the recording lost samples in {len(pieces) - 1} gaps longer than "
                        f"{max_bridged} samples, and its longest uniformly sampled stretch ({len(longest)} samples "
                        f"from t = {filled.t[longest.start]:.4f} s) is too short for the filters at {rate:g} Hz: "
                        "record again with fewer losses")
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts])   # noqa: E731
    b = base.count
    W = cat("W")
    return Rows(source=rec.source, kind=rec.kind, t=cat("t"), q=cat("q"), qd=cat("qd"), W=W[:, :, :b], y=cat("y"),
                Yl=W[:, :, b:] if with_load else None, mask=~cat("slow"),
                bandwidth_hz=float(bandwidth_hz), cutoff_hz=prepared[0][1].cutoff_hz, rate_hz=rate, factor=factor,
                samples=rec.N, effort_delay=rec.effort_delay, segments=len(parts), unused_samples=sum(short),
                bridged_samples=bridged, y_measured=cat("y_measured"), W_motion=cat("W_motion"), mended=mended,
                bandwidth_source=source, lost_device_samples=rec.lost_samples,
                segment_id=np.concatenate([np.full(len(p.t), k) for k, p in enumerate(parts)]), late_cut=late,
                rest=tuple(np.concatenate([p.rest[i] for p in parts]) for i in range(3)))


@dataclass(frozen=True, eq=False)
class _SegmentRows:
    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    W: np.ndarray      # (N', n, b [+ 10]): the base regressor [and the payload's], decimated
    y: np.ndarray
    y_measured: np.ndarray
    W_motion: np.ndarray    # (N', n, b): the base regressor of the motion low-passed by the decimation filter
    slow: np.ndarray        # (N', n) bool: rows left out (slow_window)
    rest: tuple             # (qd (M, n), W (M, n, b), y_measured (M, n)): full-rate samples near rest (rest_samples)


def rest_samples(model: Model, base: BaseParameters, s: Samples, slow_velocity: float) -> tuple:
    """(qd, W, y_measured) at the full-rate samples where some joint is slower than slow_velocity (at most
    MAX_REST_SAMPLES of them, evenly spread): the samples the fit leaves out, on which ident.fit.near_rest
    identifies the friction near rest after the fit."""
    index = np.flatnonzero(np.any(np.abs(s.qd) < slow_velocity, axis=1))
    if len(index) > MAX_REST_SAMPLES:
        index = index[np.linspace(0, len(index) - 1, MAX_REST_SAMPLES).astype(int)]
    measured = s.y if s.y_measured is None else s.y_measured
    W = np.take(dynamics.regressor(model, s.q[index], s.qd[index], s.qdd[index]), base.indices, axis=2)
    return s.qd[index], W, measured[index]


def slow_window(qd: np.ndarray, threshold: float, h: np.ndarray | None, index: np.ndarray) -> np.ndarray:
    """(N', n) bool at the rows `index` of samples qd (N, n): the rows slower than threshold (rad/s), and those
    whose decimation filter h draws more than SLOW_WEIGHT of its weight (sum |h|) from samples slower than
    NEAR_REST threshold. A row is a weighted mean of
    the samples in its window, so one whose window spans a reversal carries the friction near rest (Stribeck,
    the smooth turn of sign(qd)) that the model's fc sign(qd) does not describe, however fast the row itself."""
    slow = slow_rows(qd, threshold)
    if h is None:
        return slow[index]
    near_rest = slow_rows(qd, threshold * NEAR_REST)
    a = np.abs(h) / np.abs(h).sum()
    weight = np.stack([np.convolve(near_rest[:, j].astype(float), a, mode="same") for j in range(qd.shape[1])],
                      axis=1)
    return (weight > SLOW_WEIGHT)[index] | slow[index]


def _segment_rows(model: Model, base: BaseParameters, s: Samples, factor: int, with_load: bool,
                  steps: Steps, role: str = "identification data",
                  slow_velocity: float = DEFAULT_SLOW_VELOCITY) -> _SegmentRows:
    """The regressors of one segment's filtered samples, decimated in parallel with its effort.

    The standard regressor is built for a chunk of samples at a time (CHUNK_BYTES), its base columns taken and
    decimated at once: each chunk spans the decimation filter's windows of the rows it yields, so the result is
    the same as decimating the whole base regressor, without it or the full standard regressor in memory."""
    index = decimation_index(s.N, factor)
    if len(index) == 0:
        short = TooFewSamples(f"{s.source}: {s.N} samples are too few to decimate by {factor} "
                              f"(the filter spans {DECIMATION_TAPS_PER_FACTOR * factor + 1})")
        raise StepError(f"parallel decimation ({role}): {short}") from short
    half = DECIMATION_TAPS_PER_FACTOR * factor // 2 if factor > 1 else 0
    h = decimation_filter(factor) if factor > 1 else None
    n, b = model.n, base.count
    width = b + (10 if with_load else 0)
    per_sample = 8 * n * (14 * n + width)
    per_chunk = max(1, (max(CHUNK_BYTES // per_sample, 2 * half + factor) - 2 * half) // factor)   # output rows
    W = np.empty((len(index), n, width))
    buffer = None
    built = decimated = 0.0
    for k0 in range(0, len(index), per_chunk):
        k1 = min(k0 + per_chunk, len(index))
        a, z = int(index[k0]) - half, int(index[k1 - 1]) + half + 1
        started = time.perf_counter()
        if buffer is None or buffer.shape[0] < z - a:
            buffer = np.empty((z - a, n, 14 * n))
        Y = dynamics.regressor(model, s.q[a:z], s.qd[a:z], s.qdd[a:z], out=buffer[:z - a])
        # base columns by np.take: the same as base.regressor(Y), three times faster than fancy indexing
        chunk = np.take(Y, base.indices, axis=2)
        if with_load:
            chunk = np.concatenate([chunk, dynamics.load_regressor(model, s.q[a:z], s.qd[a:z], s.qdd[a:z])], axis=2)
        middle = time.perf_counter()
        W[k0:k1] = chunk if h is None else _fir_decimate(h, chunk, factor, k1 - k0)
        built += middle - started
        decimated += time.perf_counter() - middle
    steps.add(f"regressor ({role})", built)
    started = time.perf_counter()
    y = s.y[index].copy() if h is None else _fir_decimate(h, s.y, factor, len(index))
    steps.add(f"parallel decimation ({role})", decimated + time.perf_counter() - started)
    measured = s.y if s.y_measured is None else s.y_measured
    started = time.perf_counter()
    motion = [x[index] if h is None else _fir_decimate(h, x, factor, len(index)) for x in (s.q, s.qd, s.qdd)]
    at_rows = np.take(dynamics.regressor(model, *motion), base.indices, axis=2)
    steps.add(f"regressor ({role})", time.perf_counter() - started)
    return _SegmentRows(s.t[index], s.q[index], s.qd[index], W, y, measured[index], at_rows,
                        slow_window(s.qd, slow_velocity, h, index), rest_samples(model, base, s, slow_velocity))


@dataclass(frozen=True, eq=False)
class Validation:
    """Prediction on a second recording: rows, predicted torques (N', n) N m, per joint RMS error (N m)
    and RMS error relative to the RMS torque, against the filtered, decimated rows (rms, relative: how well the
    model explains the motion's torques) and of the model's torque at the rows (Rows.W_motion @ beta) against
    the torque as measured there, not filtered (rms_measured, relative_measured: the error a user sees, sensor
    noise included)."""

    rows: Rows
    predicted: np.ndarray
    rms: np.ndarray
    relative: np.ndarray
    rms_measured: np.ndarray | None = None
    relative_measured: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Identification:
    """Everything one identification produced (written out by ident.outputs.results and ident.outputs.report).

    fit: WLS of the base parameters in N m. gains (n,) N m/A that turned currents into torques (nominal or
    identified; None for torque data); gains_std when identified; scale_note says what fixed the scale.
    residual_rms_measured (n,) N m: the WLS residual on the fit rows against the torque as measured (not
    filtered), beside fit.residual_rms against the filtered rows; warnings: what the checks after the fit found
    suspicious (ident.fit.checks), [] when nothing. near_rest: (fs, vs) (n,) N m and rad/s, the friction near rest
    (a Stribeck excess fs exp(-(qd/vs)^2) sign(qd)) identified after the fit on the samples it left out
    (ident.fit.near_rest); None when the recording had none.
    """

    model: Model
    base: BaseParameters
    rows: Rows
    fit: estimate.Fit
    ols: estimate.Fit
    gains: np.ndarray | None
    gains_std: np.ndarray | None
    scale_note: str | None
    consistent: ConsistentFit | None
    validation: Validation | None
    trajectory: FourierTrajectory | None
    slow_velocity: float
    seconds: dict[str, float]
    residual_rms_measured: np.ndarray | None = None
    warnings: list[str] = field(default_factory=list)
    near_rest: tuple | None = None    # (fs, vs) (n,) N m, rad/s: friction near rest (ident.fit.near_rest)
    choices: list[str] = field(default_factory=list)     # the automatic choices and why (ident.fit.choices)

    @property
    def torque(self) -> np.ndarray:
        """Measured torques (N', n) N m of the identification rows."""
        return self.rows.in_torque(self.gains) if self.gains is not None else self.rows.y

    def identified_model(self) -> Model | None:
        """The model with the consistent standard parameters (and the identified gains as torque
        constants); None without a consistent fit."""
        if self.consistent is None:
            return None
        m = self.model.with_parameters(self.consistent.chi)
        if self.gains is not None and self.gains_std is not None:
            kt = np.asarray(self.gains / m.gear_ratio, dtype=float)
            kt.setflags(write=False)
            m = dataclasses.replace(m, torque_constant=kt)
        return m


def identify(model: Model, data: str | Path | Recording, *, validate: str | Path | Recording | None = None,
             trajectory: FourierTrajectory | None = None, cutoff_hz: float | None = None,
             decimate: int | None = None, slow_velocity: float = DEFAULT_SLOW_VELOCITY,
             consistent: bool = False, regularisation: float = DEFAULT_LAMBDA,
             payload_run: str | Path | Recording | None = None, payload_mass: float | None = None,
             base: BaseParameters | None = None, effort_delay: float | None = None,
             verbose: bool = False, max_bridged: int = MAX_BRIDGED_SAMPLES,
             resample_hz: float | None = None, effort: str = "torque",
             covariance: str = "correlated") -> Identification:
    """Identify the base parameters of a model from a recording: the pipeline behind `armid identify`.

    The recording is read, stale repeats dropped and uneven sampling resampled (ident.fit.resample); gaps of at
    most `max_bridged` lost samples are bridged and the recording cut at longer ones (`recording_rows`);
    each segment is filtered without phase lag, differentiated and decimated; rows of slow joints are left
    out; then OLS and WLS (ident.fit.estimate), optionally a physically consistent fit, drive gains from a
    payload run and a validation on a second recording. The checks of ident.fit.checks fill `warnings`.

    Parameters
    ----------
    model : Model
        The arm whose base parameters are identified.
    data : str, Path or Recording
        The recording: a CSV or NPZ file (docs/reference/data-files.md) or an ident.fit.preprocess.Recording.
    validate : str, Path or Recording, optional
        A second recording to predict with the identified parameters (`Identification.validation`).
    trajectory : FourierTrajectory, optional
        The excitation that was run; its bandwidth sets the filter and the decimation.
    cutoff_hz : float, optional
        Low-pass cut-off (Hz) instead of the one derived from the bandwidth.
    decimate : int, optional
        Decimation factor instead of the derived one.
    slow_velocity : float
        rad/s: rows of a joint slower than this are left out (Coulomb friction near rest is not fc sign(qd)).
    consistent : bool
        Also fit physically consistent standard parameters (needs the `ident` extra).
    regularisation : float
        Weight pulling the consistent fit towards the model's own parameters.
    payload_run : str, Path or Recording, optional
        A run carrying a payload of `payload_mass` kg, to identify the drive gains (recordings of currents).
    payload_mass : float, optional
        kg; given with payload_run.
    base : BaseParameters, optional
        The model's base parameters, if already computed.
    effort_delay : float, optional
        s: replaces the recordings' own delay of the effort behind the positions.
    verbose : bool
        Print each step and its time on stderr.
    max_bridged : int
        The longest gap of lost samples bridged; the recording is cut at longer ones.
    resample_hz : float, optional
        The rate uneven samples are resampled to (default: the recording's nominal clock).
    effort : {"torque", "current"}
        From an MCAP recording, the joint torques or the motor currents (ident.fit.preprocess.load_recording).
    covariance : {"correlated", "hac", "textbook"}
        The parameters' covariance (ident.fit.estimate.wls): for the rows' noise as the filters correlate it
        (the default), Newey-West, or the textbook s^2 (W'W)^-1 for comparison.

    Returns
    -------
    Identification
        The fit (`fit.beta`, `fit.std` in the order of `base.names`), the rows it used, the gains, the
        consistent fit and validation when asked for, the time of every step and warnings.

    Raises
    ------
    StepError
        An InputError naming the step that failed and why (a file, a column, too few samples).
    InputError
        Options that do not go together (payload_run without payload_mass, a validation recording of
        another kind).

    Examples
    --------
    A simulated recording of the generic6 arm along a shipped excitation, torques from RNEA with noise:

    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.fit import excitation
    >>> from ident.fit.batch import identify
    >>> from ident.model import load_model
    >>> from ident.fit.preprocess import Recording
    >>> model = load_model("generic6")
    >>> traj = excitation.preset("seed000")
    >>> t, q, qd, qdd = traj.sample(rate_hz=100.0)
    >>> tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(0).normal(0, 0.01, q.shape)
    >>> result = identify(model, Recording(t=t, q=q, tau=tau, current=None, qd=None, source="sim"), trajectory=traj)
    >>> result.base.count, len(result.fit.beta)
    (58, 58)
    >>> truth = result.base.from_standard(model.standard_parameters())
    >>> beyond = int(np.sum(np.abs(result.fit.beta - truth) >= 3 * result.fit.std))
    >>> beyond <= 1    # of 58 honest sigmas, 0.16 lie beyond 3 on average; two or more in 1 % of runs
    True
    """
    steps = Steps(verbose)
    bandwidth = None if trajectory is None else excitation_bandwidth(trajectory)
    if (payload_run is None) != (payload_mass is None):
        raise InputError("--payload-run and --payload-mass go together")
    read = dict(effort=effort, effort_delay=effort_delay)
    rec = _load(data, model, steps, **read)   # every input is read first: bad files fail fast
    loaded_rec = None if payload_run is None else _load(payload_run, model, steps, "the payload run", **read)
    vrec = None if validate is None else _load(validate, model, steps, "the validation recording", **read)
    if rec.kind == "torque" and loaded_rec is not None:
        raise InputError(f"{rec.source}: a payload run fixes the scale of currents; this recording holds torques")
    if loaded_rec is not None and loaded_rec.kind != "current":
        raise InputError(f"{loaded_rec.source}: the payload run must hold currents like {rec.source}")
    if vrec is not None and vrec.kind != rec.kind:
        raise InputError(f"{vrec.source}: holds {vrec.kind}s, the identification data {rec.kind}s")
    with steps("base parameters"):
        base = base or base_parameters(model)
    opts = dict(bandwidth_hz=bandwidth, cutoff_hz=cutoff_hz, decimate=decimate, slow_velocity=slow_velocity,
                steps=steps, max_bridged=max_bridged, resample_hz=resample_hz, bandwidth_from="trajectory")
    rows = recording_rows(model, base, rec, **opts)
    gains = gains_std = note = None
    if rows.kind == "current":
        gains, note = model.joint_torque_per_amp(), SCALE_NOTE_NOMINAL
        if payload_run is not None:
            loaded = recording_rows(model, base, loaded_rec, with_load=True, role="payload run", **opts)
            with steps("drive gains"):
                g = gains_with_payload(rows.W, rows.y, rows.mask, loaded.W, loaded.y, loaded.Yl, loaded.mask,
                                       float(payload_mass), names=base.names)
            gains, gains_std, note = g.gains, g.gains_std, SCALE_NOTE_PAYLOAD
    torque = rows.in_torque(gains) if gains is not None else rows.y
    with steps("least squares (OLS, WLS)"):
        same = dict(names=base.names, segments=rows.segment_id, row_correlation=rows.noise_correlation(),
                    covariance=covariance)
        ols = estimate.ols(rows.W, torque, rows.mask, **same)
        fit = estimate.wls(rows.W, torque, rows.mask, **same)
    cons = None
    if consistent:
        with steps("physically consistent fit"):
            cons = consistent_fit(model, base, fit, regularisation=regularisation)
    val = None
    if vrec is not None:
        vrows = recording_rows(model, base, vrec, role="validation recording", **opts)
        with steps("validation"):
            rms, rel = estimate.prediction_errors(vrows.W, vrows.in_torque(gains), fit.beta)
            rms_m, rel_m = measured_errors(vrows.model_regressor(), vrows.measured_torque(gains), fit.beta)
            val = Validation(vrows, estimate.predict(vrows.W, fit.beta), rms, rel, rms_m, rel_m)
    residual_measured = measured_errors(rows.model_regressor(), rows.measured_torque(gains), fit.beta,
                                        rows.mask)[0]
    with steps("friction near rest"):
        rest = rows.near_rest(fit.beta, gains, slow_velocity)
    with steps("checks"):
        found = fit_warnings(base.names, fit.beta, fit.std, fit.cond, model.tau_max,
                             _velocity_bound(model, rows), None if val is None else val.relative,
                             list(model.joint_names))
        if val is not None:
            found += outlier_joint_warnings(val.relative, fit.rows / max(len(rows.t), 1),
                                            measured_errors(rows.W, torque, fit.beta, rows.mask)[1],
                                            list(model.joint_names))
    chosen = automatic_choices(rows, cutoff_given=cutoff_hz is not None, decimate_given=decimate is not None,
                               slow_velocity=slow_velocity, delay_given=effort_delay is not None,
                               used=fit.rows, covariance=covariance)
    if verbose:
        for line in chosen:
            print(f"  choice: {line}", file=sys.stderr)
    return Identification(model=model, base=base, rows=rows, fit=fit, ols=ols, gains=gains, gains_std=gains_std,
                          scale_note=note, consistent=cons, validation=val, trajectory=trajectory,
                          slow_velocity=slow_velocity, seconds=steps.seconds, residual_rms_measured=residual_measured,
                          warnings=found, choices=chosen, near_rest=rest)


def measured_errors(W: np.ndarray, y: np.ndarray, beta: np.ndarray,
                    mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per joint: RMS of y - W beta over the rows of mask (all rows when None), and that RMS relative to the RMS
    of y over the same rows (ident.fit.estimate.prediction_errors, restricted to the rows a fit used)."""
    if mask is None:
        return estimate.prediction_errors(W, y, beta)
    e = np.where(mask, y - estimate.predict(W, beta), 0.0)
    count = np.maximum(mask.sum(axis=0), 1)
    rms = np.sqrt((e * e).sum(axis=0) / count)
    scale = np.sqrt((np.where(mask, y, 0.0) ** 2).sum(axis=0) / count)
    with np.errstate(divide="ignore", invalid="ignore"):
        return rms, np.where(scale > 0, rms / scale, np.inf)


def _velocity_bound(model: Model, rows: Rows) -> np.ndarray:
    """Each joint's velocity limit (rad/s), or the fastest velocity in the rows where the model states none."""
    fastest = np.abs(rows.qd).max(axis=0) if len(rows.qd) else np.zeros(model.n)
    return np.where(np.isfinite(model.qd_max), model.qd_max, fastest)


def _load(data, model: Model, steps: Steps, role: str = "the recording", *, effort: str = "torque",
          effort_delay: float | None = None) -> Recording:
    if isinstance(data, Recording):
        rec = data
    else:
        with steps(f"read {role}"):
            rec = load_recording(data, n=model.n, effort=effort)
    if effort_delay is None:
        return rec
    return dataclasses.replace(rec, effort_delay=check_effort_delay(effort_delay, "--effort-delay"))
