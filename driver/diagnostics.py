"""The driver's health message (docs/reference/stream.md) as diagnostics: a list of statuses in the shape of ROS's
diagnostic_msgs/DiagnosticStatus, each with a level, a name, a message, a hardware id and key-value pairs.

One status for the cycle (ERROR on a fault, WARN when the drives deliver fewer samples than the cycle runs), one
per drive (its CiA 402 state: ERROR in a fault state), and one each for the link, the command server, the
real-time settings, servo and the recording when the health message has them (WARN when a counter of bad,
refused or malformed input has counted something, ERROR when the recording failed or the link is down). Every
field of the health message is kept as a key-value pair of one of the statuses (nested fields as dotted keys; the
drives' states in their own statuses), so nothing the JSON had is lost. A JSON object of unexpected shape gives
fewer statuses, never an exception.
"""
from __future__ import annotations

import json

OK, WARN, ERROR, STALE = 0, 1, 2, 3
LEVEL_NAMES = ("OK", "WARN", "ERROR", "STALE")
MISSING_SAMPLES_RATIO = 0.95     # fewer fresh samples than this fraction of the cycles: WARN
TROUBLE_WORDS = ("bad", "malformed", "refused", "rejected", "error", "timeout", "crc", "dropped")


def _text(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return value
    return json.dumps(value, default=str)


def flatten(value, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, text) pairs of a JSON value; lists of scalars stay one value."""
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            out += flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [(prefix, _text(value))]


SETTING_SUFFIXES = ("_cycles", "_s", "_ms", "_us", "_hz")   # durations and settings, not counters


def _troubled(value, prefix: str = "") -> list[str]:
    """Dotted keys of the counters of bad input that counted something: a key naming trouble (TROUBLE_WORDS)
    whose value is a positive count, a non-empty list or a text (a last error); settings such as
    timeout_cycles are not counters."""
    if isinstance(value, dict):
        return [k for key, item in value.items() for k in _troubled(item, f"{prefix}.{key}" if prefix else str(key))]
    leaf = prefix.rsplit(".", 1)[-1].lower()
    if not any(word in leaf for word in TROUBLE_WORDS) or leaf.endswith(SETTING_SUFFIXES):
        return []
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [prefix] if value > 0 else []
    return [prefix] if len(value) else []      # a text or a list


def _section(name: str, body, hardware_id: str = "driver") -> dict:
    bad = _troubled(body)
    level, message = (WARN, "counted: " + ", ".join(bad)) if bad else (OK, "ok")
    if isinstance(body, dict) and body.get("connected") is False:
        level, message = ERROR, f"down: {body.get('down_reason') or 'not connected'}"
    return {"level": level, "name": f"armid: {name}", "message": message, "hardware_id": hardware_id,
            "values": flatten(body)}


def statuses(health: dict, joint_names: list[str]) -> list[dict]:
    """The diagnostics of one health message. joint_names name the drives (health lists their states in order)."""
    if not isinstance(health, dict):
        raise TypeError(f"health: expected a JSON object, got {type(health).__name__}")
    fault = health.get("fault")
    cycle_keys = ("time", "uptime_s", "cycle_rate_hz", "sample_rate_hz", "cycles", "fresh_samples", "stale_cycles",
                  "overruns", "caught_up", "lateness", "samples_lost", "effort_delay_s", "enabled", "moving", "fault")
    cycle = {k: health[k] for k in cycle_keys if k in health}
    events = health.get("events")
    pairs = flatten(cycle) + [(f"event.{k}", _text(e.get("text") if isinstance(e, dict) else e))
                              for k, e in enumerate(events if isinstance(events, list) else [])]
    rate, samples = health.get("cycle_rate_hz"), health.get("sample_rate_hz")
    if fault:
        level, message = ERROR, f"fault: {fault}"
    elif isinstance(rate, (int, float)) and isinstance(samples, (int, float)) and rate > 0 \
            and samples < MISSING_SAMPLES_RATIO * rate:
        level, message = WARN, f"{samples:.0f} fresh samples/s at {rate:.0f} cycles/s"
    else:
        level = OK
        message = "enabled" if health.get("enabled") else "disabled"
        if health.get("moving"):
            message += ", moving"
    out = [{"level": level, "name": "armid: cycle", "message": message, "hardware_id": "driver", "values": pairs}]
    drive_states = health.get("drive_states")
    for j, state in enumerate(drive_states if isinstance(drive_states, list) else []):
        name = joint_names[j] if j < len(joint_names) else f"j{j + 1}"
        state = str(state)
        level = ERROR if "FAULT" in state.upper() else WARN if state.upper() == "UNKNOWN" else OK
        out.append({"level": level, "name": f"armid: drive {name}", "message": state, "hardware_id": name,
                    "values": [("state", state)]})
    for key in ("link", "commands", "realtime", "servo"):
        if health.get(key) is not None:
            out.append(_section(key, health[key]))
    recording = health.get("recording")
    if recording is not None:
        section = _section("recording", recording)
        if isinstance(recording, dict) and recording.get("error"):
            section["level"], section["message"] = ERROR, str(recording["error"])
        out.append(section)
    return out
