"""The planner process seen from the daemon: a job crosses without the daemon ever waiting on the process,
whatever the process is doing (starting, stopped, gone), and a job that crossed is planned as before."""
import os
import signal
import threading

import numpy as np
import pytest

from driver.planner import PlanBounds, Planner, PlanJob, keep_spare
from ident.model import load_model
from waiting import wait_until  # noqa: E402  (tests/ is on sys.path)


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.fixture
def planner():
    p = Planner(timeout_s=30.0)
    p.start()
    yield p
    if p._proc is not None:
        try:
            os.kill(p._proc.pid, signal.SIGCONT)
        except OSError:
            pass
    p.close()


def _move(model, goal, pad=0):
    raw = b'{"cmd": "move_to", "q": ' + str(list(goal)).encode() + b" " * pad + b"}"     # blanks: a large job
    return PlanJob(raw, model, np.zeros(model.n), 1000.0, PlanBounds())


def _submit_within(planner, job, seconds):
    """Submit from a thread; True when submit returned within `seconds`."""
    errors = []

    def run():
        try:
            planner.submit("move_to", job)
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    return not t.is_alive(), errors


def test_a_large_job_to_a_stopped_planner_does_not_block_the_daemon(planner, model):
    assert planner.wait_ready(120.0)
    os.kill(planner._proc.pid, signal.SIGSTOP)       # a planner that never reads again
    returned, errors = _submit_within(planner, _move(model, [0.1] * 6, pad=4 << 20), 10.0)
    assert returned, "submit waited on a planner that does not read"
    assert not errors
    assert planner.busy


def test_a_job_crosses_as_a_file_and_is_planned(planner, model, tmp_path):
    assert planner.wait_ready(120.0)
    planner.submit("move_to", _move(model, [0.05] * 6, pad=1 << 20))
    answer = []
    assert wait_until(lambda: answer.append(planner.collect()) or answer[-1] is not None, timeout=60.0)
    plan = answer[-1]
    assert not isinstance(plan, str), plan
    np.testing.assert_allclose(plan.q[-1], [0.05] * 6, atol=1e-9)
    left = [f for f in os.listdir(planner._dir)]
    assert left == [], f"files left in the planner's folder: {left}"


def test_a_job_sent_while_the_planner_starts_is_answered(planner, model):
    """The process may still be loading its kernels: the job waits in the folder, the daemon does not."""
    returned, errors = _submit_within(planner, _move(model, [0.02] * 6, pad=256 << 10), 10.0)
    assert returned and not errors
    answer = []
    assert wait_until(lambda: answer.append(planner.collect()) or answer[-1] is not None, timeout=120.0)
    assert not isinstance(answer[-1], str), answer[-1]


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling policies")
def test_a_planner_started_from_a_real_time_thread_plans_at_the_default_policy():
    """A daemon run at a real-time policy as a whole (chrt, a parent's setting) hands it to the processes it
    starts; the planner's work is background work, so it goes back to the default policy before it plans."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except OSError:
        pytest.skip("this process may not take a real-time policy")
    p = Planner(timeout_s=30.0)
    try:
        p.start()
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        assert p.wait_ready(60)
        policies = {int(t): os.sched_getscheduler(int(t)) for t in os.listdir(f"/proc/{p._proc.pid}/task")}
        assert set(policies.values()) == {os.SCHED_OTHER}, policies
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        p.close()


def _planned(planner, model, goal) -> None:
    planner.submit("move_to", _move(model, goal))
    answer = []
    assert wait_until(lambda: answer.append(planner.collect()) or answer[-1] is not None, timeout=60.0)
    assert not isinstance(answer[-1], str), answer[-1]
    np.testing.assert_allclose(answer[-1].q[-1], goal, atol=1e-9)


def test_a_stopped_drivers_planner_goes_back_ready_and_the_next_driver_plans_with_it(model):
    """With spares kept (the test session keeps them: conftest.py), a driver's idle, ready planner process is
    handed back when it stops and the next driver takes it, ready at once; one that is still busy is ended."""
    keep_spare(True)
    first = Planner(timeout_s=30.0, spare=True)
    first.start()
    try:
        assert first.wait_ready(120.0)
        _planned(first, model, [0.05] * 6)
        recycled = first._proc
    finally:
        first.close()
    assert recycled.poll() is None, "the idle, ready planner process was ended instead of handed back"
    second = Planner(timeout_s=30.0, spare=True)
    second.start()
    try:
        assert second._proc is recycled and second.ready
        _planned(second, model, [-0.05] * 6)
        second.submit("move_to", _move(model, [0.1] * 6))       # busy when it stops: ended, not handed back
    finally:
        second.close()
    assert recycled.wait(10.0) is not None
