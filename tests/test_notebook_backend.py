"""From a notebook: identification, the fleet, and the identification, fleet and calibration reports leave
matplotlib's backend as the user set it and never import pyplot (whose state an inline backend owns)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys
    import matplotlib
    matplotlib.use("svg")                       # a backend the user chose (a notebook: the inline one)
    import numpy as np
    from ident.fit import batch, excitation
    from ident.model import dynamics
    from ident.outputs import fleet, fleet_report, report
    from ident.calibration.fit import identify, predicted_accuracy
    from ident.calibration.model import from_model, tool_pose
    from ident.calibration.report import write_report
    from ident.calibration.synthesis import random_configurations, synthesize
    from ident.model import load_model
    from ident.fit.preprocess import Recording

    out = sys.argv[1]
    model = load_model("generic6")
    t, q, qd, qdd = excitation.preset("seed000").sample(100.0)
    tau = dynamics.rnea(model, q, qd, qdd) + np.random.default_rng(0).normal(0, 0.02, q.shape)
    rec = Recording(t=t, q=q, tau=tau, current=None, qd=None, source="notebook")
    report.write_report(batch.identify(model, rec), out + "/ident")
    cm = from_model(model, (0.1, 0.0, 0.0))
    qc = random_configurations(cm, 30, seed=0)
    P = tool_pose(cm, qc, cm.nominal)[:, :3, 3]
    result = identify(synthesize(cm, "position"), qc, P, None, noise=1e-4)
    write_report(out, result, predicted_accuracy(result, random_configurations(cm, 20, seed=1)), "calibration")
    fleet_report.write_fleet_report([], out + "/fleet")
    print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules)
""")


def test_reports_keep_the_users_backend_and_never_import_pyplot(tmp_path):
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[-2:] == ["svg", "False"]
    assert (tmp_path / "report.html").is_file() and (tmp_path / "residuals.png").stat().st_size > 1000
    assert (tmp_path / "ident" / "report.html").is_file() and (tmp_path / "fleet" / "fleet.html").is_file()
