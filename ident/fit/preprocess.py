"""From a recording to identification samples: loading, zero-phase filtering, differentiation, decimation.

    rec = load_recording("run.csv")                 # CSV or NPZ, strictly checked (docs/reference/data-files.md)
    s = prepare(rec, bandwidth_hz=traj_bandwidth)   # filtered q and y, central-difference qd, qdd
    Wd, yd = decimate_parallel(W, s.y, factor=10)   # the same low-pass + downsampling on W and y
    keep = ~slow_rows(qd_decimated, 0.05)           # rows where Coulomb friction is well modelled

The cut-off rule (when no cut-off is given), one Butterworth for q and y:

    cutoff_hz = min(max(CUTOFF_PER_BANDWIDTH * bandwidth_hz, NOISE_CUTOFF_HZ), MAX_CUTOFF_OF_NYQUIST * rate_hz / 2)

with CUTOFF_PER_BANDWIDTH = k = 5 and NOISE_CUTOFF_HZ = 40 Hz.
* Why k = 5: the zero-phase (forward-backward) Butterworth of order m has the power gain
  1 / (1 + (f / f_c)^(2m)) and no phase; at the highest excitation harmonic f = f_c / 5 an order-4 filter
  changes the amplitude by 5^-8 = 2.6e-6 (relative), so the commanded motion passes untouched.
* Why the 40 Hz floor: the measured motion holds more than the commanded harmonics (the servo's tracking
  error, the jerks of Coulomb friction reversals), and y holds their torques. y is filtered here but the
  regressor W(q) is not (it is nonlinear in q), so a cut-off inside the band of the real motion biases the
  fit: on simulated CSP data without noise (generic6, seed-000 preset, 0.6 Hz bandwidth) the residual
  y - W beta_true was 0.27 N m RMS on joint 1 with a 3 Hz cut-off, 0.096 with 10 Hz and 0.006 with 40 Hz.
  This filter therefore only removes sensor noise, like Gautier's position filter whose cut-off lies well
  above the closed-loop bandwidth of the drives (industrial position loops: 5-20 Hz). The band limit of
  the fit is the parallel decimation (`decimate_parallel`), which filters W and y alike.
When the bandwidth is not known either, it is estimated from the positions (`estimate_bandwidth`: the
frequency below which 99.9 % of the energy of the spectrum of q lies).

Edges: a forward-backward filter is not exact for the first and last samples (its start-up transient);
`prepare` drops, at each end, the samples in which the slowest pole of the filter has not yet decayed by a
factor EDGE_DECAY = 1e-4 (ceil(ln(1e4) / -ln|p_max|) samples), and at least the one sample that central
differences need.
"""
from __future__ import annotations

import codecs
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.interpolate
import scipy.signal
import scipy.sparse

from firmware_bridge import recording as mcap_recording
from firmware_bridge.runtime.errors import InputError, quoted

CUTOFF_PER_BANDWIDTH = 5.0    # k in cutoff = max(k * bandwidth, NOISE_CUTOFF_HZ) (see the module docstring)
NOISE_CUTOFF_HZ = 40.0        # the cut-off is never below this: it removes sensor noise, not the motion
MAX_CUTOFF_OF_NYQUIST = 0.8   # the cut-off never exceeds 0.8 of the Nyquist frequency
EDGE_DECAY = 1e-4             # filter edges are trimmed until the slowest pole has decayed by this factor
BANDWIDTH_ENERGY = 0.999      # estimate_bandwidth: share of the positions' energy below the bandwidth
MIN_SAMPLES = 32              # fewer samples cannot be filtered (padding) and differentiated
SAMPLING_JITTER = 0.25        # sample intervals may differ from their median by this fraction at most
MAX_BRIDGED_SAMPLES = 3       # gaps of at most this many lost samples are bridged; longer ones cut the recording
DECIMATION_TAPS_PER_FACTOR = 20   # FIR length of decimate_parallel: 20 * factor + 1 taps (as scipy's decimate)
DECIMATION_CUTOFF = 0.8           # ... with the cut-off at 0.8 of the new Nyquist frequency


class PreprocessError(InputError):
    """A recording cannot be used: the message names the file and the column, line or sample at fault."""


class TooFewSamples(PreprocessError):
    """Too few samples for the filter, the differences or the decimation (a recording, or one of its
    uniformly sampled segments, is too short)."""


# ---------------------------------------------------------------------------------------------------
# Recordings

class _JointSamples:
    """n and N of a record whose q is (N, n)."""

    q: np.ndarray

    @property
    def n(self) -> int:
        """Number of joints."""
        return self.q.shape[1]

    @property
    def N(self) -> int:
        """Number of samples."""
        return self.q.shape[0]


@dataclass(frozen=True, eq=False)
class Recording(_JointSamples):
    """Raw data as recorded, SI units. Exactly one of tau / current is set.

    t (N,) s, strictly increasing; q (N, n) rad; tau (N, n) N m or current (N, n) A; qd (N, n) rad/s or None;
    source: the file name (for messages); effort_delay (s): how late the effort of sample k is against its
    positions, i.e. tau[k] or current[k] belongs to the motion at t[k] - effort_delay (a current averaged
    over the sampling period that ends at t[k] lags by half a period; a drive's current filter adds its
    group delay). `prepare` aligns the effort with the motion. clock_hz: the logger's nominal sample rate (Hz)
    when the file states it (the rate `ident.fit.resample` resamples uneven samples to), else None. lost_samples:
    the device samples the recording says were lost before they reached it (the driver's count, stream v2's
    lost-sample field), None when it says nothing. late (N,) bool or None: the samples at which the drives got
    their targets too late (the stream's LATE flag: the host was behind by more than the drives' setpoint buffer
    and extrapolation, so they held a stale target); identification cuts them out (cut_windows). Constructing one
    checks shapes, finiteness, time order, the delay, the clock, the lost count and the late marks.
    """

    t: np.ndarray
    q: np.ndarray
    tau: np.ndarray | None
    current: np.ndarray | None
    qd: np.ndarray | None
    source: str
    effort_delay: float = 0.0
    clock_hz: float | None = None
    lost_samples: int | None = None
    late: np.ndarray | None = None

    def __post_init__(self) -> None:
        fields = {"t": self.t, "q": self.q, "tau": self.tau, "current": self.current, "qd": self.qd}
        checked = _check_arrays(self.source, fields, lambda k: f"sample {k}")
        for name, arr in checked.items():
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "effort_delay", check_effort_delay(self.effort_delay, self.source))
        if self.clock_hz is not None:
            object.__setattr__(self, "clock_hz", check_clock(self.clock_hz, self.source))
        if self.lost_samples is not None:
            object.__setattr__(self, "lost_samples", check_lost_samples(self.lost_samples, self.source))
        if self.late is not None:
            object.__setattr__(self, "late", check_late(self.late, self.t.shape[0], self.source))

    @property
    def kind(self) -> str:
        """"torque" (tau in N m) or "current" (motor currents in A)."""
        return "torque" if self.tau is not None else "current"

    @property
    def y(self) -> np.ndarray:
        """The measured effort: tau (N m) or current (A), whichever was recorded."""
        return self.tau if self.tau is not None else self.current


MAX_EFFORT_DELAY = 0.1          # s: a longer lag between effort and positions is a broken recording, not a filter


def check_effort_delay(value, source: str = "recording") -> float:
    """The effort delay (s) as a float; raises PreprocessError unless it is a finite number of at most
    MAX_EFFORT_DELAY in magnitude."""
    try:
        delay = float(value)
    except (TypeError, ValueError):
        raise PreprocessError(f"{source}: effort_delay: expected a number of seconds, got {value!r}") from None
    if not (math.isfinite(delay) and abs(delay) <= MAX_EFFORT_DELAY):
        raise PreprocessError(f"{source}: effort_delay: expected a finite number of seconds within "
                              f"+-{MAX_EFFORT_DELAY:g} s, got {value!r}")
    return delay


MAX_CLOCK_HZ = 1e6              # Hz: a faster sample clock is a unit slip (a period given instead of a rate)


def check_clock(value, source: str = "recording") -> float:
    """The stated sample clock (Hz) as a float; raises PreprocessError unless it is a finite number in
    (0, MAX_CLOCK_HZ]."""
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise PreprocessError(f"{source}: clock_hz: expected a sampling rate in Hz, got {value!r}") from None
    if not (math.isfinite(rate) and 0 < rate <= MAX_CLOCK_HZ):
        raise PreprocessError(f"{source}: clock_hz: expected a sampling rate in (0, {MAX_CLOCK_HZ:g}] Hz, "
                              f"got {value!r}")
    return rate


def check_late(value, N: int, source: str = "recording") -> np.ndarray:
    """The late marks (N,) as a read-only bool array; PreprocessError naming the source when they are not one
    mark (0/1 or bool) per sample."""
    arr = np.asarray(value)
    if arr.shape != (N,):
        raise PreprocessError(f"{source}: late: expected one mark per sample ({N},), got shape {arr.shape}")
    if arr.dtype != bool:
        if arr.dtype.kind not in "iuf" or not np.isin(arr, (0, 1)).all():
            raise PreprocessError(f"{source}: late: expected 0 or 1 per sample, got other values")
        arr = arr != 0
    arr = np.array(arr, dtype=bool)
    arr.setflags(write=False)
    return arr


def check_lost_samples(value, source: str = "recording") -> int:
    """The stated count of lost device samples, checked.

    Parameters
    ----------
    value : int, float or str
        The count as stated (a CSV comment field, an NPZ array).
    source : str
        The recording's name, for the message.

    Returns
    -------
    int
        The count.

    Raises
    ------
    PreprocessError
        Unless it is a whole number >= 0.
    """
    try:
        count = float(value)
    except (TypeError, ValueError):
        raise PreprocessError(f"{source}: lost_samples: expected a count of samples, got {value!r}") from None
    if not (math.isfinite(count) and count >= 0 and count == int(count)):
        raise PreprocessError(f"{source}: lost_samples: expected a whole number >= 0, got {value!r}")
    return int(count)


_PREFIX = {"q": "q", "tau": "tau", "current": "i", "qd": "qd"}   # array name -> CSV column prefix
# |value| beyond which a recording's number is no measurement of an arm (a unit or a parsing slip, 1e300):
# refused, as its square overflows in the regressor and the fits fail far from the file
MAX_ABS = {"t": 1e10, "q": 1e3, "qd": 1e4, "tau": 1e6, "current": 1e5}
_UNITS = {"t": "s", "q": "rad or m", "qd": "rad/s or m/s", "tau": "N m", "current": "A"}


def _column(name: str, j: int) -> str:
    return f"{_PREFIX[name]}{j + 1}"


def _check_arrays(source: str, fields: dict[str, np.ndarray | None],
                  locate: Callable[[int], str]) -> dict[str, np.ndarray]:
    """Shapes, finiteness and strictly increasing time of recording arrays; returns float64 read-only copies.

    `locate(k)` words the place of sample k in the file (a CSV line, an NPZ sample)."""
    if (fields["tau"] is None) == (fields["current"] is None):
        raise PreprocessError(f"{source}: expected exactly one of joint torques (tau) and motor currents (i), "
                              f"got {'both' if fields['tau'] is not None else 'neither'}")
    out: dict[str, np.ndarray] = {}
    for name, value in fields.items():
        if value is None:
            continue
        try:
            arr = np.array(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise PreprocessError(f"{source}: {name}: expected numbers") from None
        out[name] = arr
    t, q = out["t"], out["q"]
    if t.ndim != 1:
        raise PreprocessError(f"{source}: t: expected one time per sample (N,), got shape {t.shape}")
    if q.ndim != 2 or q.shape[0] != t.shape[0] or q.shape[1] == 0:
        raise PreprocessError(f"{source}: q: expected shape ({t.shape[0]}, n) to match t, got {q.shape}")
    for name, arr in out.items():
        if name != "t" and arr.shape != q.shape:
            raise PreprocessError(f"{source}: {name}: expected shape {q.shape} like q, got {arr.shape}")
    N = t.shape[0]
    if N < MIN_SAMPLES:
        raise TooFewSamples(f"{source}: {N} samples are too few: filtering and differentiation need at least "
                              f"{MIN_SAMPLES}")
    for name, arr in out.items():
        bad = ~np.isfinite(arr)
        if bad.any():
            k, *j = np.argwhere(bad)[0]
            column = "t" if name == "t" else _column(name, j[0])
            raise PreprocessError(f"{source}: {locate(int(k))}, column {column}: not a finite number ({arr[bad][0]})")
        big = np.abs(arr) > MAX_ABS[name]
        if big.any():
            k, *j = np.argwhere(big)[0]
            column = "t" if name == "t" else _column(name, j[0])
            raise PreprocessError(f"{source}: {locate(int(k))}, column {column}: {float(arr[big][0]):g} is out of range: "
                                  f"expected |value| <= {MAX_ABS[name]:g} {_UNITS[name]} (SI units)")
    dt = np.diff(t)
    if (dt <= 0).any():
        k = int(np.flatnonzero(dt <= 0)[0]) + 1
        raise PreprocessError(f"{source}: {locate(k)}, column t: time {float(t[k])!r} s does not increase "
                              f"(previous sample {float(t[k - 1])!r} s)")
    for arr in out.values():
        arr.setflags(write=False)
    return out


def load_recording(path: str | Path, *, n: int | None = None, effort: str = "torque") -> Recording:
    """Read a recording: CSV (header t, q1..qn, tau1..taun or i1..in, optional qd1..qdn; comment lines before
    the header may state `effort_delay = S` and `clock_hz = HZ`), NPZ (arrays t, q, tau or current, optional
    qd, effort_delay, clock_hz), or an MCAP file of `armid record` (docs/reference/recording.md). SI units: s,
    rad, N m, A. Layout: docs/reference/data-files.md. A CSV's rows are read by pyarrow when it is installed (the
    `ident` extra), else by numpy.

    n: the number of joints expected (e.g. the model's). effort: from an MCAP recording, the joint torques
    ("torque") or the motor currents ("current"); an MCAP file gives its fresh samples at the drives' times, the
    driver's effort delay from its metadata and the device samples it lost, as `armid record convert` writes
    them. Raises PreprocessError naming the file and the column and line (CSV) or array and sample (NPZ) at
    fault.
    """
    path = Path(path)
    if not path.is_file():
        raise PreprocessError(f"{path}: no such file")
    if path.suffix.lower() == ".npz":
        rec = _load_npz(path)
    elif path.suffix.lower() in (".csv", ".txt"):
        rec = _load_csv(path)
    elif path.suffix.lower() == ".mcap":
        rec = _load_mcap(path, effort)
    else:
        raise PreprocessError(f"{path}: unknown recording format {path.suffix!r}: expected .csv, .npz or .mcap")
    if n is not None and rec.n != n:
        raise PreprocessError(f"{path}: {rec.n} joints recorded, expected {n}")
    return rec


def _load_mcap(path: Path, effort: str) -> Recording:
    """An MCAP recording of `armid record`, converted as `armid record convert` converts it."""
    arrays, _ = mcap_recording.identification_arrays(mcap_recording.read_recording(path), effort)
    return Recording(t=arrays["t"], q=arrays["q"], tau=arrays.get("tau"), current=arrays.get("current"),
                     qd=arrays["qd"], source=str(path), effort_delay=float(arrays["effort_delay"]),
                     lost_samples=int(arrays["lost_samples"]) if "lost_samples" in arrays else None,
                     late=arrays.get("late"))


MAX_NPZ_BYTES = 2 << 30    # the arrays of one NPZ recording, uncompressed (an hour at 1 kHz of 12 joints: ~1 GB)


def _check_npz_sizes(path: Path) -> None:
    """Refuse, before numpy allocates it, an array whose header asks for more bytes than its member holds (numpy
    allocates the header's shape first) or members larger than MAX_NPZ_BYTES in all (a zip bomb)."""
    import zipfile

    from numpy.lib import format as npy

    total = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            total += info.file_size
            if total > MAX_NPZ_BYTES:
                raise PreprocessError(f"{path}: the arrays hold more than {MAX_NPZ_BYTES} bytes uncompressed "
                                      f"(the bound of one recording)")
            if not info.filename.endswith(".npy"):
                continue
            name = info.filename[:-4]
            with z.open(info) as f:
                version = npy.read_magic(f)
                if version not in ((1, 0), (2, 0)):
                    raise PreprocessError(f"{path}: array {name!r}: .npy format version {version}, expected 1.0 or 2.0")
                read_header = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                shape, _, dtype = read_header(f)
                header = f.tell()
            if dtype.hasobject:
                continue                                     # refused below (allow_pickle=False)
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if need > info.file_size - header:
                raise PreprocessError(f"{path}: array {name!r}: its header gives shape {tuple(shape)} ({need} bytes), "
                                      f"the file holds {info.file_size - header} bytes")


def _load_npz(path: Path) -> Recording:
    import zipfile

    try:
        _check_npz_sizes(path)
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except PreprocessError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise PreprocessError(f"{path}: not a readable NPZ file: {exc}") from None
    known = ("t", "q", "tau", "current", "qd", "effort_delay", "clock_hz", "lost_samples", "late")
    unknown = sorted(set(arrays) - set(known))
    if unknown:
        raise PreprocessError(f"{path}: unknown array(s) {', '.join(unknown)}: expected t, q, tau or current, qd, "
                              "effort_delay, clock_hz, lost_samples, late")
    for name in ("t", "q"):
        if name not in arrays:
            raise PreprocessError(f"{path}: missing array {name!r}")
    for name, arr in arrays.items():
        if arr.dtype.kind not in "iuf" and not (name == "late" and arr.dtype == bool):
            raise PreprocessError(f"{path}: array {name!r}: expected real numbers, got dtype {arr.dtype}")
    scalars = {}
    for name, unit in (("effort_delay", "s"), ("clock_hz", "Hz"), ("lost_samples", "samples")):
        value = arrays.pop(name, None)
        if value is not None and value.shape not in ((), (1,)):
            raise PreprocessError(f"{path}: array {name!r}: expected one number ({unit}), got shape {value.shape}")
        scalars[name] = None if value is None else value.reshape(()).item()
    clock = None if scalars["clock_hz"] is None else check_clock(scalars["clock_hz"], f"{path}")
    lost = None if scalars["lost_samples"] is None else check_lost_samples(scalars["lost_samples"], f"{path}")
    return Recording(arrays["t"], arrays["q"], arrays.get("tau"), arrays.get("current"), arrays.get("qd"), str(path),
                     check_effort_delay(scalars["effort_delay"] or 0.0, f"{path}"), clock, lost, arrays.get("late"))


_HEADER = re.compile(r"^(t|late|q|tau|i|qd)(\d*)$")   # t and late: one column each


_SINGLE = ("t", "late")      # the columns without a joint number


def _parse_header(path: Path, header: list[str], line: int) -> tuple[int, dict[str, list[int]]]:
    """Columns by array: {"t": [c], "q": [c1..cn], "tau" or "current": [...], "qd": [...], "late": [c]} and n."""
    groups: dict[str, dict[int, int]] = {}
    for c, raw in enumerate(header):
        name = raw.strip()
        m = _HEADER.match(name)
        if not m or (m.group(1) in _SINGLE) != (m.group(2) == "") or m.group(2).startswith("0"):
            raise PreprocessError(f"{path}: line {line}, column {c + 1}: unknown column name {quoted(name)}: expected "
                                  "t, q1..qn, tau1..taun or i1..in, optional qd1..qdn and late")
        key = {"i": "current"}.get(m.group(1), m.group(1))
        index = int(m.group(2)) - 1 if m.group(2) else 0
        if index in groups.setdefault(key, {}):
            raise PreprocessError(f"{path}: line {line}: column {quoted(name)} appears twice")
        groups[key][index] = c
    if "t" not in groups:
        raise PreprocessError(f"{path}: line {line}: missing column 't' (time, s)")
    if "q" not in groups:
        raise PreprocessError(f"{path}: line {line}: missing columns q1..qn (joint positions, rad)")
    n = max(groups["q"]) + 1
    if "tau" in groups and "current" in groups:
        raise PreprocessError(f"{path}: line {line}: both torque (tau1..) and current (i1..) columns: keep one")
    if "tau" not in groups and "current" not in groups:
        raise PreprocessError(f"{path}: line {line}: missing columns tau1..tau{n} (N m) or i1..i{n} (A)")
    columns: dict[str, list[int]] = {key: [groups[key][0]] for key in _SINGLE if key in groups}
    for key, got in groups.items():
        if key in _SINGLE:
            continue
        missing = [_column(key, j) for j in range(n) if j not in got]
        if missing:
            raise PreprocessError(f"{path}: line {line}: missing column(s) {', '.join(missing)} ({n} joints from q1..q{n})")
        extra = [_column(key, j) for j in got if j >= n]
        if extra:
            raise PreprocessError(f"{path}: line {line}: column(s) {', '.join(extra)} beyond the {n} joints of q1..q{n}")
        columns[key] = [got[j] for j in range(n)]
    return n, columns


def _data_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of the file's non-empty, non-comment lines, read a line at a time: a line of more than
    HEAD_BYTES, a NUL byte or text that is not UTF-8 is refused, naming the line (so a binary file is judged by
    its first such line, not read whole)."""
    out = []
    with path.open("rb") as f:
        for number, raw in enumerate(iter(lambda: f.readline(HEAD_BYTES + 1), b""), 1):
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            line = _text_line(path, number, raw, len(raw) <= HEAD_BYTES).rstrip("\r\n")
            if line.strip() and not line.lstrip().startswith("#"):
                out.append((number, line))
    return out


# a comment line before the header that states a field of the recording: "# effort_delay = 0.0005" (s),
# "# clock_hz = 1000" (Hz, the logger's nominal sample rate) or "# lost_samples = 12" (device samples lost before
# the recording)
_FIELD = re.compile(r"^#\s*(effort_delay|clock_hz|lost_samples)\s*[=:]\s*(\S+)\s*$")


# the most of a CSV recording read before its header is judged: the comment lines and the header (64 joints' header
# takes about 1.5 KiB); a file whose header does not end within it, or that holds a NUL byte there, is refused
HEAD_BYTES = 64 * 1024


def _text_line(path: Path, number: int, raw: bytes, ended: bool) -> str:
    """Line `number` of a CSV file as text; refused, naming it, when it holds a NUL byte (a binary file), did not
    end within HEAD_BYTES (ended false) or is not UTF-8."""
    nul = raw.find(b"\0")
    if nul >= 0:
        raise PreprocessError(f"{path}: line {number}: a NUL byte at column {nul + 1}: not a text CSV file")
    if not ended:
        raise PreprocessError(f"{path}: line {number}: longer than {HEAD_BYTES // 1024} KiB: "
                              f"{quoted(raw.decode('utf-8', 'replace'))}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PreprocessError(f"{path}: line {number}: not UTF-8 text (byte {exc.start + 1} of the line)") from None


def _csv_head(path: Path) -> tuple[int, str | None, dict[str, str]]:
    """(line number of the header, the header line or None if the file has none, the fields stated in the
    comment lines before it), reading at most HEAD_BYTES: a NUL byte (a binary file), text that is not UTF-8 or
    a line that does not end within them is refused, naming the line."""
    fields: dict[str, str] = {}
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES + 1)
    except OSError as exc:
        raise PreprocessError(f"{path}: cannot read: {exc}") from None
    whole = len(head) <= HEAD_BYTES
    head = head[:HEAD_BYTES].removeprefix(codecs.BOM_UTF8)   # a spreadsheet's byte-order mark is no column name
    for number, raw in enumerate(head.splitlines(keepends=True), 1):
        line = _text_line(path, number, raw, whole or raw.endswith((b"\n", b"\r")))
        stripped = line.strip()
        if stripped.startswith("#"):
            m = _FIELD.match(stripped)
            if m:
                if m.group(1) in fields:
                    raise PreprocessError(f"{path}: line {number}: {m.group(1)} stated twice")
                fields[m.group(1)] = m.group(2)
        elif stripped:
            return number, line.rstrip("\r\n"), fields
    return 0, None, fields


def _read_body_arrow(path: Path, header_line: int, width: int) -> np.ndarray | None:
    """The data rows after the header as (N, width) float64 by pyarrow's multithreaded CSV reader (comment
    lines skipped, nothing read as missing); None when pyarrow is not installed or a row does not parse."""
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
    except ImportError:
        return None

    def comment(row) -> str:
        return "skip" if (row.text or "").lstrip().startswith("#") else "error"

    names = [f"c{k}" for k in range(width)]
    try:
        table = pacsv.read_csv(
            path, read_options=pacsv.ReadOptions(skip_rows=header_line, column_names=names),
            parse_options=pacsv.ParseOptions(delimiter=",", invalid_row_handler=comment),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.float64() for c in names}, null_values=[],
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowException, ValueError, OSError):
        return None
    data = np.empty((table.num_rows, width))
    for k, column in enumerate(table.columns):
        data[:, k] = column.to_numpy()
    return data


def _read_body(path: Path, header_line: int, width: int) -> np.ndarray | None:
    """The data rows after the header as (N, width) float64: pyarrow's CSV reader when installed (the `ident`
    extra), else numpy's loadtxt; None when a row does not parse (the caller finds and names it)."""
    data = _read_body_arrow(path, header_line, width)
    if data is None:
        _data_lines(path)        # a binary file or a line without end is refused here, before numpy reads it whole
        try:
            data = np.loadtxt(path, delimiter=",", comments="#", skiprows=header_line, ndmin=2, dtype=np.float64,
                              encoding="utf-8-sig")
        except ValueError:
            return None
    return data if data.ndim == 2 and data.shape[1] == width else None


def _load_csv(path: Path) -> Recording:
    header_line, header, stated = _csv_head(path)
    if header is None:
        raise PreprocessError(f"{path}: empty: expected a header row t, q1..qn, tau1..taun or i1..in")
    n, columns = _parse_header(path, header.split(","), header_line)
    width = len(header.split(","))
    delay = check_effort_delay(stated["effort_delay"], f"{path}: effort_delay") if "effort_delay" in stated else 0.0
    clock = check_clock(stated["clock_hz"], f"{path}: clock_hz") if "clock_hz" in stated else None
    lost = (check_lost_samples(stated["lost_samples"], f"{path}: lost_samples") if "lost_samples" in stated
            else None)
    data = _read_body(path, header_line, width)
    if data is None or len(data) == 0:
        lines = _data_lines(path)
        if len(lines) == 1:
            raise PreprocessError(f"{path}: no data rows after the header")
        _diagnose_csv(path, lines[1:], header.split(","))    # raises, naming line and column
        raise PreprocessError(f"{path}: cannot parse the data rows")   # pragma: no cover - diagnose raised

    def locate(k: int) -> str:   # only on an error: the line numbers of the data rows, counted then
        body = [number for number, _ in _data_lines(path)[1:]]
        return f"line {body[k]}" if k < len(body) else f"sample {k}"

    arrays = {name: (data[:, cols[0]] if name in _SINGLE else data[:, cols]) for name, cols in columns.items()}
    if "late" in arrays:
        bad = np.flatnonzero(~np.isin(arrays["late"], (0.0, 1.0)))
        if bad.size:
            raise PreprocessError(f"{path}: {locate(int(bad[0]))}, column late: expected 0 or 1, got "
                                  f"{float(arrays['late'][bad[0]]):g}")
    fields = {"t": arrays["t"], "q": arrays["q"], "tau": arrays.get("tau"), "current": arrays.get("current"),
              "qd": arrays.get("qd")}
    checked = _check_arrays(str(path), fields, locate)
    return Recording(checked["t"], checked["q"], checked.get("tau"), checked.get("current"), checked.get("qd"),
                     str(path), delay, clock, lost, late=arrays.get("late"))


def _diagnose_csv(path: Path, rows: list[tuple[int, str]], header: list[str]) -> None:
    """Find the first row numpy could not parse and raise an error naming its line and column."""
    for number, row in rows:
        cells = row.split(",")
        if len(cells) != len(header):
            raise PreprocessError(f"{path}: line {number}: {len(cells)} values, the header has {len(header)} columns")
        for cell, name in zip(cells, header):
            try:
                float(cell)
            except ValueError:
                raise PreprocessError(f"{path}: line {number}, column {name.strip()}: not a number: "
                                      f"{quoted(cell.strip())}") from None
    raise PreprocessError(f"{path}: cannot parse the data rows")


# ---------------------------------------------------------------------------------------------------
# Filtering and differentiation

@dataclass(frozen=True, eq=False)
class Samples(_JointSamples):
    """Filtered, differentiated samples at the full rate, filter edges trimmed; contiguous float64.

    t (N,) s; q (N, n) rad; qd rad/s; qdd rad/s^2; y (N, n) N m or A per `kind` ("torque" | "current"),
    aligned with the motion (the recording's effort_delay removed); cutoff_hz: the low-pass cut-off used;
    rate_hz: the sampling rate; source: the recording's file name; effort_delay (s) the delay removed;
    y_measured (N, n): the effort as recorded (not filtered) at the same times, aligned by the same delay
    (linear interpolation between recorded samples), against which error figures are honest.
    """

    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray
    y: np.ndarray
    kind: str
    cutoff_hz: float
    rate_hz: float
    source: str
    effort_delay: float = 0.0
    y_measured: np.ndarray | None = None


def nominal_rate(t: np.ndarray, source: str = "recording") -> float:
    """The sampling rate (Hz) of strictly increasing times t (s): 1 / the median interval. Gaps (samples lost:
    longer intervals) are allowed; raises PreprocessError naming the time of the first interval shorter than
    the median by more than SAMPLING_JITTER (a burst: doubled or misordered time stamps are not a rate)."""
    dt = np.diff(np.asarray(t, dtype=float))
    if dt.size == 0:
        raise PreprocessError(f"{source}: one sample has no sampling rate")
    h = float(np.median(dt))
    short = dt < (1.0 - SAMPLING_JITTER) * h
    if short.any():
        k = int(np.flatnonzero(short)[0])
        raise PreprocessError(f"{source}: sampling interval {dt[k]:.6g} s at t = {t[k]:.4f} s is shorter than the "
                              f"median {h:.6g} s by more than {SAMPLING_JITTER:.0%}: time stamps doubled or out of "
                              "step; resample the recording")
    return 1.0 / h


def sampling_rate(t: np.ndarray, source: str = "recording") -> float:
    """The sampling rate (Hz) of uniformly sampled, strictly increasing times t (s): 1 / median interval.
    Raises PreprocessError naming the time of the first interval more than SAMPLING_JITTER away from the
    median (a gap or a burst: the filter needs a uniform rate; split_at_gaps cuts a recording at its gaps)."""
    rate = nominal_rate(t, source)
    dt = np.diff(np.asarray(t, dtype=float))
    long = dt > (1.0 + SAMPLING_JITTER) / rate
    if long.any():
        k = int(np.flatnonzero(long)[0])
        raise PreprocessError(f"{source}: sampling interval {dt[k]:.6g} s at t = {t[k]:.4f} s exceeds the "
                              f"median {1.0 / rate:.6g} s by more than {SAMPLING_JITTER:.0%}: samples are missing; "
                              "identify the uniformly sampled stretches apart (split_at_gaps)")
    return rate


@dataclass(frozen=True)
class Segment:
    """A uniformly sampled stretch of a recording: samples start..stop-1 (a Python slice's bounds)."""

    start: int
    stop: int

    @property
    def index(self) -> slice:
        return slice(self.start, self.stop)

    def __len__(self) -> int:
        return self.stop - self.start


def split_at_gaps(rec: Recording, cut: list[tuple[float, float]] | tuple = ()) -> list[Segment]:
    """The uniformly sampled stretches of a recording, in order: it is cut wherever an interval exceeds the
    median interval by more than SAMPLING_JITTER (samples were lost there: a dropped frame, a stalled
    process). Filtering, differentiating or decimating across a long gap would invent the motion in it;
    each stretch is treated on its own instead (bridge_short_gaps fills the short ones first). The samples
    inside the time windows `cut` ([(t0, t1)] s, both ends included: cut_windows) are left out the same way.
    Raises PreprocessError on a burst (nominal_rate)."""
    rate = nominal_rate(rec.t, rec.source)
    cuts = np.flatnonzero(np.diff(rec.t) > (1.0 + SAMPLING_JITTER) / rate) + 1
    bounds = [0, *cuts.tolist(), rec.N]
    segments = [Segment(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
    if not cut:
        return segments
    inside = np.zeros(rec.N, dtype=bool)
    for t0, t1 in cut:
        inside |= (rec.t >= t0) & (rec.t <= t1)
    out = []
    for seg in segments:
        edges = np.flatnonzero(np.diff(np.concatenate([[0], (~inside[seg.index]).astype(np.int8), [0]])))
        out += [Segment(seg.start + int(a), seg.start + int(b)) for a, b in zip(edges[::2], edges[1::2])]
    return out


LATE_SETTLE_S = 0.03   # s after a late window: the drives' position loops catching up with the stream again


@dataclass(frozen=True)
class LateCut:
    """What cut_windows cut: `windows` time windows [(t0, t1)] s around the samples marked late, `samples` of
    the recording's samples inside them."""

    windows: tuple
    samples: int

    @property
    def seconds(self) -> float:
        return float(sum(t1 - t0 for t0, t1 in self.windows))

    def note(self) -> str:
        if not self.windows:
            return ""
        count = f"{len(self.windows)} window" + ("s" if len(self.windows) > 1 else "")
        return (f"{count}, {self.seconds:.3f} s ({self.samples} samples), cut where the "
                f"drives got their targets late (stream flag LATE: the host was behind by more than their setpoint "
                f"buffer and extrapolation, they held a stale target) with {LATE_SETTLE_S * 1e3:g} ms after each "
                f"and the filters' support on either side")


def cut_windows(rec: Recording, settle_s: float = LATE_SETTLE_S) -> LateCut:
    """The time windows to leave out of identification: each run of samples marked late (Recording.late), from
    its first sample to settle_s after its last (the drives' answer to the targets arriving in a burst). Cut
    like a gap (split_at_gaps), every segment is filtered apart and loses its filter edges, so the filters'
    support on either side of a window goes with it. No marks: no windows."""
    if rec.late is None or not rec.late.any():
        return LateCut((), 0)
    marks = np.concatenate([[0], rec.late.astype(np.int8), [0]])
    starts, stops = np.flatnonzero(np.diff(marks) == 1), np.flatnonzero(np.diff(marks) == -1) - 1
    windows = []
    for a, b in zip(starts, stops):
        t0, t1 = float(rec.t[a]), float(rec.t[b]) + settle_s
        if windows and t0 <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(t1, windows[-1][1]))
        else:
            windows.append((t0, t1))
    inside = sum(int(np.count_nonzero((rec.t >= t0) & (rec.t <= t1))) for t0, t1 in windows)
    return LateCut(tuple(windows), inside)


def bridge_short_gaps(rec: Recording, max_missing: int = MAX_BRIDGED_SAMPLES) -> tuple[Recording, int]:
    """The recording with the samples lost in every gap of at most max_missing samples filled in, and how many
    were filled. Positions come from a cubic spline through the recorded ones (band-limited far below the
    sampling rate, they are interpolated to a tiny fraction of their motion across a few samples); effort and
    velocities linearly (a noisy signal: a spline would ring). Longer gaps stay and split_at_gaps cuts the
    recording there. 0 fills nothing."""
    if int(max_missing) != max_missing or max_missing < 0:
        raise PreprocessError(f"bridged gaps: expected a whole number of samples >= 0, got {max_missing!r}")
    rate = nominal_rate(rec.t, rec.source)
    dt = np.diff(rec.t)
    missing = np.rint(dt * rate).astype(int) - 1
    fill = (dt > (1.0 + SAMPLING_JITTER) / rate) & (missing >= 1) & (missing <= max_missing)
    if not fill.any():
        return rec, 0
    # the lost samples evenly spaced inside their gaps
    at = np.flatnonzero(fill)
    new_t = np.concatenate([rec.t[k] + dt[k] * np.arange(1, missing[k] + 1) / (missing[k] + 1) for k in at])
    order = np.argsort(np.concatenate([rec.t, new_t]), kind="stable")
    t = np.concatenate([rec.t, new_t])[order]
    lost = order >= rec.N                           # the recorded samples stay exactly as recorded

    def linear(x):
        return None if x is None else np.column_stack([np.interp(t, rec.t, c) for c in x.T])

    q = np.empty((t.size, rec.n))
    q[~lost] = rec.q
    q[lost] = scipy.interpolate.CubicSpline(rec.t, rec.q, axis=0)(t[lost])
    return (Recording(t, q, linear(rec.tau), linear(rec.current), linear(rec.qd), rec.source, rec.effort_delay,
                      rec.clock_hz), int(len(new_t)))


def segment(rec: Recording, seg: Segment) -> Recording:
    """The samples of one segment as a Recording of their own (the source names the time span)."""
    k = seg.index
    return Recording(rec.t[k], rec.q[k], None if rec.tau is None else rec.tau[k],
                     None if rec.current is None else rec.current[k], None if rec.qd is None else rec.qd[k],
                     f"{rec.source} [t = {rec.t[seg.start]:.4f}..{rec.t[seg.stop - 1]:.4f} s]", rec.effort_delay,
                     rec.clock_hz)


def cutoff_for_bandwidth(bandwidth_hz: float, rate_hz: float) -> float:
    """The low-pass cut-off (Hz) for a motion of the given bandwidth (Hz) sampled at rate_hz:
    min(max(CUTOFF_PER_BANDWIDTH * bandwidth, NOISE_CUTOFF_HZ), MAX_CUTOFF_OF_NYQUIST * rate / 2)."""
    if not (math.isfinite(bandwidth_hz) and bandwidth_hz > 0):
        raise PreprocessError(f"bandwidth: expected a positive number in Hz, got {bandwidth_hz}")
    return min(max(CUTOFF_PER_BANDWIDTH * bandwidth_hz, NOISE_CUTOFF_HZ), MAX_CUTOFF_OF_NYQUIST * rate_hz / 2)


def estimate_bandwidth(q: np.ndarray, rate_hz: float) -> float:
    """The frequency (Hz) below which BANDWIDTH_ENERGY of the energy of the positions' spectrum lies, summed
    over the joints: the bandwidth of the motion when no trajectory file says it.

    The spectrum is that of q itself (each joint's straight line from its first to its last sample removed,
    a Hann window against leakage), not of a differentiated q: differencing weights the sensor noise by f^2,
    so that at 1 kHz the noise of a slow motion's velocity outweighs the motion (a 0.375 Hz excitation came
    out as 444 Hz); in q the noise is a tiny share of the energy and the excitation's harmonics dominate."""
    x = np.asarray(q, dtype=float)
    N = x.shape[0]
    ramp = np.linspace(0.0, 1.0, N)[:, None]
    x = x - (x[:1] + (x[-1:] - x[:1]) * ramp)
    x = x - x.mean(axis=0)
    power = (np.abs(np.fft.rfft(x * np.hanning(N)[:, None], axis=0)) ** 2).sum(axis=1)
    power[0] = 0.0
    total = power.sum()
    if not total > 0:
        raise PreprocessError("the joints do not move: no bandwidth to estimate; give the cut-off")
    f = np.fft.rfftfreq(N, 1.0 / rate_hz)
    k = int(np.searchsorted(np.cumsum(power) / total, BANDWIDTH_ENERGY))
    return float(max(f[min(k, len(f) - 1)], f[1]))


def edge_samples(sos: np.ndarray) -> int:
    """Samples to drop at each end after sosfiltfilt: until the slowest pole has decayed by EDGE_DECAY."""
    _, poles, _ = scipy.signal.sos2zpk(sos)
    radius = float(np.max(np.abs(poles))) if len(poles) else 0.0
    if radius <= 0.0:
        return 1
    return max(1, math.ceil(math.log(EDGE_DECAY) / math.log(radius)))


def central_differences(t: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and second derivatives of x (N, ...) sampled at times t (N,), at the interior samples 1..N-2,
    by three-point central differences (exact for quadratics, also for non-uniform intervals).
    Returns (xd, xdd), each (N-2, ...), in units of x per s and per s^2."""
    t = np.asarray(t, dtype=float)
    x = np.asarray(x, dtype=float)
    shape = (-1,) + (1,) * (x.ndim - 1)
    h1 = np.diff(t)[:-1].reshape(shape)       # t_k - t_{k-1}
    h2 = np.diff(t)[1:].reshape(shape)        # t_{k+1} - t_k
    xm, x0, xp = x[:-2], x[1:-1], x[2:]
    denominator = h1 * h2 * (h1 + h2)
    xd = (h1 * h1 * (xp - x0) + h2 * h2 * (x0 - xm)) / denominator
    xdd = 2.0 * (h1 * (xp - x0) - h2 * (x0 - xm)) / denominator
    return xd, xdd


def prepare(rec: Recording, *, bandwidth_hz: float | None = None, cutoff_hz: float | None = None,
            order: int = 4) -> Samples:
    """Zero-phase Butterworth low-pass (scipy.signal.sosfiltfilt, order `order`) of q and of the torques or
    currents; qd, qdd by central differences of the filtered q; filter edges trimmed. The filtered effort is
    then read effort_delay later (a cubic spline through it, evaluated at t + effort_delay), so that each row
    pairs the motion with the effort it caused; the ends lose the samples the shift needs.

    The cut-off is cutoff_hz if given, else cutoff_for_bandwidth(bandwidth_hz) (see the module docstring),
    else from estimate_bandwidth(rec.q). Rates in Hz. Raises PreprocessError if too little remains.
    """
    rate = sampling_rate(rec.t, rec.source)
    if order < 1:
        raise PreprocessError(f"filter order: expected at least 1, got {order}")
    if cutoff_hz is None:
        if bandwidth_hz is None:
            try:
                bandwidth_hz = estimate_bandwidth(rec.q, rate)
            except PreprocessError as exc:
                raise PreprocessError(f"{rec.source}: {exc}") from None
        cutoff_hz = cutoff_for_bandwidth(bandwidth_hz, rate)
    if not (math.isfinite(cutoff_hz) and 0 < cutoff_hz < rate / 2):
        raise PreprocessError(f"{rec.source}: cut-off {cutoff_hz} Hz: expected a frequency between 0 and the "
                              f"Nyquist frequency {rate / 2:g} Hz")
    sos = scipy.signal.butter(order, cutoff_hz, fs=rate, output="sos")
    edge = edge_samples(sos) + math.ceil(abs(rec.effort_delay) * rate)
    kept = rec.N - 2 * edge
    if kept < MIN_SAMPLES:
        raise TooFewSamples(
            f"{rec.source}: {rec.N} samples at {rate:g} Hz are too few for a cut-off of {cutoff_hz:.4g} Hz: the "
            f"filter edges take {edge} samples at each end and leave {max(kept, 0)}; record at least "
            f"{2 * edge + MIN_SAMPLES} samples ({(2 * edge + MIN_SAMPLES) / rate:.3g} s)")
    both = np.ascontiguousarray(np.concatenate([rec.q, rec.y], axis=1).T)   # (2n, N): one pass, along rows
    filtered = scipy.signal.sosfiltfilt(sos, both, axis=-1).T
    q_f = filtered[:, :rec.n]
    qd, qdd = central_differences(rec.t, q_f)
    keep = slice(edge, rec.N - edge)
    inner = slice(edge - 1, rec.N - edge - 1)        # central differences start at sample 1
    y = filtered[keep, rec.n:]
    measured = rec.y[keep]
    if rec.effort_delay != 0.0:   # band-limited far below Nyquist: a cubic spline interpolates it to ~1e-6
        y = scipy.interpolate.CubicSpline(rec.t, filtered[:, rec.n:], axis=0)(rec.t[keep] + rec.effort_delay)
        measured = np.column_stack([np.interp(rec.t[keep] + rec.effort_delay, rec.t, c) for c in rec.y.T])
    c = np.ascontiguousarray
    return Samples(c(rec.t[keep]), c(q_f[keep]), c(qd[inner]), c(qdd[inner]), c(y),
                   rec.kind, float(cutoff_hz), float(rate), rec.source, rec.effort_delay, c(measured))


# ---------------------------------------------------------------------------------------------------
# Decimation and row selection

def decimation_filter(factor: int) -> np.ndarray:
    """The FIR low-pass (20 * factor + 1 taps, Hamming window, cut-off 0.8 of the new Nyquist frequency,
    unit gain at 0 Hz) that decimate_parallel applies before keeping every factor-th sample."""
    return scipy.signal.firwin(DECIMATION_TAPS_PER_FACTOR * factor + 1, DECIMATION_CUTOFF / factor, window="hamming")


def decimation_index(N: int, factor: int) -> np.ndarray:
    """Indices into the N input samples of the rows decimate_parallel returns (e.g. to decimate t).

    Only outputs whose whole filter window lies inside the data are kept: no padding, no edge effect."""
    half = DECIMATION_TAPS_PER_FACTOR * factor // 2
    return np.arange(half, N - half, factor) if factor > 1 else np.arange(N)


def decimate_parallel(W: np.ndarray, y: np.ndarray, factor: int) -> tuple[np.ndarray, np.ndarray]:
    """Gautier's parallel decimation: the same zero-phase FIR low-pass (decimation_filter) and downsampling by
    `factor` on every column of the regressor W (N, n, b) and on y (N, n). Returns (N', n, b), (N', n) at the
    input rows decimation_index(N, factor). factor = 1 returns copies."""
    W = np.asarray(W, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if W.ndim != 3 or y.shape != W.shape[:2]:
        raise PreprocessError(f"decimate_parallel: expected W (N, n, b) and y (N, n), got {W.shape} and {y.shape}")
    if int(factor) != factor or factor < 1:
        raise PreprocessError(f"decimation factor: expected a positive integer, got {factor}")
    factor = int(factor)
    if factor == 1:
        return W.copy(), y.copy()
    index = decimation_index(W.shape[0], factor)
    if len(index) == 0:
        raise TooFewSamples(f"decimate_parallel: {W.shape[0]} samples are too few to decimate by {factor} "
                              f"(the filter spans {DECIMATION_TAPS_PER_FACTOR * factor + 1})")
    h = decimation_filter(factor)
    return _fir_decimate(h, W, factor, len(index)), _fir_decimate(h, y, factor, len(index))


def _fir_decimate(h: np.ndarray, x: np.ndarray, factor: int, count: int) -> np.ndarray:
    """Rows k < count of x filtered by h (centred) at input samples half + k*factor, computing only those.

    One sparse (count, N) matrix of shifted copies of h times the columns of x (N, m) that are not all zero
    (a regressor has many: joint i's row does not depend on the links before it): every tap is a
    multiply-add over a contiguous row, several times faster than filtering the columns one by one."""
    L, N = len(h), x.shape[0]
    flat = x.reshape(N, -1)
    start = np.arange(count) * factor                       # first input sample of each window
    D = scipy.sparse.csr_matrix((np.tile(h[::-1], count), (start[:, None] + np.arange(L)).ravel(),
                                 np.arange(count + 1) * L), shape=(count, N))
    live = np.flatnonzero(flat.any(axis=0))
    if len(live) == flat.shape[1]:
        out = D @ flat
    else:
        out = np.zeros((count, flat.shape[1]))
        out[:, live] = D @ flat[:, live]
    return np.ascontiguousarray(out).reshape((count,) + x.shape[1:])


def slow_rows(qd: np.ndarray, threshold: float) -> np.ndarray:
    """(N, n) bool: True where |qd_j| < threshold (rad/s), the samples where Coulomb friction
    (sign(qd)) is ill-modelled and which the fit leaves out."""
    if not (math.isfinite(threshold) and threshold >= 0):
        raise PreprocessError(f"slow-velocity threshold: expected a non-negative number in rad/s, got {threshold}")
    return np.abs(np.asarray(qd, dtype=float)) < threshold
