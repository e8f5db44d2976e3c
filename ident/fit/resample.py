"""Mending a recording's sampling before the filters: stale repeats dropped, uneven intervals resampled.

A logger that is not the drives' clock writes what it last read: some samples repeat the previous
positions and efforts exactly (stale entries), and the intervals wander (0.7-8.8 ms around a nominal
1 ms). The zero-phase filter and the decimation need a uniform rate, so:

    rec, done = mend_sampling(rec)       # a Recording on a uniform grid (or rec itself), and what was done
    print(done.note())                   # "1843 stale repeats dropped; resampled to 1000 Hz (...)"

1. **Stale repeats** (`stale_repeats`): a sample whose positions and efforts equal the previous sample's
   on every joint, to the bit, is a stale log entry; its time stamp is not when the values were measured,
   so it is dropped.
2. **Stamps scattered about a regular clock** (`on_clock`): when every stamp lies within ON_CLOCK_SCATTER of a
   period of a regular clock (a logger stamping entries late or early by its latency, while the drives sampled
   on their own clock), the samples are placed on that clock; the times are then even (entries lost leave gaps).
3. **Uneven sampling** (`is_uneven`): an interval that is no whole number of median intervals within SAMPLING_JITTER
   (a burst, or a late sample that is no clean loss). Then the recording is resampled to a uniform rate (the file's
   stated sample clock, else 1 / the median interval) piece by piece: a piece ends where more than `max_missing`
   samples in a row were lost, and the gap between pieces stays (split_at_gaps cuts the recording there).
   Positions (and recorded velocities) by a cubic spline through the samples (band-limited far below the
   sampling rate, the spline's error is a tiny fraction of the motion); efforts, which carry noise and
   friction steps, by a band-limited method: linear interpolation onto a grid UPSAMPLING times finer,
   then scipy.signal.resample_poly's anti-aliasing FIR down to the target rate, so that every recorded
   sample contributes and nothing above the new Nyquist frequency folds back.
4. What cannot be mended is refused by the steps after this one: a piece too short for the filters is left
   out and counted, as a segment between long gaps is.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import scipy.interpolate
import scipy.signal

from ident.fit.preprocess import (MAX_BRIDGED_SAMPLES, SAMPLING_JITTER, PreprocessError, Recording)

UPSAMPLING = 4       # efforts: linear interpolation onto a grid this many times finer, then an anti-aliasing FIR


@dataclass(frozen=True)
class Mended:
    """What mend_sampling did. samples_in, samples_out: sample counts before and after; repeats: stale
    repeats dropped; resampled: whether the times were moved onto a uniform grid; rate_hz: its rate;
    shortest_s, longest_s: the shortest and longest interval between the samples kept (before resampling),
    in s; pieces: stretches resampled apart (cut where more than max_missing samples were lost)."""

    samples_in: int
    samples_out: int
    repeats: int
    resampled: bool
    rate_hz: float
    shortest_s: float
    longest_s: float
    pieces: int = 1
    on_clock_s: float | None = None    # stamps scattered by up to this (s) about a regular clock, placed on it

    def note(self) -> str:
        """One line for the output and the report; "" when nothing was done."""
        parts = []
        if self.repeats:
            parts.append(f"{self.repeats} stale repeats dropped")
        if self.on_clock_s is not None:
            parts.append(f"time stamps scattered by up to {1e3 * self.on_clock_s:.3g} ms about a regular "
                         f"{self.rate_hz:g} Hz clock: samples placed on it")
        if self.resampled:
            parts.append(f"resampled to {self.rate_hz:g} Hz (intervals {1e3 * self.shortest_s:.3g}-"
                         f"{1e3 * self.longest_s:.3g} ms; positions by cubic splines, efforts band-limited; "
                         f"{self.samples_in} samples in, {self.samples_out} out"
                         + (f", {self.pieces} pieces" if self.pieces > 1 else "") + ")")
        return "; ".join(parts)

    def as_dict(self) -> dict:
        """The fields as plain values (result.json's data.resampling)."""
        return {"samples_in": self.samples_in, "samples_out": self.samples_out, "stale_repeats": self.repeats,
                "resampled": self.resampled, "rate_hz": self.rate_hz, "shortest_interval_s": self.shortest_s,
                "longest_interval_s": self.longest_s, "pieces": self.pieces,
                "stamps_placed_on_clock": self.on_clock_s is not None}


def stale_repeats(rec: Recording) -> np.ndarray:
    """(N,) bool: True at the samples whose positions and efforts equal the previous sample's exactly on every
    joint (a logger's stale entry). The first sample is never a repeat."""
    same = np.zeros(rec.N, dtype=bool)
    same[1:] = (rec.q[1:] == rec.q[:-1]).all(axis=1) & (rec.y[1:] == rec.y[:-1]).all(axis=1)
    return same


def is_uneven(t: np.ndarray) -> bool:
    """Whether an interval of t is no whole number of median intervals within SAMPLING_JITTER: shorter than
    the median by more than that (a burst), or a gap that is not a whole number of lost samples. Intervals
    of k median intervals (k - 1 samples lost) are gaps that the pipeline bridges or cuts at as they are."""
    dt = np.diff(np.asarray(t, dtype=float))
    if dt.size == 0:
        return False
    r = dt / np.median(dt)
    k = np.rint(r)
    return bool(((k < 1) | (np.abs(r - k) > SAMPLING_JITTER)).any())


def _select(rec: Recording, keep: np.ndarray | slice) -> Recording:
    pick = (lambda x: None if x is None else x[keep])
    return Recording(rec.t[keep], rec.q[keep], pick(rec.tau), pick(rec.current), pick(rec.qd), rec.source,
                     rec.effort_delay, rec.clock_hz)


def _band_limited(t: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """y (M, n) sampled at the uneven times t, at the uniform times grid (K,): linear interpolation onto a grid
    UPSAMPLING times finer (padded by the filter's reach at both ends), then resample_poly down by UPSAMPLING
    (its Kaiser-window FIR cuts at the new Nyquist frequency)."""
    h = (grid[-1] - grid[0]) / max(len(grid) - 1, 1)
    pad = 10 * UPSAMPLING           # resample_poly's default half-length is 10 output samples' worth of input
    fine = grid[0] + (np.arange(-pad, UPSAMPLING * (len(grid) - 1) + 1 + pad)) * (h / UPSAMPLING)
    dense = np.column_stack([np.interp(fine, t, c) for c in y.T])
    down = scipy.signal.resample_poly(dense, 1, UPSAMPLING, axis=0, padtype="line")
    first = pad // UPSAMPLING
    return down[first:first + len(grid)]


def resample_uniform(rec: Recording, rate_hz: float, max_missing: int = MAX_BRIDGED_SAMPLES) -> tuple[Recording, int]:
    """rec on a uniform grid at rate_hz (Hz), and the number of pieces: the recording is cut where an interval
    spans more than max_missing lost samples, and each piece is resampled on its own grid from its first time
    (positions and velocities by cubic splines, efforts band-limited; see the module docstring). The gaps between
    pieces stay. Raises PreprocessError on a rate that is not a positive number."""
    if not (math.isfinite(rate_hz) and rate_hz > 0):
        raise PreprocessError(f"{rec.source}: resampling rate: expected a positive number of Hz, got {rate_hz!r}")
    h = 1.0 / rate_hz
    cuts = np.flatnonzero(np.diff(rec.t) > (max_missing + 1 + SAMPLING_JITTER) * h) + 1
    bounds = [0, *cuts.tolist(), rec.N]
    parts: dict[str, list[np.ndarray]] = {"t": [], "q": [], "y": [], "qd": []}
    for a, b in zip(bounds[:-1], bounds[1:]):
        t = rec.t[a:b]
        count = int(math.floor((t[-1] - t[0]) * rate_hz + 1e-9)) + 1
        grid = t[0] + np.arange(count) * h
        if b - a < 4 or count < 4:      # too short to interpolate: kept as recorded (left out by the filters)
            parts["t"].append(t)
            parts["q"].append(rec.q[a:b])
            parts["y"].append(rec.y[a:b])
            parts["qd"].append(rec.qd[a:b] if rec.qd is not None else rec.q[a:b])
            continue
        parts["t"].append(grid)
        parts["q"].append(scipy.interpolate.CubicSpline(t, rec.q[a:b], axis=0)(grid))
        parts["y"].append(_band_limited(t, rec.y[a:b], grid))
        if rec.qd is not None:
            parts["qd"].append(scipy.interpolate.CubicSpline(t, rec.qd[a:b], axis=0)(grid))
    cat = {k: np.concatenate(v) if v else None for k, v in parts.items()}
    y = cat["y"]
    out = Recording(cat["t"], cat["q"], y if rec.kind == "torque" else None, y if rec.kind == "current" else None,
                    cat["qd"] if rec.qd is not None else None, rec.source, rec.effort_delay, rec.clock_hz)
    return out, len(bounds) - 1


ON_CLOCK_SCATTER = 0.45     # stamps within this fraction of a period of a regular clock are placed on it


def on_clock(t: np.ndarray, period: float) -> tuple[np.ndarray, float] | None:
    """(times, scatter): t (s) placed on the regular clock it scatters about, and the largest distance (s) of a stamp
    from it, when every stamp lies within ON_CLOCK_SCATTER periods of a clock of about `period` s (entries
    missing are fine: their ticks stay empty); else None. The ticks between consecutive stamps are counted by
    rounding their interval, so stamps off the clock by more than a quarter period may be refused. A logger that
    stamps each entry when it reads it, late or early by a latency, while the drives sampled on their own regular
    clock: read as true times, the scatter puts the positions at the wrong times, noise in the motion that biases
    the inertial parameters (about -1 standard deviation on ZZR3, fv4 and others at +-0.2 ms of jitter at 1 kHz,
    simulated)."""
    if t.size < 10 or not period > 0:
        return None
    steps = np.rint(np.diff(t) / period)        # ticks between consecutive stamps (a drifting clock's too)
    if np.any(steps < 1):
        return None
    tick = np.concatenate([[0.0], np.cumsum(steps)])
    X = np.column_stack([np.ones_like(tick), tick])
    coef = np.linalg.lstsq(X, t - t[0], rcond=None)[0]
    grid = X @ coef
    scatter = float(np.max(np.abs(t - t[0] - grid)))
    if not (coef[1] > 0 and scatter < ON_CLOCK_SCATTER * coef[1]):
        return None
    return t[0] + grid, scatter


def mend_sampling(rec: Recording, *, rate_hz: float | None = None,
                  max_missing: int = MAX_BRIDGED_SAMPLES) -> tuple[Recording, Mended]:
    """Drop stale repeats; if the sampling is uneven afterwards (is_uneven) but every stamp lies near a regular
    clock (on_clock), place the samples on it; if it is still uneven, or rate_hz is given, resample to
    a uniform rate: rate_hz, else the recording's stated sample clock (Recording.clock_hz), else 1 / the median
    interval of all its entries (repeats included: the logger wrote them on its ticks). Returns the recording
    (rec itself when nothing was to mend) and what was done.
    """
    repeats = stale_repeats(rec)
    kept = _select(rec, ~repeats) if repeats.any() else rec
    dt = np.diff(kept.t)
    shortest, longest = (float(dt.min()), float(dt.max())) if dt.size else (0.0, 0.0)
    # the logger's rate from all its entries: a stale entry was still written on a tick, so the intervals with
    # the repeats in place are the logger's own; without them, every dropped repeat lengthens one
    median_rate = 1.0 / float(np.median(np.diff(rec.t)))
    resample = rate_hz is not None or is_uneven(kept.t)
    placed = None
    if resample and rate_hz is None:
        found = on_clock(kept.t, 1.0 / (kept.clock_hz or median_rate))
        if found is not None:
            kept = dataclasses.replace(kept, t=found[0])
            placed, resample = found[1], is_uneven(found[0])
    target = rate_hz or kept.clock_hz or (median_rate if placed is None else 1.0 / float(np.median(np.diff(kept.t))))
    pieces = 1
    if resample:
        kept, pieces = resample_uniform(kept, target, max_missing)
    return kept, Mended(rec.N, kept.N, int(repeats.sum()), resample, float(target), shortest, longest, pieces,
                        placed)
