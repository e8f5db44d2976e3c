"""`armid payload`: the report of an estimate, and `apply` sending it to a running driver, which then
plans with exactly that body (its status reports the payload's 10 parameters)."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from driver.daemon import Driver, Endpoints
from sim.local_transport import LocalSimArm
from ident.model import load_model
from ident.payload import PayloadEstimate, payload_parameters
from ident.payload.report import write_report
from sim import Simulator

MASS, COM, INERTIA = 1.5, (0.01, -0.02, 0.08), (0.004, 0.0001, 0.0, 0.005, 0.0, 0.003)


def _estimate(method="global", inertia=True) -> PayloadEstimate:
    chi = payload_parameters(MASS, COM, INERTIA)
    if not inertia:
        chi = chi.copy()
        chi[:6] = np.nan
    return PayloadEstimate(method, chi, np.where(np.isfinite(chi), 1e-3, np.nan), samples=100)


def test_the_report_holds_every_estimate_and_a_ready_set_payload_command(tmp_path):
    written = write_report([_estimate("global"), _estimate("torque-balance", inertia=False)], tmp_path)
    doc = json.loads(written["json"].read_text())
    full, static = doc["estimates"]
    assert full["set_payload"]["mass"] == pytest.approx(MASS)
    assert full["set_payload"]["com"] == pytest.approx(list(COM))
    assert full["set_payload"]["inertia"] == pytest.approx(list(INERTIA), abs=1e-12)
    assert static["parameters"]["XX"] is None and static["set_payload"]["inertia"] == [0.0] * 6
    page = written["report"].read_text()
    assert "torque-balance" in page and "global" in page and written["plot"].stat().st_size > 1000


def test_apply_sets_the_identified_payload_on_a_running_driver(tmp_path):
    model = load_model("generic6")
    write_report([_estimate("global")], tmp_path)
    sim = Simulator(model, seed=1, realtime=True)
    driver = Driver(model, LocalSimArm(model, simulator=sim), endpoints=Endpoints("tcp://127.0.0.1:*", "tcp://127.0.0.1:*"))
    driver.start()
    try:
        out = subprocess.run([sys.executable, "-m", "armid.cli", "payload", "apply", str(tmp_path / "payload.json"),
                              "--commands", driver.bound["commands"]], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "centre of mass in frame flange" in out.stdout
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not np.any(driver.payload):
            time.sleep(0.01)
        np.testing.assert_allclose(driver.status()["payload"], payload_parameters(MASS, COM, INERTIA), atol=1e-12)
    finally:
        driver.stop()
        sim.stop()


def test_apply_names_what_is_wrong_with_a_bad_file_or_a_silent_driver(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "armid.cli", "payload", "apply", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "bad.json" in out.stderr and "payload.json" in out.stderr
    write_report([_estimate()], tmp_path)
    out = subprocess.run([sys.executable, "-m", "armid.cli", "payload", "apply", str(tmp_path / "payload.json"),
                          "--commands", "tcp://127.0.0.1:1", "--timeout", "0.3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no reply from the driver" in out.stderr
