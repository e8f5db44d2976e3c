"""The suite runs with the `test` extra installed, so a test that skips when an optional library is missing
(pytest.importorskip) must never skip in the README's run: a broken install fails here, by name, instead of
quietly dropping the ROS 2, Pinocchio or Foxglove checks."""
import importlib
import importlib.metadata as metadata

import pytest
from packaging.requirements import Requirement

# the libraries tests import with importorskip, by the module name they import
OPTIONAL_IMPORTS = {"cyclonedds": "cyclonedds", "rosbags": "rosbags", "pin": "pinocchio",
                    "foxglove-sdk": "foxglove", "threadpoolctl": "threadpoolctl"}


def _requirements(extras: set[str], seen: set[str] | None = None) -> list[Requirement]:
    """armid's requirements for these extras, following armid[...] self-references."""
    seen = set() if seen is None else seen
    out = []
    for text in metadata.requires("armid") or []:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in extras):
            continue
        if req.marker is None and extras != {""}:
            continue                     # the core's requirements: checked by the install itself
        if req.name == "armid":
            nested = set(req.extras) - seen
            seen |= nested
            out += _requirements(nested, seen) if nested else []
        else:
            out.append(req)
    return out


def test_every_requirement_of_the_test_extra_is_installed_at_a_version_it_allows():
    reqs = _requirements({"test"})
    names = {r.name for r in reqs}
    assert {"pytest", "cyclonedds", "pin", "rosbags", "matplotlib"} <= names, names
    missing = []
    for req in reqs:
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{req.name} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(f"{req.name} {version} (wanted {req.specifier})")
    assert not missing, "the test extra is not fully installed: " + ", ".join(missing)


@pytest.mark.parametrize("distribution", sorted(OPTIONAL_IMPORTS))
def test_the_optional_libraries_the_tests_skip_without_actually_import(distribution):
    assert distribution in {r.name for r in _requirements({"test"})}, f"{distribution} left the test extra"
    importlib.import_module(OPTIONAL_IMPORTS[distribution])
