"""Collision detection in the driver, from the user's side: the driver's own cycle on the simulator in lockstep
(armid/lockstep.py). Pushes on links 2-6 during full-speed excitation are detected and the arm stops; an
excitation without contact raises nothing; the reactions, the run-time command, the config and the thresholds'
rule; the feed-forward lowers the following error."""
from __future__ import annotations

import dataclasses
import json
import logging
import threading

import numpy as np
import pytest

from armid.lockstep import Rig, following_error, push_making
from driver.collision import (COLLISION_SIGMA, CONTACT_SIGMA, NOMINAL_COLLISION, NOMINAL_CONTACT, CollisionError,
                              Watch, make_thresholds)
from driver.commands import Commands
from firmware_bridge import cia402, stream
from ident.errors import InputError
from ident.model import dynamics, load_model
from ident.outputs.results import write_model

RATE = 1000.0
# thresholds for a model that is the simulated arm's (N m): about 3 times the largest estimate seen without contact
# during seed000 at full speed (0.6, 0.7, 0.4, 0.13, 0.14, 0.06 N m; the simulator's Stribeck friction, which the
# model lacks, and the sensors' noise make it)
CONTACT = [1.0, 1.2, 0.8, 0.3, 0.3, 0.2]
COLLISION = [2.0, 2.5, 1.5, 0.6, 0.6, 0.4]
WATCH = Watch(detect=True, contact=tuple(CONTACT), collision=tuple(COLLISION))


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


CASES = [(link, torque) for link in (2, 3, 4, 5, 6) for torque in (5.0, 10.0)]


@pytest.mark.parametrize("link,torque", CASES)
def test_a_push_during_fast_excitation_is_detected_and_the_arm_stops(model, link, torque):
    rig = Rig(model, WATCH)
    rig.enable()
    plan, start = rig.excite()
    at = start + 500 + 331 * CASES.index((link, torque))     # a different phase of the excitation each time
    rig.step(at)
    assert rig.cycle.fault is None and rig.cycle.monitor.collisions == 0
    push = push_making(model, rig.sim.read_truth().q, link, torque)
    rig.sim.apply_wrench(**push)
    for k in range(1, 200):
        rig.step()
        if rig.quick_stopping():
            break
    assert rig.quick_stopping(), f"link {link}, {torque} N m: no quick stop within 200 ms"
    if torque >= 5.0:
        assert k <= 10, f"link {link}, {torque} N m: quick stop after {k} ms"
    assert rig.cycle.fault.startswith("collision: joint")
    assert rig.state()["flags"] & stream.FLAG_COLLISION
    rig.step(1500)                                 # the quick stop ramps down; the drives switch off, brakes hold
    assert np.abs(rig.sim.read_truth().qd).max() < 1e-6
    assert rig.cycle.motion is None


def test_a_long_excitation_without_contact_raises_nothing(model):
    """Three periods of seed000 at full speed (30 s) with the move to it and the blends: no contact flag, no
    collision; the estimate stays under half of every collision threshold."""
    rig = Rig(model, WATCH)
    rig.enable()
    plan, _ = rig.excite(periods=3.0)
    peak, contacts = np.zeros(6), 0
    for _ in range(plan.samples + 10):
        rig.step()
        r = rig.state()
        np.maximum(peak, np.abs(r["tau_ext"]), out=peak)
        contacts += bool(r["flags"] & (stream.FLAG_CONTACT | stream.FLAG_COLLISION))
    assert rig.cycle.fault is None and rig.cycle.monitor.collisions == 0 and contacts == 0
    assert np.all(peak < 0.5 * np.array(COLLISION)), peak
    assert peak.max() > 0.0                       # the estimate is published


def test_stop_and_hold_ends_the_motion_and_holds_the_pose_without_a_fault(model, caplog):
    rig = Rig(model, Watch(detect=True, contact=tuple(CONTACT), collision=tuple(COLLISION), reaction="stop_and_hold"))
    rig.enable()
    _, start = rig.excite()
    rig.step(start + 700)
    rig.sim.apply_wrench(**{**push_making(model, rig.sim.read_truth().q, 3, 8.0), "duration": 0.05})
    with caplog.at_level(logging.ERROR, logger="driver.cycle"):
        for _ in range(30):
            rig.step()
            if rig.cycle.motion is None:
                break
    assert rig.cycle.motion is None and rig.cycle.fault is None
    records = [r for r in caplog.records if "collision: joint" in r.getMessage()]
    assert records and records[0].levelno == logging.ERROR
    assert records[0].joint in (1, 2, 3) and abs(records[0].tau_ext) > COLLISION[records[0].joint - 1]
    rig.step(1500)
    assert rig.cycle.enabled() and not rig.quick_stopping()
    assert np.abs(rig.sim.read_truth().qd).max() < 1e-3             # held still, actively
    assert rig.cycle.monitor.last["reaction"] == "stop_and_hold"
    health = rig.driver.health(1.0, {})
    assert health["collision"]["collisions"] == 1 and "collision: joint" in health["events"][-1]["text"]


def test_the_estimate_is_zero_while_the_drives_do_not_hold_the_arm(model):
    rig = Rig(model)            # detection off: the estimate is published all the same
    rig.step(20)
    assert not rig.state()["tau_ext"].any()
    rig.enable()
    rig.sim.apply_wrench(4, [0.0, 0.0, -30.0], point=[0.0, 0.0, 0.1], duration=0.02)
    rig.step(5)
    assert np.abs(rig.state()["tau_ext"]).max() > 0.1


def test_set_collision_refuses_anything_less_strict_while_moving(model):
    rig = Rig(model, WATCH)
    rig.enable()
    cmds = Commands(rig.driver)
    rig.excite()
    rig.step(100)
    raised = cmds.handle({"cmd": "set_collision", "collision": [c * 2 for c in COLLISION]})
    assert not raised["ok"] and "raising joint 1's collision threshold is refused while the arm moves" in raised["error"]
    assert not cmds.handle({"cmd": "set_collision", "enabled": False})["ok"]
    assert not cmds.handle({"cmd": "set_collision", "reaction": "stop_and_hold"})["ok"]
    lower = cmds.handle({"cmd": "set_collision", "contact": 0.15, "collision": [c * 0.9 for c in COLLISION]})
    assert lower["ok"], lower
    np.testing.assert_allclose(rig.cycle.monitor.thresholds.collision, np.array(COLLISION) * 0.9)
    assert cmds.handle({"cmd": "set_collision", "contact": 5.0})["ok"] is False   # above the collision level
    rig.cycle.submit(rig.cycle.disable)
    rig.step(5)
    assert cmds.handle({"cmd": "set_collision", "collision": 30.0, "contact": 10.0, "reaction": "stop_and_hold"})["ok"]
    status = cmds.handle({"cmd": "collision"})["collision"]
    assert status["reaction"] == "stop_and_hold" and status["collision"] == [30.0] * 6
    bad = cmds.handle({"cmd": "set_collision", "reaction": "dodge"})
    assert not bad["ok"] and "reaction: expected one of quick_stop, stop_and_hold, back_off" in bad["error"]


def test_thresholds_rule_from_residuals_or_torque_limits(model):
    rms = np.array([0.4, 0.5, 0.3, 0.1, 0.08, 0.05])
    th = make_thresholds(6, model.tau_max, residual_rms=rms)
    np.testing.assert_allclose(th.contact, CONTACT_SIGMA * rms)
    np.testing.assert_allclose(th.collision, COLLISION_SIGMA * rms)
    nominal = make_thresholds(6, model.tau_max)
    np.testing.assert_allclose(nominal.collision, NOMINAL_COLLISION * model.tau_max)
    np.testing.assert_allclose(nominal.contact, NOMINAL_CONTACT * model.tau_max)
    with pytest.raises(CollisionError, match="joint 2: contact threshold 9 N m is above its collision threshold"):
        make_thresholds(6, model.tau_max, contact=[1, 9, 1, 1, 1, 1], collision=5.0)
    with pytest.raises(CollisionError, match=r"collision.collision: expected one number or 6 numbers"):
        make_thresholds(6, model.tau_max, collision=[1.0, 2.0])


def test_the_driver_loads_an_identified_model_and_derives_its_thresholds(model, tmp_path):
    folder = tmp_path / "ident-out"
    folder.mkdir()
    write_model(model, folder / "model.toml", header="identified by armid from run.mcap: physically consistent")
    rms = [0.3, 0.4, 0.2, 0.05, 0.05, 0.03]
    (folder / "result.json").write_text(json.dumps({"model": {"joints": list(model.joint_names)},
                                                    "fit": {"residual_rms_measured": rms}}))
    rig = Rig(model, Watch(model=str(folder / "model.toml"), detect=True))
    p = rig.driver.model_provenance
    assert p["identified"] and p["source"].endswith("model.toml") and len(p["sha256"]) == 64
    assert p["result"].endswith("result.json")
    np.testing.assert_allclose(rig.cycle.monitor.thresholds.collision, COLLISION_SIGMA * np.array(rms))
    health = rig.driver.health(1.0, {})
    assert health["model"]["identified"] and health["collision"]["source"].startswith(f"{CONTACT_SIGMA:g} and")
    (folder / "result.json").write_text('{"fit": {}}')
    with pytest.raises(InputError, match="result.json: cannot read the residual statistics"):
        Rig(model, Watch(model=str(folder / "model.toml"), detect=True))
    with pytest.raises(InputError, match="joints"):
        Rig(model, Watch(model="puma560"))


def test_the_driver_gives_its_observer_the_friction_near_rest_of_the_identification(model, tmp_path):
    folder = tmp_path / "ident-out"
    folder.mkdir()
    write_model(model, folder / "model.toml", header="identified by armid from run.mcap: physically consistent")
    fs, vs = [0.6, 1.0, 0.4, 0.2, 0.1, 0.09], [0.05, 0.05, 0.05, 0.04, 0.05, 0.06]
    fit = {"residual_rms_measured": [0.3, 0.4, 0.2, 0.05, 0.05, 0.03],
           "near_rest_friction": {"excess": fs, "velocity": vs, "units": ["N m", "rad/s"]}}
    (folder / "result.json").write_text(json.dumps({"model": {"joints": list(model.joint_names)}, "fit": fit}))
    rig = Rig(model, Watch(model=str(folder / "model.toml"), detect=True))
    friction = rig.cycle.monitor.observer.friction
    np.testing.assert_array_equal(friction[:, 4], fs)
    np.testing.assert_array_equal(friction[:, 5], vs)
    assert rig.driver.health(1.0, {})["model"]["near_rest_friction"] == {"excess": fs, "velocity": vs}
    # without the entry (an older result.json): the model's friction alone
    del fit["near_rest_friction"]
    (folder / "result.json").write_text(json.dumps({"model": {"joints": list(model.joint_names)}, "fit": fit}))
    rig = Rig(model, Watch(model=str(folder / "model.toml"), detect=True))
    assert not rig.cycle.monitor.observer.friction[:, 4].any()
    fit["near_rest_friction"] = {"excess": fs[:5], "velocity": vs}
    (folder / "result.json").write_text(json.dumps({"model": {"joints": list(model.joint_names)}, "fit": fit}))
    with pytest.raises(InputError, match="result.json: fit.near_rest_friction: expected excess"):
        Rig(model, Watch(model=str(folder / "model.toml"), detect=True))


def test_the_config_takes_model_and_collision_sections(tmp_path):
    from driver.config import ConfigError, load_config

    good = tmp_path / "good.toml"
    good.write_text('[transport]\nname = "sim"\n[model]\npath = "ident/model.toml"\nobserver_gains = [100, 100, 80, '
                    '120, 120, 150]\n[collision]\ncollision = 3.0\nreaction = "stop_and_hold"\n')
    cfg = load_config(good)
    assert cfg.watch.model == str((tmp_path / "ident" / "model.toml").resolve())
    assert cfg.watch.detect and cfg.watch.collision == 3.0 and cfg.watch.reaction == "stop_and_hold"
    assert cfg.watch.gains == (100, 100, 80, 120, 120, 150)
    assert not load_config(_write(tmp_path, '[transport]\nname = "sim"\n')).watch.detect
    for text, field in (('[collision]\nreaction = "swerve"', "collision.reaction"),
                        ('[collision]\ncontact = "high"', "collision.contact"),
                        ('[model]\nobserver_gains = true', "model.observer_gains"),
                        ('[model]\ncolour = 1', "model.colour")):
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            load_config(_write(tmp_path, '[transport]\nname = "sim"\n' + text + "\n"))


def _write(folder, text):
    path = folder / "c.toml"
    path.write_text(text)
    return path


def test_feed_forward_lowers_the_following_error(model):
    """seed000 at full speed with the planned torque (rigid body and friction) as the drives' torque offset: the RMS
    of (planned - measured position) is a tenth of what the drives' loops leave alone, and at most 0.7 times what
    they leave with their own inertia and catalogue-friction feed-forward (0.61 measured: what remains is the
    simulated arm's Stribeck friction, which no Coulomb + viscous model holds; without it the ratio is 0.07:
    benchmarks/bench_collision.py prints the figures)."""
    from sim import DriveConfig

    with_ff = np.sqrt(np.mean(np.square(following_error(model))))
    alone = np.sqrt(np.mean(np.square(following_error(model, feed_forward=False))))
    own = np.sqrt(np.mean(np.square(following_error(model, feed_forward=False, drive=DriveConfig()))))
    assert with_ff < 0.2 * alone and with_ff < 0.7 * own, (with_ff, alone, own)


def test_the_feed_forward_holds_the_friction_continuously_and_within_the_limits(model):
    """The planned torque offset is the rigid body plus fc tanh(qd / FRICTION_SMOOTHING) + fv qd: continuous
    through zero velocity, and checked against the torque limits with the rest."""
    from driver import motion

    qd = np.linspace(-0.05, 0.05, 1001)[:, None] * np.ones(6)
    q, qdd = np.full_like(qd, 0.3), np.zeros_like(qd)
    tau = motion.feed_forward_torque(model, q, qd, qdd)
    rigid = dynamics.rnea(motion.rigid_body_model(model), q, qd, qdd)
    fc, fv = model.drive[:, 1], model.drive[:, 2]
    np.testing.assert_allclose(tau - rigid, fc * np.tanh(qd / motion.FRICTION_SMOOTHING) + fv * qd, atol=1e-12)
    far = np.abs(qd[:, 0]) > 3 * motion.FRICTION_SMOOTHING
    np.testing.assert_allclose((tau - rigid)[far], (np.sign(qd) * fc + fv * qd)[far], rtol=0.01)
    # continuous: between samples 1e-4 rad/s apart the Coulomb term moves by at most fc * 1e-4 / v_eps
    assert np.all(np.abs(np.diff(tau - rigid, axis=0)) <= fc * 1e-4 / motion.FRICTION_SMOOTHING + fv * 1e-4 + 1e-12)
    plan = motion.plan_move(model, np.zeros(6), np.full(6, 0.3), RATE)
    expect = motion.feed_forward_torque(model, plan.q, plan.qd, plan.qdd)
    np.testing.assert_allclose(plan.tau_ff, expect)
    assert np.abs(plan.tau_ff[:, 0] - dynamics.rnea(motion.rigid_body_model(model), plan.q, plan.qd, plan.qdd)[:, 0]).max() > 0.5 * fc[0]
    # a torque limit the rigid body keeps and the friction breaks: the plan is refused for its feed-forward
    rigid = dynamics.rnea(motion.rigid_body_model(model), plan.q, plan.qd, plan.qdd)
    weak = dataclasses.replace(model, tau_max=np.abs(rigid).max(axis=0) + 0.01)
    with pytest.raises(motion.MotionError, match="torque feed-forward .* is outside its torque limit"):
        motion._motion(weak, "move_to", RATE, [("move_to", plan.q, plan.qd, plan.qdd)])


def test_the_observer_integrates_over_the_device_time_and_restarts_after_a_long_gap(model):
    """A sample that comes late counts its true period; one after more than GAP_PERIODS restarts the observer
    (no false collision from the torque it did not see)."""
    from driver.collision import GAP_PERIODS, CollisionMonitor
    from driver.observer import MomentumObserver

    q, qd, current, out = np.full(6, 0.2), np.zeros(6), np.zeros(6), np.zeros(6)
    current[:] = dynamics.gravity_torques(model, q) / model.joint_torque_per_amp() + 0.5   # 0.5 A more than gravity
    mon = CollisionMonitor(MomentumObserver(model, RATE), make_thresholds(6, model.tau_max),
                           model.joint_torque_per_amp())
    for k in range(3):
        mon.watch(q, qd, current, out, True, True, k * 1_000_000)
    one = out.copy()
    mon.watch(q, qd, current, out, True, True, 2_000_000 + 3_000_000)      # three periods later
    # at rest, what holds the motors' excess over gravity and the friction offset is external: tau_ext =
    # offset - excess, and the estimate steps by K dt (tau_ext - r) per sample, dt the sample's own period
    tau_ext = model.drive[:, 3] - 0.5 * model.joint_torque_per_amp()
    np.testing.assert_allclose(one, tau_ext * (1.0 - 0.9 ** 2), rtol=1e-6)     # two steps of 1 ms so far
    np.testing.assert_allclose(out, one + 100.0 * 0.003 * (tau_ext - one), rtol=1e-6)
    mon.watch(q, qd, current, out, True, True, 5_000_000 + int((GAP_PERIODS + 1) * 1_000_000))
    assert mon.restarts == 1 and not out.any()


class _Interleaving(np.ndarray):
    """A peak array whose tolist() lets another thread run `during` (bounded wait) before it returns: the health
    thread's read at the worst moment for the cycle."""

    during = None

    def tolist(self):
        out = super().tolist()
        if self.during is not None:
            worker = threading.Thread(target=self.during, daemon=True)
            worker.start()
            worker.join(timeout=0.5)          # with the lock the cycle waits for the read to end
            self.join = worker.join
        return out


def test_a_peak_raised_while_the_health_thread_reads_the_peaks_is_not_lost(model):
    """The cycle raises the |tau_ext| peaks while the health thread reads and clears them: a peak that comes in
    between is reported then or in the next report, never cleared unseen."""
    from driver.collision import CollisionMonitor
    from driver.observer import MomentumObserver

    q, qd, out = np.full(6, 0.2), np.zeros(6), np.zeros(6)
    rest = dynamics.gravity_torques(model, q) / model.joint_torque_per_amp()
    mon = CollisionMonitor(MomentumObserver(model, RATE), make_thresholds(6, model.tau_max),
                           model.joint_torque_per_amp())
    mon.watch(q, qd, rest, out, True, True, 0)
    peak = np.zeros(6).view(_Interleaving)
    mon.peak = peak
    pushed = rest.copy()
    pushed[1] += 2.0                                   # 2 A more on joint 2: an external torque the observer sees

    def cycle():
        mon.watch(q, qd, pushed, out, True, True, 1_000_000)

    peak.during = cycle
    first = mon.peaks()
    peak.during = None
    peak.join(timeout=5.0)
    second = mon.peaks()
    seen = max(first[1], second[1])
    assert seen > 0.0 and seen == pytest.approx(abs(out[1]), rel=1e-12), (first, second, out)


def test_feed_forward_friction_off_leaves_the_rigid_body_alone_in_every_plan(model, tmp_path):
    """[model] feed_forward_friction = false (drives that compensate friction themselves): planned motions, the stop
    of one and a blend into another send the rigid body's torque only."""
    from driver import blending, motion, stopping
    from driver.config import ConfigError, load_config
    from driver.planner import PlanBounds
    from driver.plan_requests import plan_request

    path = tmp_path / "c.toml"
    path.write_text('[transport]\nname = "sim"\n[model]\nfeed_forward_friction = false\n')
    assert load_config(path).watch.feed_forward_friction is False
    path.write_text('[transport]\nname = "sim"\n[model]\nfeed_forward_friction = "no"\n')
    with pytest.raises(ConfigError, match=r"model\.feed_forward_friction: expected true or false"):
        load_config(path)
    raw = json.dumps({"cmd": "move_to", "q": [0.3, -0.2, 0.2, 0.1, 0.1, 0.1]}).encode()
    rigid = lambda p: dynamics.rnea(motion.rigid_body_model(model), p.q, p.qd, p.qdd)   # noqa: E731
    without = plan_request(raw, model, np.zeros(6), RATE, PlanBounds(friction=False))
    with_ = plan_request(raw, model, np.zeros(6), RATE, PlanBounds())
    assert not without.friction and with_.friction
    np.testing.assert_allclose(without.tau_ff, rigid(without), atol=1e-9)
    assert np.abs(with_.tau_ff - rigid(with_)).max() > 0.5 * model.drive[0, 1]
    stop = stopping.plan_stop(model, without, without.samples // 2)
    assert not stop.friction
    np.testing.assert_allclose(stop.tau_ff, rigid(stop), atol=1e-9)
    preempt = json.dumps({"cmd": "run_trajectory", "preempt": True, "samples": {
        "t": [0.0, 1.0], "q": [[0.3, -0.2, 0.2, 0.1, 0.1, 0.1], [0.35, -0.25, 0.25, 0.15, 0.15, 0.15]]}}).encode()
    new = plan_request(preempt, model, without.q[without.samples // 2], RATE, PlanBounds(friction=False))
    blend = blending.plan_blend(model, without, without.samples // 2, new)
    assert not blend.friction
    np.testing.assert_allclose(blend.tau_ff, rigid(blend), atol=1e-9)
