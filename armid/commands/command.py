"""`armid command`: send one command to a running driver (docs/reference/stream.md) and print its reply; with --wait,
wait until it has taken effect (enable: every drive enabled; a motion: it ended) and show its progress."""
from __future__ import annotations

import argparse
import json

from armid.client import DEFAULT_COMMANDS, MOTION_MARGIN_S


def register(sub) -> None:
    p = sub.add_parser("command", help="send one command to a running driver and print its reply",
                       description="Send CMD with its fields to the driver's command socket, e.g. "
                                   "`armid command enable --wait`, `armid command run_trajectory preset=seed000 "
                                   "--wait`, `armid command move_to 'q=[0,0,0,0,0,0]' speed=0.3`. A field's value is "
                                   "read as JSON when it parses (numbers, lists), else as a string. Exit status 1 "
                                   "when the driver refuses the command or faults while waiting.")
    p.add_argument("cmd", help="the command: status, enable, disable, quick_stop, fault_reset, move_to, "
                               "run_trajectory, set_payload, ... (docs/reference/stream.md)")
    p.add_argument("fields", nargs="*", metavar="KEY=VALUE", help="the command's fields")
    p.add_argument("--commands", default=DEFAULT_COMMANDS, metavar="ENDPOINT",
                   help=f"the driver's command endpoint (default {DEFAULT_COMMANDS})")
    p.add_argument("--wait", action="store_true",
                   help="enable: wait until every drive is enabled; move_to, run_trajectory: until the arm has "
                        "arrived (every joint within 2 mrad of the goal)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds to wait for each reply, and for enable under --wait (default 10)")
    p.set_defaults(run=_run)


def request(cmd: str, fields: list[str]) -> dict:
    """The request's fields {key: value, ...} from KEY=VALUE strings (InputError naming a malformed one)."""
    from ident.errors import InputError

    out: dict = {}
    for item in fields:
        key, sep, text = item.partition("=")
        if not sep or not key or key == "cmd":
            raise InputError(f"field {item!r}: expected KEY=VALUE (a key other than cmd)")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def _run(args: argparse.Namespace) -> int:
    import sys

    from armid.client import ArmClient, CommandRefused, MotionFailed
    from ident.errors import InputError

    if not (args.timeout > 0 and args.timeout <= 3600):
        raise InputError(f"--timeout {args.timeout!r}: expected 0 < seconds <= 3600")
    fields = request(args.cmd, args.fields)
    with ArmClient(commands=args.commands, timeout_s=args.timeout) as arm:
        try:
            reply = arm.request(args.cmd, **fields)
        except CommandRefused as exc:
            print(f"armid command: refused: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(reply), flush=True)
        if not args.wait or args.cmd not in ("enable", "move_to", "run_trajectory"):
            return 0
        try:
            if args.cmd == "enable":
                arm.wait_enabled(args.timeout)
                return 0
            duration = float(reply.get("duration", 0.0))
            arm.wait_motion(duration + MOTION_MARGIN_S, progress=lambda waited: print(
                f"\r  {args.cmd}: {100 * min(1.0, waited / max(duration, 1e-9)):5.1f} % of {duration:.1f} s",
                end="", file=sys.stderr, flush=True))
            print(file=sys.stderr)
            if "goal" in reply:
                arm.wait_arrived(reply["goal"])
            return 0
        except MotionFailed as exc:
            print(f"\narmid command: {exc}", file=sys.stderr)
            return 1
