"""The layers of the design hold (pyproject.toml, [tool.importlinter]): armid on top, sim and driver side by side
and never importing each other, ident below them, firmware_bridge at the bottom. No package has an import
cycle between its parts. import-linter checks every import, those inside functions too; the checker is shown to
fail on a copy of the sources with one bad import."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("armid", "sim", "driver", "ident", "firmware_bridge")
CONTRACTS = ("armid > (sim | driver) > ident > firmware_bridge", "sim and driver never import each other",
             "no import cycles between the parts of any package")
_LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    """import-linter on cwd/pyproject.toml in its own process (its import graph is built from the packages found
    first on sys.path: pythonpath ahead of the installed ones when given)."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(pythonpath), env.get("PYTHONPATH"))))
    return subprocess.run([sys.executable, "-c", _LINT, "--no-cache", "--no-logo", "pyproject.toml"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def _verdicts(out: str) -> dict[str, str]:
    return {name: m.group(1) for name in CONTRACTS
            if (m := re.search(re.escape(name) + r" (KEPT|BROKEN)", out))}


def test_every_layer_imports_only_the_layers_below_it():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert _verdicts(run.stdout) == dict.fromkeys(CONTRACTS, "KEPT"), run.stdout
    assert "3 kept, 0 broken" in run.stdout


@pytest.mark.parametrize("module, bad_import, broken", [
    # a lazy import (inside a function) of the driver from the simulator breaks both contracts
    ("sim/plant.py", "from driver.hal import copy_sample", CONTRACTS[:2]),
    # the bottom layer importing the mathematics above it breaks the layers only
    ("firmware_bridge/units.py", "import ident.model", CONTRACTS[:1]),
    # the kernels' spatial algebra importing the dynamics built on it closes a cycle, even inside a function
    ("ident/model/spatial.py", "from ident.model import dynamics", CONTRACTS[2:]),
], ids=["sim-imports-driver-in-a-function", "firmware_bridge-imports-ident", "a-cycle-inside-ident-model"])
def test_the_check_fails_on_an_import_against_the_layers(tmp_path, module, bad_import, broken):
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / module, "a") as f:
        f.write(f"\n\ndef _against_the_layers():\n    {bad_import}\n")
    run = _lint(tmp_path, pythonpath=tmp_path)
    assert run.returncode != 0, run.stdout + run.stderr
    want = {name: "BROKEN" if name in broken else "KEPT" for name in CONTRACTS}
    assert _verdicts(run.stdout) == want, run.stdout
    dotted = module.removesuffix(".py").replace("/", ".")
    package, leaf = dotted.rsplit(".", 1)
    # the offending module is named: in full by the layers, relative to its package by the cycle check
    assert dotted in run.stdout or (f"in {package}." in run.stdout and f".{leaf} ->" in run.stdout), run.stdout
