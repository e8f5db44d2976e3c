"""The numba kernels the tests call, compiled (or loaded from numba's disk cache) before the first test, on two
cores: the session's own process warms the simulator's and the driver's (`warm_here`) while a second process
warms the planning's and identification's (`python tests/warm_kernels.py`, started by `start_helper`). numba
compiles a kernel on one core, so on a fresh checkout the two halves take about as long together as the longer
one alone. Either process's compile lands in numba's cache beside the sources, where the other, and every later
process (a test's CLI subprocess too), loads it instead of compiling it again."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HELPER_TIMEOUT_S = 1800.0   # s: a cold compile of the helper's half on a loaded 2-core machine took minutes


def warm_helper_half() -> None:
    """The planning's kernels (the rnea behind a plan's feed-forward), then the dynamics', base parameters' and
    RLS's (armid warmup's ident part), and the external wrench's (the simulator's pushes)."""
    import numpy as np

    from armid.commands.warmup import warm_ident
    from driver import motion
    from ident.model import dynamics, load_model

    model = load_model("generic6")
    motion.warm_up(model, 1000.0)
    warm_ident()
    dynamics.wrench_torques(model, np.zeros(model.n), model.n, np.zeros(3), np.ones(3))


def helper_half_cached() -> bool:
    """True when numba's cache holds the helper's kernels already (every run after the first): this process then
    loads them itself in less time than a second process takes to start."""
    from armid.jit import cached_signatures
    from ident.model import kernels
    from ident.online import rls

    return all(cached_signatures(k) for k in (kernels.rnea, kernels.regressor, kernels.mass_matrix,
                                               kernels.forward_dynamics, kernels.flange_kinematics,
                                               kernels.load_regressor, kernels.wrench_torques, rls.rls_update))


def warm_here() -> None:
    """The simulator's kernels (plant, drives, the mass matrix), then the driver's: its cycle, HAL, compensation,
    observer, servo shaping and the planning it does in its own process (Driver.warm_up, nothing started)."""
    from driver.daemon import Driver, Endpoints
    from ident.model import load_model
    from sim import Simulator
    from sim.local_transport import LocalSimArm

    model = load_model("generic6")
    sim = Simulator(model, seed=0)
    sim.step(2)
    Driver(model, LocalSimArm(model, simulator=sim),
           endpoints=Endpoints("inproc://warm-kernels-state", "inproc://warm-kernels-commands")).warm_up()


def start_helper() -> subprocess.Popen:
    """The second process, importing the same source tree as this one (its cache is the one the tests load)."""
    import armid

    root = str(Path(armid.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve())], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish_helper(helper: subprocess.Popen) -> tuple[bool, str]:
    """Wait (at most HELPER_TIMEOUT_S) for the helper: (True, the seconds it took) when it did its half, else
    (False, why not, with the end of its output) after stopping it."""
    try:
        output, _ = helper.communicate(timeout=HELPER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        helper.kill()
        output, _ = helper.communicate()
        return False, f"the kernel helper process did not end within {HELPER_TIMEOUT_S:g} s: {output[-2000:]}"
    if helper.returncode != 0:
        return False, f"the kernel helper process exited {helper.returncode}: {output[-2000:]}"
    return True, output.strip().splitlines()[-1] if output.strip() else ""


if __name__ == "__main__":
    started = time.monotonic()
    warm_helper_half()
    print(f"{time.monotonic() - started:.1f} s")
