"""Batch identification of a recording, end to end (docs/identification.md):

    load_recording -> prepare (zero-phase filter, central differences) -> dynamics.regressor -> base
    regressor -> decimate_parallel -> leave out slow rows -> WLS -> [physically consistent fit]
    [-> drive gains from a payload run] [-> validation on a second recording]

Each step is a plain function; `identify` composes them and times every step. Currents are turned into
joint torques with drive gains (the model's nominal ones, or gains identified with a payload run, see
ident.drive_gains), so that every statistic afterwards is in N m.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ident import dynamics, estimate
from ident.base_params import BaseParameters, base_parameters
from ident.consistent import DEFAULT_LAMBDA, ConsistentFit, consistent_fit
from ident.drive_gains import SCALE_NOTE_NOMINAL, SCALE_NOTE_PAYLOAD, gains_with_payload
from ident.errors import InputError
from ident.excitation import FourierTrajectory, excitation_bandwidth
from ident.model import Model
from ident.preprocess import (Recording, check_effort_delay, decimate_parallel, decimation_index, estimate_bandwidth, load_recording,
                              prepare, sampling_rate, slow_rows)

DEFAULT_SLOW_VELOCITY = 0.1      # rad/s: rows of a joint slower than this are left out (Coulomb friction)
DECIMATION_PER_BANDWIDTH = 20.0  # the decimation filter's cut-off is about this many excitation bandwidths


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


@dataclass(frozen=True, eq=False)
class Rows:
    """One recording reduced to fit rows. t (N',) s; q, qd (N', n) at the rows; W (N', n, b) base
    regressor and y (N', n) (N m, or A when kind is "current") after parallel decimation; Yl (N', n, 10)
    the payload regressor when asked for; mask (N', n) the rows used (not slow); bandwidth_hz, cutoff_hz,
    rate_hz and factor (decimation) as applied; samples: samples in the recording; effort_delay (s) the lag of
    the effort behind the positions that was removed (ident.preprocess.Recording)."""

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

    def in_torque(self, gains: np.ndarray) -> np.ndarray:
        """y as joint torques (N m): currents times the drive gains (n,) N m/A."""
        return self.y * gains if self.kind == "current" else self.y


def decimation_factor(rate_hz: float, bandwidth_hz: float) -> int:
    """Default decimation: the decimation filter's cut-off (0.8 of the new Nyquist frequency) at about
    DECIMATION_PER_BANDWIDTH times the excitation bandwidth."""
    return max(1, int(0.8 * rate_hz / (2.0 * DECIMATION_PER_BANDWIDTH * bandwidth_hz)))


def recording_rows(model: Model, base: BaseParameters, rec: Recording, *, bandwidth_hz: float | None = None,
                   cutoff_hz: float | None = None, decimate: int | None = None,
                   slow_velocity: float = DEFAULT_SLOW_VELOCITY, with_load: bool = False,
                   steps: Steps | None = None) -> Rows:
    """Filter, differentiate, build the base regressor (and the payload's when with_load), decimate in
    parallel and mark the slow rows of one recording."""
    steps = steps or Steps()
    if rec.n != model.n:
        raise InputError(f"{rec.source}: {rec.n} joints recorded, the model {model.name} has {model.n}")
    with steps(f"filter and differentiate {Path(rec.source).name}"):
        rate = sampling_rate(rec.t, rec.source)
        if bandwidth_hz is None:
            bandwidth_hz = estimate_bandwidth(rec.q, rate)
        s = prepare(rec, bandwidth_hz=bandwidth_hz, cutoff_hz=cutoff_hz)   # default cut-off: a noise filter
    if decimate is None:   # the default, but never so coarse that fewer than 2 rows per parameter remain
        factor = min(decimation_factor(s.rate_hz, bandwidth_hz), max(1, s.N // (2 * base.count + 20)))
    else:
        factor = int(decimate)
    if factor < 1:
        raise InputError(f"decimation: expected a positive integer, got {decimate}")
    with steps("regressor"):
        # base columns by np.take: the same as base.regressor(Y), three times faster than fancy indexing
        W = np.take(dynamics.regressor(model, s.q, s.qd, s.qdd), base.indices, axis=2)
        if with_load:
            W = np.concatenate([W, dynamics.load_regressor(model, s.q, s.qd, s.qdd)], axis=2)
    with steps("parallel decimation"):
        Wd, yd = decimate_parallel(W, s.y, factor)
        index = decimation_index(s.N, factor)
    qd = s.qd[index]
    mask = ~slow_rows(qd, slow_velocity)
    b = base.count
    return Rows(source=rec.source, kind=s.kind, t=s.t[index], q=s.q[index], qd=qd, W=Wd[:, :, :b], y=yd,
                Yl=Wd[:, :, b:] if with_load else None, mask=mask, bandwidth_hz=float(bandwidth_hz),
                cutoff_hz=s.cutoff_hz, rate_hz=s.rate_hz, factor=factor, samples=rec.N,
                effort_delay=s.effort_delay)


@dataclass(frozen=True, eq=False)
class Validation:
    """Prediction on a second recording: rows, predicted torques (N', n) N m, per joint RMS error (N m)
    and RMS error relative to the RMS torque."""

    rows: Rows
    predicted: np.ndarray
    rms: np.ndarray
    relative: np.ndarray


@dataclass(frozen=True, eq=False)
class Identification:
    """Everything one identification produced (written out by ident.results and ident.report).

    fit: WLS of the base parameters in N m. gains (n,) N m/A that turned currents into torques (nominal or
    identified; None for torque data); gains_std when identified; scale_note says what fixed the scale.
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
             verbose: bool = False) -> Identification:
    """Identify the base parameters of `model` from a recording (path or Recording), with the options of
    `armid identify`. effort_delay (s), when given, replaces the recordings' own (see
    ident.preprocess.Recording). Raises StepError (an InputError) naming the step that failed and why."""
    steps = Steps(verbose)
    bandwidth = None if trajectory is None else excitation_bandwidth(trajectory)
    if (payload_run is None) != (payload_mass is None):
        raise InputError("--payload-run and --payload-mass go together")
    rec = _load(data, model, steps, effort_delay=effort_delay)   # every input is read first: bad files fail fast
    loaded_rec = None if payload_run is None else _load(payload_run, model, steps, "the payload run", effort_delay)
    vrec = None if validate is None else _load(validate, model, steps, "the validation recording", effort_delay)
    if rec.kind == "torque" and loaded_rec is not None:
        raise InputError(f"{rec.source}: a payload run fixes the scale of currents; this recording holds torques")
    if loaded_rec is not None and loaded_rec.kind != "current":
        raise InputError(f"{loaded_rec.source}: the payload run must hold currents like {rec.source}")
    if vrec is not None and vrec.kind != rec.kind:
        raise InputError(f"{vrec.source}: holds {vrec.kind}s, the identification data {rec.kind}s")
    with steps("base parameters"):
        base = base or base_parameters(model)
    opts = dict(bandwidth_hz=bandwidth, cutoff_hz=cutoff_hz, decimate=decimate, slow_velocity=slow_velocity,
                steps=steps)
    rows = recording_rows(model, base, rec, **opts)
    gains = gains_std = note = None
    if rows.kind == "current":
        gains, note = model.joint_torque_per_amp(), SCALE_NOTE_NOMINAL
        if payload_run is not None:
            loaded = recording_rows(model, base, loaded_rec, with_load=True, **opts)
            with steps("drive gains"):
                g = gains_with_payload(rows.W, rows.y, rows.mask, loaded.W, loaded.y, loaded.Yl, loaded.mask,
                                       float(payload_mass), names=base.names)
            gains, gains_std, note = g.gains, g.gains_std, SCALE_NOTE_PAYLOAD
    torque = rows.in_torque(gains) if gains is not None else rows.y
    with steps("least squares (OLS, WLS)"):
        ols = estimate.ols(rows.W, torque, rows.mask, names=base.names)
        fit = estimate.wls(rows.W, torque, rows.mask, names=base.names)
    cons = None
    if consistent:
        with steps("physically consistent fit"):
            cons = consistent_fit(model, base, fit, regularisation=regularisation)
    val = None
    if vrec is not None:
        vrows = recording_rows(model, base, vrec, **opts)
        with steps("validation"):
            vt = vrows.in_torque(gains) if gains is not None else vrows.y
            rms, rel = estimate.prediction_errors(vrows.W, vt, fit.beta)
            val = Validation(vrows, estimate.predict(vrows.W, fit.beta), rms, rel)
    return Identification(model=model, base=base, rows=rows, fit=fit, ols=ols, gains=gains, gains_std=gains_std,
                          scale_note=note, consistent=cons, validation=val, trajectory=trajectory,
                          slow_velocity=slow_velocity, seconds=steps.seconds)


def _load(data, model: Model, steps: Steps, role: str = "the recording",
          effort_delay: float | None = None) -> Recording:
    if isinstance(data, Recording):
        rec = data
    else:
        with steps(f"read {role}"):
            rec = load_recording(data, n=model.n)
    if effort_delay is None:
        return rec
    return dataclasses.replace(rec, effort_delay=check_effort_delay(effort_delay, "--effort-delay"))
