"""armid's simulated arm: plant (ident dynamics, friction, sensors), CiA 402 drives, time, fault injection.

    from sim import Simulator
    sim = Simulator("generic6")          # synchronous: sim.step(n); or sim.start() / sim.stop()

See docs/reference/simulator.md.
"""
from sim.clock import LatenessStats
from sim.drive import DriveConfig
from sim.faults import FaultInjection, Fate
from sim.plant import FrictionConfig, NoiseConfig
from sim.device_contract import DeviceSide
from sim.simulator import TRANSPORTS, SimState, Simulator, SimTransport, TrueState

__all__ = ["Simulator", "SimState", "DeviceSide", "SimTransport", "TrueState", "TRANSPORTS", "NoiseConfig", "FrictionConfig",
           "DriveConfig", "FaultInjection", "Fate", "LatenessStats"]
