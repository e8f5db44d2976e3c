"""Modbus TCP gateway: process-image round trips per second, and the cost of the image update per cycle.

Prints `name: value unit (reference: value unit, ratio x)`; run with `python benchmarks/bench_gateway.py [seconds]`
(`--codec`: the codec's lines only).
  * exchange: a pymodbus sync client on 127.0.0.1 writes the whole output image (50 registers: 2 of header, 8 per
    drive) and reads the whole input image (80 registers) of the 6-drive arm, as a host does each cycle (against the simulated
    gateway in one function-23 request of its input mirror, against the bare server functions 16 and 4), for `seconds` (default 5) per set-up, in turns (5 rounds; medians). Ours: the simulated gateway in front of the real-time simulator
    (1 kHz, six drives enabled in CSP, every write checked and applied, inputs refreshed every cycle);
    reference: a bare pymodbus server with a plain register store of the same size (no checks, no
    simulator). ratio = ours / reference. A second line compares with the bare server running beside the same
    real-time simulator (drives enabled too) in the process, sharing the GIL with its cycle thread: the
    gateway's own cost.
  * server CPU per exchange: the process CPU time (client and server threads) of one exchange against a bare
    server run by the simulated gateway's server class (pymodbus's ModbusTcpServer with requests scheduled in
    its own loop) beside the stock ModbusTcpServer (every request handed over through the loop's self-pipe).
  * exchange CPU, function 23 vs 16 + 4: the process CPU time (client and the simulated gateway's server
    threads; the simulator is not stepped, so that only the exchange is counted) of one exchange as the
    driver makes it with the gateway's input mirror (one read/write-multiple request) and without it (a
    write, then a read).
  * client CPU per exchange: pymodbus's sync client (what the driver's link thread uses, TCP_NODELAY) beside
    its asyncio client, each in the calling thread, against the same bare server in its own process.
  * codec CPU per call, in this thread, each in a tight loop and each right after a 1 ms sleep (as the link thread
    runs it, woken for every exchange: cold caches): ours, what the driver's link thread calls per exchange
    (firmware_bridge.gateway.encode_outputs_into(...).tolist() of the 6-drive holding image, decode_inputs_into
    of the 80 input words as pymodbus returns them, a list of ints), beside the numpy structured-dtype codec it
    replaced (kept below as the reference: the same checks, a dozen numpy calls per image; encode_outputs(image)
    .tolist(), decode_inputs(words, 6)); and the list of ints pymodbus wants for `values`: a uint16 array's
    .tolist() beside array.array('H', ...) and list() of the array.
  * per-cycle cost: one simulator cycle with the gateway's cycle callback (a scaled copy of the sample, the
    watchdog; the 80 registers are encoded at the first read after a cycle, which the round trip includes)
    against the same simulator without a transport, stepped synchronously. ratio = ours / reference.
"""
from __future__ import annotations

import array
import asyncio
import socket
import subprocess
import sys
import time

from pathlib import Path

import numpy as np
from pymodbus.client import AsyncModbusTcpClient, ModbusTcpClient
from pymodbus.server import ModbusTcpServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's code, not the installed one

from firmware_bridge import cia402  # noqa: E402
from firmware_bridge import gateway as gw  # noqa: E402
from firmware_bridge.units import JointScaling  # noqa: E402
from ident.model import load_model  # noqa: E402
from sim import Simulator  # noqa: E402
from sim.gateway_device import GatewayDevice, ModbusServerThread, register_device  # noqa: E402

N = 6


def report(name: str, value: float, unit: str, ref_name: str, ref: float) -> None:
    ratio = value / ref if ref else float("inf")
    print(f"{name}: {value:.1f} {unit} (reference: {ref_name} {ref:.1f} {unit}, ratio {ratio:.2f}x)")


def round_trips(port: int, outputs: gw.OutputImage, seconds: float, cpu: list | None = None,
                fc23: bool = False, codec: bool = True) -> float:
    """Read all inputs + write all outputs (watchdog counting) for `seconds`; round trips per second. The
    process CPU time per round trip is appended to `cpu` when given. fc23: one read/write-multiple
    request of the input mirror instead of function 4 + function 16. codec=False: pymodbus alone, the same
    words sent every time (outputs encoded once, the watchdog not counting) and the registers read not decoded."""
    fixed = gw.encode_outputs(outputs).tolist()
    client = ModbusTcpClient("127.0.0.1", port=port, timeout=2.0, retries=0)
    if not client.connect():
        raise SystemExit(f"bench_gateway: cannot connect to 127.0.0.1:{port}")
    client.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        count, t0, c0 = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < seconds:
            if codec:
                outputs.watchdog = (outputs.watchdog + 1) & 0xFFFF
                values = gw.encode_outputs(outputs).tolist()
            else:
                values = fixed
            if fc23:
                r = w = client.readwrite_registers(read_address=gw.INPUT_MIRROR_BASE, read_count=gw.input_count(N),
                                                   write_address=gw.HOLDING_BASE, values=values)
            else:
                w = client.write_registers(gw.HOLDING_BASE, values)
                r = client.read_input_registers(gw.INPUT_BASE, count=gw.input_count(N))
            if r.isError() or w.isError():
                raise SystemExit(f"bench_gateway: refused: {r} {w}")
            if codec:
                gw.decode_inputs(r.registers, N)
            count += 1
        if cpu is not None:
            cpu.append((time.process_time() - c0) / count)
        return count / (time.perf_counter() - t0)
    finally:
        client.close()


def enabled_csp(sim: Simulator) -> gw.OutputImage:
    """Enable the drives in CSP at their positions through the simulator; the matching output image."""
    scaling = JointScaling.from_gear(sim.model.gear_ratio, sim.plant.noise.encoder_counts)
    pos = sim.read_state().position
    sim.set_commands(mode=np.full(N, int(cia402.Mode.CSP)), target_position=pos,
                     controlword=np.full(N, cia402.CW_SHUTDOWN))
    sim.wait_cycles(3, timeout=10)
    sim.set_commands(controlword=np.full(N, cia402.CW_ENABLE_OPERATION))
    sim.wait_cycles(3, timeout=10)
    return gw.OutputImage(0, 1000, np.full(N, cia402.CW_ENABLE_OPERATION), np.full(N, int(cia402.Mode.CSP)),
                          scaling.position_to_counts(pos), np.zeros(N, np.int64))


def bench_round_trip(model, seconds: float, rounds: int = 5) -> None:
    """The three set-ups take turns, `rounds` times, seconds / rounds each: the machine's load drifts alike
    over all of them. Each figure is the median of its rounds."""
    bare = _bare_server()
    port = bare.start()
    plain = Simulator(model, realtime=True)
    ours, alone, beside = [], [], []
    try:
        for _ in range(rounds):
            sim = Simulator(model, transport=GatewayDevice(port=0, watchdog_s=1.0), realtime=True)
            with sim:
                outputs = enabled_csp(sim)
                ours.append(round_trips(sim.transport.port, outputs, seconds / rounds, fc23=True))
                states = sim.read_state().states()
            if any(s is not cia402.State.OPERATION_ENABLED for s in states):
                raise SystemExit(f"bench_gateway: the drives did not stay enabled: {states}")
            alone.append(round_trips(port, outputs, seconds / rounds))
            with plain:                                  # the same simulator, beside the bare server
                enabled_csp(plain)
                beside.append(round_trips(port, outputs, seconds / rounds))
    finally:
        bare.stop()
    name = (f"gateway exchange (write {gw.holding_count(N)} + read {gw.input_count(N)} registers; ours: one function 23, "
            f"bare: 16 + 4)")
    report(name, float(np.median(ours)), "/s", "bare pymodbus server, plain register store", float(np.median(alone)))
    report(name, float(np.median(ours)), "/s", "the same bare server beside the same real-time simulator",
           float(np.median(beside)))


def _bare_server(server_class=None) -> ModbusServerThread:
    zeros = gw.OutputImage(0, 1000, *(np.zeros(N, np.int64) for _ in range(4)))
    inputs = gw.encode_inputs(gw.InputImage(1, 0, 0, 0, *(np.zeros(N, np.int64) for _ in range(7)))).tolist()
    device = register_device(gw.encode_outputs(zeros).tolist(), inputs)
    if server_class is None:
        return ModbusServerThread(device, "127.0.0.1", 0)
    return ModbusServerThread(device, "127.0.0.1", 0, server_class=server_class)


def bench_server_cpu(seconds: float, rounds: int = 4) -> None:
    """Process CPU per exchange (client + server threads) against our server class and the stock one, in turns."""
    outputs = gw.OutputImage(0, 1000, *(np.zeros(N, np.int64) for _ in range(4)))
    ours, stock = [], []
    for _ in range(rounds):
        for server_class, cpu in ((None, ours), (ModbusTcpServer, stock)):
            server = _bare_server(server_class)
            port = server.start()
            try:
                round_trips(port, outputs, seconds / rounds, cpu)
            finally:
                server.stop()
    report("gateway exchange CPU, client + bare server in one process", 1e6 * float(np.median(ours)), "us",
           "the same with pymodbus's stock ModbusTcpServer", 1e6 * float(np.median(stock)))


def bench_fc23(model, seconds: float, rounds: int = 4) -> None:
    """Process CPU per exchange against the simulated gateway (not stepped), function 23 vs 16 + 4, in turns."""
    sim = Simulator(model, transport=GatewayDevice(port=0, watchdog_s=60.0))
    sim.step(2)
    state = sim.read_state()
    scaling = JointScaling.from_gear(sim.model.gear_ratio, sim.plant.noise.encoder_counts)
    outputs = gw.OutputImage(0, 60000, np.full(N, cia402.CW_SHUTDOWN), np.full(N, int(cia402.Mode.CSP)),
                             scaling.position_to_counts(state.position), np.zeros(N, np.int64))
    sim.transport.start()
    one, two = [], []
    try:
        for _ in range(rounds):
            round_trips(sim.transport.port, outputs, seconds / rounds, one, fc23=True)
            round_trips(sim.transport.port, outputs, seconds / rounds, two, fc23=False)
    finally:
        sim.transport.stop()
    report("gateway exchange CPU, simulated gateway, one function 23", 1e6 * float(np.median(one)), "us",
           "a function 16 then a function 4", 1e6 * float(np.median(two)))


_SERVER_PROCESS = """
import sys, time
sys.path.insert(0, sys.argv[1])
from benchmarks.bench_gateway import _bare_server
server = _bare_server(); print(server.start(), flush=True)
sys.stdin.read()          # until the benchmark closes our stdin
server.stop()
"""


def bench_client_cpu(seconds: float, rounds: int = 4) -> None:
    """Client CPU per exchange, sync vs asyncio pymodbus client, against a bare server in its own process."""
    words = gw.encode_outputs(gw.OutputImage(0, 1000, *(np.zeros(N, np.int64) for _ in range(4)))).tolist()
    count = gw.input_count(N)
    proc = subprocess.Popen([sys.executable, "-c", _SERVER_PROCESS, str(Path(__file__).resolve().parents[1])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())

        def sync_client(duration: float) -> float:
            client = ModbusTcpClient("127.0.0.1", port=port, timeout=2.0, retries=0)
            client.connect()
            client.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            k, t0, c0 = 0, time.perf_counter(), time.thread_time()
            while time.perf_counter() - t0 < duration:
                client.write_registers(gw.HOLDING_BASE, words)
                client.read_input_registers(gw.INPUT_BASE, count=count)
                k += 1
            client.close()
            return (time.thread_time() - c0) / k

        async def async_client(duration: float) -> float:
            client = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=2.0, retries=0)
            await client.connect()
            k, t0, c0 = 0, time.perf_counter(), time.thread_time()
            while time.perf_counter() - t0 < duration:
                await client.write_registers(gw.HOLDING_BASE, words)
                await client.read_input_registers(gw.INPUT_BASE, count=count)
                k += 1
            client.close()
            return (time.thread_time() - c0) / k

        sync_cpu, async_cpu = [], []
        for _ in range(rounds):
            sync_cpu.append(sync_client(seconds / rounds))
            async_cpu.append(asyncio.run(async_client(seconds / rounds)))
    finally:
        proc.stdin.close()
        proc.wait(10)
    report("gateway client CPU per exchange, pymodbus sync client", 1e6 * float(np.median(sync_cpu)), "us",
           "pymodbus asyncio client", 1e6 * float(np.median(async_cpu)))


def bench_image_update(model, cycles: int = 600, rounds: int = 6) -> None:
    """Synchronous steps of the two simulators in turns (rounds of `cycles`); per-cycle medians."""
    sims = [Simulator(model, transport=GatewayDevice(port=0)), Simulator(model)]
    times: list[list[float]] = [[], []]
    for sim in sims:
        sim.step(200)  # warm up
    for _ in range(rounds):
        for sim, out in zip(sims, times):
            t0 = time.perf_counter()
            sim.step(cycles)
            out.append((time.perf_counter() - t0) / cycles * 1e6)
    report("simulator cycle with the gateway's cycle callback", float(np.median(times[0])), "us",
           "the same cycle without a transport", float(np.median(times[1])))


# -- the codec it replaced (firmware_bridge/gateway.py before 23 Nov 2026), the reference of bench_codec ----------
_BE = {"u16": ">u2", "i16": ">i2", "u32": ">u4", "i32": ">i4"}


def _structured(group, size) -> np.dtype:
    return np.dtype({"names": [f.name for f in group], "formats": [_BE[f.kind] for f in group],
                     "offsets": [2 * f.offset for f in group], "itemsize": 2 * size})


_OUT_H, _OUT_D = _structured(gw.HOLDING_HEADER, gw.HOLDING_HEADER_SIZE), _structured(gw.HOLDING_DRIVE, gw.HOLDING_DRIVE_STRIDE)
_IN_H, _IN_D = _structured(gw.INPUT_HEADER, gw.INPUT_HEADER_SIZE), _structured(gw.INPUT_DRIVE, gw.INPUT_DRIVE_STRIDE)
_MODE_OK = np.zeros(0x10000, bool)
_MODE_OK[np.array(gw.HOLDING_DRIVE[1].allowed) + 0x8000] = True


def _check_field(f, v: np.ndarray) -> None:
    lo, hi = f.bounds
    bad = (v < lo) | (v > hi)
    if f.allowed is not None:
        bad |= ~_MODE_OK[np.clip(v, lo, hi) + 0x8000]
    if bad.any():
        raise gw.GatewayError(f"{f.name}: drive {int(np.flatnonzero(bad)[0]) + 1}")


def structured_encode_outputs(image: gw.OutputImage) -> np.ndarray:
    """The old encode_outputs: header checked in Python, each drive field checked with numpy and stored through
    a big-endian structured view of the words."""
    n = image.controlword.shape[0]
    header = (image.watchdog, image.watchdog_timeout_ms)
    for f, v in zip(gw.HOLDING_HEADER, header):
        if not f.bounds[0] <= v <= f.bounds[1]:
            raise gw.GatewayError(f.name)
    words = np.zeros(gw.holding_count(n), dtype=">u2")
    words[:gw.HOLDING_HEADER_SIZE].view(_OUT_H)[0] = header
    drives = words[gw.HOLDING_HEADER_SIZE:].view(_OUT_D)
    for f in gw.HOLDING_DRIVE:
        v = np.asarray(getattr(image, f.name))
        if not (v.dtype in (np.uint16, np.int8, np.int32)):   # the old trusted dtypes skipped the check
            _check_field(f, v)
        drives[f.name] = v
    return words.astype(np.uint16)


def structured_decode_inputs(words: list[int], n: int) -> gw.InputImage:
    """The old decode_inputs: the words as big-endian uint16, viewed field by field, narrowed fields checked."""
    w = np.array(words, dtype=">u2")
    if w[0] != gw.LAYOUT_VERSION or (w.shape[0] - gw.INPUT_HEADER_SIZE) // gw.INPUT_DRIVE_STRIDE != n:
        raise gw.GatewayError("layout or size")
    values = dict(zip((f.name for f in gw.INPUT_HEADER), w[:gw.INPUT_HEADER_SIZE].view(_IN_H)[0].item()))
    if not 1 <= values["drive_count"] <= gw.MAX_DRIVES:
        raise gw.GatewayError("drive_count")
    drives = w[gw.INPUT_HEADER_SIZE:].view(_IN_D)
    for f in gw.INPUT_DRIVE:
        v = drives[f.name].astype(np.int64)
        if f.lo is not None or f.hi is not None:
            _check_field(f, v)
        values[f.name] = v
    return gw.InputImage(**{k: values[k] for k in gw.InputImage.__dataclass_fields__})


def _per_call(fn, calls: int, gap_s: float) -> float:
    """Median thread CPU of fn() in us, over `calls` calls, each after a sleep of gap_s (0: a tight loop)."""
    spent = np.zeros(calls)
    for k in range(calls):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.thread_time_ns()
        fn()
        spent[k] = time.thread_time_ns() - t0
    return float(np.median(spent)) / 1e3


def bench_codec(calls: int = 20000, cold_calls: int = 2000) -> None:
    """The codec per call: ours (the link thread's calls) beside the structured-dtype codec it replaced."""
    sim = Simulator(load_model("generic6"), transport=GatewayDevice(port=0))
    sim.step(3)
    words = list(sim.transport._encoded())                     # a real image, as pymodbus hands it over
    image = gw.decode_inputs(words, N)
    outputs = gw.OutputImage(7, 100, np.full(N, cia402.CW_ENABLE_OPERATION), np.full(N, int(cia402.Mode.CSP)),
                             image.position, np.zeros(N, np.int64))
    header = np.array([7, 100], np.int64)
    fields = np.array([outputs.controlword, outputs.mode, outputs.target_position, outputs.target_torque], np.int64)
    buffer = np.zeros(gw.holding_count(N), np.uint16)
    in_header, in_drives = np.zeros(len(gw.INPUT_HEADER), np.int64), np.zeros((len(gw.INPUT_DRIVE), N), np.int64)
    assert gw.encode_outputs_into(header, fields, buffer).tolist() == structured_encode_outputs(outputs).tolist()
    cases = ((f"encode {gw.holding_count(N)} holding words", lambda: gw.encode_outputs_into(header, fields, buffer).tolist(),
              lambda: structured_encode_outputs(outputs).tolist()),
             ("decode 80 input words", lambda: gw.decode_inputs_into(words, in_header, in_drives),
              lambda: structured_decode_inputs(words, N)))
    for what, ours, old in cases:
        for gap, tag in ((0.0, ""), (1e-3, " after a 1 ms sleep")):
            k = calls if not gap else cold_calls
            report(f"gateway codec, {what}{tag}", _per_call(ours, k, gap), "us CPU per call",
                   "the numpy structured-dtype codec it replaced", _per_call(old, k, gap))
    report(f"gateway codec, the {gw.holding_count(N)} words as pymodbus's list of ints: uint16 .tolist()", _per_call(buffer.tolist, calls, 0),
           "us", "array.array('H', buffer.tobytes())", _per_call(lambda: array.array("H", buffer.tobytes()), calls, 0))
    report(f"gateway codec, the {gw.holding_count(N)} words as pymodbus's list of ints: uint16 .tolist()", _per_call(buffer.tolist, calls, 0),
           "us", "list(buffer) (numpy scalars)", _per_call(lambda: list(buffer), calls, 0))


def main(argv: list[str]) -> None:
    seconds = float(argv[1]) if len(argv) > 1 and argv[1] != "--codec" else 5.0
    model = load_model("generic6")
    bench_codec()
    if "--codec" in argv:
        return
    bench_round_trip(model, seconds)
    bench_server_cpu(seconds)
    bench_fc23(model, seconds)
    bench_client_cpu(seconds)
    bench_image_update(model)


if __name__ == "__main__":
    main(sys.argv)
