"""`armid identify DATA --model M -o DIR`: batch identification of a recording (CSV, NPZ or the MCAP file of
`armid record`; docs/guides/identification.md)."""
from __future__ import annotations

STRICT_EXIT = 3     # exit status of --strict when the checks after the fit warned

import argparse
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("identify", help="identify the base parameters of an arm from a recording (CSV/NPZ/MCAP)",
                       description="Writes result.json, report.html with PNG plots and, with --consistent, "
                                   "the identified model file model.toml into DIR.")
    p.add_argument("data", help="recording: CSV (t, q1..qn, tau1..taun or i1..in [, qd1..qdn]) or NPZ, SI units, "
                                "or the .mcap file of armid record (converted as armid record convert does); or a "
                                "fleet manifest CSV (arm_id, model, recording[, validation, date]) or a quoted glob "
                                "of recordings, identified as Dask tasks")
    p.add_argument("--model", help="a .toml or .urdf model file, or a shipped model (generic6); required except "
                                   "with a manifest")
    p.add_argument("-o", "--output", "--out", dest="output", required=True, metavar="DIR",
                   help="output directory (created)")
    p.add_argument("--validate", metavar="DATA2", help="a second recording to validate the prediction on")
    p.add_argument("--trajectory", metavar="T", help="the excitation's trajectory file or preset (sets the bandwidth)")
    p.add_argument("--consistent", action="store_true",
                   help="also fit physically consistent standard parameters and write model.toml")
    p.add_argument("--payload-run", metavar="DATA3", help="currents only: a run with a payload of known mass")
    p.add_argument("--payload-mass", metavar="KG", type=float, help="the payload's mass (kg) in --payload-run")
    p.add_argument("--cutoff", metavar="HZ", type=float, help="Butterworth cut-off (default: see the docs)")
    p.add_argument("--effort-delay", metavar="S", type=float, default=None,
                   help="how late the torques/currents are against the positions, in s (default: the recording's "
                        "own, 0 if it says nothing; a current averaged over the sample period: half a period)")
    p.add_argument("--decimate", metavar="K", type=int, help="decimation factor (default: from the bandwidth)")
    p.add_argument("--bridge", metavar="N", type=int, default=None,
                   help="fill gaps of at most N lost samples by interpolation; cut the recording at longer ones and "
                        "identify its segments together (default 3; 0 cuts at every gap)")
    p.add_argument("--slow", metavar="RAD_S", type=float, default=None,
                   help="leave out rows of joints slower than this (default 0.2 rad/s)")
    p.add_argument("--reference", "--compare", dest="compare", metavar="MODEL", default=None,
                   help="compare each base parameter with its value in MODEL (e.g. the CAD model, or the model a "
                        "simulator runs): printed, in result.json and in report.html (a table, a plot, MODEL's "
                        "torque on the validation plot), flagged beyond 3 sigma")
    p.add_argument("--current", action="store_true",
                   help=".mcap recordings: identify from the motor currents (default: the joint torques)")
    p.add_argument("--resample", metavar="HZ", type=float, default=None,
                   help="resample every recording to this rate (default: only uneven ones, to the file's clock_hz "
                        "or the median rate; stale repeats are always dropped)")
    p.add_argument("--strict", action="store_true",
                   help=f"exit with status {STRICT_EXIT} when the checks after the fit warn (the results are written)")
    p.add_argument("--no-report", action="store_true", help="write no report.html and plots (result.json only, and with --consistent the "
                                                             "model files)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--arm-id", metavar="ID", default=None,
                   help="the arm's id, stored in result.json's provenance (default: none; with a glob: the "
                        "recording's folder name)")
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="manifest or glob: the Dask scheduler to run on (default: a local cluster, one worker per "
                        "core; 'serial': a plain loop)")
    p.add_argument("--workers", metavar="N", type=int, default=None,
                   help="manifest or glob: workers of the local cluster (default: one per core)")
    drift = p.add_mutually_exclusive_group()
    drift.add_argument("--drift-sigma", metavar="S", type=float, default=None,
                       help="manifest or glob: flag a base parameter that moved by more than S combined standard "
                            "deviations since the arm's previous run (default 3: 0.27 %% of unchanged comparisons)")
    drift.add_argument("--family-wise", metavar="P", type=float, default=None,
                       help="manifest or glob: instead, the threshold at which all the fleet's comparisons (runs x "
                            "base parameters) raise any false flag with probability P, e.g. 0.01 (Sidak)")
    p.set_defaults(run=run)


def load_trajectory(spec: str):
    """A trajectory file, or a shipped preset name."""
    from ident.fit import excitation

    return excitation.load(spec) if Path(spec).suffix or Path(spec).exists() else excitation.preset(spec)


def write_outputs(ident, out: Path, source: str, *, with_report: bool = True, provenance: dict | None = None,
                  reference=None, reference_label: str | None = None) -> dict[str, Path]:
    """result.json, report.html and, with a consistent fit, the model files in out (with the comparison with the
    reference model, called reference_label, when given): ident.outputs.output_folder.write_identification."""
    from ident.outputs.output_folder import write_identification

    return write_identification(ident, out, source, with_report=with_report, provenance=provenance,
                                reference=reference, reference_label=reference_label)


def run(args: argparse.Namespace) -> int:
    from ident.fit import batch
    from ident.errors import InputError, check_output_dir
    from ident.extras import require
    from ident.model import load_model

    check_output_dir(args.output)
    if args.slow is not None and not args.slow >= 0:
        raise InputError(f"--slow: expected a velocity >= 0 rad/s, got {args.slow}")
    from ident.outputs import fleet

    if fleet.is_manifest(args.data) or (fleet.is_glob(args.data) and not Path(args.data).exists()):
        return run_fleet(args)
    for option in ("drift_sigma", "family_wise"):
        if getattr(args, option) is not None:
            raise InputError(f"--{option.replace('_', '-')}: only with a manifest or glob (drift compares an "
                             "arm's runs in a fleet table)")
    if args.model is None:
        if Path(args.data).suffix.lower() == ".csv":
            raise InputError(f"--model: required for a recording ({args.data} is no manifest: its first line does "
                             f"not name the columns {', '.join(fleet.REQUIRED_COLUMNS)} within "
                             f"{fleet.SNIFF_BYTES} bytes)")
        raise InputError("--model: required for a recording (only a manifest names the models itself)")
    verbose = not args.quiet
    if args.resample is not None and not (args.resample > 0 and args.resample < float("inf")):
        raise InputError(f"--resample: expected a sampling rate > 0 Hz, got {args.resample}")
    if not args.no_report:
        require("matplotlib.figure", "the report's plots")    # a missing extra: said before the work, not after
    if args.consistent:
        require("cvxpy", "the physically consistent fit (--consistent)")
    model = load_model(args.model)
    traj = load_trajectory(args.trajectory) if args.trajectory else None
    reference = None if args.compare is None else load_model(args.compare)
    if reference is not None and reference.n != model.n:
        raise InputError(f"--reference {args.compare}: {reference.n} joints, the model {model.name} has {model.n}")
    if verbose:
        print(f"identifying {model.name} from {args.data}", file=sys.stderr)
    warm_kernels(model)
    with blas_threads(1):   # numba's kernels use the cores; the fit's small matrices gain nothing from BLAS threads
        ident = batch.identify(model, args.data, validate=args.validate, trajectory=traj,
                               cutoff_hz=args.cutoff, decimate=args.decimate, consistent=args.consistent,
                               slow_velocity=batch.DEFAULT_SLOW_VELOCITY if args.slow is None else args.slow,
                               payload_run=args.payload_run, payload_mass=args.payload_mass,
                               effort_delay=args.effort_delay, verbose=verbose,
                               max_bridged=batch.MAX_BRIDGED_SAMPLES if args.bridge is None else args.bridge,
                               resample_hz=args.resample, effort="current" if args.current else "torque")
    label = None if args.compare is None else Path(args.compare).name    # as passed: two files, one [robot] name
    written = write_outputs(ident, Path(args.output), args.data, with_report=not args.no_report,
                            provenance=run_provenance(args), reference=reference, reference_label=label)
    if reference is None:
        print_summary(ident)
    else:
        print_comparison(ident, reference, label)
    for name, path in written.items():
        print(f"{name}: {path}")
    if "model" not in written:
        print("model file: not written (needs --consistent: a model file holds physically consistent parameters)")
    for line in ident.warnings:
        print(f"warning: {line}")
    if ident.warnings and args.strict:
        print(f"armid: {len(ident.warnings)} warning(s) after the fit (--strict): exit status {STRICT_EXIT}",
              file=sys.stderr)
        return STRICT_EXIT
    return 0


def run_fleet(args: argparse.Namespace) -> int:
    """Many recordings (a manifest or a glob) as Dask tasks: ident.outputs.fleet.identify_many. Exit status 1 when a
    recording failed (the others are identified and in the fleet table)."""
    from ident.fit import batch
    from ident.outputs import fleet
    from ident.errors import InputError
    from ident.extras import require

    for option in ("validate", "payload_run", "compare"):
        if getattr(args, option) is not None:
            raise InputError(f"--{option.replace('_', '-')}: not with a manifest or glob (a manifest has a "
                             "validation column)")
    from ident.outputs.fleet_drift import check_threshold

    for option, value in (("--drift-sigma", dict(sigma=args.drift_sigma)),
                          ("--family-wise", dict(family_wise=args.family_wise))):
        try:
            check_threshold(**value)
        except ValueError as exc:
            raise InputError(f"{option}: {exc}") from None
    if args.workers is not None and args.workers < 1:
        raise InputError(f"--workers: expected a count >= 1, got {args.workers}")
    require("distributed", "many recordings at once (Dask)")
    require("pyarrow", "the fleet table")
    require("matplotlib.figure", "the fleet report's plots")
    if args.consistent:
        require("cvxpy", "the physically consistent fit (--consistent)")
    if fleet.is_manifest(args.data):
        jobs = fleet.read_manifest(args.data)
    elif args.model is None:
        raise InputError("--model: required with a glob of recordings")
    else:
        jobs = fleet.jobs_from_glob(args.data, args.model, args.arm_id)
    options = dict(trajectory=load_trajectory(args.trajectory) if args.trajectory else None,
                   cutoff_hz=args.cutoff, decimate=args.decimate, consistent=args.consistent,
                   slow_velocity=batch.DEFAULT_SLOW_VELOCITY if args.slow is None else args.slow,
                   effort_delay=args.effort_delay,
                   max_bridged=batch.MAX_BRIDGED_SAMPLES if args.bridge is None else args.bridge,
                   resample_hz=args.resample, effort="current" if args.current else "torque")
    if not args.quiet:
        print(f"identifying {len(jobs)} recordings of {len({j.arm_id for j in jobs})} arms", file=sys.stderr)
    result = fleet.identify_many(jobs, args.output, options, scheduler=args.scheduler, workers=args.workers,
                                 with_report=not args.no_report, progress=not args.quiet,
                                 argv=getattr(args, "command_line", None), drift_sigma=args.drift_sigma,
                                 family_wise=args.family_wise)
    ok = [r for r in result.rows if r["status"] == "ok"]
    print(drift_line(result.rows, result.drift_sigma, args.family_wise))
    for r in ok:
        if r.get("drifted"):
            print(f"drift: arm {r['arm_id']} run {r['run']} since {r['previous_run']}: "
                  + ", ".join(r["drifted"].split(";")))
    for job, reason in result.failures:
        print(f"failed: arm {job.arm_id} run {job.run} ({job.recording}): {reason}")
    print(f"{len(ok)} of {len(result.rows)} recordings identified")
    for name, path in result.written.items():
        print(f"{name}: {path}")
    return 1 if result.failures else 0


def drift_line(rows: list[dict], sigma: float, family_wise: float | None) -> str:
    """The drift threshold applied and why: "drift threshold: 4.30 sigma (family-wise 1 % over 580 comparisons)"."""
    from ident.outputs.fleet_drift import DRIFT_SIGMA, comparisons

    count = comparisons(rows)
    if family_wise is not None:
        why = f"family-wise {100 * family_wise:g} % over {count} comparisons"
    else:
        why = "the default" if sigma == DRIFT_SIGMA else "--drift-sigma"
        why += f"; {count} comparisons"
    return f"drift threshold: {sigma:.2f} sigma ({why})"


def run_provenance(args: argparse.Namespace) -> dict:
    """The provenance block of this run's result.json: its input files, model, command line and arm id."""
    from ident.outputs.provenance import provenance

    inputs = {"recording": args.data, "validation": args.validate, "payload_run": args.payload_run,
              "trajectory": args.trajectory if args.trajectory and Path(args.trajectory).is_file() else None,
              "reference": args.compare if args.compare and Path(args.compare).is_file() else None}
    return provenance(args.output, inputs, args.model, arm_id=args.arm_id, argv=getattr(args, "command_line", None))


def blas_threads(limit: int):
    """A context that caps the BLAS libraries' threads (threadpoolctl, of the `ident` extra); without
    threadpoolctl, a context that does nothing."""
    import contextlib

    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=limit, user_api="blas")


def warm_kernels(model) -> None:
    """Load (or, on a cold cache, compile, with armid.jit's notice on stderr) the regressor kernel before the
    pipeline's progress lines start, so that compile messages do not cut them."""
    import numpy as np

    from ident.model import dynamics

    z = np.zeros((1, model.n))
    dynamics.regressor(model, z, z.copy(), z.copy())


def print_comparison(ident, reference, label: str | None = None) -> None:
    """print_summary beside the base parameters of the model `reference` (same structure), called label (default
    its `[robot] name`), and how many identified values lie within 3 reported sigma of them."""
    from ident.outputs.reference import REFERENCE_SIGMA, compare_with_reference

    c = compare_with_reference(ident, reference, label)
    print_summary(ident, c.reference, c.model_name)
    print(f"{c.within} of {len(c.names)} base parameters within {REFERENCE_SIGMA:g} sigma of {c.model_name}")


def print_summary(ident, truth=None, label: str = "true") -> None:
    """The base parameters (with the reference values `truth`, titled `label`, beside them when given) and
    the fit statistics."""
    import numpy as np

    from ident.outputs.results import BADLY_IDENTIFIED_PCT, losses_note

    fit = ident.fit
    head = f"{'base parameter':>16} {'identified':>12} {'sigma %':>9}"
    if truth is not None:
        head += f" {label:>12} {'error':>12}"
    print(head)
    for k, name in enumerate(ident.base.names):
        pct = fit.relative_std_pct[k]
        flag = " !" if not pct <= BADLY_IDENTIFIED_PCT else ""
        line = f"{name:>16} {fit.beta[k]:12.5g} {pct:9.2f}"
        if truth is not None:
            line += f" {truth[k]:12.5g} {fit.beta[k] - truth[k]:12.3g}"
        print(line + flag)
    print(f"condition number {fit.cond:.4g}; rows per joint {' '.join(str(int(r)) for r in fit.rows)}; "
          f"'!' = sigma above {BADLY_IDENTIFIED_PCT:g} %")
    rows = ident.rows
    print(f"filter: cut-off {rows.cutoff_hz:.4g} Hz, decimation {rows.factor} (bandwidth {rows.bandwidth_hz:.4g} Hz, "
          f"{rows.bandwidth_source})")
    print("residual RMS per joint vs filtered rows (N m):  " + " ".join(f"{x:.4g}" for x in fit.residual_rms))
    if ident.residual_rms_measured is not None:
        print("residual RMS per joint vs measured torque (N m): "
              + " ".join(f"{x:.4g}" for x in ident.residual_rms_measured))
    if rows.gaps_note():
        print(f"data: {rows.gaps_note()}")
    losses = losses_note(rows)
    if losses:
        print(f"data: {losses}")
    if ident.validation is not None:
        v = ident.validation
        print("validation RMS per joint vs filtered rows (N m):  " + " ".join(f"{x:.4g}" for x in v.rms)
              + "  (relative: " + " ".join(f"{100 * x:.2f}%" for x in v.relative) + ")")
        if v.rms_measured is not None:
            print("validation RMS per joint vs measured torque (N m): " + " ".join(f"{x:.4g}" for x in v.rms_measured)
                  + "  (relative: " + " ".join(f"{100 * x:.2f}%" for x in v.relative_measured) + ")")
    if ident.gains is not None:
        kind = "identified" if ident.gains_std is not None else "nominal"
        print(f"drive gains ({kind}, N m/A): " + " ".join(f"{g:.5g}" for g in ident.gains))
        print(f"scale: {ident.scale_note}")
    if ident.consistent is not None:
        c = ident.consistent
        print(f"physically consistent fit: {c.status}, chi^2 increase {c.chi2_increase:.3g}, "
              f"{np.count_nonzero(np.abs(c.beta - fit.beta) > fit.std)} base parameters moved by more than 1 sigma")
