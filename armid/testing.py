"""A pytest plugin for hardware-in-the-loop tests against the simulated arm: `armid sim` behind a transport
and `armid driver` on it, as processes on loopback (armid.chain), with a connected armid.client.ArmClient.

Installed with armid (the `pytest11` entry point), so a test suite gets the fixture without a conftest:

    def test_my_motion(armid_hil):
        rig = armid_hil("serial")                      # or "can", "gateway"; clocking="free" (default) | "lockstep"
        rig.client.enable()
        rig.client.move_to([0.2, 0, 0, 0, 0, 0], wait=True)
        assert abs(rig.client.latest().q[0] - 0.2) < 2e-3

Every rig the test made is stopped after it (the recorder finishes its file, the driver brings the drives to
rest, the simulator stops), also when the test fails; their logs are in the test's tmp_path (`rig.workdir`).
`rig.record(path)` starts `armid record` on the rig's stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from armid import chain
from armid.client import ArmClient


@dataclass
class HilRig:
    """A running simulator and driver, and a client connected to the driver."""

    transport: str
    clocking: str
    chain: chain.Chain
    client: ArmClient

    @property
    def workdir(self) -> Path:
        return self.chain.workdir

    def record(self, path: str | Path) -> None:
        """Start `armid record` on the rig's stream into path (.mcap); it is finished when the rig stops."""
        self.chain.start_recorder(Path(path).resolve())


@pytest.fixture
def armid_hil(tmp_path):
    """A factory: armid_hil(transport="serial", clocking="free", rate_hz=None, seed=0) -> HilRig."""
    rigs: list[HilRig] = []

    def make(transport: str = "serial", clocking: str = "free", rate_hz: float | None = None,
             seed: int = 0) -> HilRig:
        plan = chain.plan_for(transport, rate_hz, clocking)
        run = chain.Chain(tmp_path / f"hil-{len(rigs)}-{transport}-{clocking}", plan).__enter__()
        rig = HilRig(transport, clocking, run, ArmClient(run.state, run.commands, timeout_s=30.0))
        rigs.append(rig)
        run.start_sim(seed=seed)
        run.start_driver()
        return rig

    try:
        yield make
    finally:
        for rig in reversed(rigs):
            rig.client.close()
            rig.chain.stop()
