"""firmware_bridge.canopen_map: the EDS loads with python-canopen and agrees with the PDO definitions, the
golden vectors match both our codec and python-canopen's own PDO encoder, the docs carry the generated
tables, the bus-load arithmetic matches the published frame lengths, and the decoders never crash."""
from __future__ import annotations

import functools
import json
import math
import re
import struct
from pathlib import Path

import canopen
import pytest
from canopen.emcy import EMCY_STRUCT
from hypothesis import given, settings
from hypothesis import strategies as st

from firmware_bridge import canopen_map as cm
from firmware_bridge import cia402
from firmware_bridge.units import JointScaling

ROOT = Path(__file__).resolve().parents[1]
EDS = ROOT / "firmware_bridge" / "armid_drive.eds"
VECTORS = json.loads((ROOT / "firmware_bridge" / "vectors" / "can.json").read_text())

# CiA 301 pre-defined connection set (function code bases), written out from the standard
CIA301_BASES = {"TPDO1": 0x180, "TPDO2": 0x280, "TPDO3": 0x380, "TPDO4": 0x480,
                "RPDO1": 0x200, "RPDO2": 0x300, "RPDO3": 0x400, "RPDO4": 0x500,
                "EMCY": 0x080, "SDO_TX": 0x580, "SDO_RX": 0x600, "HEARTBEAT": 0x700}


def test_committed_eds_is_the_generated_one():
    assert EDS.read_text() == cm.eds_text(), "regenerate: python -m firmware_bridge.canopen_map eds > firmware_bridge/armid_drive.eds"


@pytest.mark.parametrize("node", [1, 6, 127])
def test_eds_loads_with_canopen_and_its_pdo_parameters_are_the_maps(node):
    od = canopen.objectdictionary.import_od(str(EDS), node)
    assert od[0x1000].default == 0x00020192
    assert od[0x1014].default == 0x80 + node
    assert od[0x1005].default == 0x80
    assert od[0x1017].default == cm.DEFAULT_HEARTBEAT_MS
    assert od[0x6502].default == (1 << 7) | (1 << 9)       # CSP and CST (CiA 402 bits 7 and 9)
    for pdef in cm.PDOS:
        comm, mapping = od[pdef.communication_index], od[pdef.mapping_index]
        base = CIA301_BASES[pdef.name]
        assert comm[1].default == base + node + (0 if pdef.enabled else 1 << 31)
        assert comm[2].default == 1
        assert mapping[0].default == len(pdef.entries)
        size = 0
        for k, entry in enumerate(pdef.entries, start=1):
            word = mapping[k].default
            index, sub, bits = word >> 16, (word >> 8) & 0xFF, word & 0xFF
            target = od[index] if sub == 0 else od[index][sub]
            assert (index, sub) == (entry.index, entry.subindex)
            assert target.pdo_mappable, f"{pdef.name}: 0x{index:04X} is not PDO-mappable in the EDS"
            assert bits == len(target), f"{pdef.name}: 0x{index:04X} is {len(target)} bits in the EDS, mapped as {bits}"
            size += bits
        assert size == 8 * pdef.dlc <= 64


def test_default_maps_carry_what_the_product_needs():
    tpdo = {e.index for p in cm.TPDOS if p.enabled for e in p.entries}
    rpdo = {e.index for p in cm.RPDOS if p.enabled for e in p.entries}
    assert {cia402.STATUSWORD, cia402.POSITION_ACTUAL, cia402.VELOCITY_ACTUAL, cm.CURRENT_ACTUAL_UA} <= tpdo
    assert {cia402.CONTROLWORD, cia402.TARGET_POSITION, cm.TARGET_TORQUE_MNM, cia402.MODES_OF_OPERATION} <= rpdo
    assert all(p.transmission_type == 1 for p in cm.PDOS)


def test_manufacturer_objects_are_int32_in_the_units_of_units_py():
    od = canopen.objectdictionary.import_od(str(EDS), 1)
    for index, unit in ((0x2000, "uA"), (0x2001, "mN m"), (0x2002, "mN m")):
        assert od[index].data_type == canopen.objectdictionary.INTEGER32
        assert od[index].unit == unit


@pytest.mark.parametrize("vec", VECTORS["pdos"], ids=lambda v: v["name"])
def test_golden_vector_packs_and_unpacks(vec):
    pdef = cm.pdo_by_name(vec["pdo"])
    values = [vec["values"][f] for f in pdef.fields]
    assert set(vec["values"]) == set(pdef.fields)
    assert pdef.pack(values).hex() == vec["hex"]
    assert pdef.unpack_dict(bytes.fromhex(vec["hex"])) == vec["values"]


@pytest.mark.parametrize("vec", VECTORS["pdos"], ids=lambda v: v["name"])
def test_golden_vector_is_what_canopens_own_pdo_encoder_writes(vec):
    """python-canopen, reading the map from the EDS, encodes the same values into the same bytes."""
    pdef = cm.pdo_by_name(vec["pdo"])
    node = canopen.RemoteNode(1, canopen.objectdictionary.import_od(str(EDS), 1))
    canopen.Network().add_node(node)    # no bus: read() only subscribes
    maps = node.tpdo if pdef.transmit else node.rpdo
    pdo_map = maps.map[pdef.number]
    pdo_map.read(from_od=True)
    for var, entry in zip(pdo_map.map, pdef.entries):
        var.raw = vec["values"][entry.field]
    assert bytes(pdo_map.data).hex() == vec["hex"]
    pdo_map.data = bytearray.fromhex(vec["hex"])
    assert [var.raw for var in pdo_map.map] == [vec["values"][e.field] for e in pdef.entries]


@pytest.mark.parametrize("row", VECTORS["cob_ids"], ids=lambda r: f"node{r['node']}")
def test_cob_ids_follow_the_predefined_connection_set(row):
    node = row["node"]
    for pdef in cm.PDOS:
        assert pdef.cob_id(node) == row[pdef.name] == CIA301_BASES[pdef.name] + node
    assert cm.EMCY_COB_BASE + node == row["EMCY"]
    assert cm.HEARTBEAT_COB_BASE + node == row["HEARTBEAT"]
    assert cm.SDO_TX_COB_BASE + node == row["SDO_TX"]
    assert cm.SDO_RX_COB_BASE + node == row["SDO_RX"]


@pytest.mark.parametrize("vec", VECTORS["emcy"], ids=lambda v: v["name"])
def test_emcy_vectors_with_our_error_register_and_canopens_emcy_layout(vec):
    assert cm.error_register(vec["code"]) == vec["register"]
    assert EMCY_STRUCT.pack(vec["code"], vec["register"], b"").hex() == vec["hex"]


@pytest.mark.parametrize("vec", VECTORS["scaling"], ids=lambda v: v["name"])
def test_scaling_vectors_counts_per_joint_radian(vec):
    sc = JointScaling.from_gear([vec["gear_ratio"]], vec["counts_per_rev"])
    assert sc.position_to_counts([vec["position_rad"]])[0] == vec["position_counts"]


def test_pack_refuses_values_outside_their_type_naming_the_field():
    with pytest.raises(cm.CanFrameError, match="TPDO1: statusword"):
        cm.TPDO1.pack([0x10000, 0, 0])
    with pytest.raises(cm.CanFrameError, match="RPDO1: mode"):
        cm.RPDO1.pack([0, 0, 128])
    with pytest.raises(cm.CanFrameError, match="RPDO2: target_torque"):
        cm.RPDO2.pack([1.5, 0])
    with pytest.raises(cm.CanFrameError, match="RPDO2: torque_offset"):
        cm.RPDO2.pack([0, 40_000])             # INTEGER16 per mille
    with pytest.raises(cm.CanFrameError, match="expected 3 values"):
        cm.TPDO1.pack([0, 0])


@settings(max_examples=200, deadline=None)
@given(pdo=st.sampled_from(cm.PDOS), data=st.binary(min_size=0, max_size=12))
def test_unpack_of_random_bytes_returns_the_fields_or_refuses_by_length(pdo, data):
    if len(data) != pdo.dlc:
        with pytest.raises(cm.CanFrameError, match=f"{pdo.name}: DLC {len(data)}"):
            pdo.unpack(data)
        return
    values = pdo.unpack(data)
    # independent decode: little-endian two's complement, field by field
    at = 0
    for e, v in zip(pdo.entries, values):
        n = e.bits // 8
        signed = e.data_type in (cm.INTEGER8, cm.INTEGER16, cm.INTEGER32)
        assert v == int.from_bytes(data[at:at + n], "little", signed=signed)
        at += n
    assert pdo.pack(list(values)) == data


def test_frame_bits_match_the_published_can_frame_lengths():
    # classic CAN, 11-bit id: 47 bits + 8 per data byte (with the 3-bit interframe space); worst-case
    # stuffing of an 8-byte frame gives the well-known 135 bits, of an empty one 55
    assert cm.frame_bits(8, stuffing=False) == 111
    assert cm.frame_bits(8) == 135
    assert cm.frame_bits(0, stuffing=False) == 47
    assert cm.frame_bits(0) == 55
    with pytest.raises(cm.CanFrameError):
        cm.frame_bits(9)


def test_six_joints_at_1khz_do_not_fit_one_classic_1mbit_bus():
    """The honest arithmetic the docs state: one cycle of 6 drives is ~2.4-2.9 kbit."""
    bits = cm.cycle_bits(6)
    frames = sum(cm.frame_bits(p.dlc) for p in cm.PDOS if p.enabled)
    assert bits == cm.frame_bits(0) + 6 * frames
    assert cm.max_cycle_rate(6) < 1000 < cm.max_cycle_rate(1)
    assert math.isclose(cm.max_cycle_rate(6, 1e6), 1e6 / bits)


def test_docs_contain_the_generated_tables():
    doc = (ROOT / "docs" / "reference" / "wire-can.md").read_text()
    assert cm.pdo_table() in doc, "docs/reference/wire-can.md: paste `python -m firmware_bridge.canopen_map doc`"
    assert cm.object_table() in doc


def test_c_constants_are_c_identifiers_with_the_standard_cob_bases():
    consts = cm.c_constants()
    names = [n for n, _, _ in consts]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", n) for n in names)
    values = {n: v for n, v, _ in consts}
    for pdef in cm.PDOS:
        assert values[f"CAN_{pdef.name}_COB_BASE"] == CIA301_BASES[pdef.name]
        offsets = [values[f"CAN_{pdef.name}_{e.field.upper()}_OFFSET"] for e in pdef.entries]
        sizes = [struct.calcsize("<" + {8: "b", 16: "h", 32: "i"}[e.bits]) for e in pdef.entries]
        assert offsets == [sum(sizes[:k]) for k in range(len(sizes))]
        assert values[f"CAN_{pdef.name}_DLC"] == sum(sizes)
    assert values["CAN_SYNC_COB_ID"] == 0x80 and values["CAN_DEVICE_TYPE"] == 0x00020192


# -- PdoCodec: the fast path of the driver and the simulated drives, against python-canopen's own PDO codec --
@functools.lru_cache(maxsize=None)
def _canopen_maps(pdef: cm.PdoDef, node: int):
    """python-canopen's PdoMap of pdef on a RemoteNode with our EDS (the independent decoder/encoder)."""
    remote = canopen.RemoteNode(node, canopen.objectdictionary.import_od(str(EDS), node))
    canopen.Network().add_node(remote)
    pdo_map = (remote.tpdo if pdef.transmit else remote.rpdo).map[pdef.number]
    pdo_map.read(from_od=True)
    return pdo_map


def _values_of(pdef: cm.PdoDef):
    return st.tuples(*(st.integers(*cm.type_range(e.data_type)) for e in pdef.entries))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pdef=st.sampled_from(cm.PDOS),
       nodes=st.lists(st.sampled_from([1, 2, 5, 6, 64, 127]), min_size=1, max_size=6, unique=True))
def test_pdo_codec_decodes_every_nodes_frame_as_canopen_does(data, pdef, nodes):
    codec = cm.PdoCodec((pdef,), nodes)
    j = data.draw(st.integers(0, len(nodes) - 1))
    payload = data.draw(st.binary(min_size=pdef.dlc, max_size=pdef.dlc))
    k, jj, values = codec.decode(pdef.cob_id(nodes[j]), payload)
    oracle = _canopen_maps(pdef, nodes[j])
    oracle.data = bytearray(payload)
    assert (k, jj) == (0, j)
    assert list(values) == [var.raw for var in oracle.map]


@settings(max_examples=40, deadline=None)
@given(data=st.data(), pdef=st.sampled_from(cm.PDOS))
def test_pdo_codec_encodes_in_place_the_bytes_canopen_writes(data, pdef):
    codec = cm.PdoCodec((pdef,), [3, 5])
    values = data.draw(_values_of(pdef))
    buffer = codec.payloads[0][1]
    assert codec.encode(0, 1, values) is buffer              # preallocated, reused
    oracle = _canopen_maps(pdef, 5)
    for var, v in zip(oracle.map, values):
        var.raw = v
    assert bytes(buffer) == bytes(oracle.data)
    assert bytes(codec.payloads[0][0]) == bytes(pdef.dlc)     # the other node's payload untouched


def test_pdo_codec_refuses_wrong_lengths_and_foreign_ids_and_names_the_field_it_cannot_encode():
    codec = cm.PdoCodec((cm.TPDO1, cm.TPDO2), [1, 2])
    assert codec.decode(cm.TPDO1.cob_id(3), bytes(7)) is None            # node 3 is not ours
    assert codec.decode(cm.RPDO1.cob_id(1), bytes(7)) is None            # nor an RPDO
    with pytest.raises(cm.CanFrameError, match="TPDO2 of node 2: DLC 7, expected 8"):
        codec.decode(cm.TPDO2.cob_id(2), bytes(7))
    with pytest.raises(cm.CanFrameError, match="position_actual"):
        codec.encode(0, 0, (0, 2 ** 31, 8))
    with pytest.raises(cm.CanFrameError, match="share a COB-ID"):
        cm.PdoCodec((cm.TPDO1,), [1, 1])
