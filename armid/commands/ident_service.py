"""`armid ident-service`: online identification on the driver's live stream (ident/online/service.py)."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("ident-service", help="identify the arm's base parameters online from the driver's stream")
    p.add_argument("--model", default="generic6", help="model file or shipped name (default: generic6)")
    p.add_argument("--state", default="tcp://127.0.0.1:5555", help="the driver's state endpoint")
    p.add_argument("--publish", default="tcp://127.0.0.1:5557", help="where to publish estimates and health")
    p.add_argument("--commands", default="tcp://127.0.0.1:5558", help="where to answer commands")
    p.add_argument("--rate", type=float, default=10.0, help="estimates per second (default: 10)")
    p.add_argument("--forgetting", type=float, default=1.0, help="RLS forgetting factor per sample (default: 1)")
    p.add_argument("--cutoff", type=float, default=40.0,
                   help="low-pass cut-off of q and torque, Hz, as in `armid identify` (default: 40)")
    p.add_argument("--stream-rate", type=float, default=1000.0, help="the driver's cycle rate, Hz (default: 1000)")
    p.add_argument("--estimate-file", default=None, help="JSON file the estimate is loaded from at start and saved to")
    p.add_argument("--block", type=int, default=50, help="samples per filter call (default: 50)")
    p.add_argument("--drain", type=float, default=0.01,
                   help="least time between reads of the stream, s (default: 0.01)")
    p.add_argument("--effort-delay", default="driver", metavar="S|driver",
                   help="how late the torques are against the positions, s; default \"driver\": read from the "
                        "driver's health messages ([driver] effort_delay_ms)")
    p.add_argument("--payload", choices=("model", "estimate"), default=None,
                   help="also track the payload, with the arm's parameters of the model or of the loaded estimate "
                        "(publishes topics payload and event)")
    p.set_defaults(run=_run)


def _effort_delay(text: str):
    """ "driver", or the seconds given (checked by the service)."""
    from ident.errors import InputError

    if text == "driver":
        return text
    try:
        return float(text)
    except ValueError:
        raise InputError(f"--effort-delay: expected seconds or \"driver\", got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from ident.model import load_model
    from ident.online.service import IdentService

    log = logging.getLogger(__name__)

    model = load_model(args.model)
    service = IdentService(model, state_endpoint=args.state, publish_endpoint=args.publish,
                           command_endpoint=args.commands, publish_hz=args.rate, estimate_file=args.estimate_file,
                           payload=args.payload, block=args.block, drain_s=args.drain,
                           rate_hz=args.stream_rate, cutoff_hz=args.cutoff, forgetting=args.forgetting,
                           effort_delay=_effort_delay(args.effort_delay))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    service.start()
    log.info("%s, %d base parameters; listening to %s, estimates on %s, commands on %s%s", model.name,
             service.identifier.p, args.state, service.bound["publish"], service.bound["commands"],
             f"; tracking the payload ({args.payload}'s arm parameters)" if args.payload else "")
    while not stop.wait(0.5):
        if service.error is not None:
            break
    service.stop()
    if args.estimate_file:
        service.identifier.save(args.estimate_file)
        log.info("estimate saved to %s", args.estimate_file)
    return 1 if service.error is not None else 0
