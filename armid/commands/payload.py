"""`armid payload plan|identify|apply`: payload identification (docs/guides/payload.md).

- plan: the motion a method needs (a Fourier excitation for the dynamic methods, the torque-balance sweeps (Gao, Zhao, Li 2025) for
  torque balance, D-optimal static poses for the static method), as a file the driver runs and, for the
  static methods, a CSV of joint targets for a closed controller's pendant.
- identify: the payload from a loaded and an unloaded run, with sigmas, in the model's flange frame
  (--tip); each method on its own: prints a table of those that worked and the reason of each that did
  not, writes payload.json, payload.png and report.html. Exit status 0 when every method gave an
  estimate, 1 when some did and others failed, 2 when none did (or the input is unusable).
- apply: sends the identified payload to a running driver (its set_payload command).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

PLAN_METHODS = ("dynamic", "torque-balance", "static")
IDENTIFY_METHODS = ("difference", "torque", "global", "dynamic", "torque-balance", "static")   # ident.payload.methods
SOME_FAILED = 1     # exit status: some methods gave estimates, others failed


def register(sub) -> None:
    from armid.commands._model_args import add_model_arguments

    p = sub.add_parser("payload", help="payload identification: plan the motion, identify, apply to the driver")
    psub = p.add_subparsers(dest="action", required=True)

    plan = psub.add_parser("plan", help="plan the motion a payload method needs",
                           description="dynamic: a Fourier excitation (trajectory TOML, run with run_trajectory); "
                                       "torque-balance and static: a motion file for the driver and, beside it, "
                                       "a CSV of joint targets for a pendant.")
    plan.add_argument("--method", required=True, choices=PLAN_METHODS)
    add_model_arguments(plan)
    plan.add_argument("-o", "--output", "--out", dest="output", required=True, metavar="FILE", help="the motion file to write")
    plan.add_argument("--joints", choices=("all", "wrist"), default="all",
                      help="dynamic: excite all joints (default: every dynamic method can use the runs) or the "
                           "wrist joints only (the difference method then cannot work)")
    plan.add_argument("--speed", type=float, default=None, metavar="DEG_S",
                      help="torque-balance and static: constant sweep speed, deg/s (default: the method's; "
                           "torque balance: Gao, Zhao and Li's 1 deg/s)")
    plan.add_argument("--count", type=int, default=12, help="static: number of poses (default 12)")
    plan.add_argument("--seed", type=int, default=0, help="random seed of the optimisers")
    plan.set_defaults(run=_plan)

    ident = psub.add_parser("identify", help="identify a payload from a loaded and an unloaded run",
                            description="Runs are recordings in the layout of `armid identify` (CSV/NPZ, "
                                        "docs/reference/data-files.md) or MCAP files of `armid record`. Each method runs "
                                        "on its own; one that cannot work on the runs is reported with its "
                                        "reason and the others are still printed and written. Exit status: 0 "
                                        "every method gave an estimate, 1 some did and others failed, 2 none "
                                        "did or the input is unusable.")
    ident.add_argument("--method", required=True, choices=IDENTIFY_METHODS,
                       help="difference, torque, global (Zhang, Qin, Zou 2017; 'dynamic' = all three side by side), "
                            "torque-balance (Gao, Zhao, Li 2025), static (every joint, any poses)")
    ident.add_argument("--loaded", required=True, metavar="A", help="the run with the payload")
    ident.add_argument("--unloaded", required=True, metavar="B", help="the same motion without it")
    add_model_arguments(ident)
    ident.add_argument("--trajectory", metavar="T",
                       help="dynamic methods: the runs' excitation file or preset (sets the filter bandwidth)")
    ident.add_argument("--consistent", action="store_true",
                       help="global method: constrain the payload to a body that can exist")
    ident.add_argument("-o", "--output", "--out", dest="output", default="armid-payload", metavar="DIR", help="output directory")
    ident.add_argument("--quiet", action="store_true", help="no progress on stderr")
    ident.set_defaults(run=_identify)

    run = psub.add_parser("run", help="drive a torque-balance or static motion program on a running driver",
                          description="Sends the program's steps (move_to, constant-velocity run_trajectory) one "
                                      "after the other, each once the previous motion has ended. Record the run "
                                      "with `armid record` or `armid driver --record`.")
    run.add_argument("program", help="the motion file of `armid payload plan`")
    run.add_argument("--commands", default="tcp://127.0.0.1:5556", help="the driver's command endpoint")
    run.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each of the driver's replies")
    run.set_defaults(run=_run_program)

    apply = psub.add_parser("apply", help="send an identified payload to a running driver (set_payload)")
    apply.add_argument("result", help="payload.json of `armid payload identify`")
    apply.add_argument("--commands", default="tcp://127.0.0.1:5556", help="the driver's command endpoint")
    apply.add_argument("--method", help="which estimate of the file (default: the first)")
    apply.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the driver's reply")
    apply.set_defaults(run=_apply)


def _plan(args: argparse.Namespace) -> int:
    from armid.commands._model_args import frame_text, load_model_argument
    from ident.errors import InputError, check_output_file

    check_output_file(args.output)
    model = load_model_argument(args)
    out = Path(args.output)
    if args.method == "dynamic":
        from ident.fit import excitation
        from ident.payload import dynamic

        traj = dynamic.plan(model, joints=args.joints, seed=args.seed)
        excitation.save(traj, out)
        print(f"payload excitation ({args.joints} joints, payload in frame {frame_text(model)}): {out}")
        return 0
    if args.speed is not None and not (math.isfinite(args.speed) and args.speed > 0):
        raise InputError(f"--speed: expected a speed > 0 deg/s, got {args.speed}")
    speed = {} if args.speed is None else {"speed": math.radians(args.speed)}
    if args.method == "torque-balance":
        from ident.payload import balance

        plan = balance.plan(model, **speed)
    else:
        from ident.payload import static

        plan = static.plan(model, count=args.count, seed=args.seed, **speed)
    plan.write(out)
    targets = out.with_suffix(".targets.csv")
    plan.targets_csv(targets)
    print(f"{args.method} motion (payload in frame {frame_text(model)}): {out}\npendant targets: {targets}")
    return 0


def load_run(path: str, n: int):
    """A recording (CSV, NPZ or MCAP) with n joints, as ident.fit.preprocess.Recording."""
    from ident.fit.preprocess import load_recording

    return load_recording(path, n=n)


def print_table(estimates, frame: str) -> None:
    """The estimates as a table on stdout, the centre of mass in the named frame."""
    print(f"centre of mass and inertia in frame {frame}")
    print(f"{'method':>15} {'mass kg':>9} {'±σ':>8} {'x mm':>9} {'y mm':>9} {'z mm':>9} {'±σ xyz mm':>20} {'consistent':>10}")
    for e in estimates:
        c, s = 1e3 * e.com, 1e3 * e.com_sigma
        print(f"{e.method:>15} {e.mass:9.4f} {e.sigma[9]:8.2g} {c[0]:9.2f} {c[1]:9.2f} {c[2]:9.2f} "
              f"{' '.join(f'{x:.2g}' for x in s):>20} {'yes' if e.consistent else 'NO':>10}")
        for comb in e.combinations:
            print(f"{'':>15} {comb.expression} = {comb.value:.5g} ± {comb.sigma:.2g}")
        for note in e.notes:
            print(f"{'':>15} note: {note}")


def _identify(args: argparse.Namespace) -> int:
    from armid.commands._model_args import frame_text, load_model_argument
    from ident.errors import InputError, check_output_dir
    from ident.extras import require
    from ident.payload.methods import identify_each
    from ident.payload.report import write_report

    require("matplotlib.figure", "the payload report's plot")     # a missing extra: said before the work
    check_output_dir(args.output)
    model = load_model_argument(args)
    if not args.quiet:
        print(f"reading {args.loaded} and {args.unloaded}", file=sys.stderr)
    loaded, unloaded = load_run(args.loaded, model.n), load_run(args.unloaded, model.n)
    t0 = time.perf_counter()
    trajectory = None
    if args.trajectory:
        from armid.commands.identify import load_trajectory

        trajectory = load_trajectory(args.trajectory)
    estimates, failures = identify_each(model, args.method, loaded, unloaded, trajectory=trajectory,
                                        consistent=args.consistent)
    if not estimates:
        raise InputError("no payload method gave an estimate: "
                         + "; ".join(f"{f.method}: {f.reason}" for f in failures))
    if not args.quiet:
        print(f"identified in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    print_table(estimates, frame_text(model))
    for f in failures:
        print(f"{f.method}: no estimate: {f.reason}", file=sys.stderr)
    from ident.outputs.provenance import provenance

    prov = provenance(args.output, {"loaded": args.loaded, "unloaded": args.unloaded,
                                    "trajectory": args.trajectory if args.trajectory and Path(args.trajectory).is_file()
                                    else None},
                      args.model, argv=getattr(args, "command_line", None))
    written = write_report(estimates, args.output, title=f"payload on {model.name}: {args.loaded} vs {args.unloaded}",
                           failures=failures, provenance=prov)
    for name, path in written.items():
        print(f"{name}: {path}")
    return SOME_FAILED if failures else 0


def driver_link(endpoint: str, timeout_s: float):
    """send(request dict) -> reply dict over a REQ socket to the driver's command endpoint, and close();
    InputError when the driver does not answer within timeout_s."""
    import zmq

    from ident.errors import InputError

    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))    # a request that cannot be queued ends in the same error
    sock.connect(endpoint)

    def send(request: dict) -> dict:
        try:
            sock.send_json(request)
        except zmq.Again:
            raise InputError(f"{endpoint}: the request could not be sent within {timeout_s} s "
                             f"(is the driver running there?)") from None
        try:
            return sock.recv_json()
        except zmq.Again:
            raise InputError(f"{endpoint}: no reply from the driver within {timeout_s} s") from None

    return send, sock.close


def _run_program(args: argparse.Namespace) -> int:
    from ident.payload import balance

    program = balance.load_program(args.program)
    send, close = driver_link(args.commands, args.timeout)
    try:
        steps = program["steps"]
        print(f"{args.program}: {len(steps)} steps", file=sys.stderr)
        balance.run_program(steps, send)
    finally:
        close()
    print(f"{args.program}: done")
    return 0


def _apply(args: argparse.Namespace) -> int:
    from ident.errors import InputError
    from ident.payload.report import read_set_payload

    _, command, frame = read_set_payload(args.result, args.method)
    send, close = driver_link(args.commands, args.timeout)
    try:
        reply = send(command)
    finally:
        close()
    if not reply.get("ok"):
        raise InputError(f"driver refused set_payload: {reply.get('error')}")
    print(f"payload set on the driver: {reply.get('payload')} (centre of mass in frame {frame}, as identified: "
          "the driver's model must have that flange frame)")
    return 0
