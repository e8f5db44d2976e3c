"""Online payload tracking (ident.online.payload_tracking) and its service integration: the payload is tracked on
the live stream, a payload attached mid-stream is detected once and the estimate re-converges, no change
raises no event, non-finite samples never reach the filter, unexcited directions become combinations."""
import json
import time

import numpy as np
import pytest
import zmq

from driver.daemon import Driver, Endpoints
from sim.local_transport import LocalSimArm
from ident.model import dynamics
from ident.fit import excitation
from ident.fit.excitation import FourierTrajectory
from ident.model import load_model
from ident.payload import payload_parameters
from ident.online.payload_tracking import OnlinePayload, cusum
from ident.online.service import IdentService
from sim.simulator import effort_delay

RATE = 1000.0
MASS, COM = 2.0, (0.02, -0.01, 0.08)
INERTIA = (0.004, 0.0, 0.0, 0.005, 0.0, 0.003)


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


@pytest.fixture(scope="module")
def chi():
    return payload_parameters(MASS, COM, INERTIA)


def _motion(seconds, moving=slice(None)):
    rng = np.random.default_rng(7)
    a, b = rng.uniform(-0.6, 0.6, (6, 4)), rng.uniform(-0.6, 0.6, (6, 4))
    still = np.ones(6, bool)
    still[moving] = False
    a[still], b[still] = 0.0, 0.0
    traj = FourierTrajectory(0.25, rng.uniform(-0.3, 0.3, 6), a, b)
    t = np.arange(int(seconds * RATE)) / RATE
    return t, *traj.evaluate(t)


def _stream(model, chi, seconds, change_at=None, noise=0.02, moving=slice(None), seed=1):
    """q and the measured torque of the arm (model) that carries the payload chi from change_at s on
    (from the start when change_at is None), with white torque noise (N m)."""
    t, q, qd, qdd = _motion(seconds, moving)
    loaded = dynamics.rnea(dynamics.merge_payload(model, chi), q, qd, qdd)
    tau = loaded if change_at is None else np.where(t[:, None] < change_at, dynamics.rnea(model, q, qd, qdd), loaded)
    tau = tau + np.random.default_rng(seed).normal(size=tau.shape) * noise
    return np.arange(t.size), q, tau


def _feed(tracker, seq, q, tau, batch=250):
    for k in range(0, seq.size, batch):
        tracker.push(seq[k:k + batch], q[k:k + batch], tau[k:k + batch])


def test_the_tracker_rows_are_the_load_regressor(model):
    """The tracker takes Y_load from the one regressor call: link n's inertial columns times the flange map."""
    rng = np.random.default_rng(0)
    q, qd, qdd = (rng.normal(size=(20, 6)) for _ in range(3))
    Y = dynamics.regressor(model, q, qd, qdd)
    tracker = OnlinePayload(model)
    np.testing.assert_allclose(Y[:, :, tracker._last_link] @ tracker._flange_to_link,
                               dynamics.load_regressor(model, q, qd, qdd), rtol=1e-12, atol=1e-12)


def test_a_payload_attached_mid_stream_is_detected_once_and_the_estimate_reconverges(model, chi):
    seq, q, tau = _stream(model, chi, 14.0, change_at=5.0)
    tracker = OnlinePayload(model)
    _feed(tracker, seq[:5000], q[:5000], tau[:5000])
    before = tracker.estimate()
    assert tracker.changes == [] and abs(before.mass) < 0.02          # no payload yet: about 0 kg
    _feed(tracker, seq[5000:], q[5000:], tau[5000:])
    assert len(tracker.changes) == 1
    change = tracker.changes[0]
    # the row that raised the alarm is centred within the filter's half window of the change
    assert 5000 - tracker.samples.delay <= change.seq <= 5000 + tracker.samples.delay
    est = tracker.estimate()
    assert est.identified == ("XX", "XY", "XZ", "YY", "YZ", "ZZ", "mX", "mY", "mZ", "m")
    assert est.mass == pytest.approx(MASS, abs=0.02)
    assert np.max(np.abs(est.com - COM)) < 2e-3                       # m
    assert np.all(np.abs(est.chi - chi) < 5 * est.sigma)              # the sigmas mean what they say
    assert est.consistent


def test_no_payload_change_raises_no_event_and_a_payload_present_from_the_start_is_tracked(model, chi):
    seq, q, tau = _stream(model, chi, 14.0, change_at=None, seed=2)
    tracker = OnlinePayload(model)
    _feed(tracker, seq, q, tau)
    assert tracker.changes == []
    assert tracker.statistic < tracker.threshold / 10                   # far from an alarm, not just under it
    assert tracker.estimate().mass == pytest.approx(MASS, abs=0.02)


def test_cusum_accumulates_only_a_persistent_shift():
    r = np.ones(1000)                                                  # the residual's no-change level
    assert cusum(0.0, r, 1.0, 500.0) == (0.0, -1)
    r[500:] = 12.0                                                     # shift by 11: +10 a sample
    g, k = cusum(0.0, r, 1.0, 500.0)
    assert k == 550 and g == pytest.approx(510.0)
    spikes = np.ones(1000)
    spikes[::50] = 45.0                     # isolated bursts (less than drift x spacing) do not accumulate
    assert cusum(0.0, spikes, 1.0, 500.0)[1] == -1
    assert cusum(0.0, np.full(5, np.nan), 1.0, 500.0) == (0.0, -1)


def test_non_finite_samples_never_reach_the_filter(model, chi):
    """NaN and inf samples are dropped as missing: the estimate is exactly the one of the stream
    without those samples, and finite."""
    seq, q, tau = _stream(model, chi, 5.0)
    bad_q, bad_tau = q.copy(), tau.copy()
    bad_q[1200, 1] = np.nan
    bad_tau[2500, 4] = np.inf
    bad_q[3333] = np.nan
    tracker = OnlinePayload(model)
    _feed(tracker, seq, bad_q, bad_tau)
    assert tracker.counters.rejected == 3
    assert np.isfinite(tracker.rls.theta).all() and np.isfinite(tracker.rls.P).all()
    keep = np.setdiff1d(seq, [1200, 2500, 3333])
    clean = OnlinePayload(model)
    for k in range(0, seq.size, 250):                 # the same batches of device samples as above
        part = keep[(keep >= k) & (keep < k + 250)]
        clean.push(seq[part], q[part], tau[part])
    np.testing.assert_array_equal(tracker.rls.theta, clean.rls.theta)


def test_directions_a_motion_does_not_excite_are_combinations_not_numbers(model, chi):
    """Only the wrist (joints 4-6) moves, as in a wrist-only payload excitation: joints 1-3 give no rows,
    and several payload parameters are not identifiable one by one. They are NaN; the excited
    combinations that involve them are reported, and their values are the true payload's."""
    seq, q, tau = _stream(model, chi, 8.0, moving=slice(3, 6), noise=0.01)
    tracker = OnlinePayload(model, warmup_rows=500)
    _feed(tracker, seq, q, tau)
    est = tracker.estimate()
    assert 0 < len(est.identified) < 10 and est.combinations
    assert any("not excited individually" in note for note in est.notes)
    for name, value, sigma, truth in zip(("XX", "XY", "XZ", "YY", "YZ", "ZZ", "mX", "mY", "mZ", "m"), est.chi,
                                         est.sigma, chi):
        if np.isfinite(value):
            assert abs(value - truth) < 5 * sigma + 1e-3, name
    for combo in est.combinations:
        assert abs(combo.value - combo.coefficients @ chi) < 5 * combo.sigma + 1e-3, combo.expression


def test_the_service_tracks_a_payload_attached_to_the_running_simulator_and_publishes_the_change(model, tmp_path):
    """The driver runs in this process over the lockstep simulator; the payload is attached to the
    simulated arm while it runs an excitation trajectory; the service publishes one event and a payload
    estimate that converges to the attached mass."""
    arm = LocalSimArm(model, seed=3)
    drv = Driver(model, arm, endpoints=Endpoints(state=f"ipc://{tmp_path}/state", commands=f"ipc://{tmp_path}/cmd"),
                 watchdog_s=0.5, trajectory_dir=str(tmp_path))
    drv.start()
    svc = IdentService(model, state_endpoint=drv.bound["state"], publish_endpoint="tcp://127.0.0.1:*",
                       command_endpoint="tcp://127.0.0.1:*", publish_hz=10, payload="model")
    svc.start()
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(svc.bound["publish"])
    for topic in (b"payload", b"event"):
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    got = []

    def drain():
        while sub.poll(0):
            topic, body = sub.recv_multipart()
            got.append((topic, json.loads(body)))

    def wait(pred, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            drain()
            if pred():
                return True
            time.sleep(0.02)
        return False

    try:
        a = np.tile([0.25, -0.25], (6, 1)) * np.linspace(0.5, 1.0, 6)[:, None]
        b = np.tile([0.3, -0.15], (6, 1)) * np.linspace(0.5, 1.0, 6)[:, None]
        path = tmp_path / "traj.toml"
        excitation.save(FourierTrajectory(0.5, np.zeros(6), a, b), path)
        assert wait(lambda: svc.identifier.counters.samples > 100, 30)
        assert drv.commands.handle({"cmd": "enable"})["ok"]
        assert wait(lambda: drv.commands.handle({"cmd": "status"})["enabled"], 10)
        assert drv.commands.handle({"cmd": "run_trajectory", "file": path.name, "periods": 5})["ok"]
        # the tracker's first pass (its weights) is done and no change was seen on the unloaded arm
        assert wait(lambda: svc.payload.fit.joint_sigma is not None, 20)
        time.sleep(0.5)
        assert svc.payload.changes == []
        arm.sim.attach_payload(MASS, COM, INERTIA)
        assert wait(lambda: any(t == b"event" for t, _ in got), 5), "the payload change was not published"
        assert wait(lambda: not drv.commands.handle({"cmd": "status"})["moving"], 30)
        svc._flush()
        events = [m for t, m in got if t == b"event"]
        assert len(events) == 1 and events[0]["event"] == "payload_change"
        assert wait(lambda: any(t == b"payload" and m["rows"] >= svc.payload.rows for t, m in got), 5)
        last = [m for t, m in got if t == b"payload"][-1]
        assert last["mass_kg"] == pytest.approx(MASS, abs=0.1)
        assert last["changes"] == 1 and last["arm"] == "model"
    finally:
        sub.close(0)
        svc.stop()
        drv.stop()


SWAPPED = (0.8, (-0.03, 0.02, 0.05), (0.002, 0.0, 0.0, 0.002, 0.0, 0.001))


@pytest.fixture(scope="module")
def mixed(model):
    """150 s of mixed motion on the simulator (rests, moves of some joints, excitations; the first move
    turns three joints only): no payload for 50 s, a payload attached at 50 s, swapped at 85 s, removed at
    120 s."""
    import mixed_motion

    return mixed_motion.run(model, 150.0, payloads={50.0: (MASS, COM, INERTIA), 85.0: SWAPPED, 120.0: None},
                            seed=0)


def test_over_minutes_of_mixed_motion_every_payload_change_raises_one_event_and_nothing_else_does(model, mixed):
    """Moves, excitations and rests on the simulator, the samples fed as the service feeds them (blocks of
    50): the motion's own changes (a move of some joints, then an excitation of all, rests) raise no event,
    each payload change exactly one (no re-detection once the hold-off is over), and the estimate before
    the next change is the payload then attached."""
    tracker = OnlinePayload(model, effort_delay=effort_delay(RATE))
    provisional_at_first_pass, before_next = None, {}
    ends = mixed.changes[1:] + [mixed.seq.size]
    for k in range(0, mixed.seq.size, 50):
        tracker.push(mixed.seq[k:k + 50], mixed.q[k:k + 50], mixed.tau[k:k + 50])
        if provisional_at_first_pass is None and tracker.fit.joint_sigma is not None:
            provisional_at_first_pass = tracker.fit.provisional
        if k + 50 in ends:
            before_next[k + 50] = tracker.estimate()
    # the first pass ended while joints 4-6 had not moved; they got their own weights later
    assert provisional_at_first_pass.tolist() == [False] * 3 + [True] * 3
    assert not tracker.fit.provisional.any()
    # an event is the change it follows when it comes after it and before the next one (the row's window
    # reaches delay samples ahead of its centre)
    seen = np.array([c.seq + tracker.samples.delay for c in tracker.changes])
    bounds = np.r_[mixed.changes, np.inf]
    matched = [int(np.sum((seen >= a) & (seen < b))) for a, b in zip(bounds[:-1], bounds[1:])]
    false_events = int(np.sum(seen < mixed.changes[0])) + sum(max(m - 1, 0) for m in matched)
    missed = sum(m == 0 for m in matched)
    delays_ms = [1e3 * float(seen[(seen >= a) & (seen < b)][0] - a) / RATE for a, b in zip(bounds[:-1], bounds[1:])
                 if np.any((seen >= a) & (seen < b))]
    print(f"payload changes: {len(mixed.changes)}, events: {len(seen)}, false: {false_events}, missed: {missed}, "
          f"detection delays: {', '.join(f'{d:.0f} ms' for d in delays_ms)}")
    assert (false_events, missed) == (0, 0), (seen, mixed.changes)
    assert max(delays_ms) < 1000        # simulated ms: within the first motion after the change
    payloads = [(MASS, COM), (SWAPPED[0], SWAPPED[1]), (0.0, None)]
    for (mass, com), end in zip(payloads, ends):
        est = before_next[end]
        assert est.mass == pytest.approx(mass, abs=0.01), end
        if com is not None:
            assert np.max(np.abs(est.com - com)) < 2e-3, end


def test_over_minutes_of_mixed_motion_a_payload_on_from_the_start_raises_no_event_and_is_found(model):
    """100 s of mixed motion (another plan) with a payload on the flange from the first sample: the tracker
    starts from no payload, learns it without calling that a change, and no motion raises an event."""
    import mixed_motion

    run = mixed_motion.run(model, 100.0, payloads={0.0: SWAPPED}, seed=1)
    tracker = OnlinePayload(model, effort_delay=effort_delay(RATE))
    peak = 0.0
    for k in range(0, run.seq.size, 50):
        tracker.push(run.seq[k:k + 50], run.q[k:k + 50], run.tau[k:k + 50])
        peak = max(peak, tracker.statistic)
    print(f"payload on from the start: events: {len(tracker.changes)}, CUSUM peak {peak:.1f} "
          f"(threshold {tracker.threshold:g})")
    assert tracker.changes == []
    est = tracker.estimate()
    assert est.mass == pytest.approx(SWAPPED[0], abs=0.01)
    assert np.max(np.abs(est.com - SWAPPED[1])) < 2e-3
