"""`armid calibrate plan|identify`: kinematic calibration (Pashkevich 2004). File formats: docs/guides/calibration.md."""
from __future__ import annotations

import argparse

NOISE = 5e-5    # m per coordinate: the measurement noise stated by default (a laser tracker's order)
NOISE_HELP = f"the sensor's measurement noise per coordinate, m (default {NOISE:g})"


def _common(p: argparse.ArgumentParser) -> None:
    from armid.commands._model_args import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--tool", nargs=3, type=float, default=(0.0, 0.0, 0.0), metavar=("X", "Y", "Z"),
                   help="the measured point in the flange frame, m (default: the flange origin)")
    p.add_argument("--relative", action="store_true",
                   help="the sensor frame is unknown: fit it, do not count it as robot parameters")
    p.add_argument("--strategy", default="JL", help="column selection order: letters J B T then L or R (default JL)")


def register(sub) -> None:
    cal = sub.add_parser("calibrate", help="kinematic calibration: plan poses, identify a calibrated model")
    csub = cal.add_subparsers(dest="action", required=True)

    plan = csub.add_parser("plan", help="choose K measurement poses (D-optimal from candidates within the limits)")
    _common(plan)
    plan.add_argument("--count", type=int, required=True, help="number of poses K")
    plan.add_argument("--measure", choices=("position", "pose"), default="position",
                      help="what the sensor measures (default: position)")
    plan.add_argument("--candidates", type=int, default=500, help="random candidate poses (default 500)")
    plan.add_argument("--per-joint", type=int, default=0,
                      help="use Pashkevich's per-joint optimal sets (this many values per joint) and their product "
                           "as the candidates instead of random poses")
    plan.add_argument("--noise", type=float, default=NOISE, help=NOISE_HELP)
    plan.add_argument("--seed", type=int, default=0, help="random seed of the candidates")
    plan.add_argument("-o", "--output", required=True, help="pose list CSV to write")
    plan.set_defaults(run=_plan)

    ident = csub.add_parser("identify", help="identify the kinematic errors from measured tool points")
    ident.add_argument("measurements", help="CSV: n joint values, x y z (m), optionally qx qy qz qw or rx ry rz")
    _common(ident)
    ident.add_argument("--axes", default="", metavar="AXES.csv",
                       help="start from per-axis experiments instead of the model's nominal geometry: a CSV like "
                            "MEAS.csv where each row moves one joint only (the others at 0); the model then "
                            "only gives names and limits")
    ident.add_argument("--noise", type=float, default=NOISE,
                       help=NOISE_HELP + "; a pose is an outlier when its residual exceeds 3 times the larger of "
                                         "this and the fit's residual standard deviation")
    ident.add_argument("-o", "--output", required=True, help="folder for the calibrated model, tables and report")
    ident.set_defaults(run=_identify)


def _load(args):
    import numpy as np

    from armid.commands._model_args import load_model_argument
    from ident.calibration.model import from_model

    model = load_model_argument(args)
    return model, from_model(model, np.asarray(args.tool, dtype=float))


def _tool_text(args, model) -> str:
    from armid.commands._model_args import frame_text

    return f"tool point {' '.join(f'{v:g}' for v in args.tool)} m in frame {frame_text(model)}"


def _plan(args: argparse.Namespace) -> int:
    import numpy as np

    from ident.calibration.io import write_poses
    from ident.calibration.planning import d_optimal, plan_quality, seed_plan
    from ident.calibration.synthesis import synthesize
    from ident.errors import InputError, check_output_file

    check_output_file(args.output)
    model, cm = _load(args)
    irr = synthesize(cm, args.measure, relative=args.relative, strategy=args.strategy)
    rows = 3 if args.measure == "position" else 6
    if args.count * rows <= int(irr.identified.sum()):
        raise InputError(f"--count {args.count}: {args.count * rows} equations cannot identify "
                         f"{int(irr.identified.sum())} parameters; ask for at least {int(irr.identified.sum()) // rows + 1}")
    if args.candidates < args.count and not args.per_joint:
        raise InputError(f"--candidates {args.candidates}: fewer than --count {args.count}")
    cands = seed_plan(irr, args.per_joint) if args.per_joint else None
    q, _ = d_optimal(irr, args.count, cands, n_candidates=args.candidates, seed=args.seed)
    quality = plan_quality(irr, q, noise=args.noise)
    write_poses(args.output, q, model.joint_names)
    print(f"{args.count} poses of {model.name} written to {args.output}; {irr.count} parameters "
          f"({args.measure}{', relative' if args.relative else ''}); {_tool_text(args, model)}")
    print(f"log10 det(J^T J) = {quality.log10_det:.3f}, cond(J) = {quality.cond:.1f} (scaled by the reach "
          f"{cm.length_scale:.3f} m)")
    print(f"predicted sigma for {args.noise * 1e3:g} mm noise:")
    for nm, s in zip(quality.names, quality.sigma):
        unit, f = ("mrad", 1e3) if nm[0] == "R" else ("mm", 1e3)
        print(f"  {nm:>8} {s * f:10.4f} {unit}")
    return 0


def _identify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ident.calibration.fit import identify, predicted_accuracy
    from ident.calibration.io import (calibrated_urdf, calibration_toml, check_units, read_measurements,
                                      write_parameter_table, write_residuals)
    from ident.calibration.report import write_report
    from ident.calibration.synthesis import describe, random_configurations, synthesize
    from ident.errors import check_output_dir
    from ident.extras import require

    require("matplotlib", "the calibration report's plots")       # a missing extra: said before the work
    check_output_dir(args.output)

    model, cm = _load(args)
    if args.axes:
        from ident.calibration.fit import axis_fit_model

        axes = read_measurements(args.axes, cm.n)
        check_units(axes, cm)
        cm, fits = axis_fit_model(axes.q, axes.positions, cm.joint_type, name=model.name,
                                  joint_names=model.joint_names, q_min=cm.q_min, q_max=cm.q_max)
        print(f"axis fit from {args.axes}: RMS per joint "
              + ", ".join(f"{f.rms * 1e3:.4f}" for f in fits) + " mm (initial chain, no nominal values used)")
    meas = read_measurements(args.measurements, cm.n)
    check_units(meas, cm)
    measure = "position" if meas.orientations is None else "pose"
    irr = synthesize(cm, measure, relative=args.relative, strategy=args.strategy)
    result = identify(irr, meas.q, meas.positions, meas.orientations, noise=args.noise)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    from ident.outputs.provenance import provenance

    prov = provenance(out, {"measurements": args.measurements, "axes": args.axes or None}, args.model,
                      argv=getattr(args, "command_line", None))
    (out / "calibration.toml").write_text(calibration_toml(result, model, args.tool, "axis fit" if args.axes else "nominal",
                                                           provenance=prov), encoding="utf-8")
    (out / "calibrated.urdf").write_text(calibrated_urdf(cm, result.values, model), encoding="utf-8")
    write_parameter_table(out / "parameters.csv", result)
    write_residuals(out / "residuals.csv", result, meas.lines)
    accuracy = predicted_accuracy(result, random_configurations(cm, 500, seed=1))
    report = write_report(out, result, accuracy, f"Kinematic calibration of {model.name}", provenance=prov)
    print(f"{len(meas.q)} poses ({measure}{', relative' if args.relative else ''}), {irr.count} parameters: "
          f"{describe(irr)}; {_tool_text(args, model)}")
    print(f"RMS position error {result.rms_before * 1e3:.4f} mm before, {result.rms_after * 1e3:.4f} mm after; "
          f"noise {result.noise * 1e3:.4f} mm (stated {args.noise * 1e3:g} mm)")
    if result.rms_after > 1e-3:
        print("warning: more than 1 mm RMS remains after calibration; check the units (m, rad), the joint "
              "order and --tool")
    if result.outliers.size:
        lines = ", ".join(str(int(meas.lines[i])) for i in result.outliers)
        print(f"outliers (residual > {result.threshold * 1e3:.4g} mm, 3 x max(residual sigma, --noise)) at CSV "
              f"lines {lines}")
    print(f"wrote {out / 'calibration.toml'}, calibrated.urdf, parameters.csv, residuals.csv, {report.name}")
    return 0
