"""run_trajectory's samples with waypoint velocities (and accelerations): the driver follows a Hermite spline through
every waypoint at its velocity, checked against the limits before it moves like any motion; status shows how far a
motion is."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from driver import motion, plan_requests
from driver.planner import PlanBounds
from driver.waypoints import curve
from ident.errors import InputError
from ident.model import load_model


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def _plan(model, samples, q_now=None):
    raw = json.dumps({"cmd": "run_trajectory", "samples": samples}).encode()
    q_now = model.n * [0.0] if q_now is None else q_now
    return plan_requests.plan_request(raw, model, np.array(q_now), 1000.0, PlanBounds())


def test_the_planned_motion_passes_each_waypoint_at_its_velocity(model):
    t = [0.0, 0.6, 1.2, 2.0]
    q = np.zeros((4, 6))
    q[1], q[2] = 0.1, 0.25
    qd = np.zeros((4, 6))
    qd[1], qd[2] = 0.3, 0.1
    plan = _plan(model, {"t": t, "q": q.tolist(), "qd": qd.tolist()})
    start = dict(plan.segments)["run_trajectory"]
    for k, tk in enumerate(t):
        i = start + int(round(tk * 1000))
        np.testing.assert_allclose(plan.q[i], q[k], atol=1e-12)
        np.testing.assert_allclose(plan.qd[i], qd[k], atol=1e-9)
    # without the velocities the clamped cubic spline chooses others at the inner waypoints
    plain = _plan(model, {"t": t, "q": q.tolist()})
    assert abs(plain.qd[start + 600][0] - 0.3) > 1e-3


def test_waypoint_accelerations_give_a_quintic_through_them(model):
    t = np.array([0.0, 1.0, 2.0])
    q = np.array([[0.0] * 6, [0.2] * 6, [0.3] * 6])
    qd = np.array([[0.0] * 6, [0.2] * 6, [0.0] * 6])
    qdd = np.array([[0.0] * 6, [-0.1] * 6, [0.0] * 6])
    c = curve(t, q, qd, qdd)
    np.testing.assert_allclose(c(t, 2), qdd, atol=1e-9)
    plan = _plan(model, {"t": t.tolist(), "q": q.tolist(), "qd": qd.tolist(), "qdd": qdd.tolist()})
    start = dict(plan.segments)["run_trajectory"]
    np.testing.assert_allclose(plan.qdd[start + 1000], qdd[1], atol=1e-9)


@pytest.mark.parametrize("change, words", [
    (lambda s: s["qd"][-1].__setitem__(0, 0.2), "does not end at rest"),
    (lambda s: s["qd"][1].__setitem__(2, 50.0), "refused: joint j3"),
    (lambda s: s["qd"].pop(), "samples.qd: expected a list with one row per time"),
    (lambda s: s["qd"][1].__setitem__(0, "x"), "samples.qd[1]: expected a list of numbers"),
    (lambda s: s.update(qdd=s.pop("qd")), "qdd"),
    (lambda s: s.update(extra=1), "samples: expected"),
])
def test_bad_or_unsafe_waypoint_velocities_are_refused_by_name(model, change, words):
    s = {"t": [0.0, 1.0, 2.0], "q": [[0.0] * 6, [0.1] * 6, [0.2] * 6], "qd": [[0.0] * 6, [0.1] * 6, [0.0] * 6]}
    change(s)
    with pytest.raises(InputError, match=re.escape(words)):
        _plan(model, s)


def test_progress_names_the_segment_and_the_time(model):
    plan = motion.plan_samples(model, np.full(6, 0.05), [0.0, 1.0], [[0.0] * 6, [0.1] * 6], 1000.0)
    first = plan.progress(0)
    assert first["segment"] == "move to start" and first["elapsed_s"] == 0.0
    start = dict(plan.segments)["run_trajectory"]
    p = plan.progress(start + 250)
    assert p["segment"] == "run_trajectory" and p["segment_start_s"] == start / 1000
    assert p["elapsed_s"] == pytest.approx((start + 250) / 1000) and 0 < p["fraction"] < 1
    assert plan.progress(10 ** 9)["fraction"] == 1.0
