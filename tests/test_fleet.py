"""A fleet on Dask: 3 simulated arms x 3 nightly runs, one arm's joint-2 friction raised before its last run,
plus a broken recording. The arms differ (their links' inertial parameters scaled), so a comparison across arms would flag
everything. The drift flag finds exactly that arm, run and parameters; Dask (a small in-process
cluster, and `armid identify MANIFEST --scheduler ADDRESS`) gives the serial loop's results exactly; the broken
recording fails with its reason and the others are identified; the table reads back from Parquet and CSV."""
from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from armid import cli
from degraded import write_csv
from rounding import least_squares_bound_of
from ident.model import dynamics
from ident.fit import excitation
from ident.outputs import fleet
from ident.errors import InputError
from ident.model import load_model

RATE = 200.0
NOISE = 0.02                        # N m
ARMS = {"A": 1.0, "B": 1.08, "C": 0.93}   # each arm's links: generic6's inertial parameters times this
DATES = ["2026-03-01T02:00:00", "2026-03-02T02:00:00", "2026-03-03T02:00:00"]
CHANGED_ARM, CHANGED_RUN = "B", 2   # its joint-2 Coulomb and viscous friction x 1.5 from this run on
CHANGED = {"fc2", "fv2"}


def arm_parameters(model, arm: str, run: int) -> np.ndarray:
    P = model.params_matrix().copy()
    P[:, :10] *= ARMS[arm]
    if arm == CHANGED_ARM and run >= CHANGED_RUN:
        P[1, 11:13] *= 1.5
    return P.ravel()


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("fleet")
    model = load_model("generic6")
    t, q, qd, qdd = excitation.preset("seed000").sample(RATE)
    lines = [["arm_id", "model", "recording", "date"]]
    for a, arm in enumerate(ARMS):
        (d / arm).mkdir()
        for r, date in enumerate(DATES):
            tau = dynamics.rnea(model, q, qd, qdd, params=arm_parameters(model, arm, r))
            # the same noise in every run of an arm: only the friction change may move its parameters (with
            # noise drawn anew per run, 3 sigma also flags about 1 % of 58 parameters x 6 comparisons by chance)
            tau = tau + np.random.default_rng(100 * a).normal(0, NOISE, tau.shape)
            write_csv(d / arm / f"night{r}.csv", t, q, tau)
            lines.append([arm, "generic6", f"{arm}/night{r}.csv", date])
    (d / "D").mkdir()
    (d / "D" / "night0.csv").write_text("t,q1,q2\n0,1\n")        # broken: too few fields, wrong joint count
    lines.append(["D", "generic6", "D/night0.csv", DATES[0]])
    with open(d / "manifest.csv", "w", newline="") as f:
        csv.writer(f).writerows(lines)
    return d


@pytest.fixture(scope="module")
def serial(fleet_dir):
    jobs = fleet.read_manifest(fleet_dir / "manifest.csv")
    return fleet.identify_many(jobs, fleet_dir / "serial", {"trajectory": excitation.preset("seed000")},
                               scheduler="serial", progress=False)


@pytest.fixture(scope="module")
def on_dask(fleet_dir):
    from distributed import Client

    jobs = fleet.read_manifest(fleet_dir / "manifest.csv")
    with fleet.local_cluster(2, processes=False) as cluster, Client(cluster) as client:
        return fleet.identify_many(jobs, fleet_dir / "dask", {"trajectory": excitation.preset("seed000")},
                                   client=client, progress=False)


def by_key(rows):
    return {(r["arm_id"], r["run"]): r for r in rows}


def test_drift_flags_exactly_the_changed_arm_run_and_friction(serial):
    rows = by_key(serial.rows)
    flagged = {(arm, run): set(r["drifted"].split(";")) - {""} for (arm, run), r in rows.items()
               if r["status"] == "ok" and r["drifted"]}
    changed_run = fleet.Job(CHANGED_ARM, "generic6", "x", date=DATES[CHANGED_RUN]).run
    assert flagged == {(CHANGED_ARM, changed_run): CHANGED}
    r = rows[(CHANGED_ARM, changed_run)]
    assert r["previous_run"] == fleet.Job(CHANGED_ARM, "generic6", "x", date=DATES[CHANGED_RUN - 1]).run
    assert r["fc2_drift"] is True and r["fv2_drift"] is True and r["fc1_drift"] is False
    firsts = [r for r in serial.rows if r["status"] == "ok" and r["previous_run"] is None]
    assert len(firsts) == len(ARMS) and all(r["fc2_drift"] is None for r in firsts)


def test_identified_friction_tracks_the_truth(serial):
    model = load_model("generic6")
    rows = by_key(serial.rows)
    for arm in ARMS:
        for r, date in enumerate(DATES):
            row = rows[(arm, fleet.Job(arm, "", "", date=date).run)]
            truth = arm_parameters(model, arm, r).reshape(model.n, 14)[1, 11]
            assert abs(row["fc2"] - truth) < 4 * row["fc2_std"] + 1e-9


def test_a_broken_recording_fails_with_its_reason_and_the_rest_are_identified(serial):
    assert len(serial.failures) == 1
    job, reason = serial.failures[0]
    assert job.arm_id == "D" and "night0.csv" in reason
    statuses = [r["status"] for r in serial.rows]
    assert statuses.count("ok") == len(ARMS) * len(DATES) and statuses.count("failed") == 1


def test_dask_gives_the_serial_results_to_rounding(serial, on_dask):
    """Every count is the same; every float is the same up to rounding. Another process sums in another order
    (numpy's and BLAS's vector kernels follow the arrays' alignment), so the floats may differ by what the fit's
    conditioning makes of a backward error: the forward bound of a least-squares solution, which also bounds
    the covariance built from the same triangular factor."""
    s, d = by_key(serial.rows), by_key(on_dask.rows)
    assert s.keys() == d.keys()
    for key in s:
        assert s[key].keys() == d[key].keys()
        params = sum(1 for col in s[key] if col.endswith("_std"))
        fitted = s[key].get("cond") is not None         # a failed job's row has no fit
        bound = least_squares_bound_of(s[key]["cond"], 1.0, 1.0, 0.0, s[key]["rows"], params) if fitted else 0.0
        for col, value in s[key].items():
            if col == "error":
                continue
            if isinstance(value, float):
                assert d[key][col] == pytest.approx(value, rel=bound, abs=0.0), (key, col, bound)
            else:
                assert d[key][col] == value, (key, col)
    assert [j.recording for j, _ in on_dask.failures] == [j.recording for j, _ in serial.failures]


def test_each_run_has_its_result_with_provenance(serial, fleet_dir):
    for r in serial.rows:
        if r["status"] != "ok":
            continue
        doc = json.loads((fleet_dir / "serial" / r["result"]).read_text())
        assert doc["provenance"]["arm_id"] == r["arm_id"]
        rec = (fleet_dir / "serial" / r["result"]).parent / doc["provenance"]["inputs"]["recording"]["path"]
        assert rec.resolve() == (fleet_dir / "serial" / r["recording"]).resolve()
        names = [p["name"] for p in doc["base_parameters"]]
        assert [p["value"] for p in doc["base_parameters"]] == [r[n] for n in names]


def test_table_reads_back_from_parquet_and_csv(serial):
    table = pq.read_table(serial.written["table"]).to_pylist()
    assert len(table) == len(serial.rows)
    for got, want in zip(table, serial.rows):
        for col, value in want.items():
            assert got[col] == value, col
    csv_table = pacsv.read_csv(serial.written["table csv"])
    assert csv_table.num_rows == len(serial.rows)
    np.testing.assert_array_equal(csv_table.column("fc2").to_numpy(zero_copy_only=False).astype(float),
                                  [r.get("fc2", np.nan) for r in serial.rows])


def test_fleet_report_names_the_drift_and_the_failure(serial):
    page = serial.written["report"].read_text()
    assert "fc2, fv2" in page and "night0.csv" in page
    plots = serial.written["report"].parent / "fleet_plots"
    assert (plots / "fc2.png").stat().st_size > 1000 and len(list(plots.glob("*.png"))) == 58


def _overlapping_tick_labels(fig) -> list[tuple[str, str]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    return [(labels[i].get_text(), labels[k].get_text()) for i in range(len(boxes)) for k in range(i + 1, len(boxes))
            if boxes[i].overlaps(boxes[k])]


@pytest.mark.parametrize("nights", [3, 30])
def test_fleet_plots_date_ticks_do_not_overlap(serial, nights):
    from datetime import datetime, timedelta

    from ident.outputs import fleet_report

    ok = [r for r in serial.rows if r["status"] == "ok"]
    if nights != len(DATES):         # the same runs spread over a month of nights
        start = datetime.fromisoformat(DATES[0])
        ok = [dict(r, date=(start + timedelta(days=(nights - 1) * DATES.index(r["date"]) // 2)).isoformat())
              for r in ok]
    xs, xlabel = fleet_report._x(ok)
    assert xlabel == "date"
    fig = fleet_report._figure("fc2", ok, xs, xlabel, legend=True)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(labels) >= 2 and _overlapping_tick_labels(fig) == []


def test_tables_of_two_fleet_runs_concatenate_without_promotion(fleet_dir, serial, tmp_path):
    """A later night whose recording states its lost samples, on an arm with no previous run in that table: its
    columns have the types of the first table's, though none of its values says which."""
    import pyarrow as pa

    model = load_model("generic6")
    t, q, qd, qdd = excitation.preset("seed000").sample(RATE)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(9).normal(0, NOISE, q.shape)
    write_csv(tmp_path / "night9.csv", t, q, tau, fields={"lost_samples": 0})
    later = fleet.identify_many([fleet.Job("A", "generic6", str(tmp_path / "night9.csv"), date="2026-03-09")],
                                tmp_path / "out", {"trajectory": excitation.preset("seed000")}, scheduler="serial",
                                progress=False, report=False)
    first, second = pq.read_table(serial.written["table"]), pq.read_table(later.written["table"])
    assert second.column("lost_device_samples").to_pylist() == [0]
    both = pa.concat_tables([first, second])          # no promotion: the schemas must be equal
    assert both.num_rows == len(serial.rows) + 1
    assert both.schema.field("lost_device_samples").type == pa.int64()
    assert both.schema.field("drifted").type == pa.string()
    assert both.schema.field("fc2_drift").type == pa.bool_()


def test_drifted_is_null_exactly_when_the_run_was_compared_with_none(serial):
    for r in serial.rows:
        compared = r["status"] == "ok" and r.get("previous_run") is not None
        assert (r.get("drifted") is not None) == compared, r["arm_id"]
        if compared and not any(r.get(f"{n}_drift") for n in fleet.parameter_names([r])):
            assert r["drifted"] == ""


def test_cli_manifest_on_a_scheduler_address(fleet_dir, serial, capsys):
    with fleet.local_cluster(2, processes=False) as cluster:
        code = cli.main(["identify", str(fleet_dir / "manifest.csv"), "-o", str(fleet_dir / "cli"), "--trajectory",
                         "seed000", "--scheduler", cluster.scheduler_address, "--no-report", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1                       # one recording failed
    assert f"drift: arm {CHANGED_ARM}" in out and "fc2, fv2" in out and "9 of 10 recordings identified" in out
    rows = by_key(pq.read_table(fleet_dir / "cli" / "fleet.parquet").to_pylist())
    for key, want in by_key(serial.rows).items():
        assert rows[key].get("fc2") == want.get("fc2")


def test_a_gib_of_nul_bytes_in_a_manifest_fails_that_recording_briefly_and_the_table_is_written(fleet_dir, tmp_path,
                                                                                                 capsys):
    nul = tmp_path / "nul.csv"
    with open(nul, "wb") as f:
        f.truncate(2 ** 30)                 # sparse: cheap to make, read back as NUL bytes
    (tmp_path / "manifest.csv").write_text(f"arm_id,model,recording\nA,generic6,{fleet_dir / 'A' / 'night0.csv'}\n"
                                           f"Z,generic6,{nul}\n")
    code = cli.main(["identify", str(tmp_path / "manifest.csv"), "-o", str(tmp_path / "out"), "--trajectory",
                     "seed000", "--scheduler", "serial", "--no-report", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1, out
    failed = [line for line in out.splitlines() if line.startswith("failed:")]
    assert len(failed) == 1 and "nul.csv: line 1: a NUL byte" in failed[0] and len(failed[0]) < 400, failed
    rows = by_key(pq.read_table(tmp_path / "out" / "fleet.parquet").to_pylist())
    assert rows[("A", "night0")]["status"] == "ok" and rows[("Z", "nul")]["status"] == "failed"


def test_glob_takes_the_arm_from_the_folder(fleet_dir):
    jobs = fleet.jobs_from_glob(str(fleet_dir / "[ABC]" / "night*.csv"), "generic6")
    assert [(j.arm_id, j.run) for j in jobs] == [(a, f"night{r}") for a in ARMS for r in range(3)]
    with pytest.raises(InputError, match="no file matches"):
        fleet.jobs_from_glob(str(fleet_dir / "nothing*.csv"), "generic6")


@pytest.mark.parametrize("text, message", [
    ("arm_id,model\nA,generic6\n", "missing recording"),
    ("arm_id,model,recording,colour\nA,generic6,a.csv,red\n", "unknown colour"),
    ("arm_id,model,recording\nA,,a.csv\n", "line 2: column model: empty"),
    ("arm_id,model,recording,date\nA,generic6,a.csv,yesterday\n", "line 2: column date"),
    ("arm_id,model,recording\nA,generic6,a.csv\nA,generic6,b/a.csv\n", "line 3: arm A run a is on line 2"),
    ("arm_id,model,recording\nA,generic6,a.csv,extra\n", "line 2: more fields"),
])
def test_bad_manifests_are_refused_naming_line_and_column(tmp_path, text, message):
    path = tmp_path / "m.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        fleet.read_manifest(path)


def test_cli_glob_in_a_serial_loop_and_the_single_recording_path_still_needs_a_model(fleet_dir, serial, capsys):
    out = fleet_dir / "glob"
    code = cli.main(["identify", str(fleet_dir / "A" / "night*.csv"), "--model", "generic6", "-o", str(out),
                     "--trajectory", "seed000", "--scheduler", "serial", "--no-report", "--quiet"])
    assert code == 0 and "3 of 3 recordings identified" in capsys.readouterr().out
    rows = pq.read_table(out / "fleet.parquet").to_pylist()
    assert [(r["arm_id"], r["run"]) for r in rows] == [("A", f"night{k}") for k in range(3)]
    want = [r for r in serial.rows if r["arm_id"] == "A"]
    assert [r["fc2"] for r in rows] == [r["fc2"] for r in want]
    assert cli.main(["identify", str(fleet_dir / "A" / "night0.csv"), "-o", str(fleet_dir / "single")]) == 2
    assert "--model: required" in capsys.readouterr().err
    assert cli.main(["identify", str(fleet_dir / "manifest.csv"), "-o", str(fleet_dir / "x"), "--validate",
                     str(fleet_dir / "A" / "night0.csv")]) == 2
    assert "--validate: not with a manifest" in capsys.readouterr().err
