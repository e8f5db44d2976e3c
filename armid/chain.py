"""The hardware-in-the-loop chain as separate processes on loopback: `armid sim` behind a transport,
`armid driver` connected to it, `armid record` on the driver's stream, and the driver's command channel.

Used by `armid demo`, the end-to-end and soak tests and benchmarks/bench_driver.py, so that all of them
start, wire and stop the processes the same way. Every child is started with `python -P -m armid.cli` by the
interpreter running this one, importing armid from where this process imported it (child_environment: a
wheel, an editable install or a checkout), in the caller's working directory, and is given absolute paths
only; it writes its stdout and stderr to files in the run's work directory (read back
for the ready line and for the tail shown when a step fails), and dies with its parent
(PR_SET_PDEATHSIG on Linux), so that no child outlives the process that started it even if that one
is killed.

CAN crosses processes on python-can's `udp_multicast` interface, on a multicast group of this run's own.
Every transport's simulator is clocked by the host, one cycle per driver cycle (CAN: each SYNC; serial: each
COMMAND; the gateway: each Modbus exchange), so its cycle rate is the driver's.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq

from ident.errors import InputError

TRANSPORTS = ("serial", "can", "gateway")
COMPILE_LINES = ("armid: compil", "armid: still compiling")    # armid.jit's lines, relayed from the children


class ChainError(InputError):
    """A step of the chain failed: the message names the step, the cause and what to check."""


@dataclass(frozen=True)
class TransportPlan:
    """How the chain runs one transport: the driver's cycle rate (Hz), its watchdog (ms), the simulator's
    cycle rate (Hz), extra `armid sim` arguments and extra [transport] options of the driver, how many
    times slower than designed an excitation should run through it (slowdown, see docs/guides/demo.md), the
    driver's clock, and whether the simulator steps once per driver cycle (lockstep: its rate follows the
    driver's)."""

    name: str
    rate_hz: float
    watchdog_ms: float
    sim_rate_hz: float
    sim_args: tuple[str, ...] = ()
    driver_options: tuple[tuple[str, object], ...] = ()
    slowdown: float = 1.0
    clock: str = "auto"          # the driver's [driver] clock (docs/reference/driver-config.md)
    lockstep: bool = False


# Rates. The simulated drives run CSP from the targets they are sent (their loops at 1 kHz, a cubic through the
# targets between cycles), so a target that arrives a cycle late or early, or never, is a torque kick. So every
# simulator is clocked by the host, one cycle per driver cycle, and a late cycle delays the arm's time instead
# of holding or skipping its targets: serial, each COMMAND is one cycle (step_on_command); CAN, each SYNC (the drives' own protocol);
# gateway, each Modbus exchange (step_on_exchange: a real gateway's EtherCAT cycle follows the master's
# process data). The driver's own timer sets the pace (clock "host" on serial and the gateway; CAN's "auto"
# is host: the driver is the SYNC master). The rate is what each link carries one exchange per cycle of,
# measured in docs/guides/demo.md: serial 1 kHz; CAN 250 Hz (a real 1 Mbit/s bus carries six drives at 285 Hz at
# most, and python-can's udp_multicast between processes loses samples above it on this machine); the
# gateway 1 kHz (every command goes out once and in order and the driver's cycle runs the exchanges pipelined; a
# link that sent only the newest command turned a replaced command into a skipped target, a torque kick). The
# drives' loops run at 1 kHz whatever the cycle
# (docs/reference/simulator.md), so a slower cycle no longer leaves joint 3 in a limit cycle).
# Watchdogs of 2 s on both sides: the processes share the machine with other work, and the first command
# of a fresh process loads compiled kernels (numba's cache) while holding the GIL.
SERIAL_HZ, CAN_HZ, GATEWAY_HZ = 1000.0, 250.0, 1000.0
# CAN's handshake (one SYNC whose TPDOs must come back) is the simulator's first cycle: in a fresh checkout that
# compiles the drive and plant kernels (numba, tens of seconds on a loaded 2-core machine). With the driver's
# default 2 s the driver gave up, the chain killed the simulator mid-compile, nothing was cached, and every
# `armid demo --transport can` of a fresh checkout failed the same way.
CAN_BOOT_TIMEOUT_S = 60.0         # s, within start_driver's 90 s
PLANS = {
    "serial": TransportPlan("serial", SERIAL_HZ, 2000.0, SERIAL_HZ,
                            ("--option", "watchdog_s=2", "--option", "step_on_command=true"), (("device_watchdog_ms", 2000),),
                            1.0, clock="host", lockstep=True),
    "can": TransportPlan("can", CAN_HZ, 2000.0, CAN_HZ, (),
                         (("heartbeat_ms", 1000), ("sdo_timeout_s", 2.0), ("boot_timeout_s", CAN_BOOT_TIMEOUT_S)),
                         1.0, lockstep=True),
    "gateway": TransportPlan("gateway", GATEWAY_HZ, 2000.0, GATEWAY_HZ, ("--option", "step_on_exchange=true"),
                             (("watchdog_ms", 2000),), 1.0, clock="host", lockstep=True),
    "sim": TransportPlan("sim", 1000.0, 2000.0, 1000.0, (), (("realtime", True),), 1.0),
}


# Free-running: the simulated devices tick on their own clock, as hardware does, with a crystal that is not the
# host's (FREE_DRIFT_PPM, the upper end of a common +-100 ppm part) and an interrupt latency (FREE_JITTER_US); the
# driver takes the clock it takes on a real arm ("auto": serial follows the device's samples, the gateway's host
# timer runs the exchanges). CAN's drives are clocked by the master's SYNC in CANopen itself, so CAN runs the
# same either way.
# The gateway's host then has to send one target per device cycle on its own timer: a Modbus exchange takes
# 1.7-2 ms there and back here, so at 1 kHz the host's cycle fell behind the device's (1146 cycles of 22616
# without a target, each a hold and a kick: residuals 5-10x the lockstep chain's); at 250 Hz it keeps up.
FREE_GATEWAY_HZ = 250.0
FREE_DRIFT_PPM = 100.0
FREE_JITTER_US = 20.0
CLOCKINGS = ("lockstep", "free")
_FREE_CLOCK_ARGS = ("--clock-drift-ppm", f"{FREE_DRIFT_PPM:g}", "--clock-jitter-us", f"{FREE_JITTER_US:g}")
FREE_PLANS = {
    "serial": dataclasses.replace(PLANS["serial"], sim_args=("--option", "watchdog_s=2", *_FREE_CLOCK_ARGS),
                                  clock="auto", lockstep=False),
    "can": PLANS["can"],
    "gateway": dataclasses.replace(PLANS["gateway"], rate_hz=FREE_GATEWAY_HZ, sim_rate_hz=FREE_GATEWAY_HZ,
                                   sim_args=_FREE_CLOCK_ARGS, clock="host", lockstep=False),
}


def plan_for(transport: str, rate_hz: float | None = None, clocking: str = "lockstep") -> TransportPlan:
    """The TransportPlan of a transport (serial, can, gateway, or sim: the simulator inside the driver),
    optionally at another cycle rate (Hz), with the simulated devices in lockstep with the driver's cycles or
    free-running on their own clocks (clocking "free", see FREE_PLANS)."""
    if transport not in PLANS:
        raise InputError(f"--transport: unknown {transport!r} (available: {', '.join(TRANSPORTS)})")
    if clocking not in CLOCKINGS:
        raise InputError(f"--clocking: unknown {clocking!r} (available: {', '.join(CLOCKINGS)})")
    p = FREE_PLANS.get(transport, PLANS[transport]) if clocking == "free" else PLANS[transport]
    if rate_hz is None:
        return p
    if not (rate_hz > 0 and rate_hz <= 10000):
        raise InputError(f"rate: expected a cycle rate in (0, 10000] Hz, got {rate_hz}")
    free_sim = clocking == "free" and not p.lockstep
    return dataclasses.replace(p, rate_hz=float(rate_hz),
                               sim_rate_hz=float(rate_hz) if p.lockstep or free_sim else p.sim_rate_hz)


def sim_options(transport: str) -> list[str]:
    """Extra `armid sim` arguments: CAN on udp_multicast, on a multicast group derived from this process's
    id (two runs at once do not hear each other)."""
    if transport != "can":
        return []
    pid = os.getpid()
    return ["--option", "interface=udp_multicast", "--option", f"channel=239.74.{pid % 250}.{pid // 250 % 250 + 1}"]


def transport_options(transport: str, line: str) -> dict[str, object]:
    """The driver's [transport] options from the ready line `armid sim` prints
    (`armid sim: serial ready: port=/dev/pts/5 baudrate=3000000`)."""
    pairs = dict(re.findall(r"(\w+)=(\S+)", line))
    if not pairs:
        raise ChainError(f"armid sim --transport {transport} printed no address: {line!r}")
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in pairs.items()}


def driver_config(transport: str, options: dict[str, object], *, rate_hz: float, watchdog_ms: float,
                  state: str, commands: str, model: str = "generic6", clock: str = "auto",
                  effort_delay_ms: float = 0.0) -> str:
    """The text of a driver TOML file (docs/reference/driver-config.md) for these transport options and endpoints."""
    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(v) if isinstance(v, (int, float)) else json.dumps(str(v))

    lines = ["[driver]", f"model = {json.dumps(model)}", f"rate_hz = {rate_hz:g}", f"watchdog_ms = {watchdog_ms:g}",
             f"clock = {json.dumps(clock)}", f"effort_delay_ms = {effort_delay_ms!r}", "[transport]", f"name = {json.dumps(transport)}"]
    lines += [f"{k} = {value(v)}" for k, v in options.items()]
    lines += ["[zmq]", f"state = {json.dumps(state)}", f"commands = {json.dumps(commands)}"]
    # `armid sim`'s drives compensate friction themselves (sim.DriveConfig): the feed-forward leaves it to them
    lines += ["[model]", "feed_forward_friction = false"]
    return "\n".join(lines) + "\n"


# -- child processes ----------------------------------------------------------------------------------------
# SCHED_RR priority of each process when allowed (root or CAP_SYS_NICE); the recorder too, as it must keep up
# with 1 kHz (the driver's PUB queues 10 s for it, then drops). Else NICE when allowed, else the default.
# Equal priorities: the runs that completed on the loaded development machine used them. A pty's data
# still passes through a kernel worker at normal priority, so on a saturated machine the serial link
# stalls whatever the processes' priority (docs/guides/demo.md).
RT_PRIORITY = {"sim": 10, "driver": 10, "recorder": 10}
NICE = -10


def _child_setup(priority: int, better_nice: bool = True) -> None:
    """Runs in the child between fork and exec: die with the parent (PR_SET_PDEATHSIG), and run SCHED_RR at
    `priority` (0: no real-time) when allowed. The simulator and the driver are 1 kHz loops, and on a
    machine shared with other work (a test suite, other users) the default scheduler stalls them for tens
    of ms, long enough for the simulated drives' following-error monitors to trip (a deployed driver runs
    SCHED_FIFO too, deploy/RT.md). ARMID_CHAIN_RT=0 in the environment keeps the default scheduler."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.environ.get("ARMID_CHAIN_RT", "1") == "0" or not better_nice:
        return
    try:
        if priority > 0:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(priority))
            return
    except OSError:   # not permitted: try a better niceness
        pass
    try:
        os.nice(NICE)
    except OSError:   # not permitted either: the default priority
        pass


@dataclass
class Child:
    """One process of the chain: its name, the Popen and the files holding its stdout and stderr."""

    name: str
    proc: subprocess.Popen
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 6) -> str:
        """The last lines of its stderr (then stdout), for error messages."""
        for path in (self.stderr, self.stdout):
            try:
                text = path.read_text(errors="replace").strip()
            except OSError:
                continue
            if text:
                return " | ".join(text.splitlines()[-lines:])
        return "(no output)"

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, wait up to timeout_s, then SIGKILL; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def child_command() -> list[str]:
    """The command line that runs `armid` as a child: this interpreter, `-P` (the working directory is not put
    on sys.path, so a folder named armid there cannot stand in for the installed one) and `-m armid.cli`."""
    return [sys.executable, "-P", "-m", "armid.cli"]


def child_environment() -> dict[str, str]:
    """This process's environment with the folder this armid was imported from first on PYTHONPATH: the
    children run the same code as their parent, installed (a wheel, an editable install) or not."""
    import armid

    where = str(Path(armid.__file__).resolve().parents[1])
    rest = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": where + (os.pathsep + rest if rest else "")}


def start_child(name: str, args: list[str], workdir: Path, *, realtime: bool = True) -> Child:
    """Start `python -m armid.cli ARGS` in its own session (a Ctrl-C on the terminal reaches only the
    parent, which stops its children in order), output to WORKDIR/NAME.out and NAME.err; with realtime,
    at RT_PRIORITY[name] when allowed (see _child_setup)."""
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    out, err = workdir / f"{name}.out", workdir / f"{name}.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        env = child_environment()
        # the chain sets its children's policy itself (_child_setup: SCHED_RR for the whole process where
        # permitted): not the daemons' own SCHED_FIFO for their loop threads on top of it. With both, the serial
        # lockstep demo faulted (0x8611) in 3 of 6 runs at load 2-5, and in none of 3 with the chain's alone.
        env["ARMID_REALTIME"] = "0"
        proc = subprocess.Popen([*child_command(), *args], env=env, stdout=fo, stderr=fe,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=functools.partial(_child_setup, RT_PRIORITY.get(name, 0) if realtime else 0,
                                                             realtime))
    return Child(name, proc, out, err)


def run_tool(name: str, args: list[str], workdir: Path, step: str, *, timeout_s: float,
             echo_stderr: bool = True) -> str:
    """Run `python -m armid.cli ARGS` to its end as its own process (output in WORKDIR/NAME.out and .err,
    its stderr relayed as it comes when echo_stderr, e.g. a tool's progress) and return its stdout.
    ChainError naming the step, the exit status and the stderr tail if it fails or outlasts timeout_s;
    the process is stopped whatever happens (also on Ctrl-C)."""
    child = start_child(name, args, workdir, realtime=False)
    deadline = time.monotonic() + timeout_s
    try:
        with open(child.stderr, "rb") as err:
            while True:
                done = child.proc.poll() is not None
                if echo_stderr:
                    sys.stderr.write(err.read().decode(errors="replace"))    # what came since the last read
                    sys.stderr.flush()
                if done:
                    break
                if time.monotonic() > deadline:
                    raise ChainError(f"{step}: {name} did not finish within {timeout_s:g} s; its stderr ends: "
                                     f"{child.tail()}; check {child.stderr}")
                time.sleep(0.05)
    finally:
        child.stop(timeout_s=5.0)
    if child.proc.returncode != 0:
        raise ChainError(f"{step}: {name} exited with status {child.proc.returncode}; its stderr ends: "
                         f"{child.tail()}; check {child.stderr}")
    return child.stdout.read_text(errors="replace")


def wait_for(child: Child, ready, timeout_s: float, what: str, step: str, check: str, tick=None):
    """Poll ready() (a value or None) every 20 ms until it returns a value; ChainError naming the step if
    the child exits or timeout_s passes first. tick(), if given, is called on every poll."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = ready()
        if tick is not None:
            tick()
        if value is not None:
            return value
        if not child.alive():
            raise ChainError(f"{step}: {child.name} exited with status {child.proc.returncode} before {what}; "
                             f"its stderr ends: {child.tail()}; check {check}")
        if time.monotonic() > deadline:
            raise ChainError(f"{step}: no {what} within {timeout_s:g} s; {child.name} stderr ends: {child.tail()}; "
                             f"check {check}")
        time.sleep(0.02)


# -- the command channel ------------------------------------------------------------------------------------
def request(endpoint: str, timeout_s: float = 10.0, **req) -> dict:
    """Send one JSON command to the driver's REP socket and return the reply; ChainError if none comes
    within timeout_s (a fresh socket per request, so a lost reply never blocks the next one)."""
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(json.dumps(req).encode())
        if not sock.poll(int(timeout_s * 1000)):
            raise ChainError(f"driver command {req.get('cmd')!r}: no reply within {timeout_s:g} s from {endpoint}")
        return json.loads(sock.recv())
    finally:
        sock.close(0)


def command(endpoint: str, step: str, driver: Child | None = None, *, timeout_s: float = 10.0, **req) -> dict:
    """request() that must succeed: ChainError naming the step, the driver's error and its stderr tail."""
    reply = request(endpoint, timeout_s, **req)
    if not reply.get("ok"):
        tail = f"; driver stderr ends: {driver.tail()}" if driver is not None else ""
        raise ChainError(f"{step}: the driver refused {req.get('cmd')!r}: {reply.get('error')}{tail}")
    return reply


# -- the chain ----------------------------------------------------------------------------------------------
@dataclass
class Chain:
    """The processes of one run, in start order; `stop()` (also on leaving `with`) ends them in reverse
    order: the recorder finishes its file, the driver brings the drives to rest, then the simulator stops.

    workdir holds the logs and the driver's config. While a child starts, the lines it prints about numba
    compiling (a fresh install: armid.jit) are relayed to this process's stderr, prefixed with its name
    (relay_compiles=False: not). realtime: run the simulator and
    the driver SCHED_RR when allowed (False: the default scheduler, e.g. for benchmarks that compare
    against a reference at the default priority)."""

    workdir: Path
    plan: TransportPlan
    realtime: bool = True
    model: str = "generic6"          # the arm the simulator and the driver run: a shipped name or an absolute path
    children: list[Child] = field(default_factory=list)
    sim: Child | None = None
    driver: Child | None = None
    recorder: Child | None = None
    connection: dict[str, object] = field(default_factory=dict)

    relay_compiles: bool = True
    _relayed: dict = field(default_factory=dict)   # child name -> bytes of its stderr already scanned
    sockets: Path | None = None     # a short temporary folder for the ipc endpoints (paths are limited to ~100 bytes)

    @property
    def state(self) -> str:
        return f"ipc://{self._sockets()}/state"

    @property
    def commands(self) -> str:
        return f"ipc://{self._sockets()}/commands"

    def _sockets(self) -> Path:
        if self.sockets is None:
            self.sockets = Path(tempfile.mkdtemp(prefix="armid-chain-"))
        return self.sockets

    def __enter__(self) -> "Chain":
        self.workdir = Path(self.workdir).resolve()       # the children get absolute paths only
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start_sim(self, *, seed: int = 0, timeout_s: float = 90.0) -> dict[str, object]:
        """`armid sim --transport T` (real time); waits for its ready line and returns the connection
        (the driver's transport options)."""
        p = self.plan
        self.sim = self._start("sim", ["sim", "--transport", p.name, "--realtime", "--rate", f"{p.sim_rate_hz:g}",
                                       "--seed", str(seed), "--model", self.model, *sim_options(p.name), *p.sim_args])

        def ready():
            for line in self.sim.stdout.read_text(errors="replace").splitlines():
                if " ready: " in line:
                    return line
            return None

        line = wait_for(self.sim, ready, timeout_s, "its ready line", "start the simulator",
                        "`python -m armid.cli sim --transport " + p.name + "` by hand",
                        tick=lambda: self.relay_compiles_of(self.sim))
        self.connection = transport_options(p.name, line)
        return self.connection

    def start_driver(self, *, timeout_s: float = 90.0) -> dict:
        """`armid driver` on the simulator's connection (or the in-process sim), ipc endpoints in the
        workdir; waits until it answers `status` and returns that status."""
        from driver.recorder import RecorderError, query_status
        from sim.simulator import effort_delay

        p = self.plan
        options = {**self.connection, **dict(p.driver_options)}
        cfg = self.workdir / "driver.toml"
        cfg.write_text(driver_config(p.name, options, rate_hz=p.rate_hz, watchdog_ms=p.watchdog_ms,
                                     state=self.state, commands=self.commands, model=self.model, clock=p.clock,
                                     effort_delay_ms=1000.0 * effort_delay(p.sim_rate_hz)))
        self.driver = self._start("driver", ["driver", "--config", str(cfg)])

        def ready():
            try:
                return query_status(self.commands, timeout_s=0.5)
            except RecorderError:
                return None

        return wait_for(self.driver, ready, timeout_s, "answer to status", "start the driver",
                        f"the driver's stderr ({self.driver.stderr}) and its config {cfg}",
                        tick=lambda: (self.relay_compiles_of(self.driver), self.relay_compiles_of(self.sim)))

    def start_recorder(self, path: Path, *, timeout_s: float = 60.0) -> Child:
        """`armid record` of the state stream into path (MCAP); waits until it has written messages."""
        self.recorder = self._start("recorder", ["record", "--state", self.state, "--commands", self.commands,
                                                 "-o", str(Path(path).resolve()), "--force", "--progress-interval", "0.2"])

        def ready():
            counts = re.findall(r": (\d+) messages \(seq", self.recorder.stderr.read_text(errors="replace"))
            return True if counts and int(counts[-1]) > 0 else None

        wait_for(self.recorder, ready, timeout_s, "state messages recorded", "start the recorder",
                 f"the recorder's stderr ({self.recorder.stderr}) and the driver's ({self.driver and self.driver.stderr})")
        return self.recorder

    def recorded_seq(self) -> int | None:
        """The last seq the recorder reports having written (from its progress lines), or None."""
        found = re.findall(r"messages \(seq \d+\.\.(\d+)\)", self.recorder.stderr.read_text(errors="replace"))
        return int(found[-1]) if found else None

    def finish_recording(self, until_seq: int | None = None, timeout_s: float = 60.0) -> None:
        """Wait until the recorder has written the state message until_seq (it may lag behind the stream
        and would lose its backlog when stopped), then stop it (SIGTERM: it closes the file complete) and
        check it exited cleanly."""
        rec = self.recorder
        if rec is None:
            return
        if until_seq is not None:
            wait_for(rec, lambda: True if (self.recorded_seq() or -1) >= until_seq else None, timeout_s,
                     f"state message {until_seq} recorded", "stop the recorder",
                     f"the recorder's stderr ({rec.stderr}): it falls behind the stream")
        code = rec.stop(timeout_s)
        if code != 0:
            raise ChainError(f"stop the recorder: it exited with status {code}; its stderr ends: {rec.tail()}")

    def command(self, step: str, **req) -> dict:
        """One driver command that must succeed; when the driver refuses it, a child that has died (the
        likely cause) is named first."""
        try:
            return command(self.commands, step, self.driver, **req)
        except ChainError:
            self.check_alive(step, settle_s=0.2)
            raise

    def check_alive(self, step: str, settle_s: float = 0.0) -> None:
        """ChainError naming the first child that has exited (after settle_s, s), its status and its stderr
        tail."""
        time.sleep(settle_s)
        for child in self.children:
            if not child.alive():
                raise ChainError(f"{step}: the {child.name} process exited with status {child.proc.returncode}; "
                                 f"its stderr ends: {child.tail()}; check {child.stderr}")

    def stop(self) -> None:
        """Stop every child still running, newest first, and remove the ipc folder."""
        for child in reversed(self.children):
            child.stop()
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)
            self.sockets = None

    def relay_compiles_of(self, child: Child | None) -> None:
        """Copy the complete lines about numba compiling that child wrote to its stderr since the last call
        to this process's stderr."""
        if not self.relay_compiles or child is None:
            return
        try:
            with open(child.stderr, "rb") as f:
                f.seek(self._relayed.get(child.name, 0))
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self._relayed[child.name] = self._relayed.get(child.name, 0) + end
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith(COMPILE_LINES):
                print(f"      {child.name}: {line}", file=sys.stderr, flush=True)

    def _start(self, name: str, args: list[str]) -> Child:
        child = start_child(name, args, self.workdir, realtime=self.realtime)
        self.children.append(child)
        return child

    # -- motions --------------------------------------------------------------------------------------------
    def enable(self, *, timeout_s: float = 10.0) -> None:
        """`enable`, then wait until every drive is OPERATION ENABLED."""
        step = "enable the drives"
        self.await_status(lambda s: not set(s["drive_states"]) & {"UNKNOWN", "NOT READY TO SWITCH ON"}, timeout_s,
                          step, "state from the drives (the link delivers no samples)")
        self.command(step, cmd="enable")
        self.await_status(lambda s: s["enabled"], timeout_s, step, "the drives enabled")

    def run_motion(self, step: str, request_: dict, progress=None, *, margin_s: float = 20.0) -> tuple[int, int]:
        """Start a motion command (move_to, run_trajectory), wait until it ends, and return the seq range
        (first, last) of the state messages published while it ran. progress(fraction) is called as it
        goes. ChainError if the driver refuses it, faults, or the motion outlasts its duration + margin_s."""
        before = self.command(step, cmd="status")["seq"]
        reply = self.command(step, **request_)
        duration = float(reply["duration"])
        started = time.monotonic()
        status = self.await_status(lambda s: not s["moving"], duration + margin_s, step, "the end of the motion",
                                   tick=None if progress is None else
                                   lambda: progress(min(1.0, (time.monotonic() - started) / max(duration, 1e-9))))
        return int(before), int(status["seq"])

    def await_status(self, done, timeout_s: float, step: str, what: str, tick=None) -> dict:
        """Poll the driver's status every 0.1 s until done(status); ChainError on a fault, a dead driver or
        timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive(step)
            status = self.command(step, cmd="status")
            if status.get("fault"):
                self.check_alive(step, settle_s=0.2)       # a child that died caused it: name that one
                raise ChainError(f"{step}: the driver faulted: {status['fault']} (drive states "
                                 f"{', '.join(status['drive_states'])}); driver stderr ends: {self.driver.tail()}; "
                                 f"check the logs in {self.workdir}")
            if tick is not None:
                tick()
            if done(status):
                return status
            if time.monotonic() > deadline:
                raise ChainError(f"{step}: no {what} within {timeout_s:g} s (drive states "
                                 f"{', '.join(status['drive_states'])}); driver stderr ends: {self.driver.tail()}")
            time.sleep(0.1)


# -- process figures (soak test, benchmarks) ---------------------------------------------------------------
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (bytes), from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ChainError(f"/proc/{pid}/status: no VmRSS line")


def fd_count(pid: int) -> int:
    """Open file descriptors of a process (/proc/PID/fd), but those open on /proc itself: the driver's
    health reads /proc/self/status for a moment now and then, which is not a leak."""
    base = f"/proc/{pid}/fd"
    count = 0
    for fd in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{fd}")
        except OSError:                     # closed meanwhile
            continue
        count += not target.startswith("/proc/")
    return count


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (s), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


# -- from the recording to identification data ------------------------------------------------------------
@dataclass(frozen=True)
class StreamFigures:
    """What the recorded stream delivered: state messages, host seconds they span, messages per second,
    messages lost (seq gaps) and in how many gaps, STALE messages (no new device data) and fresh samples
    per second."""

    messages: int
    seconds: float
    rate_hz: float
    dropped: int
    gaps: int
    stale: int
    fresh_rate_hz: float

    def line(self) -> str:
        return (f"stream: {self.messages} state messages in {self.seconds:.1f} s = {self.rate_hz:.1f} msg/s, "
                f"{self.dropped} dropped ({self.gaps} seq gaps); {self.stale} stale (no new device data), "
                f"fresh samples {self.fresh_rate_hz:.1f}/s")


def stream_figures(log) -> StreamFigures:
    """StreamFigures of a firmware_bridge.recording.StateLog."""
    from firmware_bridge import stream

    s = log.states
    span = float(s["host_time_ns"][-1] - s["host_time_ns"][0]) * 1e-9 if len(s) > 1 else 0.0
    stale = int(np.count_nonzero(s["flags"] & stream.FLAG_STALE))
    dropped, gaps = log.seq_gaps()
    rate = (len(s) - 1) / span if span > 0 else 0.0
    return StreamFigures(len(s), span, rate, dropped, gaps, stale, rate * (len(s) - stale) / max(len(s), 1))


def motion_window(log, first_seq: int, last_seq: int):
    """The part of a StateLog published while one motion ran: seq in [first_seq, last_seq] with the
    MOVING flag. ChainError if there is none."""
    from firmware_bridge import stream

    s = log.states
    keep = (s["seq"] >= first_seq) & (s["seq"] <= last_seq) & ((s["flags"] & stream.FLAG_MOVING) != 0)
    if not keep.any():
        raise ChainError(f"{log.path}: no MOVING state message with seq in {first_seq}..{last_seq}")
    return dataclasses.replace(log, states=s[keep])
