"""End to end on the simulated arm, hardware in the loop: `armid demo --transport T` starts `armid sim`
behind transport T, `armid driver` connected to it and `armid record` on its stream, as processes on
loopback (armid.chain); runs enable, move_to and two run_trajectory commands through the driver's command
channel; converts the recording and identifies it. Once per transport (serial over a pty, CAN on
python-can's udp_multicast, the Modbus TCP gateway), shared by the tests below; the chain checks of all three
run by default.

Fast mode (FAST): a quarter period of the seed000 excitation (at the transport's plan, docs/guides/demo.md),
blended in from rest and out to rest over 2 s each, then the same motion time-reversed for validation.
Nothing else is shortened: real processes, real links, the driver's real-time cycle, the real recorder.

The chain checks, per transport:
- the demo exits 0, its recording is complete with no state message lost (no seq gap);
- the stream ran at the plan's rate in the arm's own time: the simulator is clocked by the host (one cycle
  per driver cycle), so consecutive fresh samples are one simulator cycle apart (median device-time
  interval = 1 / rate), and most cycles delivered a fresh sample;
- the trajectory ran: the excitation window starts and ends at rest at the trajectory's mean pose (within
  REST_TOLERANCE) and sweeps
  each joint over the range the commanded samples sweep;
- identification produced a result: finite parameters, at least MIN_MEANINGFUL well identified, a
  validation RMS per joint;
- the run split into the simulator's noise (known from the demo's --seed and each sample's device time,
  sim.noise_split) and the rest: every recorded current carries its own cycle's noise, and the recording with the
  noise removed identifies the truth within 1 sigma (the bias the chain itself adds).
And the statistics, on all three in the default run (see the comment above the test for what kept CAN's and
the gateway's opt-in): the base parameters whose reported relative standard deviation is at most the product's
"well identified" bound (ident.outputs.results.BADLY_IDENTIFIED_PCT, 10 %) lie within the family-wise bound of
the simulator's truth (the generic6 model it runs): the number of reported sigmas that all m of them stay within
with probability 1 - FALSE_FAILURE when the sigmas are honest (ident.outputs.fleet_drift.family_wise_sigma, about
4.2 for m = 34); the assertion message lists every z-score.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from armid import chain, cli
from armid.commands import demo
from firmware_bridge.recording import StateLog, read_recording
from firmware_bridge import stream
from ident.fit import excitation
from ident.model.base_params import base_parameters
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from ident.outputs.fleet_drift import family_wise_sigma
from ident.outputs.results import BADLY_IDENTIFIED_PCT

FAST = ["--periods", "0.25"]
PERIODS = 0.25
MIN_MEANINGFUL = 3     # fewer well-identified parameters than this: the excitation reached nothing
MIN_FRESH = 0.5        # fraction of the driver's cycles that must carry a new sample
SEED = 11             # the simulator's noise: any but 0, the seed the chain's simulator ran with whatever the demo said
FALSE_FAILURE = 1e-3   # the statistics test's chance of failing a run whose sigmas are honest and estimate unbiased
REST_TOLERANCE = 0.02  # rad: the simulated drives' loops, tuned for 1 kHz, hold joint 3 in a limit cycle up to
                       # 13 mrad off its target at CAN's 250 Hz (docs/guides/demo.md); their following-error window is 0.05


@pytest.fixture(scope="module")
def truth():
    model = load_model("generic6")
    base = base_parameters(model)
    return base.names, base.from_standard(model.standard_parameters())


@dataclass
class DemoRun:
    transport: str
    clocking: str
    out: Path
    code: int
    stdout: str
    stderr: str
    log: StateLog | None


# Transports whose chain checks are opt-in (`-m e2e`): none now. CAN's was, because python-can's udp_multicast
# (the only interface that joins two processes here: no SocketCAN) lost frames when a process stalled under load
# (the kernel's default 212992-byte socket buffer holds 8 cycles), and a lost RPDO was a target held for a cycle,
# then a jump: the simulated drive 6 tripped its following error (0x8611) in about one run of three at load 3.5.
# Now both sides' sockets get 4 MiB and hear their own group only, the simulated drives extrapolate a lost target
# as CiA 402 drives do, and the driver keeps every complete sample in order (docs/guides/demo.md).
E2E_ONLY: set[str] = set()
# Each transport with its simulator in lockstep with the driver, and serial and the gateway also free-running
# (their devices on their own drifting, jittering clocks, as hardware is: armid.chain.FREE_PLANS; CAN's drives
# step on the master's SYNC either way).
RUNS = [(t, "lockstep") for t in chain.TRANSPORTS] + [("serial", "free"), ("gateway", "free")]
# The free-running runs were opt-in (`-m e2e`): on a machine loaded by other work a free-running host fell behind
# the device's clock for stretches and the simulated drives' setpoint buffer carried every late burst as lasting
# latency (120-171 ms of lag). With the latency bounded (never with a jump), the cycle and the simulator
# real-time where permitted, no compile in the cycle and the planner off the real-time policy, the lag holds, but
# they still fail too often under load to run by default: serial's validation trajectory ended in a following-
# error fault (0x8611, drive 2) once at load 5, and their statistics are off (the comment above the free-running
# statistics test). Opt-in until that is found.
E2E_ONLY_RUNS: set[tuple[str, str]] = {("serial", "free"), ("gateway", "free")}


@pytest.fixture(scope="module", params=[pytest.param(r, marks=pytest.mark.e2e, id=f"{r[0]}-{r[1]}")
                                        if r[0] in E2E_ONLY or r in E2E_ONLY_RUNS
                                        else pytest.param(r, id=f"{r[0]}-{r[1]}") for r in RUNS])
def demo_run(request, tmp_path_factory) -> DemoRun:
    """`armid demo --transport T --clocking C` in fast mode, once per run of RUNS for the tests of this module."""
    transport, clocking = request.param
    out = tmp_path_factory.mktemp("e2e") / f"{transport}-{clocking}"
    so, se = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        code = cli.main(["demo", "-o", str(out), "--transport", transport, "--clocking", clocking, *FAST, "--quiet",
                         "--seed", str(SEED)])
    log = read_recording(out / "run.mcap") if (out / "run.mcap").is_file() else None
    return DemoRun(transport, clocking, out, code, so.getvalue(), se.getvalue(), log)


def _ran(run: DemoRun) -> None:
    assert run.code == 0, f"armid demo --transport {run.transport} --clocking {run.clocking} failed: {run.stderr[-2000:]}"


def test_the_demo_chain_streams_at_its_rate_without_a_lost_message(demo_run):
    _ran(demo_run)
    assert "stream: " in demo_run.stdout and "report: " in demo_run.stdout
    log = demo_run.log
    assert log.complete
    assert log.seq_gaps() == (0, 0)
    plan = chain.plan_for(demo_run.transport, clocking=demo_run.clocking)
    s = log.states
    fresh = s[(s["flags"] & stream.FLAG_STALE) == 0]
    assert len(fresh) >= MIN_FRESH * len(s), f"{len(fresh)} fresh samples of {len(s)} messages"
    interval = np.median(np.diff(fresh["device_time_ns"])) * 1e-9
    assert interval == pytest.approx(1.0 / plan.rate_hz, rel=0.01), "one simulator cycle per driver cycle"


def test_the_demo_chain_ran_the_excitation_from_rest_at_its_start_pose_over_its_whole_range(demo_run):
    _ran(demo_run)
    plan = chain.plan_for(demo_run.transport, clocking=demo_run.clocking)
    traj = demo.time_scaled(excitation.preset("seed000"), plan.slowdown)
    _, q_cmd = demo.excitation_samples(traj, PERIODS)
    with np.load(demo_run.out / "excitation.npz") as data:
        q = data["q"]
    assert q.shape[1] == 6 and len(q) > 100
    # rad: at rest at the start pose and back there at the end, within REST_TOLERANCE
    np.testing.assert_allclose(q[0], traj.q0, atol=REST_TOLERANCE)
    np.testing.assert_allclose(q[-1], traj.q0, atol=REST_TOLERANCE)
    swept, commanded = np.ptp(q, axis=0), np.ptp(q_cmd, axis=0)
    np.testing.assert_allclose(swept, commanded, rtol=0.05, atol=0.01)


def test_the_demo_chain_identifies_the_recording_and_validates_it(demo_run, truth):
    _ran(demo_run)
    names, _ = truth
    doc = json.loads((demo_run.out / "result.json").read_text())
    rows = doc["base_parameters"]
    assert [r["name"] for r in rows] == names
    assert all(r["value"] is not None and np.isfinite(r["value"]) for r in rows)
    pct = np.array([np.inf if r["relative_std_pct"] is None else r["relative_std_pct"] for r in rows])
    assert (pct <= BADLY_IDENTIFIED_PCT).sum() >= MIN_MEANINGFUL, "the excitation identified next to nothing"
    rms = np.array(doc["validation"]["rms"], dtype=float)
    assert rms.shape == (6,) and np.all(np.isfinite(rms)) and np.all(rms > 0)
    # the identification used the fresh samples as recorded, and the summary says what it did with lost ones
    data = doc["data"]
    with np.load(demo_run.out / "excitation.npz") as npz:
        assert data["samples"] == npz["t"].size and np.all(np.diff(npz["t"]) > 0)
    line = next(x for x in demo_run.stdout.splitlines() if x.startswith("identification data:"))
    assert line.startswith(f"identification data: {data['samples']} fresh samples at {data['rate_hz']:g} Hz")
    assert (f"{data['bridged_samples']} lost samples bridged" in line) == (data["bridged_samples"] > 0)
    assert (f"cut into {data['segments']} uniformly sampled segments" in line) == (data["segments"] > 1)


def z_scores(doc: dict, true_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(identified - true) / reported sigma of every base parameter, and which are well identified
    (relative sigma at most BADLY_IDENTIFIED_PCT)."""
    rows = doc["base_parameters"]
    value = np.array([r["value"] for r in rows], dtype=float)
    std = np.array([r["std"] for r in rows], dtype=float)
    pct = np.array([np.inf if r["relative_std_pct"] is None else r["relative_std_pct"] for r in rows])
    return (value - true_values) / std, pct <= BADLY_IDENTIFIED_PCT


# The gateway's was opt-in for torque kicks and lost samples at 400 Hz (max |z| 4.2, 6.2, 1.6, 3.3, 3.2 over five
# runs): its link re-sent the last command when the cycle was late, and the host-clocked gateway ran a cycle on the
# stale target; at 400 Hz one exchange took ~1.7 ms of the 2.5 ms period, so targets were also skipped. The link now
# only reads then, and the gateway ran at 250 Hz: 7 of 7 runs passed, max |z| 1.7-2.4, two of them with two busy
# processes added. Its link still sent only the newest command, and a target skipped when the link fell behind
# failed the check now and then (max |z| 5.0-6.3); since every command goes out once and in order it runs at 1 kHz:
# 8 of 8 passed, max |z| 2.1-2.9, two at load 2.9 (docs/guides/demo.md).
# CAN's was opt-in for its drives' bias at 250 Hz (fv2/fv3 +2 to +5 sigma: the linear interpolation of the targets
# between the drives' 1 kHz loop ticks, docs/reference/simulator.md); with the drives' cubic interpolation it passed 12 of 12
# runs at load 2.6-5.5, max |z| 1.7-2.7 (docs/guides/demo.md).
def test_the_well_identified_parameters_lie_within_the_family_wise_bound_of_the_simulators_truth(demo_run, truth):
    """Every well-identified base parameter within family_wise_sigma(FALSE_FAILURE, m) reported sigmas of the
    truth, m the number of them (about 4.2 sigma for 34): with honest sigmas all m stay inside with probability at
    least 1 - FALSE_FAILURE (Sidak's bound holds for correlated estimates too), so one failure in a thousand
    correct runs; a bias of the size this test has caught (the half-period effort lag: 9.7 sigma) still fails.
    It holds for every term, friction and joint 6's drive terms included, with no exception: an earlier rule
    (at most one term beyond 3, none beyond 4) failed about 0.6 % of correct runs, and its allowance for joint 6
    (Ia6 at -4.2 and -4.3 sigma in two runs, never reproduced in the later runs) turned out to be the noise: the
    same runs' noise-free estimates (the test below) show the lockstep chains add 0.3 sigma at most, and Ia6 at
    -2.75 and -3.14 in two of them came out -0.07 with the noise removed. Joint 3's Coulomb friction, 2.5-3.4
    sigma high while rows whose decimation window spanned a reversal were kept, is unbiased since
    (ident.fit.batch.slow_window).
    Free-running runs: test_on_a_free_running_chain_the_well_identified_parameters_lie_within_the_bound."""
    if demo_run.clocking == "free":
        pytest.skip("a free-running run's statistics are checked under -m e2e (see the comment below)")
    _check_family_wise(demo_run, truth)


# The free-running runs (chain checks and statistics) are opt-in, `-m e2e`. At load 9-13 two well-identified terms
# lay beyond 3 sigma in 2 of 3 serial runs and 1 of 4 gateway runs, and one serial run's own bias, noise removed,
# was 3.9 sigma: a host late by more than the simulated drives' setpoint buffer and extrapolation (3 + 4 cycles)
# makes them hold their last received target in mid-motion, behind the one they had extrapolated to; the arm stops,
# reverses and saturates its torques, and the friction of a reversal shorter than the filters biases friction and
# inertia (docs/design/science.md; benchmarks/bench_chain_bias.py --late-host reproduces it in process).


@pytest.mark.e2e
def test_on_a_free_running_chain_the_well_identified_parameters_lie_within_the_bound(demo_run, truth):
    """The criterion above, on the free-running runs (opt-in: see the comment above)."""
    if demo_run.clocking != "free":
        pytest.skip("lockstep runs: checked by the test above")
    _check_family_wise(demo_run, truth)


def _check_family_wise(demo_run: DemoRun, truth) -> None:
    _ran(demo_run)
    names, true_values = truth
    z, meaningful = z_scores(json.loads((demo_run.out / "result.json").read_text()), true_values)
    assert meaningful.sum() >= MIN_MEANINGFUL
    listed = ", ".join(f"{n} {v:+.1f}" for n, v, m in zip(names, z, meaningful) if m)
    every = np.abs(z[meaningful])
    bound = family_wise_sigma(FALSE_FAILURE, every.size)
    assert every.max() <= bound, (f"{demo_run.transport} {demo_run.clocking}: max |z| {every.max():.1f} over "
                                  f"{every.size} parameters (bound {bound:.2f}): {listed}")


# -- the chain split into the simulator's noise and the rest (sim.noise_split) ---------------------------------
def _noise(demo_run: DemoRun, samples: np.ndarray) -> np.ndarray:
    from sim import NoiseConfig
    from sim.noise_split import noise_torques

    plan = chain.plan_for(demo_run.transport, clocking=demo_run.clocking)
    model = load_model("generic6")
    return noise_torques(samples, seed=SEED, current_std=NoiseConfig().current_std, rate_hz=plan.sim_rate_hz,
                         torque_per_amp=model.joint_torque_per_amp())


def test_every_recorded_sample_carries_the_current_noise_the_simulator_drew_at_that_samples_device_time(demo_run):
    """The simulator's current noise is known per cycle (its seed, the demo's --seed), so the pairing of every
    recorded current with its own device time through the transport, the driver and the recorder is checked
    sample by sample: the high-passed effort regressed on the noise drawn at that cycle and at the cycles before and
    after it, together, gives 1 for its own cycle and 0 for the others, each within 5 standard errors of the regression (the drives' own effort ripple
    is the rest of the high-passed effort; 0.03-0.09 on serial and the gateway at 1 kHz; CAN at 250 Hz and the
    free-running chains ripple too much for the check, 0.13-1.4, and skip it)."""
    import scipy.signal
    from sim.noise_split import fresh_samples

    _ran(demo_run)
    s = fresh_samples(demo_run.log.states)
    s = s[len(s) // 10:]               # the arm moving and at rest, from well after the start
    rough = s["torque"] - scipy.signal.savgol_filter(s["torque"], 31, 3, axis=0)
    period_ns = 1e9 / chain.plan_for(demo_run.transport, clocking=demo_run.clocking).sim_rate_hz

    def high_passed_noise(shift: int) -> np.ndarray:
        moved = s.copy()
        moved["device_time_ns"] += int(round(shift * period_ns))
        noise = _noise(demo_run, moved)
        return noise - scipy.signal.savgol_filter(noise, 31, 3, axis=0)

    # One regression per joint on the noise of the cycle before, the sample's own and the one after together: the
    # high-pass makes neighbouring cycles' filtered noise correlated (about -0.08 for a 31-point cubic filter), so
    # each alone would pick up part of its neighbour's slope; together the coefficients are exactly 0, 1, 0.
    shifts = (-1, 0, 1)
    x = np.stack([high_passed_noise(k) for k in shifts], axis=-1)         # samples x joints x shifts
    b = np.empty((rough.shape[1], len(shifts)))
    se = np.empty_like(b)
    for j in range(rough.shape[1]):
        coef, *_ = np.linalg.lstsq(x[:, j], rough[:, j], rcond=None)
        rest = rough[:, j] - x[:, j] @ coef
        b[j] = coef
        se[j] = np.sqrt(np.mean(rest ** 2) * np.diag(np.linalg.inv(x[:, j].T @ x[:, j])))
    own = shifts.index(0)
    if not np.all(se[:, own] < 0.15):   # 5 standard errors must still tell 1 from 0
        # CAN at 250 Hz: the current averaged over the drives' four loop ticks ripples 0.13-0.25 noise units per
        # sample; the noise-free identification below still fails on noise paired with the wrong cycle
        pytest.skip(f"the noise is too small against the drives' effort ripple to check it per sample "
                    f"(se {se[:, own]})")
    for i, shift in enumerate(shifts):
        expected = 1.0 if shift == 0 else 0.0
        assert np.all(np.abs(b[:, i] - expected) < 5 * se[:, i]), (
            f"the noise {shift:+d} cycle: slopes {b[:, i]} (expected {expected}, se {se[:, i]})")


def test_without_the_simulators_noise_the_chains_recording_identifies_the_truth_within_one_sigma(demo_run, truth):
    """The systematic part of the chain's estimate: the same excitation.npz with the noise of every sample
    subtracted, identified as `armid identify` did, against the truth in the noisy run's reported sigmas. Anything
    the chain does to the samples (timing, pairing, held or skipped targets, stamps, the recording) that biases the
    estimate stays; the noise, which decides the statistics criterion run by run, goes. Measured on the lockstep
    chains: at most 0.3 sigma on every well-identified base parameter (15 serial and gateway runs; the same motion
    in process with the noise off: 0.43). A simulator process stopped for 50 ms every 0.7 s made it 0.9-1.6; a
    free-running chain whose host is late in mid-motion 2.0-3.9 (docs/design/science.md)."""
    from ident.fit import excitation as excitation_file
    from ident.fit.batch import identify
    from ident.fit.preprocess import load_recording
    from sim.noise_split import window

    _ran(demo_run)
    names, true_values = truth
    model = load_model("generic6")
    rec = load_recording(demo_run.out / "excitation.npz")
    samples = window(demo_run.log.states, rec.q)
    clean = dataclasses.replace(rec, tau=rec.tau - _noise(demo_run, samples))
    fit = identify(model, clean, trajectory=excitation_file.load(demo_run.out / "excitation.toml"),
                   base=base_parameters(model)).fit
    doc = json.loads((demo_run.out / "result.json").read_text())
    _, meaningful = z_scores(doc, true_values)
    z_clean = (fit.beta - true_values) / np.array([r["std"] for r in doc["base_parameters"]])
    listed = ", ".join(f"{n} {v:+.2f}" for n, v, m in zip(names, z_clean, meaningful) if m)
    assert np.abs(z_clean[meaningful]).max() <= 1.0, \
        f"{demo_run.transport} {demo_run.clocking}: the chain's own bias, noise removed: {listed}"


# -- the chain's own pieces (fast) ----------------------------------------------------------------------------
def test_the_sims_ready_line_becomes_a_driver_config_that_the_driver_reads_back(tmp_path):
    from driver.config import load_config

    options = chain.transport_options("serial", "armid sim: serial ready: port=/dev/pts/7 baudrate=3000000")
    assert options == {"port": "/dev/pts/7", "baudrate": 3000000}
    plan = chain.plan_for("serial")
    path = tmp_path / "driver.toml"
    path.write_text(chain.driver_config("serial", {**options, **dict(plan.driver_options)}, rate_hz=plan.rate_hz,
                                       watchdog_ms=plan.watchdog_ms, state="ipc:///tmp/x-state",
                                       commands="ipc:///tmp/x-commands", effort_delay_ms=0.5))
    cfg = load_config(path)
    assert cfg.transport == "serial" and cfg.rate_hz == plan.rate_hz and cfg.effort_delay_s == 0.5e-3
    assert cfg.transport_options == {"port": "/dev/pts/7", "baudrate": 3000000, "device_watchdog_ms": 2000}
    assert cfg.endpoints.state == "ipc:///tmp/x-state" and cfg.endpoints.commands == "ipc:///tmp/x-commands"
    assert cfg.watch.feed_forward_friction is False      # `armid sim`'s drives compensate friction themselves
    with pytest.raises(chain.ChainError, match="printed no address"):
        chain.transport_options("gateway", "something else")


def test_every_transport_runs_the_simulator_at_the_drivers_rate_because_the_host_clocks_it():
    """CAN's drives step on each SYNC, serial's boards on each COMMAND, the gateway on each exchange: the
    simulator's dt is the driver's period, at the default rate and at any other."""
    for name in chain.TRANSPORTS:
        p = chain.plan_for(name)
        assert p.lockstep and p.sim_rate_hz == p.rate_hz
        for rate in (100.0, 400.0):
            p = chain.plan_for(name, rate)
            assert p.rate_hz == p.sim_rate_hz == rate
    assert "step_on_command=true" in chain.plan_for("serial").sim_args
    assert "step_on_exchange=true" in chain.plan_for("gateway").sim_args
    assert chain.plan_for("gateway").clock == chain.plan_for("serial").clock == "host"
    with pytest.raises(InputError, match="unknown"):
        chain.plan_for("ethercat")


def test_free_running_plans_leave_the_devices_on_their_own_drifting_clocks():
    for name in ("serial", "gateway"):
        p = chain.plan_for(name, clocking="free")
        assert not p.lockstep and not any(a.startswith("step_on_") for a in p.sim_args)
        assert p.sim_args[-4:] == ("--clock-drift-ppm", f"{chain.FREE_DRIFT_PPM:g}", "--clock-jitter-us",
                                   f"{chain.FREE_JITTER_US:g}")
        assert p.sim_rate_hz == p.rate_hz
        assert chain.plan_for(name, 100.0, "free").sim_rate_hz == 100.0
    assert chain.plan_for("serial", clocking="free").clock == "auto"       # the driver follows the device's samples
    assert chain.plan_for("can", clocking="free") == chain.plan_for("can")   # CANopen drives step on the SYNC
    with pytest.raises(InputError, match="--clocking: unknown 'wall'"):
        chain.plan_for("serial", clocking="wall")


def _log(seq, flags, host_ns):
    from firmware_bridge.recording import StateLog
    from firmware_bridge import stream

    s = np.zeros(len(seq), dtype=stream.state_dtype(6))
    s["seq"], s["flags"], s["host_time_ns"], s["device_time_ns"] = seq, flags, host_ns, host_ns
    return StateLog("x.mcap", tuple(f"j{k}" for k in range(1, 7)), s, True, 0, "", {})


def test_stream_figures_count_seq_gaps_and_stale_messages_and_the_motion_window_keeps_moving_ones():
    from firmware_bridge import stream

    seq = np.array([10, 11, 12, 15, 16, 20])
    flags = np.array([0, stream.FLAG_MOVING, stream.FLAG_MOVING | stream.FLAG_STALE, stream.FLAG_MOVING, 0,
                      stream.FLAG_MOVING])
    log = _log(seq, flags, np.arange(6) * 1_000_000)
    f = chain.stream_figures(log)
    assert (f.messages, f.dropped, f.gaps, f.stale) == (6, 5, 2, 1)
    assert f.rate_hz == pytest.approx(1000.0) and f.seconds == pytest.approx(0.005)
    window = chain.motion_window(log, 11, 16)
    assert list(window.states["seq"]) == [11, 12, 15]
    with pytest.raises(chain.ChainError, match="no MOVING"):
        chain.motion_window(log, 16, 19)


def test_the_demos_help_states_each_transports_rate_as_the_chain_plans_it():
    import argparse

    parser = argparse.ArgumentParser()
    demo.register(parser.add_subparsers())
    text = " ".join(parser._subparsers._group_actions[0].choices["demo"].format_help().split())
    rates = ", ".join(f"{name} {chain.plan_for(name).rate_hz:g}" for name in chain.TRANSPORTS)
    assert f"default: {rates} Hz" in text
    assert all(chain.plan_for(name).slowdown == 1.0 for name in chain.TRANSPORTS)
