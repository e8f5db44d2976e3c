"""Every transport's capability flags say what it does: a flag is True exactly when the class overrides the methods
its base declares for it (Arm.CAPABILITIES on the driver's side, DeviceSide.CAPABILITIES on the simulator's), so
no flag can promise a method the class leaves at its default, nor hide one it implements."""
from __future__ import annotations

import pytest

from driver.transports import TRANSPORTS, transport_class
from firmware_bridge.runtime.transport_contract import Arm, lying_flags
from sim.device_contract import DeviceSide, device_class, registered

CLASSES = [(Arm, transport_class(name)) for name in sorted(TRANSPORTS)] + [
    (DeviceSide, device_class(name)) for name in sorted(registered())]


def test_both_sides_have_their_transports_registered():
    assert set(TRANSPORTS) == {"sim", "serial", "can", "gateway"}
    assert set(registered()) == {"serial", "can", "gateway"}


@pytest.mark.parametrize("base, cls", CLASSES, ids=[f"{b.__name__}:{c.__name__}" for b, c in CLASSES])
def test_each_capability_flag_matches_the_methods_the_class_overrides(base, cls):
    assert issubclass(cls, base)
    assert lying_flags(cls, base) == []


@pytest.mark.parametrize("base, cls", CLASSES, ids=[f"{b.__name__}:{c.__name__}" for b, c in CLASSES])
def test_a_flag_turned_around_is_caught(base, cls):
    for flag in base.CAPABILITIES:
        liar = type(f"Lying{cls.__name__}", (cls,), {flag: not getattr(cls, flag)})
        assert [w for w in lying_flags(liar, base) if f".{flag} =" in w], flag


def test_a_method_overridden_without_its_flag_is_caught():
    class Quiet(Arm):
        def wait_new(self, timeout_s):
            return True

    class HalfPump(Arm):
        cycle_reads_link = True

        def pump_new(self, timeout_s):
            return True

    assert lying_flags(Quiet, Arm) == ["Quiet.streams_on_own_clock = False, overrides wait_new of wait_new"]
    assert [w for w in lying_flags(HalfPump, Arm) if "cycle_reads_link" in w]
