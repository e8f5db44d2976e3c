"""The `sim` transport: a sim.Simulator in this process, read and commanded directly (no wire). It registers
itself with the driver by name, as python-can's interfaces do (the entry point `sim` of the group
"armid.transports" in pyproject.toml), so the driver never imports the simulator.

Lockstep (default when this transport creates the simulator, or is given one that is not running): the
driver's cycle is the simulator's clock, as the SYNC master is on CAN: begin_cycle() steps the simulator
one cycle, so every driver cycle carries exactly one new device sample. Otherwise (a simulator already
running on its own clock) each read copies its newest published sample. Current and torque are already
SI, so no wire scaling is involved.
"""
from __future__ import annotations

import time

from firmware_bridge.runtime.options import Option, OptionSet
from firmware_bridge.runtime.transport_contract import Arm, ArmCommand, ArmState, LinkError
from sim.plant import INTEGRATORS
from sim.simulator import SimState, Simulator


# the simulator's options (sim.Simulator checks their values); realtime is accepted and ignored
SIM_OPTIONS = OptionSet(
    "sim",
    Option("realtime", "any", what="true or false", doc="accepted and ignored: the driver's cycle steps the simulator"),
    Option("seed", "any", 0, what="an integer", doc="the sensors' and fault injection's random generators"),
    Option("substeps", "any", what="an integer",
           doc="integrator substeps per cycle (left out: the fewest that keep the friction model stable)"),
    Option("integrator", "any", "rk4", what=f"one of {', '.join(INTEGRATORS)}", doc="the plant's integrator"),
    Option("q0", "any", what="one angle per joint (rad)", doc="the initial position"),
    Option("brakes", "any", True, what="true or false",
           doc="a drive that is not powered holds its joint (false: the joint is free and falls)"),
    *(Option(name, "any", in_config=False) for name in ("noise", "friction", "drive")))


class LocalSimArm(Arm):
    """Arm over an in-process simulator: LocalSimArm(model, simulator=None, **simulator_options)."""

    OPTION_SPEC = SIM_OPTIONS

    def __init__(self, model, simulator=None, **simulator_options):
        simulator_options = {k: v for k, v in SIM_OPTIONS.parse(simulator_options).items() if k in simulator_options}
        if simulator is None:
            simulator_options.pop("realtime", None)      # the driver's cycle keeps the time
            simulator = Simulator(model, **simulator_options)
            self._owned = True
        else:
            self._owned = False
        self.lockstep = not simulator.running
        self.sim = simulator
        self.n = simulator.n
        self._sample = SimState.empty(self.n)
        self._last_cycle = -1
        self._reads = 0
        self._lost = 0

    def open(self) -> None:
        self.lockstep = not self.sim.running
        if self.lockstep:
            self.sim.warm_up()          # the kernels load here, not in the driver's first cycle

    def close(self) -> None:
        if self._owned:
            self.sim.stop()

    def begin_cycle(self) -> None:
        if self.lockstep:
            try:
                self.sim.step(1)
            except Exception as exc:  # noqa: BLE001 - the simulator failing is this link failing
                raise LinkError(f"simulator step failed: {exc}") from exc

    def read(self, out: ArmState) -> bool:
        if self.sim.error is not None:
            raise LinkError(f"simulator failed: {self.sim.error}")
        s = self.sim.read_state(self._sample)
        out.host_time_ns = time.time_ns()
        out.device_time_ns = int(round(s.time * 1e9))
        out.q[:] = s.position
        out.qd[:] = s.velocity
        out.current[:] = s.current
        out.torque[:] = s.torque
        out.statusword[:] = s.statusword
        out.error_code[:] = s.error_code
        out.mode[:] = s.mode_display
        fresh = s.cycle != self._last_cycle
        if fresh and self._last_cycle >= 0 and s.cycle > self._last_cycle + 1:
            self._lost += s.cycle - self._last_cycle - 1     # a free-running simulator stepped past unread samples
        self._last_cycle = s.cycle
        self._reads += 1
        return fresh

    def lost_samples(self) -> int:
        """Simulator cycles that passed unread (only when the simulator runs on its own clock)."""
        return self._lost

    def write(self, command: ArmCommand) -> None:
        self.sim.set_commands(controlword=command.controlword, mode=command.mode,
                              target_position=command.target_position, target_torque=command.target_torque,
                              torque_offset=command.torque_offset)

    def link_stats(self) -> dict:
        return {"transport": "sim", "reads": self._reads, "device_cycle": int(self._last_cycle),
                "samples_lost": self._lost}
