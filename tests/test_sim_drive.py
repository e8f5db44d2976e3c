"""The simulated CiA 402 drives, seen as a host sees them (controlword in, statusword out): every transition
of the standard's table, illegal commands ignored, faults and fault reset, CSP tracking, CST, following
error, quick stop, position limits and torque saturation."""
import numpy as np
import pytest
from sim_helpers import enable, fourier, fourier_at_rest

from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode, State, state_of
from ident.model import dynamics as dyn
from firmware_bridge.runtime.errors import InputError
from ident.model import load_model
from sim import Simulator
from sim.drive import DriveConfig
from sim.plant import FrictionConfig, NoiseConfig

S = State
SHUTDOWN, SWITCH_ON, ENABLE, DISABLE_VOLTAGE, QUICK_STOP = 0x06, 0x07, 0x0F, 0x00, 0x02
DISABLE_OPERATION = 0x07
COMMANDS = {"shutdown": SHUTDOWN, "switch on": SWITCH_ON, "enable operation": ENABLE,
            "disable voltage": DISABLE_VOLTAGE, "quick stop": QUICK_STOP,
            "shutdown (bit 3 set)": 0x0E, "disable voltage (bit 2 set)": 0x04, "quick stop (bit 0 set)": 0x03}

# CiA 402 (IEC 61800-7-201) state transition table, written from the standard, not from the code:
# (state, controlword) -> (next state, transition number). Anything else leaves the state unchanged.
TABLE = {
    (S.SWITCH_ON_DISABLED, SHUTDOWN): (S.READY_TO_SWITCH_ON, "2"),
    (S.SWITCH_ON_DISABLED, 0x0E): (S.READY_TO_SWITCH_ON, "2"),
    (S.READY_TO_SWITCH_ON, SWITCH_ON): (S.SWITCHED_ON, "3"),
    (S.READY_TO_SWITCH_ON, ENABLE): (S.OPERATION_ENABLED, "3+4"),
    (S.SWITCHED_ON, ENABLE): (S.OPERATION_ENABLED, "4"),
    (S.OPERATION_ENABLED, DISABLE_OPERATION): (S.SWITCHED_ON, "5"),
    (S.OPERATION_ENABLED, 0x03): (S.QUICK_STOP_ACTIVE, "11"),
    (S.SWITCHED_ON, SHUTDOWN): (S.READY_TO_SWITCH_ON, "6"),
    (S.SWITCHED_ON, 0x0E): (S.READY_TO_SWITCH_ON, "6"),
    (S.READY_TO_SWITCH_ON, DISABLE_VOLTAGE): (S.SWITCH_ON_DISABLED, "7"),
    (S.READY_TO_SWITCH_ON, 0x04): (S.SWITCH_ON_DISABLED, "7"),
    (S.READY_TO_SWITCH_ON, QUICK_STOP): (S.SWITCH_ON_DISABLED, "7"),
    (S.READY_TO_SWITCH_ON, 0x03): (S.SWITCH_ON_DISABLED, "7"),
    (S.OPERATION_ENABLED, SHUTDOWN): (S.READY_TO_SWITCH_ON, "8"),
    (S.OPERATION_ENABLED, 0x0E): (S.READY_TO_SWITCH_ON, "8"),
    (S.OPERATION_ENABLED, DISABLE_VOLTAGE): (S.SWITCH_ON_DISABLED, "9"),
    (S.OPERATION_ENABLED, 0x04): (S.SWITCH_ON_DISABLED, "9"),
    (S.SWITCHED_ON, DISABLE_VOLTAGE): (S.SWITCH_ON_DISABLED, "10"),
    (S.SWITCHED_ON, 0x04): (S.SWITCH_ON_DISABLED, "10"),
    (S.SWITCHED_ON, QUICK_STOP): (S.SWITCH_ON_DISABLED, "10"),
    (S.SWITCHED_ON, 0x03): (S.SWITCH_ON_DISABLED, "10"),
    (S.OPERATION_ENABLED, QUICK_STOP): (S.QUICK_STOP_ACTIVE, "11"),
    (S.QUICK_STOP_ACTIVE, DISABLE_VOLTAGE): (S.SWITCH_ON_DISABLED, "12"),
    (S.QUICK_STOP_ACTIVE, 0x04): (S.SWITCH_ON_DISABLED, "12"),
    (S.QUICK_STOP_ACTIVE, ENABLE): (S.OPERATION_ENABLED, "16"),  # quick-stop option 5..8
}
PATH = {  # controlwords that lead from SWITCH ON DISABLED to each state
    S.SWITCH_ON_DISABLED: [],
    S.READY_TO_SWITCH_ON: [SHUTDOWN],
    S.SWITCHED_ON: [SHUTDOWN, SWITCH_ON],
    S.OPERATION_ENABLED: [SHUTDOWN, SWITCH_ON, ENABLE],
    S.QUICK_STOP_ACTIVE: [SHUTDOWN, SWITCH_ON, ENABLE, QUICK_STOP],
}


@pytest.fixture(scope="module")
def model():
    return load_model("generic6")


def quiet_sim(model, **kw):
    kw.setdefault("noise", NoiseConfig.off())
    kw.setdefault("drive", DriveConfig(quick_stop_option=6))  # quick stop is a state one can stay in
    sim = Simulator(model, q0=[0.0, 0.3, -0.5, 0.2, 0.4, 0.1], **kw)
    sim.set_commands(mode=np.full(sim.n, int(Mode.CSP)))
    sim.step(1)
    return sim


def write(sim, cw: int, cycles: int = 1):
    sim.set_commands(controlword=np.full(sim.n, cw))
    sim.step(cycles)
    return sim.read_state()


def states_of(sample) -> set:
    return {state_of(int(w)) for w in sample.statusword}


def go(sim, state: State):
    sample = write(sim, DISABLE_VOLTAGE)
    assert states_of(sample) == {S.SWITCH_ON_DISABLED}
    for cw in PATH[state]:
        sample = write(sim, cw)
    assert states_of(sample) == {state}


def test_power_up_is_not_ready_then_switch_on_disabled(model):
    sim = Simulator(model, noise=NoiseConfig.off())
    assert states_of(sim.read_state()) == {S.NOT_READY_TO_SWITCH_ON}      # transition 0
    sim.step(1)
    assert states_of(sim.read_state()) == {S.SWITCH_ON_DISABLED}          # transition 1


def test_every_transition_of_the_standard_table(model):
    sim = quiet_sim(model)
    for (start, cw), (end, number) in TABLE.items():
        go(sim, start)
        sample = write(sim, cw, 2)
        assert states_of(sample) == {end}, f"transition {number}: {start.value} + 0x{cw:02X}"
        word = int(sample.statusword[0])
        mask, value = cia402.STATE_PATTERNS[end]
        assert word & mask == value
        assert bool(word & cia402.SW_QUICK_STOP) == (end is not S.QUICK_STOP_ACTIVE)


@pytest.mark.parametrize("start", list(PATH))
def test_commands_outside_the_table_are_ignored(model, start):
    sim = quiet_sim(model)
    for name, cw in list(COMMANDS.items()) + [("fault reset", 0x80), ("fault reset + enable", 0x8F)]:
        if (start, cw) in TABLE:
            continue
        go(sim, start)
        sample = write(sim, cw, 3)
        assert states_of(sample) == {start}, f"{name} (0x{cw:02X}) in {start.value}"


def test_quick_stop_option_2_ends_in_switch_on_disabled_and_ignores_enable(model):
    sim = quiet_sim(model, drive=DriveConfig(quick_stop_option=2))
    go(sim, S.OPERATION_ENABLED)
    assert states_of(write(sim, QUICK_STOP)) == {S.QUICK_STOP_ACTIVE}
    assert states_of(write(sim, QUICK_STOP, 40)) == {S.SWITCH_ON_DISABLED}   # 12, automatic at rest
    assert states_of(write(sim, ENABLE, 3)) == {S.SWITCH_ON_DISABLED}


def test_fault_reaction_fault_and_reset_on_the_rising_edge_only(model):
    sim = quiet_sim(model)
    go(sim, S.OPERATION_ENABLED)
    sim.faults.drive_fault(2, 0x2310)
    sample = write(sim, ENABLE)
    assert sample.states()[2] is S.FAULT_REACTION_ACTIVE                       # 13
    assert sample.error_code[2] == 0x2310
    assert sample.states()[:2] + sample.states()[3:] == [S.OPERATION_ENABLED] * 5
    sample = write(sim, 0x80)                                                   # reset bit rises during the reaction
    assert sample.states()[2] is S.FAULT                                       # 14
    assert sample.statusword[2] & cia402.SW_FAULT
    assert write(sim, 0x80, 3).states()[2] is S.FAULT                          # held high: no new edge
    write(sim, 0x00)
    sample = write(sim, 0x80)
    assert sample.states()[2] is S.SWITCH_ON_DISABLED                          # 15
    assert sample.error_code[2] == 0


def test_a_sticky_fault_survives_reset_until_its_cause_is_cleared(model):
    sim = quiet_sim(model)
    go(sim, S.OPERATION_ENABLED)
    sim.faults.drive_fault(0, 0x5400, sticky=True)
    write(sim, ENABLE, 2)
    write(sim, 0x00)
    assert write(sim, 0x80).states()[0] is S.FAULT
    sim.faults.clear_drive_fault(0)
    write(sim, 0x00)
    assert write(sim, 0x80).states()[0] is S.SWITCH_ON_DISABLED


def test_brakes_hold_the_arm_while_the_drives_are_off_and_release_when_enabled(model):
    sim = quiet_sim(model)
    q0 = sim.read_truth().q
    sim.step(200)
    np.testing.assert_array_equal(sim.read_truth().q, q0)
    free = Simulator(model, noise=NoiseConfig.off(), brakes=False, q0=q0)
    free.step(200)
    assert np.abs(free.read_truth().q - q0).max() > 0.05  # without brakes it falls


def test_csp_tracks_a_smooth_fourier_trajectory(model):
    sim = Simulator(model, q0=[0.0, 0.3, -0.5, 0.2, 0.4, 0.1], seed=5)  # default sensor noise and quantisation
    enable(sim, Mode.CSP)
    sim.step(300)
    q0 = sim.read_truth().q
    rng = np.random.default_rng(1)
    a, b = fourier_at_rest(rng, model.n, 4, 0.15)
    wf = 2 * np.pi * 0.2
    err, ferr, speed = np.zeros(model.n), np.zeros(model.n), np.zeros(model.n)
    for k in range(5000):
        target, qd, _ = fourier(q0, a, b, wf, k * sim.dt)  # the target for the cycle starting now
        sim.set_commands(target_position=target)
        sample = sim.step(1)
        reached, _, _ = fourier(q0, a, b, wf, (k + 1) * sim.dt)
        err = np.maximum(err, np.abs(sim.read_truth().q - reached))
        ferr = np.maximum(ferr, np.abs(sample.following_error))
        speed = np.maximum(speed, np.abs(qd))
    _, qd0, qdd0 = fourier(q0, a, b, wf, 0.0)
    assert np.abs(qd0).max() < 1e-12 and np.abs(qdd0).max() < 1e-12   # starts at rest
    assert speed.min() > 0.2, speed                                    # a real excitation
    assert states_of(sim.read_state()) == {S.OPERATION_ENABLED}
    assert err.max() < 5e-4, err      # rad, at 0.2 to 0.4 rad/s (without feed-forward: ~ qd / KP = 7e-3)
    assert ferr.max() < 5e-4, ferr


def test_cst_applies_the_target_torque_and_saturates_at_the_torque_limit(model):
    sim = quiet_sim(model, friction=FrictionConfig(enabled=False))
    sim.set_commands(mode=np.full(model.n, int(Mode.CST)), target_torque=np.zeros(model.n))
    go(sim, S.OPERATION_ENABLED)
    tau = np.array([5.0, 30.0, -200.0, 1.0, -0.5, 0.2])  # joint 3 beyond its 60 N m
    before = sim.read_truth()
    sim.set_commands(target_torque=tau)
    sample = sim.step(1)
    truth = sim.read_truth()
    applied = np.clip(tau, -model.tau_max, model.tau_max)
    np.testing.assert_array_equal(truth.tau, applied)
    np.testing.assert_allclose(sample.torque, applied, rtol=1e-14)
    P = model.params_matrix().copy()
    P[:, 11:] = 0.0
    np.testing.assert_allclose(truth.qdd, dyn.forward_dynamics(model.with_parameters(P.ravel()), before.q, before.qd,
                                                               applied), rtol=0, atol=1e-12)
    assert sample.statusword[2] & cia402.SW_INTERNAL_LIMIT and not sample.statusword[0] & cia402.SW_INTERNAL_LIMIT
    sim.configure_drive(0, max_torque=2.0)
    assert sim.drive_parameters(0)["max_torque"] == 2.0
    sim.step(1)
    assert sim.read_truth().tau[0] == 2.0


def test_following_error_on_a_stalled_joint_faults_that_drive_after_the_timeout(model):
    sim = quiet_sim(model)
    go(sim, S.OPERATION_ENABLED)
    sim.configure_drive(1, following_error_window=0.02, following_error_timeout=0.015)
    sim.faults.stall(1)
    target = sim.read_state().position.copy()
    first_beyond = fault_at = None
    for k in range(400):
        target[1] += 0.5 * sim.dt
        sim.set_commands(target_position=target)
        sample = sim.step(1)
        if first_beyond is None and abs(target[1] - sample.position[1]) > 0.02:
            first_beyond = k
        if sample.states()[1] is not S.OPERATION_ENABLED:
            fault_at = k
            break
    assert fault_at is not None and first_beyond is not None
    assert 14 <= fault_at - first_beyond <= 17         # 15 ms beyond a 20 mrad window
    assert sample.states()[1] is S.FAULT_REACTION_ACTIVE
    assert sample.error_code[1] == 0x8611
    assert sample.statusword[1] & cia402.SW_FOLLOWING_ERROR
    others = sample.states()
    assert others[:1] + others[2:] == [S.OPERATION_ENABLED] * 5


def test_quick_stop_decelerates_at_the_set_rate_and_brings_the_joint_to_rest(model):
    for option, final in ((2, S.SWITCH_ON_DISABLED), (6, S.QUICK_STOP_ACTIVE)):
        sim = quiet_sim(model, drive=DriveConfig(quick_stop_option=option, quick_stop_deceleration=10.0))
        go(sim, S.OPERATION_ENABLED)
        target = sim.read_state().position.copy()
        v = 0.0
        for _ in range(1500):                                 # joint 1 up to 1.5 rad/s
            v = min(v + 10.0 * sim.dt, 1.5)
            target[0] += v * sim.dt
            sim.set_commands(target_position=target)
            sim.step(1)
        assert sim.read_truth().qd[0] == pytest.approx(1.5, abs=0.01)
        speeds = []
        sample = write(sim, QUICK_STOP)
        for _ in range(300):
            speeds.append(sim.read_truth().qd[0])
            if sample.states()[0] is not S.QUICK_STOP_ACTIVE or sample.statusword[0] & cia402.SW_TARGET_REACHED:
                break
            sample = write(sim, QUICK_STOP)
        speeds = np.array(speeds)
        assert sample.states()[0] is final
        t_stop = np.argmax(np.abs(speeds) < 0.01) * sim.dt
        assert 0.14 <= t_stop <= 0.17                        # 1.5 rad/s at 10 rad/s^2: 0.15 s
        assert speeds.min() > -0.02                          # no reversal
        q_rest = sim.read_truth().q[0]
        sample = write(sim, QUICK_STOP, 100)
        assert abs(sim.read_truth().q[0] - q_rest) < 1e-4    # and it stays there
        if option == 6:
            assert sample.statusword[0] & cia402.SW_TARGET_REACHED
            sim.set_commands(target_position=sim.read_state().position)
            assert write(sim, ENABLE).states()[0] is S.OPERATION_ENABLED  # 16


def test_csp_targets_beyond_the_software_limit_stop_at_the_limit(model):
    sim = quiet_sim(model)
    go(sim, S.OPERATION_ENABLED)
    sim.configure_drive(0, position_limits=(-0.3, 0.25))
    target = sim.read_state().position.copy()
    limited = False
    for _ in range(1500):
        target[0] += 0.8 * sim.dt                             # runs on to 1.2 rad
        sim.set_commands(target_position=target)
        sample = sim.step(1)
        limited |= bool(sample.statusword[0] & cia402.SW_INTERNAL_LIMIT)
        assert sim.read_truth().q[0] <= 0.25 + 2e-4
    assert limited
    assert sim.read_truth().q[0] == pytest.approx(0.25, abs=2e-4)
    assert states_of(sample) == {S.OPERATION_ENABLED}


def test_cst_leaving_the_software_limit_faults_the_drive(model):
    sim = quiet_sim(model)
    sim.set_commands(mode=np.full(model.n, int(Mode.CST)), target_torque=np.zeros(model.n))
    go(sim, S.OPERATION_ENABLED)
    sim.set_commands(mode=np.array([int(Mode.CST)] + [int(Mode.CSP)] * 5),
                     target_position=sim.read_state().position, target_torque=np.array([8.0, 0, 0, 0, 0, 0]))
    sim.configure_drive(0, position_limits=(-0.3, 0.2))
    for _ in range(2000):
        sample = sim.step(1)
        if sample.states()[0] is not S.OPERATION_ENABLED:
            break
    assert sample.states()[0] is S.FAULT_REACTION_ACTIVE and sample.error_code[0] == 0x8612
    q_fault = sim.read_truth().q[0]
    assert 0.2 < q_fault < 0.2 + 0.01
    sim.step(50)
    assert sim.read_truth().q[0] == q_fault                  # torque off, brake on


def test_bad_drive_parameters_are_refused_naming_the_drive(model):
    sim = quiet_sim(model)
    with pytest.raises(InputError, match=r"drive 2 \(j2\): max_torque: 500 N m is above"):
        sim.configure_drive(1, max_torque=500.0)
    with pytest.raises(InputError, match=r"drive 1 \(j1\): position_limits"):
        sim.configure_drive(0, position_limits=(0.5, -0.5))
    with pytest.raises(InputError, match="following_error_window"):
        sim.configure_drive(0, following_error_window=-1.0)
    with pytest.raises(InputError, match="quick_stop_option"):
        Simulator(model, drive=DriveConfig(quick_stop_option=3))
    with pytest.raises(InputError, match="bandwidth"):
        Simulator(model, drive=DriveConfig(bandwidth=(100.0, 100.0)))
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(InputError, match="extrapolated_targets: expected an integer 0..1000"):
            Simulator(model, drive=DriveConfig(extrapolated_targets=bad))


def test_operation_enabled_without_a_mode_holds_the_position(model):
    sim = quiet_sim(model)
    go(sim, S.OPERATION_ENABLED)
    held = sim.read_truth().q
    sim.set_commands(mode=np.zeros(model.n), target_position=held + 0.3, target_torque=np.full(model.n, 5.0))
    sample = write(sim, ENABLE, 500)
    assert states_of(sample) == {S.OPERATION_ENABLED} and not sample.mode_display.any()
    np.testing.assert_allclose(sim.read_truth().q, held, atol=2e-3)


def ur5_urdf():
    pin = pytest.importorskip("pinocchio")
    from pathlib import Path
    prefix = Path(pin.__file__).resolve()
    while prefix.name != "cmeel.prefix":
        prefix = prefix.parent
    path = prefix / "share/example-robot-data/robots/ur_description/urdf/ur5_robot.urdf"
    if not path.exists():
        pytest.skip("example-robot-data has no UR5")
    return load_model(path)


@pytest.mark.parametrize("name, tolerance", [("puma560", 1e-3), ("ur5 urdf", 0.1)])
def test_other_arms_hold_their_pose_in_csp_with_the_gravity_torque(name, tolerance):
    # the UR5 URDF has no rotor inertia and no friction: its joints are strongly coupled, the drives' defaults
    # slow down (DriveConfig, default_inertia) and a slow, decaying oscillation of ~0.05 N m remains at 3 s
    arm = ur5_urdf() if name.startswith("ur5") else load_model(name)
    sim = Simulator(arm, noise=NoiseConfig.off())
    sim.step(1)
    enable(sim, Mode.CSP)
    sim.step(3000)
    sample = sim.read_state()
    assert states_of(sample) == {S.OPERATION_ENABLED}
    q = sim.read_truth().q
    assert np.abs(q - sample.position).max() == 0.0 and np.abs(sample.following_error).max() < 1e-4
    hold = dyn.gravity_torques(arm, q) + arm.drive[:, 3]  # at rest friction leaves only the offset
    assert np.abs(hold).max() > 10.0
    np.testing.assert_allclose(sample.torque, hold, rtol=0, atol=tolerance)
