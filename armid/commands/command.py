"""`armid command`: send one command to a running driver (docs/stream.md) and print its reply; with --wait,
wait until it has taken effect (enable: every drive enabled; a motion: it ended) and show its progress."""
from __future__ import annotations

import argparse
import json

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5556"
MARGIN_S = 20.0        # s a motion may outlast its planned duration under --wait (a loaded machine, a slow link)


def register(sub) -> None:
    p = sub.add_parser("command", help="send one command to a running driver and print its reply",
                       description="Send CMD with its fields to the driver's command socket, e.g. "
                                   "`armid command enable --wait`, `armid command run_trajectory preset=seed000 "
                                   "--wait`, `armid command move_to 'q=[0,0,0,0,0,0]' speed=0.3`. A field's value is "
                                   "read as JSON when it parses (numbers, lists), else as a string. Exit status 1 "
                                   "when the driver refuses the command or faults while waiting.")
    p.add_argument("cmd", help="the command: status, enable, disable, quick_stop, fault_reset, move_to, "
                               "run_trajectory, set_payload, ... (docs/stream.md)")
    p.add_argument("fields", nargs="*", metavar="KEY=VALUE", help="the command's fields")
    p.add_argument("--commands", default=DEFAULT_ENDPOINT, metavar="ENDPOINT",
                   help=f"the driver's command endpoint (default {DEFAULT_ENDPOINT})")
    p.add_argument("--wait", action="store_true",
                   help="enable: wait until every drive is enabled; move_to, run_trajectory: until the motion ends")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds to wait for each reply, and for enable under --wait (default 10)")
    p.set_defaults(run=_run)


def request(cmd: str, fields: list[str]) -> dict:
    """The request {"cmd": cmd, key: value, ...} from KEY=VALUE strings (InputError naming a malformed one)."""
    from ident.errors import InputError

    out: dict = {"cmd": cmd}
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
    import time

    import zmq

    from ident.errors import InputError

    if not (args.timeout > 0 and args.timeout <= 3600):
        raise InputError(f"--timeout {args.timeout!r}: expected 0 < seconds <= 3600")
    req = request(args.cmd, args.fields)
    ctx = zmq.Context.instance()

    def call(message: dict) -> dict:
        sock = ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(args.commands)
            sock.send(json.dumps(message).encode())
            if not sock.poll(int(args.timeout * 1000)):
                raise InputError(f"--commands {args.commands}: no reply to {message['cmd']} within "
                                 f"{args.timeout:g} s (is the driver running there?)")
            return json.loads(sock.recv())
        finally:
            sock.close(0)

    reply = call(req)
    print(json.dumps(reply), flush=True)
    if not reply.get("ok"):
        return 1
    if not args.wait or args.cmd not in ("enable", "move_to", "run_trajectory"):
        return 0
    motion = args.cmd != "enable"
    duration = float(reply.get("duration", 0.0)) if motion else 0.0
    started = time.monotonic()
    deadline = started + (duration + MARGIN_S if motion else args.timeout)
    while True:
        status = call({"cmd": "status"})
        if status.get("fault"):
            print(f"armid command: the driver faulted: {status['fault']}", file=sys.stderr)
            return 1
        if (not status.get("moving")) if motion else status.get("enabled"):
            if motion:
                print(file=sys.stderr)
            return 0
        if time.monotonic() > deadline:
            what = "the motion did not end" if motion else "the drives did not all enable"
            print(f"armid command: {what} within {deadline - started:.1f} s (status: {json.dumps(status)[:300]})",
                  file=sys.stderr)
            return 1
        if motion:
            done = min(1.0, (time.monotonic() - started) / max(duration, 1e-9))
            print(f"\r  {args.cmd}: {100 * done:5.1f} % of {duration:.1f} s", end="", file=sys.stderr, flush=True)
        time.sleep(0.1)
