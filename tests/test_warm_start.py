"""Nothing compiles in a running cycle: a driver in a fresh interpreter (tests/compile_probe.py: a free-running
serial arm behind a pty, in the same process) loads every kernel the cycle calls before Driver.start() returns,
the point where it tells systemd READY=1; enabling, a move, servo sessions in both modes, a quick stop and a
fault reset then add no signature to any numba kernel of ours (a new one is a compile or a cache load inside the
cycle: hundreds of ms on a loaded machine, the watchdog's "no new data") and fault nothing.

With an empty NUMBA_CACHE_DIR (everything compiled from scratch, minutes on a loaded 2-core machine) the same
holds; that run is opt-in (`-m e2e`).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from armid import chain

PROBE = Path(__file__).with_name("compile_probe.py")


def _probe(env: dict[str, str], timeout_s: float) -> dict:
    done = subprocess.run([sys.executable, str(PROBE)], env=env, capture_output=True, text=True, timeout=timeout_s,
                          cwd=PROBE.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_after_start_no_kernel_of_the_cycle_compiles_or_loads_and_nothing_faults():
    got = _probe(chain.child_environment(), 300)
    assert got["kernels"] > 20, got                  # the probe saw the kernels it watches
    assert got["new_signatures"] == {}, got
    assert got["faults"] == [], got


@pytest.mark.e2e
def test_with_an_empty_numba_cache_no_kernel_compiles_in_the_cycle(tmp_path):
    got = _probe({**chain.child_environment(), "NUMBA_CACHE_DIR": str(tmp_path)}, 1200)
    assert got["new_signatures"] == {}, got
