"""The hardware-in-the-loop fixture (armid.testing's armid_hil, a pytest plugin installed with armid) on every
transport, free-running: a client enables the drives, moves the arm and runs a shipped excitation blended in
from rest, and the stream shows each step."""
from __future__ import annotations

import numpy as np
import pytest

from ident.fit.excitation import preset
from waiting import wait_until  # noqa: E402  (tests/ is on sys.path)

GOAL = [0.2, -0.15, 0.25, 0.1, -0.2, 0.3]


@pytest.mark.parametrize("transport", ["serial", "can", "gateway"])
def test_a_client_moves_the_free_running_simulated_arm_on_every_transport(armid_hil, transport):
    rig = armid_hil(transport)
    arm = rig.client
    assert arm.latest(timeout_s=30).q.shape == (6,)
    arm.enable()
    arm.move_to(GOAL, speed=0.5, wait=True)
    np.testing.assert_allclose(arm.latest().q, GOAL, atol=3e-3)
    reply = arm.run_trajectory(preset="seed000", periods=0.05, blend_s=1.0)
    assert [s["name"] for s in reply["segments"]] == ["move to start", "blend in", "run_trajectory", "blend out"]
    # the newest sample, not the next queued one: a starved client's queue still holds the rest before the motion
    assert wait_until(lambda: arm.latest().moving, 30.0), "the stream never showed the motion"
    arm.wait_motion(reply["duration"] + 30)
    np.testing.assert_allclose(reply["goal"], preset("seed000").q0, atol=0.02)       # back to rest at its mean pose
    arm.wait_arrived(reply["goal"])       # the drives' buffer and tracking end a few cycles after the targets
    assert arm.status()["fault"] is None
    assert arm.seq_gaps == 0


def test_every_rig_is_stopped_after_the_test_and_its_logs_stay(armid_hil):
    rig = armid_hil("serial", clocking="lockstep")
    assert rig.chain.sim.proc.poll() is None and rig.chain.driver.proc.poll() is None
    assert (rig.workdir / "driver.toml").is_file()
