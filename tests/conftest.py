import os
import sys
from pathlib import Path

# One BLAS thread: the suite's linear algebra is small, and on a shared 2-core machine OpenBLAS's thread
# pool makes a 720x58 SVD 10-100x slower. Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).parent))  # the test helpers (chains.py)


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels():
    """Compile (or load from numba's disk cache) the simulator's and the dynamics' kernels once, before any
    test: a first-call compile inside a test's bounded wait (a CAN SYNC answer, a pty read) would
    otherwise time out on a fresh checkout."""
    from sim import Simulator

    Simulator("generic6", seed=0).step(2)
