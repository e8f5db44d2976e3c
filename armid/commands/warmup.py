"""`armid warmup`: compile (or load from the cache) the numba kernels once, e.g. as a deploy step or in a
container build, so that no later command pays the compile. Each part runs the real code on a few samples,
so the kernels are compiled for the argument types the commands use."""
from __future__ import annotations

import argparse
import sys
import time

PARTS = ("identify", "ident", "driver")


def register(sub) -> None:
    p = sub.add_parser("warmup", help="compile the numba kernels once (a deploy or container-build step)",
                       description="Runs each part's code on a few samples so that numba compiles its kernels for "
                                   "this machine and caches them (__pycache__ beside the sources, NUMBA_CACHE_DIR, "
                                   "or numba's per-user folder where the sources' folder is read-only). Kernels "
                                   "already cached are only loaded.")
    p.add_argument("--part", choices=(*PARTS, "all"), default="all",
                   help="identify: what armid identify and model show use (the regressor); "
                        "ident: all the dynamics, base parameters, RLS (also ident-service, payload, excite); "
                        "driver: the driver's cycle and HAL, run on the simulated arm, whose kernels it compiles too "
                        "(armid driver, sim; the gateway's register codec compiles on that transport's first run); "
                        "default: ident and driver")
    p.set_defaults(run=run)


def warm_identify() -> None:
    """The kernels of `armid identify` (and `model show`): the regressor, on generic6."""
    from armid.commands.identify import warm_kernels
    from ident.model import load_model

    warm_kernels(load_model("generic6"))


def warm_ident() -> None:
    """The dynamics kernels (regressor, RNEA, mass matrix, forward dynamics, flange kinematics, payload
    regressor), the base parameters and the RLS update, on generic6."""
    import numpy as np

    from ident.model import dynamics
    from ident.model.base_params import base_parameters
    from ident.model import load_model
    from ident.online.rls import RecursiveLS

    model = load_model("generic6")
    rng = np.random.default_rng(0)
    q, qd, qdd = (rng.uniform(-1.0, 1.0, (8, model.n)) for _ in range(3))
    tau = dynamics.rnea(model, q, qd, qdd)
    dynamics.regressor(model, q, qd, qdd)
    dynamics.mass_matrix(model, q)
    dynamics.forward_dynamics(model, q, qd, tau)
    dynamics.flange_kinematics(model, q)
    dynamics.load_regressor(model, q, qd, qdd)
    base = base_parameters(model)
    Yb = base.regressor(dynamics.regressor(model, q, qd, qdd))
    RecursiveLS(base.count, model.n).update(Yb, tau)


COLD_WAIT_S = 600.0     # s: each wait of the driver part (the planner's kernels, a reply, the move), sized for a
                        # cold cache on a loaded 2-core machine (a full compile took minutes there)


def warm_driver() -> None:
    """The driver's cycle on the simulated arm (in this process, on ipc endpoints in a temporary folder):
    start, enable, a short move once the planner has its kernels, stop. (The gateway's register codec compiles
    when that transport first runs.)"""
    import shutil
    import tempfile

    from armid import chain
    from driver.daemon import Driver, Endpoints
    from sim.local_transport import LocalSimArm
    from ident.model import load_model
    from sim import Simulator

    model = load_model("generic6")
    folder = tempfile.mkdtemp(prefix="armid-warmup-")
    sim = Simulator(model, seed=0, realtime=True)
    driver = Driver(model, LocalSimArm(model, simulator=sim),
                    endpoints=Endpoints(f"ipc://{folder}/state", f"ipc://{folder}/commands"), watchdog_s=2.0)
    try:
        driver.start()
        commands = f"ipc://{folder}/commands"
        if not driver.planner.wait_ready(COLD_WAIT_S):
            raise chain.ChainError(f"warmup: the planner process did not load its kernels within {COLD_WAIT_S:g} s")
        deadline = time.monotonic() + COLD_WAIT_S
        while not chain.request(commands, cmd="status").get("drive_states") or \
                set(chain.request(commands, cmd="status")["drive_states"]) & {"UNKNOWN", "NOT READY TO SWITCH ON"}:
            if time.monotonic() > deadline:
                raise chain.ChainError(f"warmup: the simulated drives did not become ready within {COLD_WAIT_S:g} s")
            time.sleep(0.05)
        chain.command(commands, "warmup: enable", cmd="enable", timeout_s=COLD_WAIT_S)
        status = chain.request(commands, COLD_WAIT_S, cmd="status")
        q = [float(x) + 0.01 for x in status.get("q", [0.0] * model.n)]
        chain.command(commands, "warmup: move", cmd="move_to", q=q, speed=0.5, timeout_s=COLD_WAIT_S)
        deadline = time.monotonic() + COLD_WAIT_S
        while chain.request(commands, cmd="status").get("moving") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        driver.stop()
        sim.stop()
        shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    from armid.jit import install_notice

    notice = install_notice()
    started = time.perf_counter()
    parts = ("ident", "driver") if args.part == "all" else (args.part,)
    for part in parts:
        t0 = time.perf_counter()
        before = len(notice.compiled)
        {"identify": warm_identify, "ident": warm_ident, "driver": warm_driver}[part]()
        fresh = notice.compiled[before:]
        print(f"armid warmup: {part}: {len(fresh)} kernel(s) compiled"
              + (f" ({sum(s for _, s in fresh):.1f} s)" if fresh else ", the rest loaded from the cache")
              + f"; {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(f"armid warmup: done in {time.perf_counter() - started:.1f} s ({len(notice.compiled)} kernel(s) compiled)")
    return 0
