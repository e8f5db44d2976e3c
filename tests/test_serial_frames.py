"""The serial link's allocation-free codecs (driver/transports/serial_frames.py) against the protocol's own
codec (firmware_bridge.serial_protocol): the same bytes out, the same values and the same drop counts in."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from driver.hal import ArmCommand
from driver.transports.serial_frames import MESSAGE, STATE, CommandEncoder, FrameSplitter
from firmware_bridge import serial_protocol as sp
from firmware_bridge.units import JointScaling, WireValueError

N = 6
SCALING = JointScaling.from_gear(np.array([100.0, 100.0, 80.0, 50.0, 50.0, 50.0]))
finite = st.floats(-3.0, 3.0, allow_nan=False)


def _command(q, tau, cw=0x0F, mode=8) -> ArmCommand:
    c = ArmCommand(N)
    c.controlword[:] = cw
    c.mode[:] = mode
    c.target_position[:] = q
    c.target_torque[:] = tau
    return c


@settings(max_examples=40, deadline=None)
@given(q=st.lists(finite, min_size=N, max_size=N), tau=st.lists(st.floats(-500, 500), min_size=N, max_size=N),
       seq=st.integers(0, 0xFFFF), cw=st.sampled_from([0, 2, 6, 7, 0x0F, 0x80]))
def test_command_frames_are_the_protocols_own_bytes(q, tau, seq, cw):
    cmd = _command(q, tau, cw)
    reference = sp.encode(sp.Command(controlword=cmd.controlword, mode=cmd.mode,
                                     target_position=SCALING.position_to_counts(cmd.target_position),
                                     target_torque=JointScaling.torque_to_raw(cmd.target_torque)), seq)
    assert CommandEncoder(N, SCALING.counts_per_rad).encode(seq, cmd) == b"\0" + reference


@pytest.mark.parametrize("field, value, joint", [("target_position", np.nan, 3), ("target_torque", np.inf, 5),
                                                 ("target_position", 1e6, 1)])
def test_a_target_that_cannot_be_sent_is_refused_naming_the_joint(field, value, joint):
    cmd = _command(np.zeros(N), np.zeros(N))
    getattr(cmd, field)[joint - 1] = value
    with pytest.raises(WireValueError, match=f"joint {joint}"):
        CommandEncoder(N, SCALING.counts_per_rad).encode(0, cmd)


def _state(cycle: int, rng) -> sp.State:
    return sp.State(timestamp_us=1000 * cycle + 7, cycle=cycle, statusword=rng.integers(0, 0xFFFF, N),
                    mode_display=rng.integers(-128, 127, N), error_code=rng.integers(0, 0xFFFF, N),
                    position=rng.integers(-2**31, 2**31 - 1, N), velocity=rng.integers(-2**31, 2**31 - 1, N),
                    current=rng.integers(-2**31, 2**31 - 1, N))


def test_states_take_the_fast_path_with_the_decoders_values_and_anything_else_its_checks():
    rng = np.random.default_rng(3)
    states = [_state(k, rng) for k in range(5)]
    good = [sp.encode(m, seq) for seq, m in enumerate(states)]
    bad_crc = bytearray(sp.encode_frame(states[0], 9))
    bad_crc[-1] ^= 0xFF
    other_n = sp.encode(sp.State(**{**vars(_state(9, rng)), **{k: getattr(_state(9, rng), k)[:4] for k in (
        "statusword", "mode_display", "error_code", "position", "velocity", "current")}}), 5)
    stream_bytes = (good[0] + good[1] + sp.cobs_encode(bytes(bad_crc)) + b"\0" + sp.encode(sp.Heartbeat(time_us=5), 2)
                    + b"\x01\x02garbage\0" + good[2] + other_n + good[3] + good[4])
    for chunk in (1, 7, 64, len(stream_bytes)):      # any split of the byte stream
        splitter, reference = FrameSplitter(N), sp.StreamDecoder()
        got = []
        for i in range(0, len(stream_bytes), chunk):
            part = stream_bytes[i:i + chunk]
            reference.feed(part)
            for kind, value in splitter.feed(part):
                if kind is STATE:
                    got.append(("state", int(splitter.state["fixed"]["cycle"]),
                                {k: splitter.joints[k].copy() for k in ("position", "velocity", "current",
                                                                        "statusword", "error_code", "mode_display")}))
                else:
                    got.append((type(value).__name__, None, None))
        assert [g[0] for g in got] == ["state", "state", "Heartbeat", "state", "State", "state", "state"]
        for (_, cycle, cols), m in zip([g for g in got if g[0] == "state"], [states[k] for k in (0, 1, 2, 3, 4)]):
            assert cycle == m.cycle
            for k, v in cols.items():
                np.testing.assert_array_equal(v, getattr(m, k))
        assert splitter.decoder.counters.as_dict() == reference.counters.as_dict()
        assert reference.counters.crc == 1 and reference.counters.cobs + reference.counters.truncated >= 1


def test_an_overlong_chunk_is_counted_once_and_the_stream_resynchronises():
    rng = np.random.default_rng(4)
    data = b"\x05" * (sp.MAX_ENCODED + 50) + b"\0" + sp.encode(_state(1, rng), 0)
    splitter, reference = FrameSplitter(N), sp.StreamDecoder()
    out = []
    for i in range(0, len(data), 100):
        reference.feed(data[i:i + 100])
        out += splitter.feed(data[i:i + 100])
    assert [kind for kind, _ in out] == [STATE]
    assert splitter.decoder.counters.as_dict() == reference.counters.as_dict()
    assert reference.counters.overflow == 1
    assert MESSAGE != STATE
