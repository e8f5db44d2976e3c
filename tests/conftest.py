import os
import sys
from pathlib import Path

# One BLAS thread: the suite's linear algebra is small, and on a shared 2-core machine OpenBLAS's thread
# pool makes a 720x58 SVD 10-100x slower. Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).parent))  # the test helpers (chains.py)


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    """Compile (or load from numba's disk cache) the simulator's, the driver's, the planning's and the dynamics'
    kernels once, before the first test: a first-call compile inside a test's bounded wait (a CAN SYNC answer, a
    pty read, a CLI subprocess) would otherwise time out on a fresh checkout. Here, outside any test, the per-test
    time limit does not count a cold compile on a busy machine (minutes) against the first test. Two processes
    share the compile (tests/warm_kernels.py): numba compiles on one core."""
    if not session.items or session.config.option.collectonly:
        return
    import time

    import warm_kernels

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    started = time.monotonic()
    if reporter is not None:
        reporter.write_line("compiling the simulator's, the driver's and the dynamics' kernels (cached after the "
                            "first run) ...")
    if warm_kernels.helper_half_cached():       # a warm cache: loading all of them here is quicker
        warm_kernels.warm_here()
        warm_kernels.warm_helper_half()
        if reporter is not None:
            reporter.write_line(f"kernels ready in {time.monotonic() - started:.1f} s")
        return
    helper = warm_kernels.start_helper()
    try:
        warm_kernels.warm_here()
    except BaseException:
        helper.kill()
        helper.communicate()
        raise
    here = time.monotonic() - started
    done, said = warm_kernels.finish_helper(helper)
    if not done:                    # its half in this process then: the tests need the kernels either way
        if reporter is not None:
            reporter.write_line(f"{said}; compiling its kernels here")
        warm_kernels.warm_helper_half()
    if reporter is not None:
        reporter.write_line(f"kernels ready in {time.monotonic() - started:.1f} s (this process {here:.1f} s, the "
                            f"helper process {said if done else 'failed'})")


@pytest.fixture(scope="session", autouse=True)
def _planner_started_ahead():
    """Each driver a test starts takes a planner process that was started (and has loaded its kernels) while
    the tests before it ran, instead of waiting for a fresh one (driver.planner.keep_spare); the last spare is
    stopped at the end of the run."""
    from driver.planner import keep_spare

    keep_spare(True)
    yield
    keep_spare(False)


# -- shared fixtures: a module's own fixture of the same name takes precedence -------------------------------
@pytest.fixture(scope="module")
def model():
    """The generic6 model, loaded once per test module."""
    from ident.model import load_model

    return load_model("generic6")


@pytest.fixture
def driver(model):
    """A driver on the in-process simulator (tests/local_driver.py) for one test: (driver, simulator)."""
    from local_driver import local_driver

    with local_driver(model) as running:
        yield running


# -- the soak marker ------------------------------------------------------------------------------------
# Soak tests (tests/test_soak.py, 10 minutes) run only when asked for: `python -m pytest -m soak
# tests/test_soak.py`, or ARMID_SOAK=1 in the environment. Elsewhere they are skipped.
def pytest_configure(config):
    config.addinivalue_line("markers", "soak: long-running test, run with `python -m pytest -m soak tests/test_soak.py`")


def pytest_collection_modifyitems(config, items):
    if "soak" in (config.getoption("markexpr") or "").replace("not soak", "") or os.environ.get("ARMID_SOAK"):
        return
    skip = pytest.mark.skip(reason="soak test: run with `python -m pytest -m soak tests/test_soak.py`")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
