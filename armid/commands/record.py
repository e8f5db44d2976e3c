"""`armid record`: record the driver's state stream to MCAP, and convert recordings for identification.

    armid record --state ENDPOINT [--commands ENDPOINT] -o run.mcap [--duration S]
    armid record convert run.mcap -o run.csv|run.npz [--torque|--current]
    armid record info run.mcap

docs/reference/recording.md describes the topics, the timestamps, the crash guarantee and the conversion.
"""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("record", help="record the driver's state stream to MCAP (Foxglove, PlotJuggler); "
                                      "convert recordings to CSV/NPZ for identification",
                       description="Record the driver's state stream into an MCAP file until Ctrl-C, SIGTERM or "
                                   "--duration. Subcommands: convert, info.")
    p.add_argument("--state", metavar="ENDPOINT", help="the driver's state endpoint (PUB), e.g. tcp://127.0.0.1:5555")
    p.add_argument("--commands", metavar="ENDPOINT", help="the driver's command endpoint: joint names, model and rate from its status")
    p.add_argument("-o", "--output", metavar="FILE.mcap", help="the MCAP file to write (run.mcap)")
    p.add_argument("--duration", type=float, metavar="S", help="stop after this many seconds (default: until Ctrl-C/SIGTERM)")
    p.add_argument("--rate", type=float, default=None, metavar="HZ",
                   help="the stream's nominal rate in Hz, which sizes the chunks (default: the driver's status, else 1000)")
    p.add_argument("--chunk-seconds", type=float, default=0.25, metavar="S",
                   help="seconds of data per MCAP chunk, at most what a killed recorder loses (default 0.25)")
    p.add_argument("--progress-interval", type=float, default=2.0, metavar="S", help="seconds between progress lines on stderr")
    p.add_argument("--model", metavar="MODEL",
                   help="the arm's model (a file or a shipped name), for /robot_description and /tf in the recording "
                        "(default: the model the driver's status names, when it is a shipped one)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(run=_record, action=None)
    actions = p.add_subparsers(dest="action", required=False, metavar="{convert,info}")
    convert = actions.add_parser("convert", help="convert a recording to the CSV/NPZ layout that identify reads")
    convert.add_argument("recording", help="an MCAP file of armid record (complete, or cut short by a kill)")
    convert.add_argument("-o", "--output", required=True, metavar="FILE", help="run.csv or run.npz")
    effort = convert.add_mutually_exclusive_group()
    effort.add_argument("--torque", dest="effort", action="store_const", const="torque",
                        help="joint torques tau1..taun in N m (default)")
    effort.add_argument("--current", dest="effort", action="store_const", const="current",
                        help="motor currents i1..in in A")
    convert.set_defaults(run=_convert, effort="torque")
    info = actions.add_parser("info", help="what a recording holds: samples, seq gaps, flags, whether it is complete")
    info.add_argument("recording", help="an MCAP file of armid record")
    info.set_defaults(run=_info)


def _record(args: argparse.Namespace) -> int:
    import logging
    import signal
    import sys
    import threading

    from driver.recorder import RecorderError, check_output, check_sizing, query_status, record

    if not args.state or not args.output:
        raise RecorderError("record: give --state ENDPOINT and -o FILE.mcap (or a subcommand: convert, info)")
    check_output(args.output, overwrite=args.force)
    check_sizing(args.rate or 1000.0, args.chunk_seconds)
    for name in ("duration", "rate", "chunk_seconds", "progress_interval"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            raise RecorderError(f"record: --{name.replace('_', '-')} must be a positive number, got {value}")
    joint_names, rate, meta = None, args.rate, {}
    if args.commands:
        status = query_status(args.commands)
        joint_names = status["joints"]
        rate = rate or float(status.get("rate_hz") or 1000.0)
        meta = {"model": str(status.get("model", "")), "commands_endpoint": args.commands,
                "effort_delay_s": repr(float(status.get("effort_delay_s") or 0.0))}

    def say(text: str) -> None:
        print(f"armid record: {text}", file=sys.stderr, flush=True)

    model = _model(args.model, meta.get("model"), joint_names, say)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    say(f"recording {args.state} into {args.output}" + (f" for {args.duration:g} s" if args.duration else
                                                         " until Ctrl-C or SIGTERM"))
    stats = record(args.output, args.state, joint_names=joint_names, rate_hz=rate or 1000.0,
                   chunk_seconds=args.chunk_seconds, stop=stop, duration_s=args.duration,
                   progress=lambda s: say(s.line()), progress_interval_s=args.progress_interval,
                   log=logging.getLogger(__name__).warning,
                   metadata=meta, overwrite=args.force, model=model)
    for reason, count in stats.reasons.items():
        say(f"skipped {count} x {reason}")
    if stats.messages == 0:
        raise RecorderError(f"no state message received from {args.state} (is the driver running there?); "
                            f"{args.output} holds an empty recording")
    say(f"done: {stats.messages} state messages, {stats.dropped} dropped in {stats.gaps} seq gaps, "
        f"{stats.malformed} malformed skipped; {args.output} is complete")
    return 0


def _model(given: str | None, named: str | None, joint_names: list[str] | None, say):
    """The model for /robot_description and /tf: --model, else the driver's if it is a shipped model; None (and
    say so) when there is none. A model whose joints differ from the driver's is refused."""
    from ident.model import load_model, shipped_models

    if given is None and named not in shipped_models():
        say("no model (--model): the recording has no /robot_description and no /tf")
        return None
    model = load_model(given or named)
    say(f"/robot_description and /tf from the model {model.source}" + ("" if given else
        " (the shipped model the driver's status names; give --model if the driver runs an edited copy)"))
    if joint_names is not None and list(model.joint_names) != list(joint_names):
        from driver.recorder import RecorderError

        raise RecorderError(f"--model {given or named}: joints {', '.join(model.joint_names)} are not the driver's "
                            f"({', '.join(joint_names)})")
    return model


def _convert(args: argparse.Namespace) -> int:
    import sys

    from firmware_bridge.recording import convert

    arrays, notes = convert(args.recording, args.output, args.effort)
    for note in notes:
        print(f"armid record convert: {args.recording}: {note}", file=sys.stderr)
    t = arrays["t"]
    print(f"{args.output}: {len(t)} samples of {arrays['q'].shape[1]} joints over {t[-1]:.3f} s "
          f"({args.effort}), from {args.recording}")
    return 0


def _info(args: argparse.Namespace) -> int:
    import numpy as np

    from firmware_bridge import stream
    from firmware_bridge.recording import read_recording

    log = read_recording(args.recording)
    s = log.states
    missing, gaps = log.seq_gaps()
    span = (s["device_time_ns"][-1] - s["device_time_ns"][0]) * 1e-9
    print(f"{log.path}: {'complete' if log.complete else 'cut short (no footer)'}; {len(s)} state messages of "
          f"{log.n} joints ({', '.join(log.joint_names)}), seq {s['seq'][0]}..{s['seq'][-1]}, {span:.3f} s of device time")
    print(f"  {missing} messages missing in {gaps} seq gaps; {log.skipped} malformed skipped")
    for name in ("ENABLED", "MOVING", "FAULT", "STALE", "PAYLOAD"):
        bit = getattr(stream, f"FLAG_{name}")
        print(f"  {name:8s} {int(np.count_nonzero(s['flags'] & bit)):8d} samples")
    if log.cut_note:
        print(f"  {log.cut_note}")
    for name, values in log.metadata.items():
        print(f"  metadata {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return 0
