"""The driver's health message (docs/reference/stream.md) as diagnostics: a list of statuses in the shape of ROS's
diagnostic_msgs/DiagnosticStatus, each with a level, a name, a message, a hardware id and key-value pairs.

One status for the cycle (ERROR on a fault, WARN when the drives deliver fewer samples than the cycle runs), one
per drive (its CiA 402 state: ERROR in a fault state), and one each for the link, the command server, the
real-time settings, servo and the recording when the health message has them (WARN when a counter of bad,
refused or malformed input has counted something, ERROR when the recording failed). Every field of the health
message is kept as a key-value pair (nested fields as dotted keys), so nothing the JSON had is lost.
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


def _troubled(pairs: list[tuple[str, str]]) -> list[str]:
    """Keys of counters of bad input that counted something."""
    out = []
    for key, text in pairs:
        leaf = key.rsplit(".", 1)[-1].lower()
        if any(word in leaf for word in TROUBLE_WORDS):
            try:
                if float(text) > 0:
                    out.append(key)
            except ValueError:
                if text not in ("null", "", "None"):
                    out.append(key)
    return out


def _section(name: str, body, hardware_id: str = "driver") -> dict:
    pairs = flatten(body)
    bad = _troubled(pairs)
    return {"level": WARN if bad else OK, "name": f"armid: {name}",
            "message": ("counted: " + ", ".join(bad)) if bad else "ok", "hardware_id": hardware_id, "values": pairs}


def statuses(health: dict, joint_names: list[str]) -> list[dict]:
    """The diagnostics of one health message. joint_names name the drives (health lists their states in order)."""
    if not isinstance(health, dict):
        raise TypeError(f"health: expected a JSON object, got {type(health).__name__}")
    fault = health.get("fault")
    cycle_keys = ("uptime_s", "cycle_rate_hz", "sample_rate_hz", "cycles", "fresh_samples", "stale_cycles",
                  "overruns", "caught_up", "lateness", "samples_lost", "effort_delay_s", "enabled", "moving", "fault")
    cycle = {k: health[k] for k in cycle_keys if k in health}
    pairs = flatten(cycle) + [(f"event.{k}", _text(e.get("text") if isinstance(e, dict) else e))
                              for k, e in enumerate(health.get("events") or [])]
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
    for j, state in enumerate(health.get("drive_states") or []):
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
