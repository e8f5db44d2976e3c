"""The simulated gateway (sim.gateway_device) driven by pymodbus's own sync client, over TCP on 127.0.0.1:
header and layout version, the inputs against the simulator's own samples, the CiA 402 state machine through
controlwords, a CSP move, refused writes, the host watchdog's quick stop, fault injection (silent, dropped,
late responses) and a clean start/stop."""
from __future__ import annotations

import collections
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pymodbus.client import ModbusTcpClient
from pymodbus.exceptions import ModbusIOException

from firmware_bridge import cia402
from firmware_bridge import gateway as gw
from firmware_bridge.cia402 import Mode, State
from firmware_bridge.units import JointScaling
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from sim import Simulator
from sim.gateway_device import GatewayDevice

N = 6
WAIT_S = 20.0          # bound of every wait on the simulator (generous: the machine is shared)
ILLEGAL_FUNCTION, ILLEGAL_ADDRESS, ILLEGAL_VALUE = 1, 2, 3


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


class Recorder:
    """Copies of the simulator's own samples by cycle (a cycle callback): the oracle for what the gateway serves."""

    def __init__(self, size: int = 20000):
        self.samples: dict[int, tuple] = {}
        self.order: collections.deque = collections.deque()
        self.size = size
        self.lock = threading.Lock()
        self.changes: list[tuple[int, tuple]] = []   # (cycle, statuswords) whenever they change: kept whole

    def __call__(self, s) -> None:
        with self.lock:
            self.samples[s.cycle] = (s.statusword.copy(), s.mode_display.copy(), s.error_code.copy(),
                                     s.position_counts.copy(), s.current.copy(), s.position.copy())
            self.order.append(s.cycle)
            words = tuple(int(w) for w in s.statusword)
            if not self.changes or self.changes[-1][1] != words:
                self.changes.append((s.cycle, words))
            if len(self.order) > self.size:
                self.samples.pop(self.order.popleft(), None)

    def at(self, cycle: int) -> tuple:
        with self.lock:
            return self.samples[cycle]

    def states_since(self, cycle: int) -> set:
        with self.lock:
            return {cia402.state_of(w) for c, words in self.changes if c >= cycle for w in words}


class Host:
    """A host program written against the documented layout with pymodbus's sync client."""

    def __init__(self, port: int, timeout: float = 5.0):
        self.client = ModbusTcpClient("127.0.0.1", port=port, timeout=timeout, retries=0)
        assert self.client.connect()
        self.beat = 0

    def inputs(self) -> gw.InputImage:
        r = self.client.read_input_registers(gw.INPUT_BASE, count=gw.input_count(N))
        assert not r.isError(), r
        return gw.decode_inputs(r.registers, N)

    def outputs(self) -> gw.OutputImage:
        r = self.client.read_holding_registers(gw.HOLDING_BASE, count=gw.holding_count(N))
        assert not r.isError(), r
        return gw.decode_outputs(r.registers, N)

    def write(self, image: gw.OutputImage, beat: bool = True):
        if beat:
            self.beat = (self.beat + 1) & 0xFFFF
            image.watchdog = self.beat
        return self.client.write_registers(gw.HOLDING_BASE, gw.encode_outputs(image).tolist())

    def wait(self, predicate, what: str, timeout: float = WAIT_S) -> gw.InputImage:
        deadline = time.monotonic() + timeout
        while True:
            image = self.inputs()
            if predicate(image):
                return image
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not reached within {timeout} s; last image {image}")
            time.sleep(0.005)

    def wait_states(self, state: State) -> gw.InputImage:
        return self.wait(lambda im: all(cia402.state_of(int(w)) is state for w in im.statusword), state.value)

    def enable_csp(self) -> gw.InputImage:
        """Shutdown, then enable operation, in CSP at the current position, as any host would."""
        now = self.inputs()
        out = self.outputs()
        out.mode[:] = int(Mode.CSP)
        out.target_position[:] = now.position
        out.controlword[:] = cia402.CW_SHUTDOWN
        assert not self.write(out).isError()
        self.wait_states(State.READY_TO_SWITCH_ON)
        out.controlword[:] = cia402.CW_ENABLE_OPERATION
        assert not self.write(out).isError()
        return self.wait_states(State.OPERATION_ENABLED)

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def rig(model):
    """A running simulator (fast mode) behind a gateway on a free port, a recorder and a connected host."""
    gateway = GatewayDevice(host="127.0.0.1", port=0, watchdog_s=60.0)
    sim = Simulator(model, transport=gateway, realtime=False)
    recorder = Recorder()
    sim.add_cycle_callback(recorder)
    sim.start()
    sim.wait_until(1, timeout=WAIT_S)      # an image exists (before the first cycle the inputs are not valid)
    host = Host(gateway.port)
    try:
        yield sim, gateway, host, recorder
    finally:
        host.close()
        sim.stop()
    assert not any(t.name == "armid-gateway" for t in threading.enumerate())


def _scaling(model) -> JointScaling:
    return JointScaling.from_gear(model.gear_ratio, 2 ** 17)


def test_header_carries_the_layout_version_drive_count_and_a_running_cycle_counter(rig):
    sim, gateway, host, _ = rig
    raw = host.client.read_input_registers(gw.INPUT_BASE, count=gw.INPUT_HEADER_SIZE).registers
    assert raw[0] == gw.LAYOUT_VERSION and raw[1] == N
    first = host.inputs()
    sim.wait_cycles(5, timeout=WAIT_S)
    later = host.wait(lambda im: im.cycle_counter > first.cycle_counter + 4, "cycle counter")
    assert later.gateway_status & gw.STATUS_DATA_VALID
    assert later.timestamp_us == round(later.cycle_counter * sim.dt * 1e6)  # device time of that cycle, in us


def test_inputs_are_the_simulators_own_sample_of_the_same_cycle(rig, model):
    sim, gateway, host, recorder = rig
    host.enable_csp()
    sim.wait_cycles(20, timeout=WAIT_S)
    for _ in range(3):
        image = host.inputs()
        statusword, mode, error, counts, current, _ = recorder.at(image.cycle_counter)
        assert np.array_equal(image.statusword, statusword) and np.array_equal(image.mode_display, mode)
        assert np.array_equal(image.error_code, error)
        assert np.array_equal(image.position, counts)             # the encoder's own counts, not a re-scaling
        assert np.array_equal(image.current, np.rint(current * 1e6))
        assert np.all(image.mode_display == int(Mode.CSP))


def test_controlwords_take_every_drive_through_the_cia402_state_machine(rig):
    sim, _, host, recorder = rig
    assert all(cia402.state_of(int(w)) is State.SWITCH_ON_DISABLED for w in host.inputs().statusword)
    now = host.inputs()
    out = host.outputs()
    out.mode[:], out.target_position[:] = int(Mode.CSP), now.position
    for cw, state in ((cia402.CW_SHUTDOWN, State.READY_TO_SWITCH_ON), (cia402.CW_SWITCH_ON, State.SWITCHED_ON),
                      (cia402.CW_ENABLE_OPERATION, State.OPERATION_ENABLED), (cia402.CW_DISABLE_OPERATION, State.SWITCHED_ON),
                      (cia402.CW_DISABLE_VOLTAGE, State.SWITCH_ON_DISABLED)):
        out.controlword[:] = cw
        assert not host.write(out).isError()
        host.wait_states(state)
    assert all(s is State.SWITCH_ON_DISABLED for s in sim.read_state().states())


def test_a_joint_moves_in_csp_and_the_reported_position_is_the_simulators(rig, model):
    sim, _, host, recorder = rig
    start = host.enable_csp()
    scaling = _scaling(model)
    j, step = 1, 0.05
    out = host.outputs()
    target = out.target_position.copy()
    target[j] += int(round(step * scaling.counts_per_rad[j]))
    out.target_position[:] = target
    assert not host.write(out).isError()
    error = lambda im: np.abs(scaling.counts_to_position(im.position - target))  # noqa: E731  rad
    image = host.wait(lambda im: np.all(error(im) < 0.5e-3), "every joint at its target (joint 2 moved)")
    _, _, _, counts, _, _ = recorder.at(image.cycle_counter)
    assert np.array_equal(image.position, counts)                        # the simulator's own encoder counts
    moved = scaling.counts_to_position(image.position - start.position)
    assert abs(moved[j] - step) < 1e-3 and np.all(np.abs(np.delete(moved, j)) < 1e-3)
    assert abs(sim.read_truth().q[j] - scaling.counts_to_position(target)[j]) < 1e-3


def _exception_code(response) -> int:
    assert response.isError(), response
    return response.exception_code


@pytest.mark.parametrize("field,value,reason", [
    ("mode", 7, "mode .* = 7"),                                  # not a CiA 402 mode
    ("mode", int(Mode.CSV), "mode: joint 3"),                    # a CiA 402 mode these drives do not have
    ("mode", 0xFFFF, "mode .* = -1"),                            # INTEGER8 -1: no such mode
])
def test_impossible_writes_get_illegal_data_value_and_change_nothing(rig, model, field, value, reason):
    sim, gateway, host, recorder = rig
    host.enable_csp()
    before_out, before = host.outputs(), host.inputs()
    response = host.client.write_register(gw.holding_address(field, 2), value)
    assert _exception_code(response) == ILLEGAL_VALUE
    assert gateway.refused_writes == 1 and re.search(reason, gateway.last_refusal)
    sim.wait_cycles(50, timeout=WAIT_S)
    after = host.wait(lambda im: im.refused_writes == 1, "refusal counted in the header")
    assert _same(host.outputs(), before_out)
    assert np.all(after.mode_display == int(Mode.CSP))
    assert all(cia402.state_of(int(w)) is State.OPERATION_ENABLED for w in after.statusword)
    assert np.all(np.abs(after.position - before.position) < 1e-3 * _scaling(model).counts_per_rad)  # held (settling)


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)


def test_targets_beyond_the_joint_limits_or_torque_are_refused_and_the_joint_stays(rig, model):
    sim, gateway, host, _ = rig
    start = host.enable_csp()
    scaling = _scaling(model)
    out = host.outputs()
    far = out.target_position.copy()
    far[4] = scaling.position_to_counts(model.q_max)[4] + 1000
    refused = gw.OutputImage(out.watchdog, out.watchdog_timeout_ms, out.controlword, out.mode, far, out.target_torque)
    assert _exception_code(host.write(refused)) == ILLEGAL_VALUE
    assert "target_position: drive 5" in gateway.last_refusal
    torque = out.target_torque.copy()
    torque[0] = int(model.tau_max[0] * 1000) + 10
    refused = gw.OutputImage(out.watchdog, out.watchdog_timeout_ms, out.controlword, out.mode, out.target_position, torque)
    assert _exception_code(host.write(refused)) == ILLEGAL_VALUE
    assert "target_torque: drive 1" in gateway.last_refusal
    assert _exception_code(host.client.write_register(gw.holding_address("watchdog_timeout_ms"), 0)) == ILLEGAL_VALUE
    sim.wait_cycles(200, timeout=WAIT_S)
    now = host.inputs()
    assert now.refused_writes == gateway.refused_writes == 3
    assert np.all(np.abs(scaling.counts_to_position(now.position - start.position)) < 1e-3)
    assert _same(host.outputs(), out)


def test_requests_outside_the_image_or_for_bits_are_refused_by_modbus_itself(rig):
    _, _, host, _ = rig
    c = host.client
    assert _exception_code(c.read_input_registers(gw.INPUT_BASE, count=gw.input_count(N) + 1)) == ILLEGAL_ADDRESS
    assert _exception_code(c.read_holding_registers(gw.INPUT_BASE, count=1)) == ILLEGAL_ADDRESS   # wrong table
    assert _exception_code(c.write_register(gw.HOLDING_BASE + gw.holding_count(N), 1)) == ILLEGAL_ADDRESS
    assert _exception_code(c.read_coils(0, count=1)) == ILLEGAL_FUNCTION
    assert _exception_code(c.write_coil(0, True)) == ILLEGAL_FUNCTION
    assert host.inputs().refused_writes == 0           # refused by Modbus, never reached the drives


def test_one_function_23_applies_the_write_then_reads_the_mirrored_inputs_of_the_simulators_cycle(rig, model):
    """The input mirror (holding registers from INPUT_MIRROR_BASE) holds the input image; a read/write-multiple
    request writes the commands first and reads the image; a refused write applies and reads nothing; the
    mirror itself cannot be written."""
    sim, gateway, host, recorder = rig
    now = host.inputs()
    out = host.outputs()
    out.mode[:], out.target_position[:], out.controlword[:] = int(Mode.CSP), now.position, cia402.CW_SHUTDOWN
    reply = host.client.readwrite_registers(read_address=gw.INPUT_MIRROR_BASE, read_count=gw.input_count(N),
                                           write_address=gw.HOLDING_BASE, values=gw.encode_outputs(out).tolist())
    assert not reply.isError(), reply
    image = gw.decode_inputs(reply.registers, N)
    statusword, mode, error, counts, _, _ = recorder.at(image.cycle_counter)    # a whole cycle's own sample
    assert np.array_equal(image.statusword, statusword) and np.array_equal(image.position, counts)
    assert _same(host.outputs(), out)                                          # the write was applied
    host.wait_states(State.READY_TO_SWITCH_ON)
    mirrored = host.client.read_holding_registers(gw.INPUT_MIRROR_BASE, count=gw.input_count(N))
    assert not mirrored.isError() and mirrored.registers[:2] == [gw.LAYOUT_VERSION, N]
    gw.decode_inputs(mirrored.registers, N)                                    # a whole valid image
    bad = gw.encode_outputs(out)
    bad[gw.holding_address("mode", 3) - gw.HOLDING_BASE] = 7                   # not a CiA 402 mode
    refused = host.client.readwrite_registers(read_address=gw.INPUT_MIRROR_BASE, read_count=gw.input_count(N),
                                             write_address=gw.HOLDING_BASE, values=bad.tolist())
    assert _exception_code(refused) == ILLEGAL_VALUE and gateway.refused_writes == 1
    assert _same(host.outputs(), out)
    assert _exception_code(host.client.write_register(gw.INPUT_MIRROR_BASE + 4, 1)) == ILLEGAL_ADDRESS


def test_the_host_watchdog_quick_stops_enabled_drives_when_the_host_goes_quiet(rig):
    sim, gateway, host, recorder = rig
    host.enable_csp()
    assert gateway.watchdog_trips == 0 and not host.inputs().gateway_status & gw.STATUS_WATCHDOG_EXPIRED
    # the host shortens the watchdog to 50 ms, then writes nothing more
    quiet_from = host.inputs().cycle_counter
    assert not host.client.write_register(gw.holding_address("watchdog_timeout_ms"), 50).isError()
    image = host.wait(lambda im: not any(cia402.state_of(int(w)) is State.OPERATION_ENABLED for w in im.statusword),
                      "drives out of OPERATION ENABLED")
    assert image.gateway_status & gw.STATUS_WATCHDOG_EXPIRED and gateway.watchdog_trips >= 1
    host.wait_states(State.SWITCH_ON_DISABLED)               # quick stop option: at rest, voltage off
    assert State.QUICK_STOP_ACTIVE in recorder.states_since(quiet_from)   # a quick stop, not a disable
    assert np.all(host.outputs().controlword == cia402.CW_QUICK_STOP)   # what the gateway commanded, read back
    # writing the watchdog re-arms it and clears the status bit
    assert not host.client.write_register(gw.holding_address("watchdog"), 1).isError()
    host.wait(lambda im: not im.gateway_status & gw.STATUS_WATCHDOG_EXPIRED, "watchdog bit cleared")


@pytest.mark.parametrize("faults", [dict(silent=True), dict(drop=1.0), dict(corrupt=1.0), dict(bad_crc=1.0)],
                         ids=["silent", "drop", "corrupt", "bad_crc"])
def test_a_gateway_that_does_not_answer_times_out_on_the_client_and_recovers(rig, faults):
    sim, gateway, host, _ = rig
    quick = Host(gateway.port, timeout=0.3)
    try:
        sim.faults.set_frame_faults(**faults)
        with pytest.raises(ModbusIOException):
            quick.client.read_input_registers(gw.INPUT_BASE, count=gw.input_count(N))
        assert gateway.dropped_responses >= 1
    finally:
        sim.faults.clear()
        quick.close()
    assert host.inputs().n == N                                     # answers again once the fault is cleared


@pytest.mark.parametrize("junk", [
    b"\x00\x01\x00\x00\x00\x06\x01\x63\x00\x00\x00\x01",       # MBAP header, unknown function 0x63
    b"\x00\x02\x00\x00\x00\x06\x01\x04\x00",                      # truncated read request
    b"\x00\x03\x00\x00\x00\x0b\x01\x10\x04\x00\x00\x02\x09\x00\x00\x00\x00\x00",  # byte count lies
    bytes(range(256)) * 4,                                               # noise
], ids=["unknown-function", "truncated", "bad-byte-count", "noise"])
def test_malformed_frames_from_a_raw_socket_do_not_disturb_the_gateway(rig, junk):
    sim, gateway, host, _ = rig
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=2) as raw:
        raw.sendall(junk)
        raw.settimeout(0.3)
        try:
            raw.recv(1024)                       # an exception response, or nothing: either is fine
        except (TimeoutError, ConnectionResetError):
            pass
    assert host.inputs().n == N and host.inputs().refused_writes == 0
    assert sim.error is None and sim.running


def test_latency_spikes_delay_responses_beyond_a_short_client_timeout(rig):
    sim, gateway, host, _ = rig
    sim.faults.set_frame_faults(latency_spike_probability=1.0, latency_spike_s=0.05)
    assert host.inputs().n == N                                    # 50 ms late, within 5 s: answered
    assert sim.faults.counts["delayed"] >= 1
    quick = Host(gateway.port, timeout=0.2)
    try:
        sim.faults.set_frame_faults(latency_spike_s=1.0)
        with pytest.raises(ModbusIOException):
            quick.client.read_input_registers(gw.INPUT_BASE, count=gw.input_count(N))
    finally:
        sim.faults.clear()
        quick.close()


def test_the_documented_example_host_runs_against_the_simulated_gateway(rig):
    sim, gateway, host, _ = rig
    doc = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "wire-gateway.md").read_text()
    code = doc.split("## Example host (pymodbus)")[1].split("```python")[1].split("```")[0]
    assert 10 <= len(code.strip().splitlines()) <= 25
    exec(compile(code, "docs/reference/wire-gateway.md", "exec"), {"PORT": gateway.port})
    host.wait_states(State.READY_TO_SWITCH_ON)          # its shutdown command reached every drive


def test_stop_closes_the_server_and_releases_the_port_for_the_next_gateway(model):
    gateway = GatewayDevice(port=0, watchdog_s=None)
    sim = Simulator(model, transport=gateway, realtime=False)
    sim.start()
    port = gateway.port
    host = Host(port)
    assert host.inputs().n == N
    busy = Simulator(model, transport=GatewayDevice(port=port), realtime=False)
    with pytest.raises(InputError, match=f"cannot listen on 127.0.0.1:{port}"):
        busy.start()
    busy.stop()
    sim.stop()
    host.close()
    assert not any(t.name == "armid-gateway" for t in threading.enumerate())
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    again = Simulator(model, transport=GatewayDevice(port=port), realtime=False)
    with again:
        host = Host(port)
        assert host.inputs().n == N
        host.close()


def _exchange(host: Host, out: gw.OutputImage):
    """One function-23 exchange as the driver makes it: the whole holding image written, the mirror read."""
    host.beat = (host.beat + 1) & 0xFFFF
    out.watchdog = host.beat
    return host.client.readwrite_registers(read_address=gw.INPUT_MIRROR_BASE, read_count=gw.input_count(N),
                                           write_address=gw.HOLDING_BASE, values=gw.encode_outputs(out).tolist())


def _is_sample(image: gw.InputImage, sample) -> bool:
    statusword, mode, error, counts, current, _ = sample
    return (np.array_equal(image.statusword, statusword) and np.array_equal(image.mode_display, mode)
            and np.array_equal(image.error_code, error) and np.array_equal(image.position, counts)
            and np.array_equal(image.current, np.rint(current * 1e6)))


def test_a_host_clocked_gateway_runs_one_cycle_per_accepted_write_and_answers_an_exchange_with_that_cycle(model):
    """step_on_exchange: no clock of its own. Reads step nothing; each accepted write of process data (function
    23, 16, 6) is exactly one cycle, run after the write is applied and before the read: a function-23 exchange returns the
    simulator's own sample of the cycle its command started (a shutdown written in it already shows READY TO
    SWITCH ON), and reads after a function 16 return that same cycle until the next write. Refused writes and
    writes of the watchdog word alone (after the first write) step nothing."""
    gateway = GatewayDevice(host="127.0.0.1", port=0, watchdog_s=60.0, step_on_exchange=True)
    sim = Simulator(model, transport=gateway, realtime=True)
    assert sim.external_clock
    recorder = Recorder()
    sim.add_cycle_callback(recorder)
    sim.start()
    host = Host(gateway.port)
    try:
        time.sleep(0.05)                       # a free-running clock would have run ~50 cycles by now
        first = host.inputs()
        assert host.client.read_holding_registers(gw.INPUT_MIRROR_BASE, count=gw.input_count(N)).registers[:2] \
            == [gw.LAYOUT_VERSION, N]
        assert sim.read_state().cycle == 0 and first.cycle_counter == 0
        assert not first.gateway_status & gw.STATUS_DATA_VALID            # no cycle has run: no data yet
        out = host.outputs()                   # the targets start at the drives' actual positions
        out.mode[:], out.controlword[:] = int(Mode.CSP), cia402.CW_SHUTDOWN
        reply = _exchange(host, out)
        assert not reply.isError(), reply
        image = gw.decode_inputs(reply.registers, N)
        assert image.cycle_counter == 1 == sim.read_state().cycle == gateway.exchanges
        assert image.gateway_status & gw.STATUS_DATA_VALID and image.timestamp_us == round(sim.dt * 1e6)
        assert _is_sample(image, recorder.at(1))
        assert all(cia402.state_of(int(w)) is State.READY_TO_SWITCH_ON for w in image.statusword)
        out.controlword[:] = cia402.CW_ENABLE_OPERATION
        for k in range(2, 42):
            image = gw.decode_inputs(_exchange(host, out).registers, N)
            assert image.cycle_counter == k == sim.read_state().cycle, k
            assert _is_sample(image, recorder.at(k)), k
        assert all(cia402.state_of(int(w)) is State.OPERATION_ENABLED for w in image.statusword)
        assert not host.write(out).isError()                               # the fallback: function 16 ...
        after = [host.inputs() for _ in range(3)]                          # ... then reads (function 4)
        assert [im.cycle_counter for im in after] == [42] * 3 and sim.read_state().cycle == 42
        assert _is_sample(after[0], recorder.at(42))
        bad = gw.encode_outputs(out)
        bad[gw.holding_address("mode", 3) - gw.HOLDING_BASE] = 7                   # not a CiA 402 mode
        refused = host.client.readwrite_registers(read_address=gw.INPUT_MIRROR_BASE, read_count=gw.input_count(N),
                                                 write_address=gw.HOLDING_BASE, values=bad.tolist())
        assert _exception_code(refused) == ILLEGAL_VALUE
        assert _exception_code(host.client.write_register(gw.holding_address("mode", 0), 7)) == ILLEGAL_VALUE
        assert sim.read_state().cycle == 42 == gateway.exchanges
        assert not host.client.write_register(gw.holding_address("watchdog"), 7).isError()    # the watchdog alone
        assert sim.read_state().cycle == 42 == gateway.exchanges       # (a host reconnecting): no cycle
        assert not host.client.write_register(gw.holding_address("controlword", 0),
                                              cia402.CW_ENABLE_OPERATION).isError()        # function 6, process data
        assert sim.read_state().cycle == 43 == gateway.exchanges == host.inputs().cycle_counter
        assert sim.error is None and gateway.watchdog_trips == 0
    finally:
        host.close()
        sim.stop()


def _wait(predicate, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.001)


def test_the_drivers_transport_sends_each_command_in_its_own_exchange_and_reads_the_cycle_it_started(model):
    """The driver's gateway transport against the host-clocked gateway: write() starts the exchange, so the
    command written is the one the simulator's next cycle latches, and the sample read back is that cycle's
    (device time = cycles run x dt). Commands written while an exchange is slow are all sent afterwards, each
    one cycle, in order, and each cycle's image is read: no target is skipped (a torque kick), no image lost."""
    from driver.hal import ArmCommand, ArmState
    from driver.transports.gateway import GatewayArm

    gateway = GatewayDevice(host="127.0.0.1", port=0, watchdog_s=60.0, step_on_exchange=True)
    sim = Simulator(model, transport=gateway)
    sim.start()
    arm = GatewayArm(model, host="127.0.0.1", port=gateway.port, watchdog_ms=5000, timeout_ms=2000)
    scaling = _scaling(model)
    state, cmd = ArmState(N), ArmCommand(N)
    try:
        arm.open()
        _wait(lambda: arm.read(state), "the first sample")
        cmd.controlword[:], cmd.mode[:] = cia402.CW_SHUTDOWN, int(Mode.CSP)
        for k in range(1, 31):
            cmd.target_position[:] = state.q + 1e-4 * k
            before = sim.read_state().cycle
            arm.write(cmd)
            _wait(lambda: arm.read(state), f"the sample of command {k}")
            now = sim.read_state()
            assert now.cycle == before + 1, k                                    # one exchange, one cycle
            assert state.device_time_ns == round(now.time * 1e6) * 1000, k      # the cycle this command started
            written = gw.decode_outputs(host_words(gateway), N)
            assert np.array_equal(written.target_position, scaling.position_to_counts(cmd.target_position)), k
        assert arm.link_stats()["superseded_commands"] == 0
        sim.faults.set_frame_faults(latency_spike_probability=1.0, latency_spike_s=0.2)
        before = sim.read_state()
        arm.write(cmd)                                                   # its exchange is answered 0.2 s late
        _wait(lambda: arm._sent == arm._written, "the exchange of the first command")
        sim.faults.clear()
        for _ in range(2):                                               # written while that exchange waits
            cmd.target_position += 1e-3
            arm.write(cmd)
        newest = scaling.position_to_counts(cmd.target_position)
        for k in range(1, 4):                                            # each sent, each one cycle, in order
            _wait(lambda: arm.read(state), f"the sample of queued command {k}")
            assert state.device_time_ns == round((before.cycle + k) * sim.dt * 1e6) * 1000, k
        assert sim.read_state().cycle == before.cycle + 3
        assert np.array_equal(gw.decode_outputs(host_words(gateway), N).target_position, newest)
        assert arm.link_stats()["superseded_commands"] == 0
    finally:
        sim.faults.clear()
        arm.close()
        sim.stop()


def test_the_scaling_registers_let_a_host_without_the_model_convert_positions_and_currents(rig, model):
    """A host that reads only the gateway (no model file): counts per revolution, gear ratio and torque constant
    per joint from the scaling registers; with them the image's positions are the simulator's own (rad) and
    its currents give the torques the image reports."""
    sim, gateway, host, recorder = rig
    r = host.client.read_input_registers(gw.SCALING_BASE, count=gw.scaling_count(N))
    assert not r.isError(), r
    sc = gw.decode_scaling(r.registers, N)
    assert sc.counts_per_rev.tolist() == [2 ** 17] * N
    np.testing.assert_allclose(sc.gear_numerator / sc.gear_denominator, model.gear_ratio, rtol=1e-9)
    np.testing.assert_allclose(sc.torque_constant * 1e-6, model.torque_constant, rtol=0, atol=5e-7)
    image = host.inputs()
    position = recorder.at(image.cycle_counter)[5]
    np.testing.assert_allclose(image.position / sc.counts_per_rad(), position, rtol=0,
                               atol=float((0.5 / sc.counts_per_rad()).max()))
    torque = image.current * 1e-6 * sc.gear_numerator / sc.gear_denominator * sc.torque_constant * 1e-6
    np.testing.assert_allclose(torque, image.torque * 1e-3, rtol=0, atol=2e-3)
    assert _exception_code(host.client.write_register(gw.SCALING_BASE, 1)) == ILLEGAL_ADDRESS   # read-only


def test_the_watchdog_does_not_expire_before_any_host_has_written(model):
    """No host yet: however long the gateway waits, the watchdog neither expires nor trips; a host that only
    reads does not arm it; once a host has written and gone quiet, it expires."""
    gateway = GatewayDevice(host="127.0.0.1", port=0, watchdog_s=0.02)
    sim = Simulator(model, transport=gateway, realtime=False)
    sim.start()
    host = None
    try:
        sim.wait_until(1, timeout=WAIT_S)
        start = time.monotonic()
        sim.wait_cycles(50, timeout=WAIT_S)
        while time.monotonic() - start < 0.2:                # ten watchdog times without a host
            sim.wait_cycles(10, timeout=WAIT_S)
        host = Host(gateway.port)
        image = host.inputs()
        assert not image.gateway_status & gw.STATUS_WATCHDOG_EXPIRED and gateway.watchdog_trips == 0
        start = time.monotonic()
        while time.monotonic() - start < 0.2:
            sim.wait_cycles(10, timeout=WAIT_S)
        assert not host.inputs().gateway_status & gw.STATUS_WATCHDOG_EXPIRED
        assert not host.client.write_register(gw.holding_address("watchdog"), 1).isError()
        host.wait(lambda im: im.gateway_status & gw.STATUS_WATCHDOG_EXPIRED, "the watchdog expired")
    finally:
        if host is not None:
            host.close()
        sim.stop()


def host_words(gateway: GatewayDevice) -> list[int]:
    """The gateway's holding image as the drives were last commanded (its own copy, under its lock)."""
    with gateway._lock:
        return gateway._holding.tolist()


@pytest.mark.parametrize("kwargs,message", [(dict(port=70000), "port"), (dict(port="502"), "port"),
                                            (dict(host=""), "host"), (dict(watchdog_s=0.0), "watchdog_s"),
                                            (dict(watchdog_s=float("nan")), "watchdog_s"),
                                            (dict(step_on_exchange="yes"), "step_on_exchange")])
def test_bad_gateway_options_are_refused_with_input_error(kwargs, message):
    with pytest.raises(InputError, match=message):
        GatewayDevice(**kwargs)


@pytest.fixture(scope="module")
def quiet_rig(model):
    """One running gateway (watchdog off) for the property test's many writes."""
    gateway = GatewayDevice(port=0, watchdog_s=None)
    sim = Simulator(model, transport=gateway, realtime=False)
    sim.start()
    host = Host(gateway.port)
    try:
        yield sim, gateway, host
    finally:
        host.close()
        sim.stop()


def _acceptable(words: list[int], previous_timeout: int, model) -> bool:
    """The documented rule, written from the doc: modes 0, 8, 10; targets within q limits, target torque, torque
    offset and their sum within tau_max;
    the watchdog time not switched off."""
    modes = [w - 0x10000 * (w >= 0x8000) for w in words[gw.HOLDING_HEADER_SIZE + 1::gw.HOLDING_DRIVE_STRIDE]]
    if not set(modes) <= {0, 8, 10}:
        return False
    image = gw.decode_outputs(words, N)
    q = image.target_position / (2 ** 17 * model.gear_ratio / (2 * np.pi))
    tau, offset = image.target_torque * 1e-3, image.torque_offset * 1e-3
    half = np.pi / (2 ** 17 * np.abs(model.gear_ratio))
    if np.any(q < model.q_min - half) or np.any(q > model.q_max + half) or np.any(np.abs(tau) > model.tau_max + 5e-4):
        return False
    if np.any(np.abs(offset) > model.tau_max + 5e-4) or np.any(np.abs(tau + offset) > model.tau_max + 1e-3):
        return False                       # the offset alone, and what the drive would apply: target + offset
    return not (image.watchdog_timeout_ms == 0 and previous_timeout != 0)


_WORD = st.one_of(st.sampled_from([0, 1, 6, 7, 8, 9, 10, 15, 0x80, 100, 0xFFFF]), st.integers(0, 0xFFFF))


@given(offset=st.integers(0, gw.holding_count(N) - 1), values=st.lists(_WORD, min_size=1, max_size=14))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_writes_are_applied_whole_or_refused_whole(quiet_rig, model, offset, values):
    sim, gateway, host = quiet_rig
    values = values[:gw.holding_count(N) - offset]
    before = host.client.read_holding_registers(gw.HOLDING_BASE, count=gw.holding_count(N)).registers
    refused = gateway.refused_writes
    expected = before[:offset] + values + before[offset + len(values):]
    accept = _acceptable(expected, before[1], model)
    event("accepted" if accept else "refused")
    reply = host.client.write_registers(gw.HOLDING_BASE + offset, values)
    after = host.client.read_holding_registers(gw.HOLDING_BASE, count=gw.holding_count(N)).registers
    assert reply.isError() is not accept, (reply, gateway.last_refusal)
    if accept:
        assert after == expected and gateway.refused_writes == refused
    else:
        assert reply.exception_code == ILLEGAL_VALUE and after == before and gateway.refused_writes == refused + 1
    sim.wait_cycles(2, timeout=WAIT_S)
    assert np.array_equal(sim.read_state().mode_display, gw.decode_outputs(after, N).mode)   # what the drives run
    assert sim.error is None

