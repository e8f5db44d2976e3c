"""`armid model show`: print a robot model, its limits and its base parameters."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    from armid.commands._model_args import TIP_HELP

    model = sub.add_parser("model", help="robot models: show a model and its base parameters")
    msub = model.add_subparsers(dest="action", required=True)
    show = msub.add_parser("show", help="print a model (TOML, URDF or shipped name) and its base parameters")
    show.add_argument("model", help="a .toml or .urdf file, or a shipped model: generic6, puma560")
    show.add_argument("--tip", default="", metavar="LINK", help=TIP_HELP)
    show.add_argument("--base", choices=("qr", "closed-form"), default="qr",
                      help="how to compute the base parameters (default: qr)")
    show.set_defaults(run=_show)


def _show(args: argparse.Namespace) -> int:
    import numpy as np

    from ident.model.base_params import base_parameters
    from ident.model import load_model

    model = load_model(args.model, tip=args.tip)
    deg = np.degrees
    print(f"model {model.name}: {model.n} joints, from {model.source}")
    print(f"gravity {model.gravity.tolist()} m/s^2; flange frame {model.flange_frame} at {model.flange_p.tolist()} m "
          f"in frame {model.n}")
    print(f"{'joint':>12} {'type':>9} {'mass kg':>8} {'q min deg':>10} {'q max deg':>10} {'qd max':>7} "
          f"{'qdd max':>8} {'tau max':>8} {'gear':>7} {'kt N m/A':>8}")
    for j, name in enumerate(model.joint_names):
        kind = "revolute" if model.joint_type[j] == 0 else "prismatic"
        print(f"{name:>12} {kind:>9} {model.inertial[j, 9]:8.3f} {deg(model.q_min[j]):10.1f} {deg(model.q_max[j]):10.1f} "
              f"{model.qd_max[j]:7.2f} {model.qdd_max[j]:8.1f} {model.tau_max[j]:8.1f} {model.gear_ratio[j]:7.2f} "
              f"{model.torque_constant[j]:8.4f}")
    if model.is_dh:
        print("modified DH (Khalil-Kleinfinger): alpha deg, d m, theta deg, r m")
        for j, (a, d, t, r) in enumerate(model.dh):
            print(f"{model.joint_names[j]:>12} {deg(a):8.2f} {d:8.4f} {deg(t):8.2f} {r:8.4f}")
    if args.base:
        base = base_parameters(model, method=args.base)
        chi = model.standard_parameters()
        values = base.from_standard(chi)
        print(f"\n{base.count} base parameters ({base.method}) of {len(chi)} standard:")
        for expr, v in zip(base.expressions, values):
            print(f"  {v:12.6g}   {expr}")
    return 0
