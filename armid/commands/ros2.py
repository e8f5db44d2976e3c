"""`armid ros2`: the running driver as a ROS 2 node on plain DDS (armid.ros2.bridge), no ROS install needed."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("ros2", help="show the driver to ROS 2 on DDS: topics, services, a trajectory action",
                       description="Publish the driver's stream as ROS 2 topics (joint_states, /tf, /tf_static, "
                                   "robot_description, /diagnostics) and serve enable/disable/quick_stop, the forward "
                                   "command controllers' servo topics and a FollowJointTrajectory action, on Cyclone "
                                   "DDS with ROS 2's names, types and QoS (docs/guides/ros2.md). Ctrl-C stops.")
    p.add_argument("--state", default="tcp://127.0.0.1:5555", metavar="ENDPOINT",
                   help="the driver's state endpoint (default tcp://127.0.0.1:5555)")
    p.add_argument("--commands", default="tcp://127.0.0.1:5556", metavar="ENDPOINT",
                   help="the driver's command endpoint (default tcp://127.0.0.1:5556)")
    p.add_argument("--model", default=None,
                   help="the model the driver runs: a file or a shipped name (default: the name the driver reports)")
    p.add_argument("--namespace", default="", metavar="NS", help="the node's namespace (default: none)")
    p.add_argument("--domain-id", type=int, default=None, metavar="ID",
                   help="DDS domain 0..232 (default: $ROS_DOMAIN_ID, else 0)")
    p.add_argument("--rate", type=float, default=100.0, metavar="HZ",
                   help="joint_states and /tf rate, at most the stream's (default 100)")
    p.add_argument("--controller", default="armid_controller", metavar="NAME",
                   help="the action is NAME/follow_joint_trajectory (default armid_controller)")
    p.add_argument("--curve-server-public", default=None, metavar="FILE", help="the driver's public CURVE certificate")
    p.add_argument("--curve-client-secret", default=None, metavar="FILE", help="this client's secret CURVE certificate")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    import os
    import signal
    import sys
    import threading

    from ident.errors import InputError
    from ident.extras import require
    from ident.model import load_model

    require("cyclonedds", "the ROS 2 bridge", extra="ros2")
    from armid.client import ArmClient
    from armid.ros2 import dds
    from armid.ros2.bridge import MAX_RATE_HZ, Ros2Bridge

    domain = args.domain_id
    if domain is None:
        raw = os.environ.get("ROS_DOMAIN_ID", "0") or "0"
        if not raw.strip().isdigit():
            raise InputError(f"ROS_DOMAIN_ID {raw!r}: expected an integer 0..232")
        domain = int(raw)
    dds.check_domain_id(domain)                         # the options checked before the driver is asked anything
    dds.normalize_namespace(args.namespace)
    if not 0 < args.rate <= MAX_RATE_HZ:
        raise InputError(f"--rate {args.rate:g}: expected 0 < Hz <= {MAX_RATE_HZ:g}")
    client = ArmClient(args.state, args.commands, curve_server_public=args.curve_server_public,
                       curve_client_secret=args.curve_client_secret)
    try:
        if args.model:
            model = load_model(args.model)
        else:
            name = client.status()["model"]
            try:
                model = load_model(name)
            except InputError as exc:
                raise InputError(f"the driver runs the model {name!r}, which is not a shipped one ({exc}); give its "
                                 f"file with --model (the identified model file, when the driver runs one)") from None
        bridge = Ros2Bridge(client, model, namespace=args.namespace, domain_id=domain, rate_hz=args.rate,
                            controller=args.controller).start()
    except BaseException:
        client.close()
        raise
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    print(f"armid ros2: domain {domain}, namespace '{bridge.namespace or '/'}', joint_states at "
          f"{args.rate:g} Hz (every {bridge.decimate}. sample), action "
          f"{bridge.name(bridge.controller + '/follow_joint_trajectory')}; Ctrl-C stops", flush=True)
    try:
        while not stop.wait(0.5):
            if bridge.errors:
                print(f"armid ros2: stopped: {bridge.errors[0]}", file=sys.stderr)
                return 1
    finally:
        bridge.stop()
        print(f"armid ros2: {bridge.published} joint states published", file=sys.stderr)
    return 0
