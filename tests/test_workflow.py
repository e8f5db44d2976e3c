"""The README's commissioning workflow, run line by line as a user would, on the free-running simulated arm.

The commands are read from the README itself (its "Commissioning workflow" block, up to the identification),
each run with `python -m armid.cli` in a fresh working directory; `armid sim`, `armid driver` and `armid record`
run in the background as the README says (each in its own terminal). What the README asks the user to do by
hand is done here the same way: deploy/driver-serial.toml copied to driver.toml, its port set to the one the
simulator printed and effort_delay_ms to the value the simulator printed. Three things differ, for the test
machine's sake only: the stream and command endpoints are free ports instead of 5555/5556 (another run may
hold those), the watchdogs are 2 s as in the demo's chain (the machine is shared with the rest of the suite,
and the deploy file's 50 and 100 ms are for an arm's own controller PC), and the excitation design gets
fewer optimiser iterations (--max-iter) to keep the suite short.
The end is checked as the end-to-end tests check a recording: every well-identified base parameter within the
family-wise bound of the simulator's truth (tests/test_e2e.py's criterion: one failure in a thousand runs whose
sigmas are honest).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ident.model.base_params import base_parameters
from ident.model import load_model
from ident.outputs.fleet_drift import family_wise_sigma
from test_e2e import FALSE_FAILURE, z_scores

ROOT = Path(__file__).resolve().parents[1]
DESIGN_ITERATIONS = "15"
STEP_TIMEOUT_S = 600.0


def workflow_lines() -> list[str]:
    """The README's workflow commands up to the identification (comments and trailing comments dropped)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Commissioning workflow", 1)[1].split("\nEvery command prints", 1)[0]
    lines = []
    for raw in block.splitlines():
        if not raw.startswith("    "):
            continue
        line = shlex.join(shlex.split(raw, comments=True))
        if not line:
            continue
        lines.append(line)
        if line.startswith("armid identify"):
            break
    return lines


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class User:
    """A shell in a working directory: runs armid commands to the end or in the background (stopped after)."""

    def __init__(self, cwd: Path, ports: dict[str, str]):
        self.cwd, self.ports, self.background = cwd, ports, []
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def argv(self, line: str) -> list[str]:
        for old, new in self.ports.items():
            line = line.replace(old, new)
        words = shlex.split(line)
        assert words[0] == "armid", line
        if words[1:3] == ["excite", "design"]:
            words += ["--max-iter", DESIGN_ITERATIONS]
        if words[1] == "command" and "--commands" not in words:         # its default is the README's 5556
            words += ["--commands", self.ports["tcp://127.0.0.1:5556"]]
        return [sys.executable, "-m", "armid.cli", *words[1:]]

    def run(self, line: str) -> str:
        done = subprocess.run(self.argv(line), cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=STEP_TIMEOUT_S)
        assert done.returncode == 0, f"{line}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout + done.stderr

    def start(self, line: str, name: str) -> subprocess.Popen:
        out = open(self.cwd / f"{name}.log", "w")
        proc = subprocess.Popen(self.argv(line), cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        self.background.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.cwd / f"{name}.log").read_text(errors="replace")

    def wait_log(self, name: str, pattern: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log(name))
            if found:
                return found
            assert proc.poll() is None, f"{name} exited {proc.returncode}: {self.log(name)[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"{name}: no {pattern!r} within {timeout_s:g} s: {self.log(name)[-3000:]}")

    def stop_all(self) -> None:
        for proc in reversed(self.background):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in reversed(self.background):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_the_readme_lists_the_workflow_this_test_runs():
    lines = workflow_lines()
    heads = [" ".join(shlex.split(x)[:2]) for x in lines]
    assert heads == ["armid model", "mkdir trajectories", "armid excite", "armid excite", "armid sim", "cp deploy/driver-serial.toml",
                     "armid driver", "armid record", "armid command", "armid command", "armid identify"]


def test_the_readme_commissioning_workflow_runs_as_written_on_the_free_running_simulator(tmp_path):
    lines = workflow_lines()
    ports = {"tcp://127.0.0.1:5555": f"tcp://127.0.0.1:{_free_port()}",
             "tcp://127.0.0.1:5556": f"tcp://127.0.0.1:{_free_port()}"}
    user = User(tmp_path, ports)
    try:
        for line in lines:
            if line.startswith("mkdir "):
                (tmp_path / line.split()[1]).mkdir()
            elif line.startswith("cp deploy/driver-serial.toml"):
                sim_said = user.log("sim")
                port = re.search(r"serial ready: port=(\S+)", sim_said).group(1)
                delay = re.search(r"effort_delay_ms = ([0-9.]+)", sim_said).group(1)
                text = (ROOT / "deploy" / "driver-serial.toml").read_text()
                text = re.sub(r'(?m)^port = "[^"]*"', f'port = "{port}"', text)
                text = re.sub(r"(?m)^# effort_delay_ms = [0-9.]+", f"effort_delay_ms = {delay}", text)
                text = re.sub(r"(?m)^watchdog_ms = \d+", "watchdog_ms = 2000", text)
                text = re.sub(r"(?m)^device_watchdog_ms = \d+", "device_watchdog_ms = 2000", text)
                for old, new in ports.items():
                    text = text.replace(old, new)
                (tmp_path / "driver.toml").write_text(text)
            elif line.startswith("armid sim"):
                proc = user.start(line, "sim")
                user.wait_log("sim", r"effort_delay_ms = [0-9.]+", proc)
            elif line.startswith("armid driver"):
                proc = user.start(line, "driver")
                user.run(f"armid command status --commands {ports['tcp://127.0.0.1:5556']} --timeout 120")
                assert proc.poll() is None, user.log("driver")
            elif line.startswith("armid record"):
                proc = user.start(line, "record")
                user.wait_log("record", r"record", proc, 60)
            else:
                printed = user.run(line)
                if line.startswith("armid command run_trajectory"):
                    time.sleep(0.5)                     # the last samples reach the recorder
                    user.background[-1].send_signal(signal.SIGINT)       # the README's Ctrl-C
                    user.background[-1].wait(30)
                    assert user.background[-1].returncode == 0, user.log("record")
                if line.startswith("armid identify"):
                    assert "result: " in printed
    finally:
        user.stop_all()
    model = load_model("generic6")
    truth = base_parameters(model).from_standard(model.standard_parameters())
    z, meaningful = z_scores(json.loads((tmp_path / "out" / "result.json").read_text()), truth)
    outside = np.abs(z[meaningful])
    assert meaningful.sum() >= 10
    bound = family_wise_sigma(FALSE_FAILURE, int(meaningful.sum()))
    assert outside.max() <= bound, f"max |z| {outside.max():.1f} of {meaningful.sum()} (bound {bound:.2f})"
    assert "setpoint buffer" in user.log("sim")            # the simulator ran free, and said what its buffer did
