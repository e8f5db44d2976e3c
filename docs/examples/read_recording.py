"""Read a driver's MCAP recording and turn it into the identification data file (CSV), then load that.

The recording is made here by a driver on the simulated generic6 arm ([record] in a driver config, or
`armid record`, write the same file); pass the path of your own .mcap to read that instead.

usage: python read_recording.py [RUN.mcap]
"""
import sys
from pathlib import Path

import numpy as np

from driver.recording import identification_arrays, read_recording, write_identification
from ident.preprocess import load_recording

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("run.mcap")
if len(sys.argv) == 1:                                              # record a short move
    from armid.client import ArmClient
    from driver.daemon import Driver, Endpoints, Record
    from ident.model import load_model
    from sim import Simulator
    from sim.local_transport import LocalSimArm

    path.unlink(missing_ok=True)
    model = load_model("generic6")
    sim = Simulator(model, seed=0, realtime=True)
    driver = Driver(model, LocalSimArm(model, simulator=sim), record=Record(str(path)), watchdog_s=0.5,
                    endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
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
print(f"{path}: {len(log.states)} messages of {log.n} joints {log.joint_names}, complete: {log.complete}, "
      f"{missing} missing in {gaps} gaps")
arrays, notes = identification_arrays(log, effort="torque")        # SI arrays, stale samples dropped
write_identification(arrays, "run.csv")                            # or run.npz (docs/data-files.md)
rec = load_recording("run.csv", n=log.n)                            # what `armid identify` reads
print(f"run.csv: {len(rec.t)} samples over {rec.t[-1] - rec.t[0]:.3f} s, {rec.kind}, "
      f"q range joint 1: {rec.q[:, 0].min():.3f} .. {rec.q[:, 0].max():.3f} rad")
print("same positions as the recording:", bool(np.array_equal(rec.q, arrays["q"])), *notes)
