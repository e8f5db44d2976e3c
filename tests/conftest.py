import os
import sys
from pathlib import Path

# One BLAS thread: the suite's linear algebra is small, and on a shared 2-core machine OpenBLAS's thread
# pool makes a 720x58 SVD 10-100x slower. Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).parent))  # the test helpers (chains.py)
