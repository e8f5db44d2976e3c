"""The simulator's serial device side, through a real pseudo-terminal and pyserial: handshake, the CiA 402
state machine driven by COMMAND frames, a joint moved in CSP and followed in STATE frames (against the
simulator's own encoder counts), FAULT frames, injected frame faults counted exactly by the host's decoder,
host garbage counted by the device, the host watchdog, and a clean stop."""
from __future__ import annotations

import logging
import os
import select
import time
import tty
from collections import deque

import numpy as np
import pytest
import serial

from firmware_bridge import cia402
from firmware_bridge import serial_protocol as sp
from firmware_bridge.cia402 import Mode, State
from firmware_bridge.units import JointScaling
from firmware_bridge.runtime.errors import InputError
from sim import Simulator
from sim.serial_device import SerialDevice

TIMEOUT = 30.0   # s: the bound of every wait (never reached when things work)


class Host:
    """A minimal host on a pyserial port: decodes everything, keeps the last STATE and every other message."""

    def __init__(self, path: str):
        self.port = serial.Serial(path, baudrate=1_000_000, timeout=0.02)
        self.dec = sp.StreamDecoder()
        self.enc = sp.FrameEncoder()
        self.state: sp.State | None = None
        self.states = 0
        self.log: deque[sp.State] = deque(maxlen=20_000)
        self.others: list = []
        self.scaling: JointScaling | None = None

    def send(self, msg) -> None:
        self.port.write(self.enc.encode(msg))

    def pump(self, heartbeat: bool = True) -> int:
        """Read and decode what has arrived (waits up to the port timeout); returns the bytes read."""
        data = self.port.read(max(1, self.port.in_waiting))
        for m in self.dec.feed(data):
            if isinstance(m, sp.State):
                self.state, self.states = m, self.states + 1
                self.log.append(m)
            else:
                self.others.append(m)
        if heartbeat:
            self.send(sp.Heartbeat(time_us=time.monotonic_ns() // 1000))
        return len(data)

    def wait(self, what: str, pred, heartbeat: bool = True):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            self.pump(heartbeat)
            got = pred()
            if got:
                return got
        raise AssertionError(f"host: timed out waiting for {what}")

    def hello(self, watchdog_us: int = 0) -> sp.HelloAck:
        self.send(sp.Hello(watchdog_us=watchdog_us))
        ack = self.wait("HELLO_ACK", lambda: next((m for m in self.others if isinstance(m, sp.HelloAck)), None))
        self.others.remove(ack)
        self.scaling = JointScaling(ack.counts_per_rev * ack.gear_ratio / (2 * np.pi))
        return ack

    def states_are(self, state: State, joints=None) -> bool:
        s = self.state
        return s is not None and all(cia402.state_of(int(w)) is state
                                     for w in (s.statusword if joints is None else s.statusword[joints]))

    def command(self, controlword, mode, target_counts, torque=None) -> None:
        n = len(target_counts)
        self.send(sp.Command(controlword=np.broadcast_to(controlword, n), mode=np.broadcast_to(np.asarray(mode, int), n),
                             target_position=target_counts,
                             target_torque=np.zeros(n, int) if torque is None else torque))

    def enable_csp(self) -> np.ndarray:
        """Shutdown -> switch on -> enable operation in CSP, holding the current position; returns it (counts)."""
        self.wait("a STATE", lambda: self.state)
        hold = self.state.position.copy()
        for cw, state in ((cia402.CW_SHUTDOWN, State.READY_TO_SWITCH_ON), (cia402.CW_SWITCH_ON, State.SWITCHED_ON),
                          (cia402.CW_ENABLE_OPERATION, State.OPERATION_ENABLED)):
            self.command(cw, Mode.CSP, hold)
            self.wait(state.value, lambda: self.states_are(state))
        return hold

    def close(self) -> None:
        self.port.close()


@pytest.fixture
def rig(request):
    """A fast-mode simulator with a serial device on a pty, and a host on its path."""
    opts = getattr(request, "param", {})
    dev = SerialDevice(watchdog_s=opts.get("watchdog_s", 5.0))
    sim = Simulator("generic6", transport=dev, realtime=opts.get("realtime", False), seed=1)
    history: dict[int, tuple] = {}

    def record(s):   # the simulator's own sample per cycle: the oracle for the STATE frames
        history[s.cycle] = (s.position_counts.copy(), s.statusword.copy(), np.rint(s.current * 1e6))
        if len(history) > 200_000:
            history.pop(next(iter(history)))

    sim.add_cycle_callback(record)
    sim.start()
    host = Host(dev.path)
    try:
        yield sim, dev, host, history
    finally:
        host.close()
        sim.stop()


def test_device_path_is_a_terminal_and_handshake_reports_the_arm(rig):
    sim, dev, host, _ = rig
    assert os.path.exists(dev.path) and dev.path.startswith("/dev/")
    assert dev.connection() == {"port": dev.path, "baudrate": 3_000_000}   # what `armid sim` prints
    ack = host.hello(watchdog_us=250_000)
    assert ack.counts_per_rev.tolist() == [2 ** 17] * sim.n
    assert ack.gear_ratio.tolist() == sim.model.gear_ratio.tolist()
    assert ack.cycle_period_us == 1000 and ack.watchdog_us == 250_000 and dev.watchdog_s == 0.25
    host.wait("a STATE", lambda: host.state)
    assert host.state.statusword.shape == (sim.n,)
    assert dev.counters.hellos == 1 and dev.rx_counters.dropped == 0


def test_host_enables_the_drives_moves_a_joint_in_csp_and_states_match_the_simulator(rig):
    sim, dev, host, history = rig
    host.hello()
    hold = host.enable_csp()
    assert all(m == int(Mode.CSP) for m in host.state.mode_display)
    j, step = 1, 0.03
    target = hold.copy()
    target[j] += int(round(step * host.scaling.counts_per_rad[j]))
    host.command(cia402.CW_ENABLE_OPERATION, Mode.CSP, target)
    goal = target[j] / host.scaling.counts_per_rad[j]
    host.wait("joint 2 at its target", lambda: abs(host.state.position[j] / host.scaling.counts_per_rad[j] - goal) < 2e-4)
    # every STATE frame, through the enabling and the move, equals the simulator's own sample of its cycle
    checked = 0
    for st_ in host.log:
        if st_.cycle not in history:
            continue
        counts, statusword, current_ua = history[st_.cycle]
        assert st_.position.tolist() == counts.tolist()        # the plant's encoder count, not our conversion
        assert st_.statusword.tolist() == statusword.tolist()
        assert st_.current.tolist() == current_ua.astype(int).tolist()
        assert st_.timestamp_us == st_.cycle * 1000
        checked += 1
    assert checked > 20 and len({tuple(x.statusword) for x in host.log}) >= 4   # several drive states seen
    s = host.state
    others = [k for k in range(sim.n) if k != j]
    held = (s.position[others] - hold[others]) / host.scaling.counts_per_rad[others]
    assert np.abs(held).max() < 5e-4              # the other joints held (rad; they feel the coupling)
    assert host.dec.counters.dropped == 0 and dev.rx_counters.dropped == 0 and dev.counters.rejected == 0


def test_drive_fault_sends_a_fault_frame_naming_the_joint_and_code(rig):
    sim, dev, host, _ = rig
    host.hello()
    host.enable_csp()
    sim.faults.drive_fault(3, code=0x2310)
    fault = host.wait("FAULT", lambda: next((m for m in host.others if isinstance(m, sp.Fault)), None))
    assert (fault.joint, fault.error_code) == (3, 0x2310)
    assert cia402.state_of(fault.statusword) in (State.FAULT, State.FAULT_REACTION_ACTIVE)
    host.wait("joint 4 in FAULT", lambda: host.states_are(State.FAULT, [3]))
    assert host.state.error_code[3] == 0x2310
    assert sum(isinstance(m, sp.Fault) for m in host.others) == 1    # once per entry into FAULT


def test_injected_frame_faults_are_counted_exactly_and_dropped_by_the_host_decoder(rig):
    sim, dev, host, _ = rig
    host.hello()
    host.wait("100 states", lambda: host.states >= 100)
    before = host.dec.counters.as_dict()
    sim.faults.set_frame_faults(drop=0.1, corrupt=0.2, bad_crc=0.1, latency_spike_probability=0.05,
                                latency_spike_s=0.001)
    host.wait("300 more states", lambda: host.states >= 400)
    sim.faults.clear()
    injected = dict(sim.faults.counts)            # frozen: every switch is off
    host.hello()                                  # its answer is sent after every faulty frame
    c = host.dec.counters
    assert injected["corrupted"] > 0 and injected["bad_crc"] > 0 and injected["dropped"] > 0
    assert c.crc - before["crc"] == injected["corrupted"] + injected["bad_crc"]
    assert c.lost - before["lost"] == injected["dropped"] + injected["corrupted"] + injected["bad_crc"]
    assert c.dropped - before_dropped(before) == c.crc - before["crc"]   # nothing else went wrong
    assert injected["delayed"] > 0


def before_dropped(counts: dict) -> int:
    return sum(counts[r] for r in sp.DROP_REASONS)


def test_silent_device_sends_nothing_then_recovers_and_the_host_counts_what_it_missed(rig):
    sim, dev, host, _ = rig
    host.hello()
    lost0 = host.dec.counters.lost
    sim.faults.set_frame_faults(silent=True)
    sim.wait_cycles(100, TIMEOUT)
    host.wait("the line to fall quiet", lambda: host.pump() == 0)
    states, sent = host.states, dev.counters.frames_sent
    sim.wait_cycles(300, TIMEOUT)
    for _ in range(5):
        host.pump()
    assert host.states == states and dev.counters.frames_sent == sent
    sim.faults.set_frame_faults(silent=False)
    host.hello()                                     # answered: the device talks again
    assert host.dec.counters.lost - lost0 == sim.faults.counts["dropped"] > 0
    assert host.dec.counters.dropped == 0


def test_host_garbage_is_counted_by_the_device_which_keeps_serving(rig):
    sim, dev, host, _ = rig
    host.hello()
    good = sp.encode_frame(sp.Heartbeat(time_us=1), 500)
    bad_crc = good[:8] + bytes([good[8] ^ 0x40]) + good[9:]
    host.port.write(b"\x05\x01\x00" + sp.cobs_encode(bad_crc) + b"\0" + b"\x7f" * (sp.MAX_ENCODED + 100) + b"\0"
                    + sp.encode(sp.Command(controlword=[6], mode=[8], target_position=[0], target_torque=[0]))
                    + sp.encode(sp.State(timestamp_us=0, cycle=0, statusword=[0], mode_display=[0], error_code=[0],
                                         position=[0], velocity=[0], current=[0])))
    ack = host.hello()
    assert ack.watchdog_us == round(dev.watchdog_s * 1e6)
    rx = dev.rx_counters
    assert (rx.cobs, rx.crc, rx.overflow) == (1, 1, 1) and rx.dropped == 3
    assert dev.counters.rejected == 1            # a COMMAND for 1 joint, the arm has 6
    assert dev.counters.unexpected == 1          # a STATE from the host
    assert dev.alive and sim.error is None
    n = host.states
    host.wait("states keep coming", lambda: host.states > n + 10)


def test_command_with_a_mode_the_drives_refuse_is_counted_not_applied(rig):
    sim, dev, host, _ = rig
    host.hello()
    host.wait("a STATE", lambda: host.state)
    host.command(cia402.CW_SHUTDOWN, 5, host.state.position)   # mode 5 does not exist here
    host.wait("the refusal", lambda: dev.counters.rejected == 1)
    sim.wait_cycles(5, TIMEOUT)
    assert all(s is State.SWITCH_ON_DISABLED for s in sim.read_state().states())


def test_command_with_a_target_outside_the_limits_is_refused_whole_and_nothing_moves(rig):
    """2^31 - 1 counts on joint 3 (every drive would run to its limit and fault): the whole COMMAND is refused
    and counted (out_of_limits), the drives stay enabled where they were."""
    sim, dev, host, _ = rig
    host.hello()
    hold = host.enable_csp()
    far = hold.copy()
    far[2] = 2 ** 31 - 1
    host.command(cia402.CW_ENABLE_OPERATION, Mode.CSP, far)
    host.wait("the refusal", lambda: dev.counters.out_of_limits == 1)
    sim.wait_cycles(200, TIMEOUT)
    s = sim.read_state()
    assert dev.counters.rejected == 1 and "target_position: drive 3" in dev.last_refusal
    assert all(st is State.OPERATION_ENABLED for st in s.states())
    assert np.abs(s.position_counts - hold).max() < 1e-3 * host.scaling.counts_per_rad.min()


@pytest.mark.parametrize("rig", [{"watchdog_s": 0.3, "realtime": True}], indirect=True)
def test_watchdog_quick_stops_the_drives_when_the_host_goes_quiet(rig):
    sim, dev, host, _ = rig
    host.hello()
    hold = host.enable_csp()
    modes = np.array([int(Mode.CST)] + [int(Mode.CSP)] * (sim.n - 1))
    torque = np.zeros(sim.n, int)
    torque[0] = 10_000                                 # 10 N m on the base joint: it speeds up until stopped
    host.command(cia402.CW_ENABLE_OPERATION, modes, hold, torque)   # then silence
    host.wait("the watchdog", lambda: dev.counters.watchdog_trips == 1, heartbeat=False)
    host.wait("drives switched off", lambda: host.states_are(State.SWITCH_ON_DISABLED), heartbeat=False)
    assert not any(isinstance(m, sp.Fault) for m in host.others)    # stopped by the quick stop, not a limit
    sim.wait_cycles(2, TIMEOUT)
    truth = sim.read_truth()
    assert np.all(truth.qd == 0.0)                     # at rest, brakes on
    moved = truth.q[0] - hold[0] / host.scaling.counts_per_rad[0]
    assert moved > 0.01                                # it was under way when the link went quiet
    assert dev.counters.watchdog_trips == 1
    # back: the host must enable the drives again
    host.enable_csp()
    assert dev.counters.watchdog_trips == 1


def test_device_on_a_port_opened_by_name_through_pyserial():
    master, slave = os.openpty()
    tty.setraw(slave)
    tty.setraw(master)
    dev = SerialDevice(port=os.ttyname(slave), watchdog_s=5.0)
    sim = Simulator("generic6", transport=dev, realtime=False)
    try:
        sim.start()
        assert dev.path == os.ttyname(slave)
        os.write(master, sp.encode(sp.Hello(watchdog_us=0)))
        dec, got, deadline = sp.StreamDecoder(), [], time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and not ({sp.HelloAck, sp.State} <= {type(m) for m in got}):
            if select.select([master], [], [], 0.05)[0]:
                got += dec.feed(os.read(master, 4096))
        ack = next(m for m in got if isinstance(m, sp.HelloAck))
        assert ack.gear_ratio.tolist() == sim.model.gear_ratio.tolist() and ack.watchdog_us == 5_000_000
        assert any(isinstance(m, sp.State) for m in got) and dec.counters.dropped == 0
    finally:
        sim.stop()
        os.close(master)
        os.close(slave)


def test_stop_joins_the_threads_and_closes_the_pty_and_start_stop_are_idempotent(caplog):
    dev = SerialDevice()
    sim = Simulator("generic6", transport=dev, realtime=False)
    with caplog.at_level(logging.INFO, logger="sim.serial_device"):
        sim.start()
    assert f"the host opens {dev.path}" in caplog.text
    sim.start()
    fd = dev._link.fd
    threads = list(dev._threads)
    assert dev.alive
    sim.stop()
    sim.stop()
    assert not any(t.is_alive() for t in threads) and not dev.alive
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize("kw, word", [({"watchdog_s": 0}, "watchdog_s"), ({"heartbeat_s": float("nan")}, "heartbeat_s"),
                                      ({"state_queue": 0}, "state_queue"), ({"port": 3}, "port")])
def test_device_options_are_checked(kw, word):
    with pytest.raises(InputError, match=word):
        SerialDevice(**kw)


def test_a_port_that_cannot_be_opened_is_one_clear_error():
    sim = Simulator("generic6", transport=SerialDevice(port="/nonexistent/tty"), realtime=False)
    with pytest.raises(InputError, match="/nonexistent/tty"):
        sim.start()
    sim.stop()


def test_registered_by_name_the_transport_takes_its_options(monkeypatch):
    from sim import simulator
    monkeypatch.setitem(simulator.TRANSPORTS, "serial", "sim.serial_device:SerialDevice")
    sim = Simulator("generic6", transport="serial", watchdog_s=0.5, heartbeat_s=0.2)
    assert isinstance(sim.transport, SerialDevice) and sim.transport.watchdog_s == 0.5
    assert sim.transport.scaling.n == sim.n and not sim.external_clock


def test_a_state_that_does_not_fit_the_wire_is_counted_and_not_sent_never_clipped():
    from sim.simulator import SimState
    dev = SerialDevice()
    sim = Simulator("generic6", transport=dev, realtime=False)
    sample = SimState.empty(sim.n)
    sample.statusword[:] = 0x0250
    sample.position[2] = 5000.0          # rad: beyond int32 motor counts with this gear
    dev._on_cycle(sample)                # the cycle callback, called as the simulator would
    sample.position[2], sample.current[4] = 0.0, float("nan")
    dev._on_cycle(sample)
    assert dev.counters.unencodable == 2
    assert not any(isinstance(m, sp.State) for m in dev._tx)
    sample.current[4] = 1.5
    dev._on_cycle(sample)
    states = [m for m in dev._tx if isinstance(m, sp.State)]
    assert len(states) == 1 and states[0].current.tolist() == [0, 0, 0, 0, 1_500_000, 0]


def test_a_host_clocked_device_steps_once_per_command_and_answers_each_with_that_cycles_state():
    """step_on_command: no clock of its own; the HELLO and each accepted COMMAND are one cycle, answered by
    its STATE (the simulator's sample of that cycle); a refused COMMAND (wrong joint count) steps nothing."""
    dev = SerialDevice(watchdog_s=5.0, step_on_command=True)
    sim = Simulator("generic6", transport=dev, seed=1)
    assert sim.external_clock
    history: dict[int, np.ndarray] = {}
    sim.add_cycle_callback(lambda s: history.__setitem__(s.cycle, s.position_counts.copy()))
    sim.start()
    host = Host(dev.path)
    try:
        time.sleep(0.05)
        host.pump(heartbeat=False)
        assert host.states == 0 and sim.read_state().cycle == 0          # silent until the host speaks
        host.hello()
        host.wait("the first STATE", lambda: host.states >= 1, heartbeat=False)
        time.sleep(0.05)
        host.pump(heartbeat=False)
        assert host.states == 1 and sim.read_state().cycle == 1          # heartbeats step nothing
        hold = host.state.position.copy()
        for k in range(2, 32):
            host.command(cia402.CW_SHUTDOWN, Mode.CSP, hold)
            host.wait(f"the STATE of command {k}", lambda: host.states >= k, heartbeat=False)
        assert sim.read_state().cycle == 31 and host.states == 31
        assert [s.cycle for s in host.log] == list(range(1, 32))
        np.testing.assert_array_equal(host.state.position, history[31])
        host.send(sp.Command(controlword=[6], mode=[8], target_position=[0], target_torque=[0]))
        host.wait("the refusal", lambda: dev.counters.rejected == 1, heartbeat=False)
        assert sim.read_state().cycle == 31
    finally:
        host.close()
        sim.stop()


def test_step_on_command_must_be_a_boolean():
    with pytest.raises(InputError, match="step_on_command"):
        SerialDevice(step_on_command="yes")


def test_a_host_clocked_device_sends_the_state_of_every_cycle_even_when_the_host_reads_late():
    """A host-clocked device steps once per COMMAND, so every STATE is one the host asked for: when the COMMANDs
    of a host that stopped reading (or of a simulator that was not scheduled) run back to back, their STATEs
    wait for the line, none skipped. A skipped one was a sample lost to identification that the chain made: a
    gap bridged or a recording cut (benchmarks/bench_chain_bias.py). 300 COMMANDs: more than the pty holds."""
    dev = SerialDevice(watchdog_s=5.0, step_on_command=True)
    sim = Simulator("generic6", transport=dev, seed=1)
    sim.start()
    host = Host(dev.path)
    try:
        host.hello()
        host.wait("the first STATE", lambda: host.states >= 1, heartbeat=False)
        hold = host.state.position.copy()
        burst = 300
        for _ in range(burst):          # written without reading what comes back
            host.command(cia402.CW_SHUTDOWN, Mode.CSP, hold)
        host.wait("every STATE", lambda: host.states >= 1 + burst or dev.counters.tx_skipped, heartbeat=False)
        time.sleep(0.05)
        host.pump(heartbeat=False)
        assert dev.counters.tx_skipped == 0
        assert [s.cycle for s in host.log] == list(range(1, 2 + burst))
    finally:
        host.close()
        sim.stop()
