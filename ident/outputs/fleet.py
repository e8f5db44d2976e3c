"""Identification for a fleet: many recordings (arms x runs) identified as Dask tasks, a fleet table with one row
per arm and run, and drift between an arm's runs (docs/guides/identification.md, "Many recordings: a fleet").

    read_manifest / jobs_from_glob -> identify_many (dask.distributed, or a plain loop) -> fleet table with drift
    -> fleet.parquet, fleet.csv, fleet.html (ident.outputs.fleet_report)

Each job is one recording of one arm: `identify_job` identifies it with ident.fit.batch.identify and writes what
`armid identify` writes (result.json with provenance, report, model files) into OUT/ARM/RUN; it returns the
job's row of the fleet table, or its failure and reason. A failed job never stops the others.

Drift: for each arm, in the order of its runs (by date when every run has one, else as listed), a base parameter
whose value moved from the arm's previous successful run by more than k combined standard deviations,
|b - b_prev| > k sqrt(std^2 + std_prev^2), is flagged (ident.outputs.fleet_drift): k = DRIFT_SIGMA (3), another
`drift_sigma`, or the family-wise threshold for a chance `family_wise` of any false flag over the table.
"""
from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass, field
from datetime import datetime
from glob import glob
from pathlib import Path

import numpy as np

from firmware_bridge.errors import quoted
from ident.errors import InputError
from ident.fit import batch
from ident.model import load_model
from ident.outputs.fleet_drift import (DRIFT_SIGMA, check_threshold, drift_sigma as threshold_of, flag_drift,
                                      parameter_names, safe_name)
from ident.outputs.fleet_report import write_fleet_report
from ident.outputs.output_folder import write_identification
from ident.outputs.provenance import provenance
from ident.outputs.results import dropped_samples

MANIFEST_COLUMNS = ("arm_id", "model", "recording", "validation", "date")
REQUIRED_COLUMNS = ("arm_id", "model", "recording")


@dataclass(frozen=True)
class Job:
    """One recording of one arm: arm_id, model (file or shipped name), recording and validation recording
    (paths), date (ISO 8601 text, or None)."""

    arm_id: str
    model: str
    recording: str
    validation: str | None = None
    date: str | None = None

    @property
    def run(self) -> str:
        """The run's name: its date, or the recording's file name without suffix (safe as a folder name)."""
        return safe_name(self.date or Path(self.recording).stem)

    def out_dir(self, root: str | Path) -> Path:
        """Where the job's results go: root/ARM/RUN."""
        return Path(root) / safe_name(self.arm_id) / self.run


SNIFF_BYTES = 4096    # what is_manifest reads of a file: a manifest's first line is shorter


def is_manifest(path: str | Path) -> bool:
    """Whether path is a fleet manifest: a CSV file whose first line (within its first SNIFF_BYTES) names the
    columns arm_id, model and recording (a recording's first line names t, q1, ...). Reads at most SNIFF_BYTES:
    anything else (a binary file, a first line too long) is no manifest, and the recording's reader judges it."""
    p = Path(path)
    if p.suffix.lower() != ".csv" or not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return False
    first, newline, _ = head.partition(b"\n")
    if b"\0" in first or not (newline or len(head) < SNIFF_BYTES):
        return False
    try:
        names = next(csv.reader([first.decode("utf-8-sig", errors="replace")]), [])
    except csv.Error:
        return False
    return set(REQUIRED_COLUMNS) <= {h.strip() for h in names}


def is_glob(text: str) -> bool:
    """Whether text is a glob pattern (holds *, ? or [)."""
    return any(c in text for c in "*?[")


def read_manifest(path: str | Path) -> list[Job]:
    """The jobs of a manifest CSV with the columns arm_id, model, recording and optionally validation and date.

    Relative paths (recordings, and model files that exist there) are taken from the manifest's folder. Raises
    InputError naming the line and column of anything wrong: a missing column or value, an unknown column, a
    date that is not ISO 8601, the same arm and run twice.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the manifest: {exc}") from None
    if "\0" in text:
        raise InputError(f"{path}: line {text.count(chr(10), 0, text.index(chr(0))) + 1}: a NUL byte: not a text "
                         "CSV manifest")
    reader = csv.DictReader(text.splitlines())
    try:
        return _manifest_jobs(path, reader)
    except csv.Error as exc:       # a field over csv's size limit, a stray quote
        raise InputError(f"{path}: line {reader.reader.line_num}: {exc}") from None


def _manifest_jobs(path: Path, reader: csv.DictReader) -> list[Job]:
    base = path.parent
    columns = [c.strip() for c in reader.fieldnames or []]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    unknown = [c for c in columns if c not in MANIFEST_COLUMNS]
    if missing or unknown:
        raise InputError(f"{path}: line 1: expected the columns {', '.join(MANIFEST_COLUMNS[:3])} [, validation, "
                         f"date]; " + (f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(unknown)}"))
    jobs, seen = [], {}
    for line, raw in enumerate(reader, start=2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if k is not None}
        if None in raw:
            raise InputError(f"{path}: line {line}: more fields than the {len(columns)} columns")
        if not any(row.values()):
            continue
        for c in REQUIRED_COLUMNS:
            if not row.get(c):
                raise InputError(f"{path}: line {line}: column {c}: empty")
        date = row.get("date") or None
        if date is not None:
            try:
                datetime.fromisoformat(date)
            except ValueError:
                raise InputError(f"{path}: line {line}: column date: expected an ISO 8601 date or time, "
                                 f"got {quoted(date)}") from None

        def local(p: str) -> str:
            return str(base / p) if not Path(p).is_absolute() else p
        model = row["model"]
        model = local(model) if (base / model).is_file() else model
        job = Job(row["arm_id"], model, local(row["recording"]),
                  local(row["validation"]) if row.get("validation") else None, date)
        key = (job.arm_id, job.run)
        if key in seen:
            raise InputError(f"{path}: line {line}: arm {job.arm_id} run {job.run} is on line {seen[key]} already")
        seen[key] = line
        jobs.append(job)
    if not jobs:
        raise InputError(f"{path}: no recordings listed")
    return jobs


def jobs_from_glob(pattern: str, model: str, arm_id: str | None = None) -> list[Job]:
    """One job per file matching pattern (sorted), each of the arm arm_id or, when None, of the arm named by the
    file's folder. Raises InputError when nothing matches."""
    files = sorted(glob(pattern, recursive=True))
    if not files:
        raise InputError(f"{pattern}: no file matches")
    return [Job(arm_id or Path(f).resolve().parent.name, model, f) for f in files]


@dataclass
class Outcome:
    """What one job gave: its row of the fleet table (None when it failed) or the reason it failed."""

    job: Job
    row: dict | None
    error: str | None = None


def _row(job: Job, ident, out: Path, root: Path) -> dict:
    """The job's row of the fleet table: data quality, fit and validation figures, base parameters with std.
    lost_device_samples: the device samples the recording says were lost before it (None when it says nothing);
    dropped_samples: the recording's samples no fit row comes from (ident.outputs.results.dropped_samples)."""

    rows, fit = ident.rows, ident.fit
    row: dict = {"arm_id": job.arm_id, "run": job.run, "date": job.date, "status": "ok", "error": None,
                 "recording": os.path.relpath(job.recording, root), "model": job.model,
                 "result": os.path.relpath(out / "result.json", root),
                 "samples": int(rows.samples), "lost_device_samples": rows.lost_device_samples,
                 "dropped_samples": dropped_samples(rows),
                 "stale_repeats": 0 if rows.mended is None else int(rows.mended.repeats),
                 "bridged_samples": int(rows.bridged_samples), "unused_samples": int(rows.unused_samples),
                 "segments": int(rows.segments), "rows": int(len(rows.t)), "cond": float(fit.cond),
                 "residual_rms_max": float(np.max(fit.residual_rms)),
                 "validation_relative_max": None if ident.validation is None
                 else float(np.max(ident.validation.relative)),
                 "warnings": len(ident.warnings)}
    for name, value, std in zip(ident.base.names, fit.beta, fit.std):
        row[name] = float(value)
        row[f"{name}_std"] = float(std)
    return row


def identify_job(job: Job, out: str | Path, options: dict | None = None, *, with_report: bool = False,
                 argv: list[str] | None = None) -> Outcome:
    """Identify one job and write its results into job.out_dir(out); never raises for bad input or a failed
    identification (the Outcome says why).

    Parameters
    ----------
    job : Job
        The recording, its arm and model.
    out : str or Path
        The fleet's output folder.
    options : dict, optional
        Keyword options of ident.fit.batch.identify (trajectory, cutoff_hz, decimate, consistent, slow_velocity,
        effort_delay, max_bridged, resample_hz, effort). Recordings are read by ident.fit.preprocess.load_recording
        (CSV, NPZ or MCAP).
    with_report : bool
        Also write report.html with its plots (seconds per recording).
    argv : list of str, optional
        The command line for the provenance (default: this process's).

    Returns
    -------
    Outcome
    """
    import numba


    target = job.out_dir(out)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)        # one numba thread per task: the tasks are the parallelism
    try:
        with _blas_threads(1):
            model = load_model(job.model)
            ident = batch.identify(model, job.recording, validate=job.validation, **(options or {}))
            prov = provenance(target, {"recording": job.recording, "validation": job.validation}, job.model,
                              arm_id=job.arm_id, argv=argv)
            write_identification(ident, target, job.recording, with_report=with_report, provenance=prov)
        return Outcome(job, _row(job, ident, target, Path(out)))
    except InputError as exc:
        return Outcome(job, None, str(exc))
    except Exception as exc:        # a batch runner: one recording's failure, whatever it is, is its own
        return Outcome(job, None, f"{type(exc).__name__}: {exc}")
    finally:
        numba.set_num_threads(threads)


def _blas_threads(limit: int):
    import contextlib

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=limit, user_api="blas")


@dataclass
class FleetResult:
    """The fleet table (a list of rows, one per arm and run, drift columns filled in), the failures
    [(job, reason)], and the files written by name."""

    rows: list[dict]
    failures: list[tuple[Job, str]]
    written: dict[str, Path] = field(default_factory=dict)
    drift_sigma: float = DRIFT_SIGMA      # the drift threshold applied, in combined standard deviations


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="recordings identified", unit="rec", disable=not enabled, file=sys.stderr)


def identify_many(jobs: list[Job], out: str | Path, options: dict | None = None, *, scheduler: str | None = None,
                  client=None, workers: int | None = None, with_report: bool = False,
                  progress: bool = True, argv: list[str] | None = None, report: bool = True,
                  drift_sigma: float | None = None, family_wise: float | None = None) -> FleetResult:
    """Identify many recordings as Dask tasks and write the fleet table and report into out.

    Parameters
    ----------
    jobs : list of Job
        From read_manifest or jobs_from_glob.
    out : str or Path
        Output folder: OUT/ARM/RUN/result.json (and the rest of `armid identify`'s outputs) per job, and
        fleet.parquet, fleet.csv, fleet.html with its plots.
    options : dict, optional
        Keyword options of ident.fit.batch.identify for every job (see identify_job).
    scheduler : str, optional
        None: a dask.distributed LocalCluster of `workers` processes (default: one per core), one thread each;
        an address ("tcp://host:8786"): that Dask scheduler (its workers must see the files and `out` at the same
        paths, and should run one thread each with NUMBA_NUM_THREADS=1 in their environment: the tasks are the
        parallelism); "serial": a plain loop in this process, no Dask.
    client : distributed.Client, optional
        An existing client to submit to (scheduler is then ignored); it is not closed.
    workers : int, optional
        Workers of the local cluster (default: os.cpu_count()).
    with_report : bool
        Write each job's report.html (seconds per recording).
    progress : bool
        Show the tasks done on stderr, and each failure with its reason as it comes.
    argv : list of str, optional
        The command line for the results' provenance.
    report : bool
        Write fleet.html and its plots (about 0.1 s per base parameter).
    drift_sigma : float, optional
        The drift threshold in combined standard deviations (default 3: 0.27 % of unchanged comparisons flag).
    family_wise : float, optional
        Instead of drift_sigma: the chance of any false flag over all the table's comparisons (e.g. 0.01), the
        threshold then set by Sidak's rule (ident.outputs.fleet_drift.family_wise_sigma).

    Returns
    -------
    FleetResult
        The rows (manifest order) with drift, the failures and the files written.

    Raises
    ------
    InputError
        No jobs. A job whose recording is bad or whose identification fails does not raise: it is in
        `failures` with the reason, and the other jobs go on.

    Examples
    --------
    Two runs of one simulated arm, and a recording that is not there:

    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from ident.model import dynamics
    >>> from ident.fit import excitation
    >>> from ident.outputs.fleet import Job, identify_many
    >>> from ident.model import load_model
    >>> model = load_model("generic6")
    >>> t, q, qd, qdd = excitation.preset("seed000").sample(rate_hz=100.0)
    >>> header = ",".join(["t"] + [f"q{j}" for j in range(1, 7)] + [f"tau{j}" for j in range(1, 7)])
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> for run in (1, 2):
    ...     tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(run).normal(0, 0.01, q.shape)
    ...     np.savetxt(folder / f"run{run}.csv", np.column_stack([t, q, tau]), delimiter=",", header=header,
    ...                comments="")
    >>> jobs = [Job("arm-7", "generic6", str(folder / f"run{run}.csv")) for run in (1, 2, 3)]
    >>> fleet = identify_many(jobs, folder / "out", scheduler="serial", progress=False, report=False)
    >>> [(row["run"], row["status"]) for row in fleet.rows]
    [('run1', 'ok'), ('run2', 'ok'), ('run3', 'failed')]
    >>> len(fleet.failures), (folder / "out" / "arm-7" / "run1" / "result.json").is_file()
    (1, True)
    >>> import shutil; shutil.rmtree(folder)
    """
    if not jobs:
        raise InputError("no recordings to identify")
    try:
        check_threshold(drift_sigma, family_wise)      # refused before any work
    except ValueError as exc:
        raise InputError(f"drift threshold: {exc}") from None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    args = dict(with_report=with_report, argv=argv)
    outcomes: dict[int, Outcome] = {}
    bar = _progress(len(jobs), progress)

    def done(k: int, o: Outcome) -> None:
        outcomes[k] = o
        if o.error is not None and progress:
            bar.write(f"failed: arm {o.job.arm_id} run {o.job.run} ({o.job.recording}): {o.error}", file=sys.stderr)
        bar.update(1)

    try:
        if client is None and scheduler == "serial":
            for k, job in enumerate(jobs):
                done(k, identify_job(job, out, options, **args))
        else:
            _run_on_dask(jobs, out, options, args, done, client, scheduler, workers)
    finally:
        bar.close()
    ordered = [outcomes[k] for k in range(len(jobs))]
    rows = [o.row if o.row is not None else _failed_row(o, out) for o in ordered]
    sigma = threshold_of(rows, drift_sigma, family_wise)
    rows = flag_drift(rows, sigma)
    failures = [(o.job, o.error) for o in ordered if o.error is not None]
    written = write_table(rows, out)
    if report:
        written["report"] = write_fleet_report(rows, out, sigma=sigma)
    return FleetResult(rows, failures, written, sigma)


# Dask starts its workers with MALLOC_TRIM_THRESHOLD_ set (to return memory to the system early). Setting it turns
# off glibc's adaptive mmap threshold, so every large transient array of an identification (the regressor's
# chunks) is mapped and faulted in afresh: 1.6x the CPU per recording, measured. Our cluster leaves it unset; for
# a scheduler of your own, start its workers with `distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_`
# set to null. The statistical profiler (a stack sample every 10 ms) is off too: nobody looks at it here.
CLUSTER_CONFIG = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                  "distributed.worker.profile.enabled": False}


def local_cluster(workers: int | None = None, **kwargs):
    """A dask.distributed LocalCluster for identifications: `workers` processes (default: one per core) of one
    thread each, no dashboard, and the worker settings of CLUSTER_CONFIG. kwargs go to LocalCluster (e.g.
    processes=False). Close it (or use it in a with block) when done."""
    import dask
    from distributed import LocalCluster

    with dask.config.set(CLUSTER_CONFIG):
        return LocalCluster(**{"n_workers": workers or os.cpu_count() or 1, "threads_per_worker": 1,
                               "dashboard_address": None, **kwargs})


def _run_on_dask(jobs, out, options, args, done, client, scheduler, workers) -> None:
    from distributed import Client, as_completed

    own = []
    try:
        if client is None:
            if scheduler is None:
                cluster = local_cluster(workers)
                own.append(cluster)
                client = Client(cluster)
            else:
                client = Client(scheduler)
            own.insert(0, client)
        futures = {client.submit(identify_job, job, str(out), options, pure=False, **args): k
                   for k, job in enumerate(jobs)}
        for future in as_completed(futures):
            k = futures[future]
            try:
                done(k, future.result())
            except Exception as exc:     # a worker died or the task could not run: the job failed, not the fleet
                done(k, Outcome(jobs[k], None, f"{type(exc).__name__}: {exc}"))
    finally:
        for thing in own:
            thing.close()


def _failed_row(o: Outcome, root: Path) -> dict:
    return {"arm_id": o.job.arm_id, "run": o.job.run, "date": o.job.date, "status": "failed", "error": o.error,
            "recording": os.path.relpath(o.job.recording, root), "model": o.job.model}


# The fleet table's columns before the base parameters, with their Arrow types: the same in every run whatever its
# data says (a column no row fills is null of its type, never of Arrow's null type), so that the tables of nightly
# runs concatenate. Then per base parameter NAME: NAME, NAME_std (float64) and NAME_drift (bool).
TABLE_COLUMNS = (("arm_id", "string"), ("run", "string"), ("date", "string"), ("status", "string"),
                 ("error", "string"), ("recording", "string"), ("model", "string"), ("result", "string"),
                 ("samples", "int64"), ("lost_device_samples", "int64"), ("dropped_samples", "int64"),
                 ("stale_repeats", "int64"), ("bridged_samples", "int64"), ("unused_samples", "int64"),
                 ("segments", "int64"), ("rows", "int64"), ("cond", "float64"), ("residual_rms_max", "float64"),
                 ("validation_relative_max", "float64"), ("warnings", "int64"), ("previous_run", "string"),
                 ("drifted", "string"))


def table_schema(rows: list[dict]):
    """The fleet table's pyarrow schema: TABLE_COLUMNS, then NAME, NAME_std, NAME_drift per base parameter of the
    rows (ident.outputs.fleet_drift.parameter_names' order)."""
    import pyarrow as pa

    fields = [pa.field(name, getattr(pa, kind)()) for name, kind in TABLE_COLUMNS]
    for name in parameter_names(rows):
        fields += [pa.field(name, pa.float64()), pa.field(f"{name}_std", pa.float64()),
                   pa.field(f"{name}_drift", pa.bool_())]
    return pa.schema(fields)


def write_table(rows: list[dict], out: str | Path) -> dict[str, Path]:
    """fleet.parquet and fleet.csv (pyarrow) in out: one row per arm and run, the columns of table_schema."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    schema = table_schema(rows)
    table = pa.Table.from_pylist([{c: r.get(c) for c in schema.names} for r in rows], schema=schema)
    out = Path(out)
    pq.write_table(table, out / "fleet.parquet")
    pacsv.write_csv(table, out / "fleet.csv")
    return {"table": out / "fleet.parquet", "table csv": out / "fleet.csv"}
