"""`armid excite`: design an excitation trajectory, check it against a model's limits, sample it."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    excite = sub.add_parser("excite", help="excitation trajectories: design, check against the limits, sample")
    esub = excite.add_subparsers(dest="action", required=True)

    design = esub.add_parser("design", help="optimise a Fourier-series excitation (min cond or max log det of "
                                            "the base regressor) within the model's limits")
    design.add_argument("--model", required=True, help="a .toml or .urdf file, or a shipped model: generic6, puma560")
    design.add_argument("--harmonics", type=int, default=5, help="harmonics per joint (default 5)")
    design.add_argument("--base-frequency", type=float, default=0.1, help="Hz; the period is its inverse (default 0.1)")
    design.add_argument("--seed", type=int, default=0, help="random seed of the starting points (default 0)")
    design.add_argument("--criterion", choices=("cond", "logdet"), default="cond",
                        help="minimise cond() or maximise log det (D-optimal) (default cond)")
    design.add_argument("--floor", type=float, default=None, metavar="Z",
                        help="keep the flange origin above the plane z = Z (m, base frame)")
    design.add_argument("--start-pose", default=None, metavar="Q1,Q2,...",
                        help="rest pose at t = 0 and t = T, rad, comma-separated (default: middle of each range)")
    design.add_argument("--restarts", type=int, default=1, help="random starting points (default 1)")
    design.add_argument("--max-iter", type=int, default=200, help="SLSQP iterations per start (default 200)")
    design.add_argument("--grid", type=int, default=None, help="samples per period during the search (default 120)")
    design.add_argument("-o", "--output", required=True, help="trajectory file to write (.toml)")
    design.set_defaults(run=_design)

    check = esub.add_parser("check", help="check a trajectory file against a model's limits")
    check.add_argument("trajectory", help="a trajectory file, or a shipped preset: seed000")
    check.add_argument("--model", required=True, help="a .toml or .urdf file, or a shipped model")
    check.add_argument("--floor", type=float, default=None, metavar="Z", help="flange origin above z = Z (m)")
    check.add_argument("--rate", type=float, default=1000.0, help="samples per second of the check (default 1000)")
    check.set_defaults(run=_check)

    sample = esub.add_parser("sample", help="sample q, qd, qdd of a trajectory file into a CSV")
    sample.add_argument("trajectory", help="a trajectory file, or a shipped preset: seed000")
    sample.add_argument("--rate", type=float, default=1000.0, help="samples per second (default 1000)")
    sample.add_argument("--periods", type=float, default=1.0, help="how many periods (default 1)")
    sample.add_argument("-o", "--output", required=True, help="CSV to write: t, q1..qn, qd1..qdn, qdd1..qddn")
    sample.set_defaults(run=_sample)


def _trajectory(arg: str):
    """A trajectory file, or a shipped preset by name."""
    from pathlib import Path

    from ident.fit import excitation

    if Path(arg).suffix == ".toml" or Path(arg).exists():
        return excitation.load(arg)
    if arg not in excitation.presets():
        raise excitation.TrajectoryFileError(f"{arg}: neither a trajectory file nor a shipped preset "
                                             f"({', '.join(excitation.presets())})")
    return excitation.preset(arg)


def _pose(text: str | None, n: int):
    from ident.errors import InputError

    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise InputError(f"--start-pose: expected {n} comma-separated numbers in rad, got {text!r}") from None
    if len(values) != n:
        raise InputError(f"--start-pose: expected {n} values (one per joint), got {len(values)}")
    return values


def _print_usage(model, traj, rate: float) -> None:
    from ident.model.limits import limit_usage

    _, q, qd, qdd = traj.sample(rate)
    usage = limit_usage(model, q, qd, qdd)
    print("peak use of the limits: " + ", ".join(f"{k} {100 * v:.0f} % ({j})" for k, (v, j) in usage.items()))


def _design(args: argparse.Namespace) -> int:
    from ident.fit import excitation
    from ident.model.base_params import base_parameters
    from ident.model.limits import LimitError
    from ident.model import load_model

    from ident.errors import check_output_file

    check_output_file(args.output)
    model = load_model(args.model)
    base = base_parameters(model)
    grid = excitation.GRID_PER_PERIOD if args.grid is None else args.grid
    traj = excitation.design(model, harmonics=args.harmonics, base_frequency=args.base_frequency,
                             start_pose=_pose(args.start_pose, model.n), criterion=args.criterion,
                             floor_z=args.floor, seed=args.seed, max_iter=args.max_iter, restarts=args.restarts,
                             grid=grid, base=base, progress=True)
    info = traj.info
    print(f"designed for {model.name}: {traj.harmonics} harmonics of {traj.base_frequency:g} Hz (period "
          f"{traj.period:g} s, bandwidth {excitation.excitation_bandwidth(traj):g} Hz), criterion {args.criterion}, "
          f"seed {args.seed}")
    print(f"cond {info['cond']:.1f}   log det {info['logdet']:.1f}   "
          f"(best random feasible start: cond {info['start_cond']:.1f}, log det {info['start_logdet']:.1f})")
    preset = excitation.preset("seed000")
    if preset.n == model.n:
        scores = excitation.criteria(excitation.stacked_base_regressor(model, base, preset))
        try:
            excitation.check(model, preset, floor_z=args.floor)
            keeps = "keeps the limits"
        except LimitError as exc:
            keeps = f"breaks a limit: {exc}"
        print(f"preset seed000 (Zhang, Qin, Zou 2017, Table 1, {preset.harmonics} harmonics of {preset.base_frequency:g} Hz) on "
              f"{model.name}: cond {scores['cond']:.1f}   log det {scores['logdet']:.1f}; it {keeps}")
    _print_usage(model, traj, 1000.0)
    excitation.save(traj, args.output)
    print(f"wrote {args.output}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ident.fit import excitation
    from ident.model import load_model

    model = load_model(args.model)
    traj = _trajectory(args.trajectory)
    excitation.check(model, traj, rate_hz=args.rate, floor_z=args.floor)
    rest = "starts and ends at rest" if excitation.at_rest(traj) else \
        "does NOT start at rest (qd or qdd at t = 0 is not 0): ramp into it before running it"
    print(f"{args.trajectory}: keeps every limit of {model.name} over one period of {traj.period:g} s "
          f"(checked at {args.rate:g} Hz); it {rest}")
    _print_usage(model, traj, args.rate)
    return 0


def _sample(args: argparse.Namespace) -> int:
    import numpy as np

    from ident.errors import InputError, check_output_file

    check_output_file(args.output)
    traj = _trajectory(args.trajectory)
    if not (args.rate > 0 and args.periods > 0):
        raise InputError(f"--rate and --periods: expected positive numbers, got {args.rate} and {args.periods}")
    t, q, qd, qdd = traj.sample(args.rate, args.periods)
    n = traj.n
    header = ",".join(["t"] + [f"{p}{j + 1}" for p in ("q", "qd", "qdd") for j in range(n)])
    np.savetxt(args.output, np.column_stack([t, q, qd, qdd]), delimiter=",", header=header, comments="", fmt="%.10g")
    print(f"wrote {args.output}: {len(t)} samples at {args.rate:g} Hz over {args.periods:g} period(s)")
    return 0
