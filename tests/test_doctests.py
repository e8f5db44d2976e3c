"""The public API's docstrings: numpydoc sections on every documented entry point, and their examples run as
doctests, so what the documentation shows is what the code does."""
from __future__ import annotations

import doctest
import importlib
import inspect
import io

import numpy as np
import pytest

# Modules whose docstring examples run. armid.client's need a running driver: see the `driver_globals` fixture.
MODULES = ["ident.model.dynamics", "ident.model.model_file", "ident.model.robot", "ident.model.base_params", "ident.fit.batch", "ident.fit.excitation", "ident.fit.estimate",
           "ident.payload.body", "ident.payload.methods", "ident.payload.dynamic", "ident.payload.static",
           "ident.payload.balance", "ident.calibration.synthesis", "ident.calibration.fit", "ident.calibration.model",
           "ident.calibration.planning", "ident.calibration.io", "ident.model.urdf_export", "ident.outputs.fleet"]

# The public entry points that carry every numpydoc section (a function without arguments has no Parameters, a
# class no Returns, a generator Yields instead).
ENTRY_POINTS = [
    "ident.model.dynamics:" + name for name in ("rnea", "regressor", "mass_matrix", "gravity_torques", "coriolis_torques",
                                        "forward_dynamics", "flange_pose", "jacobian", "flange_kinematics",
                                        "load_regressor")
] + [
    "ident.model:load_model", "ident.model.base_params:base_parameters", "ident.fit.batch:identify", "ident.fit.excitation:design",
    "ident.fit.excitation:check", "ident.fit.excitation:load", "ident.fit.excitation:save", "ident.fit.excitation:preset",
    "ident.fit.estimate:ols", "ident.fit.estimate:wls", "ident.payload.body:payload_parameters",
    "ident.payload.methods:identify_one", "ident.payload.dynamic:identify", "ident.payload.static:identify",
    "ident.payload.balance:identify", "ident.calibration.model:from_model", "ident.calibration.synthesis:synthesize",
    "ident.calibration.fit:identify", "ident.calibration.planning:d_optimal", "ident.calibration.io:read_measurements",
    "ident.model.urdf_export:write_urdf", "ident.outputs.fleet:identify_many",
    "armid.client:ArmClient", "armid.client:ArmClient.request", "armid.client:ArmClient.enable",
    "armid.client:ArmClient.move_to", "armid.client:ArmClient.run_trajectory", "armid.client:ArmClient.servo",
    "armid.client:ArmClient.latest", "armid.client:ArmClient.samples", "armid.client:ArmClient.wait_motion",
]
SECTIONS = ("Parameters", "Returns", "Raises", "Examples")


def run_doctests(module_name: str, extraglobs: dict | None = None) -> tuple[int, str]:
    """Run the docstring examples of a module: (examples run, the report of the failures ('' when none))."""
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module, module_name, extraglobs=extraglobs):
        runner.run(test, out=report.write)
    return runner.tries, report.getvalue()


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run_as_written(module_name):
    with np.printoptions(legacy=False):
        tries, failures = run_doctests(module_name)
    assert tries > 0, f"{module_name}: no docstring examples"
    assert not failures, failures


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_public_entry_points_have_the_numpydoc_sections(entry):
    module_name, name = entry.split(":")
    obj = importlib.import_module(module_name)
    for part in name.split("."):
        obj = getattr(obj, part)
    doc = inspect.getdoc(obj) or ""
    takes_arguments = bool([p for p in inspect.signature(obj).parameters if p != "self"])
    for section in SECTIONS:
        if (section == "Parameters" and not takes_arguments) or (section == "Returns" and inspect.isclass(obj)):
            continue
        if section == "Returns" and inspect.isgeneratorfunction(obj):
            section = "Yields"
        assert f"\n{section}\n{'-' * len(section)}\n" in doc, f"{entry}: no {section} section"


@pytest.fixture(scope="module")
def driver_globals():
    """A driver on the in-process simulated generic6 arm, as the client's examples assume it (`driver`), and a
    client connected to it (`arm`); both stopped after the module's tests."""
    from local_driver import local_driver

    from armid.client import ArmClient
    from ident.model import load_model

    with local_driver(load_model("generic6"), seed=0) as (driver, _):
        with ArmClient(driver.bound["state"], driver.bound["commands"], timeout_s=30.0) as arm:
            yield {"driver": driver, "arm": arm}


def test_the_clients_docstring_examples_run_against_a_simulated_driver(driver_globals):
    tries, failures = run_doctests("armid.client", driver_globals)
    assert tries > 0 and not failures, failures
