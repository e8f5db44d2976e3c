"""report.html of `armid identify --reference MODEL`: the comparison table holds, per base parameter, the
identified value and std of result.json, the reference model's value (checked against an independent route:
RNEA of the reference model solved for the base parameters) and the difference in sigma, flagged beyond 3;
the report names its provenance (version, UTC time, command line, the inputs' SHA-256) as result.json does."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shlex
from html.parser import HTMLParser
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tomli_w

from armid import cli
from ident.model import dynamics
from ident.fit import excitation
from ident.outputs import results
from ident.model.base_params import base_parameters, random_states
from ident.model import load_model
from degraded import write_csv

RATE = 200.0
NOISE = 0.02   # N m


class Tables(HTMLParser):
    """The text of every cell of the tables with an id, and of the list with id "provenance"."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.items: dict[str, list[str]] = {}
        self._table = self._list = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "id" in a:
            self._table = self.tables.setdefault(a["id"], [])
        elif tag == "ul" and "id" in a:
            self._list = self.items.setdefault(a["id"], [])
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th", "li") and (self._table is not None or self._list is not None):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._table is not None and self._cell is not None:
            self._table[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "li" and self._list is not None and self._cell is not None:
            self._list.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "ul":
            self._list = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("refreport")
    model = load_model("generic6")
    rng = np.random.default_rng(11)
    t, q, qd, qdd = excitation.preset("seed000").sample(RATE)
    tau = dynamics.rnea(model, q, qd, qdd)
    data = write_csv(d / "run.csv", t, q, tau + rng.normal(0, NOISE, tau.shape))
    np.savez(d / "val.npz", t=t, q=q, tau=tau + rng.normal(0, NOISE, tau.shape))
    # the reference: generic6 with a heavier last link and more viscous friction on joint 2 (some parameters
    # far outside 3 sigma, the rest the same as the arm's)
    doc = results.model_document(model)
    link = doc["joint"][5]["link"]          # the whole body 1.5 times as dense: still one that can exist
    link["mass"] *= 1.5
    link["inertia_origin"] = [1.5 * x for x in link["inertia_origin"]]
    doc["joint"][1]["drive"]["fv"] += 0.5
    ref = d / "reference.toml"
    ref.write_text(tomli_w.dumps(doc))
    argv = ["identify", str(data), "--model", "generic6", "-o", str(d / "out"), "--validate", str(d / "val.npz"),
            "--trajectory", "seed000", "--reference", str(ref), "--arm-id", "arm-3", "--quiet"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(argv) == 0
    (d / "stdout.txt").write_text(printed.getvalue())
    parser = Tables()
    parser.feed((d / "out" / "report.html").read_text())
    return d, json.loads((d / "out" / "result.json").read_text()), parser, argv


def reference_base_values(path: Path) -> np.ndarray:
    """The reference model's base parameters by another route than the projection the code uses: its RNEA
    torques at random states, solved for the base regressor's coefficients (exact: the residual is checked)."""
    ref = load_model(path)
    base = base_parameters(load_model("generic6"))
    q, qd, qdd = random_states(ref, 400, seed=5)
    W = base.regressor(dynamics.regressor(ref, q, qd, qdd)).reshape(-1, base.count)
    tau = dynamics.rnea(ref, q, qd, qdd).ravel()
    beta, *_ = np.linalg.lstsq(W, tau, rcond=None)
    assert np.max(np.abs(W @ beta - tau)) < 1e-9 * max(1.0, np.max(np.abs(tau)))
    return beta


def test_report_table_holds_identified_std_reference_and_sigma_difference(run):
    d, doc, parser, _ = run
    table = parser.tables["reference-comparison"]
    assert table[0] == ["name", "identified", "std", "reference", "difference (sigma)", "flag"]
    rows = table[1:]
    params = doc["base_parameters"]
    assert [r[0] for r in rows] == [p["name"] for p in params]
    value = np.array([p["value"] for p in params])
    std = np.array([p["std"] for p in params])
    ref = reference_base_values(d / "reference.toml")
    z = (value - ref) / std
    cells = np.array([[float(c) for c in r[1:5]] for r in rows])
    np.testing.assert_allclose(cells[:, 0], value, rtol=1e-5, atol=1e-12)      # 6 significant digits
    np.testing.assert_allclose(cells[:, 1], std, rtol=1e-2)                     # 3
    np.testing.assert_allclose(cells[:, 2], ref, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(cells[:, 3], z, rtol=1e-3, atol=1e-3)            # 4
    flagged = np.array([r[5] == "beyond 3 sigma" for r in rows])
    np.testing.assert_array_equal(flagged, np.abs(z) > 3)
    assert 0 < flagged.sum() < len(rows) // 2      # the changed link and friction, not the rest
    assert f"{int((~flagged).sum())} of {len(rows)} base parameters within 3" in (d / "out" / "report.html").read_text()


def test_result_json_and_report_carry_the_same_comparison(run):
    d, doc, parser, _ = run
    block = doc["reference"]
    assert block["model"] == "reference.toml"
    np.testing.assert_allclose(block["values"], reference_base_values(d / "reference.toml"), rtol=1e-9, atol=1e-12)
    rows = parser.tables["reference-comparison"][1:]
    assert block["flagged"] == [r[5] == "beyond 3 sigma" for r in rows]


def test_the_comparison_is_labelled_with_the_file_passed_not_the_models_robot_name(run):
    d, doc, *_ = run
    robot = load_model(d / "reference.toml").name
    assert robot == "generic6"          # the variant keeps its robot's name: a label by name would not tell them apart
    printed = (d / "stdout.txt").read_text()
    within = [line for line in printed.splitlines() if "base parameters within" in line]
    assert len(within) == 1 and within[0].endswith("sigma of reference.toml"), printed
    assert "reference.toml" in printed.splitlines()[0]        # the table's column
    page = (d / "out" / "report.html").read_text()
    assert "Comparison with the reference model reference.toml" in page
    assert f"of {robot}" not in printed and f"reference model {robot}" not in page


def test_report_shows_the_comparison_plot_and_the_references_torque_on_validation(run):
    d, *_ = run
    page = (d / "out" / "report.html").read_text()
    assert '<img src="reference.png"' in page and (d / "out" / "reference.png").stat().st_size > 1000
    assert (d / "out" / "validation.png").is_file()


def test_report_names_the_provenance_of_result_json(run):
    d, doc, parser, argv = run
    prov = doc["provenance"]
    facts = dict(item.split(": ", 1) for item in parser.items["provenance"])
    assert facts["armid version"] == metadata.version("armid") == prov["armid_version"]
    assert facts["created (UTC)"] == prov["created_utc"]
    assert facts["arm id"] == "arm-3"
    assert shlex.split(facts["command line"]) == ["armid", *argv]
    inputs = {r[0]: r[1:] for r in parser.tables["provenance-inputs"][1:]}
    assert inputs["recording"] == ["../run.csv", digest(d / "run.csv")]
    assert inputs["validation"] == ["../val.npz", digest(d / "val.npz")]
    assert inputs["reference"] == ["../reference.toml", digest(d / "reference.toml")]
    assert inputs["model"][1] == prov["model"]["sha256"]


def test_identify_without_reference_writes_no_comparison(tmp_path, run):
    d, *_ = run
    assert cli.main(["identify", str(d / "run.csv"), "--model", "generic6", "-o", str(tmp_path / "o"),
                     "--trajectory", "seed000", "--quiet"]) == 0
    assert "reference" not in json.loads((tmp_path / "o" / "result.json").read_text())
    assert 'id="reference-comparison"' not in (tmp_path / "o" / "report.html").read_text()
