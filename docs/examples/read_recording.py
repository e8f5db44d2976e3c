"""Read a driver's MCAP recording, turn it into the identification data file (CSV) and load that.

Without an argument, a driver on the simulated generic6 arm records a short move into run.mcap first (a
driver config's [record] section and `armid record` write the same file); give your own .mcap to read it.

usage: python read_recording.py [RUN.mcap]
"""
import sys

import numpy as np

from armid.client import ArmClient
from driver.daemon import Driver, Endpoints, Record
from firmware_bridge.recording import identification_arrays, read_recording, write_identification
from ident.model import load_model
from ident.fit.preprocess import load_recording
from sim import Simulator
from sim.local_transport import LocalSimArm

path = sys.argv[1] if len(sys.argv) > 1 else "run.mcap"
if len(sys.argv) == 1:
    model = load_model("generic6")
    sim = Simulator(model, seed=0, realtime=True)
    driver = Driver(model, LocalSimArm(model, simulator=sim), record=Record(path, overwrite=True),
                    endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"), watchdog_s=0.5)
    driver.start()
    try:
        with ArmClient(driver.bound["state"], driver.bound["commands"], timeout_s=30.0) as arm:
            arm.enable()
            arm.move_to([0.3, 0.0, 0.0, 0.0, 0.0, 0.0], wait=True)
    finally:
        driver.stop()                                               # the recording is finished with it
        sim.stop()

log = read_recording(path)                                          # every state message, in file order
missing, gaps = log.seq_gaps()
print(f"{path}: {len(log.states)} messages of {log.n} joints, complete: {log.complete}, "
      f"{missing} missing in {gaps} gaps")
arrays, notes = identification_arrays(log, effort="torque")        # SI arrays, stale samples dropped
write_identification(arrays, "run.csv")                            # or run.npz (docs/reference/data-files.md)
rec = load_recording("run.csv", n=log.n)                            # what `armid identify` reads
print(f"run.csv: {len(rec.t)} samples over {rec.t[-1]:.3f} s of {rec.kind}; joint 1 from "
      f"{rec.q[0, 0]:.3f} to {rec.q[-1, 0]:.3f} rad; same positions: {np.array_equal(rec.q, arrays['q'])}", *notes)
