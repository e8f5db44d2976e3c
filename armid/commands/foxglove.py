"""`armid foxglove`: serve a running driver's stream to Foxglove (a WebSocket server on loopback)."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("foxglove", help="serve the driver's live stream to Foxglove (WebSocket, loopback)",
                       description="Subscribe to the driver's state and health topics and serve them through the "
                                   "Foxglove SDK's WebSocket server: /joint_states, /tf, /robot_description, "
                                   "/diagnostics, /armid/state, /armid/health, /armid/model. Open Foxglove, 'Open connection', "
                                   "Foxglove WebSocket, ws://HOST:PORT.")
    p.add_argument("--state", default="tcp://127.0.0.1:5555", metavar="ENDPOINT",
                   help="the driver's state endpoint (default tcp://127.0.0.1:5555)")
    p.add_argument("--model", default="generic6", help="the driver's model: a file or a shipped name (default generic6)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765, 0: any free one)")
    p.add_argument("--decimate", type=int, default=10, metavar="K",
                   help="publish every K-th state message (default 10: 100 Hz from a 1 kHz stream)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    import signal
    import sys
    import threading

    from ident.errors import InputError
    from ident.extras import require
    from ident.model import load_model

    require("foxglove", "the live view in Foxglove", extra="foxglove")
    if not 1 <= args.decimate <= 10_000:
        raise InputError(f"--decimate {args.decimate}: expected 1..10000")
    from armid.foxglove_bridge import Bridge

    bridge = Bridge(load_model(args.model), args.state, host=args.host, port=args.port, decimate=args.decimate).start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    print(f"armid foxglove: ws://{args.host}:{bridge.port} (stream from {args.state}); Ctrl-C stops", flush=True)
    try:
        stop.wait()
    finally:
        bridge.stop()
        print(f"armid foxglove: {bridge.received} state messages received, {bridge.published} published, "
              f"{bridge.bad_messages} undecodable", file=sys.stderr)
    return 0
