"""The `armid` command's logging set-up: the one place that configures handlers (library code only logs).

    armid --log-level DEBUG driver --config driver.toml --log-format json

Every module logs on `logging.getLogger(__name__)` (driver.cycle, sim.serial_device, ...). `configure()`
sends all of it, python-can's logger ("can"), canopen's and pymodbus's included, to stderr through one
handler:

- level: `--log-level` (DEBUG, INFO, WARNING, ERROR, CRITICAL), else the environment's ARMID_LOG_LEVEL, else
  INFO. Unless it is DEBUG, python-can's, canopen's and Dask's (distributed) loggers pass WARNING and above
  only, and pymodbus's only CRITICAL (it logs every lost response at ERROR; the gateway transport counts them
  and logs them rate-limited). The floor holds even for a library that sets its own loggers' levels when it is
  imported (distributed does): the handler filters by logger name.
- format: `--log-format text` (one line: time, level, logger, message) or `json` (one JSON object per line:
  time, level, logger, message, PRIORITY and the record's extra fields such as joint or error_code). By
  default json when stderr is not a terminal and JOURNAL_STREAM is set (a systemd service), else text.
- journald: when stderr is the journal's stream (JOURNAL_STREAM names its device and inode) each line
  starts with the syslog priority, `<3>` for an error (sd-daemon(3)); journald strips it and files the
  entry at that priority, so `journalctl -p warning` filters. The JSON's PRIORITY field carries the same number.

Records go through a queue to a listener thread that writes them, so that a thread that logs (the 1 kHz
cycle included) never waits for stderr.
"""
from __future__ import annotations

import argparse
import atexit
import logging
import logging.handlers
import os
import queue
import sys
from datetime import datetime, timezone

from firmware_bridge.runtime.errors import InputError

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
ENV_LEVEL = "ARMID_LOG_LEVEL"
# third-party loggers' lowest level unless --log-level DEBUG: python-can's and canopen's warnings pass;
# pymodbus logs each lost response at ERROR, which driver.transports.gateway counts and logs rate-limited;
# Dask's distributed logs a cluster's start and stop at INFO (dozens of lines through a progress bar)
THIRD_PARTY = {"can": logging.WARNING, "canopen": logging.WARNING, "pymodbus": logging.CRITICAL,
               "distributed": logging.WARNING}
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_listener: logging.handlers.QueueListener | None = None
_handler: logging.Handler | None = None
_levels_before: dict[str, int] = {}       # the levels configure() changed, for shutdown() to restore


def syslog_priority(levelno: int) -> int:
    """The syslog priority (journald's PRIORITY) of a logging level.

    Parameters
    ----------
    levelno : int
        A `logging` level number.

    Returns
    -------
    int
        2 critical, 3 error, 4 warning, 6 info, 7 debug.
    """
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def add_arguments(parser: argparse.ArgumentParser, defaults: bool = True) -> None:
    """Add --log-level and --log-format to a parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The main parser, or a subcommand's.
    defaults : bool
        False for a subcommand's parser: an option left out there does not overwrite what the main parser
        read.
    """
    keep = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument("--log-level", type=str.upper, choices=LEVELS, metavar="LEVEL", **keep,
                        help=f"the lowest level logged: {', '.join(LEVELS)} (default: ${ENV_LEVEL}, else INFO)")
    parser.add_argument("--log-format", choices=FORMATS, **keep,
                        help="text lines, or one JSON object per line (default: json under systemd, i.e. "
                             "when stderr is not a terminal and JOURNAL_STREAM is set; text otherwise)")


def resolve_level(option: str | None, environ: dict | None = None) -> int:
    """The level to log at.

    Parameters
    ----------
    option : str or None
        --log-level's value (one of LEVELS), or None when it was not given.
    environ : dict, optional
        The environment to read ARMID_LOG_LEVEL from (default os.environ).

    Returns
    -------
    int
        The option's level, else ARMID_LOG_LEVEL's, else logging.INFO.

    Raises
    ------
    InputError
        ARMID_LOG_LEVEL names no level.
    """
    env = os.environ if environ is None else environ
    name = option or env.get(ENV_LEVEL, "").strip().upper() or "INFO"
    if name not in LEVELS:
        raise InputError(f"{ENV_LEVEL}={env.get(ENV_LEVEL)!r}: expected one of {', '.join(LEVELS)}")
    return getattr(logging, name)


def under_journald(stream, environ: dict | None = None) -> bool:
    """Whether `stream` is the journal's stream connection.

    Parameters
    ----------
    stream : file object
        Where the log lines go.
    environ : dict, optional
        The environment (default os.environ); JOURNAL_STREAM holds "device:inode" of the journal's stream.

    Returns
    -------
    bool
        True when the stream's file descriptor is that device and inode.
    """
    env = os.environ if environ is None else environ
    dev, sep, ino = env.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(stream.fileno())
        return bool(sep) and (st.st_dev, st.st_ino) == (int(dev), int(ino))
    except (OSError, ValueError, AttributeError):   # no file descriptor (a test's StringIO), a bad variable
        return False


def resolve_format(option: str | None, stream, environ: dict | None = None) -> str:
    """The format of the log lines.

    Parameters
    ----------
    option : str or None
        --log-format's value ("text" or "json"), or None when it was not given.
    stream : file object
        Where the log lines go.
    environ : dict, optional
        The environment (default os.environ).

    Returns
    -------
    str
        The option, else "json" when `stream` is no terminal and JOURNAL_STREAM is set, else "text".
    """
    if option:
        return option
    env = os.environ if environ is None else environ
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return "json" if env.get("JOURNAL_STREAM") and not tty else "text"


def _json_formatter() -> logging.Formatter:
    """python-json-logger's formatter (imported only for JSON output): time (ISO 8601, UTC), level, logger,
    message, the record's extra fields, PRIORITY."""
    from pythonjsonlogger.json import JsonFormatter

    class Json(JsonFormatter):
        def add_fields(self, log_data, record, message_dict):
            log_data["time"] = datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(
                timespec="milliseconds")
            super().add_fields(log_data, record, message_dict)
            log_data["PRIORITY"] = syslog_priority(record.levelno)

    return Json("{levelname}{name}{message}", style="{", rename_fields={"levelname": "level", "name": "logger"})


class _Text(logging.Formatter):
    def __init__(self):
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record, datefmt=None):   # noqa: N802 - logging's name
        return datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")


class _ThirdPartyFloor(logging.Filter):
    """Drops a third-party logger's records below its THIRD_PARTY floor, whatever level the library gave its
    loggers itself (distributed sets "distributed" to INFO when it is imported)."""

    def filter(self, record):
        name = record.name
        for prefix, floor in THIRD_PARTY.items():
            if (name == prefix or name.startswith(prefix + ".")) and record.levelno < floor:
                return False
        return True


class _Prefixed(logging.Formatter):
    """Each line of another formatter's output prefixed with the record's syslog priority (journald)."""

    def __init__(self, inner: logging.Formatter):
        super().__init__()
        self.inner = inner

    def format(self, record):
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in self.inner.format(record).split("\n"))


def configure(level: str | None = None, fmt: str | None = None, stream=None,
              environ: dict | None = None) -> tuple[int, str]:
    """Send every logger's records to one stream (module docstring). Calling it again replaces the previous
    set-up; shutdown() undoes it.

    Parameters
    ----------
    level : str or None
        The lowest level written (LEVELS); None: ARMID_LOG_LEVEL, else INFO.
    fmt : str or None
        "text" or "json"; None: json under systemd (resolve_format), else text.
    stream : file object, optional
        Where the lines go (default sys.stderr).
    environ : dict, optional
        The environment (default os.environ).

    Returns
    -------
    tuple of (int, str)
        The level and the format chosen.

    Raises
    ------
    InputError
        ARMID_LOG_LEVEL names no level.
    """
    stream = sys.stderr if stream is None else stream
    levelno = resolve_level(level, environ)
    fmt = resolve_format(fmt, stream, environ)
    formatter = _json_formatter() if fmt == "json" else _Text()
    if under_journald(stream, environ):
        formatter = _Prefixed(formatter)
    shutdown()
    out = logging.StreamHandler(stream)
    out.setFormatter(formatter)
    global _listener, _handler, _levels_before
    _levels_before = {name: logging.getLogger(name or None).level for name in ("", *THIRD_PARTY)}
    records: queue.SimpleQueue = queue.SimpleQueue()
    _listener = logging.handlers.QueueListener(records, out)
    _handler = logging.handlers.QueueHandler(records)
    if levelno > logging.DEBUG:
        _handler.addFilter(_ThirdPartyFloor())
    root = logging.getLogger()
    root.addHandler(_handler)
    root.setLevel(levelno)
    for name, floor in THIRD_PARTY.items():
        logging.getLogger(name).setLevel(levelno if levelno <= logging.DEBUG else max(levelno, floor))
    logging.captureWarnings(True)
    _listener.start()
    atexit.register(shutdown)
    return levelno, fmt


def shutdown() -> None:
    """Write what is queued, remove the handler configure() installed and give the loggers back their levels
    (nothing when it did not run)."""
    global _listener, _handler, _levels_before
    if _listener is not None:
        _listener.stop()         # writes every record queued so far
        _listener = None
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        _handler = None
        logging.captureWarnings(False)
    for name, level in _levels_before.items():
        logging.getLogger(name or None).setLevel(level)
    _levels_before = {}
