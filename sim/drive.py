"""The arm's n simulated CiA 402 drives: state machines driven by the controlword, statusword out, modes
CSP and CST, following-error fault, quick stop, software position limits and torque saturation.

The states, controlword values, statusword bits and modes are firmware_bridge.cia402's. Commands are
evaluated on every cycle against the current controlword (level-triggered, as drives do); a command that
the standard's table does not allow in the current state is ignored. Fault reset acts on the rising edge
of bit 7. The transitions (CiA 402 numbering):

    0, 1  start -> NOT READY TO SWITCH ON -> SWITCH ON DISABLED      automatic (first cycle)
    2     SWITCH ON DISABLED -> READY TO SWITCH ON                   shutdown
    3     READY TO SWITCH ON -> SWITCHED ON                          switch on (or enable operation: 3 then 4)
    4     SWITCHED ON -> OPERATION ENABLED                           enable operation
    5     OPERATION ENABLED -> SWITCHED ON                           disable operation
    6     SWITCHED ON -> READY TO SWITCH ON                          shutdown
    7     READY TO SWITCH ON -> SWITCH ON DISABLED                   disable voltage / quick stop
    8     OPERATION ENABLED -> READY TO SWITCH ON                    shutdown
    9     OPERATION ENABLED -> SWITCH ON DISABLED                    disable voltage
    10    SWITCHED ON -> SWITCH ON DISABLED                          disable voltage / quick stop
    11    OPERATION ENABLED -> QUICK STOP ACTIVE                     quick stop
    12    QUICK STOP ACTIVE -> SWITCH ON DISABLED                    disable voltage, or at rest (option 1, 2)
    13    any -> FAULT REACTION ACTIVE                               fault
    14    FAULT REACTION ACTIVE -> FAULT                             automatic (next cycle)
    15    FAULT -> SWITCH ON DISABLED                                fault reset (rising edge of bit 7)
    16    QUICK STOP ACTIVE -> OPERATION ENABLED                     enable operation (option 5, 6)

Simplifications, documented: leaving OPERATION ENABLED other than by quick stop removes the torque at
once (disable-operation option 0); the fault reaction removes the torque at once (fault-reaction option 0);
a holding brake (when the Simulator has brakes) holds every joint whose drive is not powered. The
quick-stop option code (0x605A) may be 0 (disable at once), 1 or 2 (ramp, then SWITCH ON DISABLED), 5 or 6
(ramp, then hold in QUICK STOP ACTIVE).

Gains: see sim.drive_control. Defaults: velocity bandwidth 300 rad/s for the smallest inertia the joint
sees over its workspace (rotor plus arm, so the loop is slower, never unstable, in heavier poses), PI
corner 60 rad/s, position gain 60 1/s, friction feed-forward from the model's fc and fv. For an arm whose
joints are strongly coupled (no rotor inertia, e.g. a plain URDF) the inertia and the outer gains are
reduced by the factor r of default_inertia().
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from firmware_bridge import cia402
from firmware_bridge.cia402 import Mode, State
from firmware_bridge.runtime.errors import InputError
from ident.model import Model
from sim import drive_control as dc
from sim.plant import largest_generalised_eigenvalue, workspace_mass_matrices

# EMCY / 0x603F error codes the simulated drives raise (CiA 402 error code list)
ERR_FOLLOWING = 0x8611       # following error
ERR_POSITION_LIMIT = 0x8612  # reference (software position) limit
ERR_INJECTED = 0x2310        # default of an injected fault: continuous over-current
QUICK_STOP_OPTIONS = (0, 1, 2, 5, 6)
SUPPORTED_MODES = (Mode.NONE, Mode.CSP, Mode.CST)
POWERED = (State.OPERATION_ENABLED, State.QUICK_STOP_ACTIVE)
STATES = tuple(State)                                   # state code = index in this tuple
_CODE = {s: i for i, s in enumerate(STATES)}
_POWERED_TABLE = np.array([s in POWERED for s in STATES])
# statusword of each state: its pattern bits, remote, and bit 5 (quick stop) set unless quick stop is active
_BASE_WORD = np.array([cia402.statusword_for(s) | cia402.SW_REMOTE
                       | (0 if s is State.QUICK_STOP_ACTIVE else cia402.SW_QUICK_STOP) for s in STATES],
                      dtype=np.int64)

# Controlword commands: (mask, value) over bits 0-3 and 7, values from cia402. With bit 7 clear they are
# mutually exclusive and cover every controlword; with bit 7 set (fault reset) none matches.
COMMANDS = {
    "disable voltage": (0x82, cia402.CW_DISABLE_VOLTAGE),
    "quick stop": (0x86, cia402.CW_QUICK_STOP),
    "shutdown": (0x87, cia402.CW_SHUTDOWN),
    "switch on": (0x8F, cia402.CW_SWITCH_ON),            # also "disable operation"
    "enable operation": (0x8F, cia402.CW_ENABLE_OPERATION),
}
_S = State
# (state, command) -> next state (CiA 402 transition number); quick-stop option cases in next_state()
TRANSITIONS = {
    (_S.SWITCH_ON_DISABLED, "shutdown"): _S.READY_TO_SWITCH_ON,            # 2
    (_S.READY_TO_SWITCH_ON, "switch on"): _S.SWITCHED_ON,                  # 3
    (_S.READY_TO_SWITCH_ON, "enable operation"): _S.SWITCHED_ON,           # 3 (then 4)
    (_S.SWITCHED_ON, "enable operation"): _S.OPERATION_ENABLED,            # 4
    (_S.OPERATION_ENABLED, "switch on"): _S.SWITCHED_ON,                   # 5
    (_S.SWITCHED_ON, "shutdown"): _S.READY_TO_SWITCH_ON,                   # 6
    (_S.READY_TO_SWITCH_ON, "disable voltage"): _S.SWITCH_ON_DISABLED,     # 7
    (_S.READY_TO_SWITCH_ON, "quick stop"): _S.SWITCH_ON_DISABLED,          # 7
    (_S.OPERATION_ENABLED, "shutdown"): _S.READY_TO_SWITCH_ON,             # 8
    (_S.OPERATION_ENABLED, "disable voltage"): _S.SWITCH_ON_DISABLED,      # 9
    (_S.SWITCHED_ON, "disable voltage"): _S.SWITCH_ON_DISABLED,            # 10
    (_S.SWITCHED_ON, "quick stop"): _S.SWITCH_ON_DISABLED,                 # 10
    (_S.OPERATION_ENABLED, "quick stop"): _S.QUICK_STOP_ACTIVE,            # 11
    (_S.QUICK_STOP_ACTIVE, "disable voltage"): _S.SWITCH_ON_DISABLED,      # 12
    (_S.QUICK_STOP_ACTIVE, "enable operation"): _S.OPERATION_ENABLED,      # 16 (options 5, 6)
}


def command_of(cw: int) -> str | None:
    """The CiA 402 command a controlword carries (None with the fault-reset bit set)."""
    for name, (mask, value) in COMMANDS.items():
        if cw & mask == value:
            return name
    return None


def next_state(state: State, cw: int, quick_stop_option: int) -> State:
    """The state a drive in `state` moves to under the controlword cw (itself when cw is not allowed)."""
    nxt = TRANSITIONS.get((state, command_of(cw)), state)
    if state is _S.OPERATION_ENABLED and nxt is _S.QUICK_STOP_ACTIVE and quick_stop_option == 0:
        return _S.SWITCH_ON_DISABLED                                        # 11 with option 0: off at once
    if state is _S.QUICK_STOP_ACTIVE and nxt is _S.OPERATION_ENABLED and quick_stop_option not in (5, 6):
        return state
    return nxt


def default_inertia(mass_samples: np.ndarray, headroom: float = 2.0) -> tuple[np.ndarray, float]:
    """The drives' load-inertia setting J (n,) kg m^2 and its reduction r >= 1.

    J is the smallest M_jj over the workspace samples, divided by r where the joints' coupling would let
    a mode of the decentralised loops respond more than `headroom` times faster than each loop's
    bandwidth (arms without large rotor inertias: the gearbox's reflected inertia is what decouples the
    joints of a real arm). The outer gains must then be r times slower too.
    """
    J = np.diagonal(mass_samples, axis1=1, axis2=2).min(axis=0)
    r = max(1.0, largest_generalised_eigenvalue(J, mass_samples) / headroom)
    return J / r, r


def joint_index(joint, n: int, context: str) -> int:
    """joint (0-based) as an int, or InputError '<context>: joint index: expected 0..n-1, got ...'."""
    if isinstance(joint, bool) or not isinstance(joint, (int, np.integer)) or not 0 <= joint < n:
        raise InputError(f"{context}: joint index: expected 0..{n - 1}, got {joint!r}")
    return int(joint)


def _per_joint(name: str, value, n: int, positive: bool = True) -> np.ndarray:
    arr = np.broadcast_to(np.asarray(value, dtype=float), (n,)).copy() if np.ndim(value) == 0 else np.array(value, dtype=float)
    if arr.shape != (n,) or np.isnan(arr).any() or (positive and not (arr > 0).all()):
        raise InputError(f"drive: {name}: expected a {'positive ' if positive else ''}number or {n} of them, got {value!r}")
    return arr


@dataclass(frozen=True)
class DriveConfig:
    """Tuning and protection of the drives; scalars apply to every joint, or give n values.

    bandwidth (rad/s): velocity-loop crossover for the inertia J; integral_corner (rad/s): PI zero;
    position_gain (1/s); inertia (kg m^2): the drive's load-inertia setting. friction_feedforward: the drive adds
    the model's Coulomb and viscous friction at the reference velocity; acceleration_feedforward: the drive adds
    J times the reference acceleration (set both off for a host that sends its model's torque, friction included,
    as the CSP torque offset: the armid driver does; on, they count twice). Defaults: J from
    default_inertia() (the smallest M_jj + Ia over the workspace, reduced by r >= 1 for strongly coupled
    arms), integral_corner = position_gain = 60 / r; following_error_window (rad), following_error_timeout (s);
    quick_stop_deceleration (rad/s^2, default the model's qdd_max, 10 where that is unbounded);
    standstill_velocity (rad/s): below it a stopping joint counts as at rest; extrapolated_targets: drive
    cycles in a row without a new CSP target for which a drive continues the targets it received before it
    holds the last one (sim.drive_targets; 0: hold at once).
    """

    bandwidth: float | tuple = 300.0
    integral_corner: float | tuple | None = None
    position_gain: float | tuple | None = None
    inertia: float | tuple | None = None
    friction_feedforward: bool = True
    acceleration_feedforward: bool = True
    following_error_window: float | tuple = 0.05
    following_error_timeout: float | tuple = 0.01
    quick_stop_deceleration: float | tuple | None = None
    quick_stop_option: int = 2
    standstill_velocity: float = 0.01
    extrapolated_targets: int = 4


class Drives:
    """The n drives. Not thread-safe by itself (the Simulator serialises access).

    Per cycle: `update(controlword, mode)` runs the state machines, `control(...)` the control laws,
    `after_control()` turns the laws' flags into faults and finished quick stops.
    """

    def __init__(self, model: Model, dt: float, config: DriveConfig | None = None,
                 mass_samples: np.ndarray | None = None):
        cfg = config or DriveConfig()
        n = self.n = model.n
        self.model, self.dt, self.config = model, float(dt), cfg
        if cfg.quick_stop_option not in QUICK_STOP_OPTIONS:
            raise InputError(f"drive: quick_stop_option: expected one of {QUICK_STOP_OPTIONS}, got {cfg.quick_stop_option!r}")
        x = cfg.extrapolated_targets
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 1000:
            raise InputError(f"drive: extrapolated_targets: expected an integer 0..1000 (cycles), got {x!r}")
        p = self.params = np.zeros((n, dc.NPARAM))
        if cfg.inertia is not None:
            p[:, dc.J], r = _per_joint("inertia", cfg.inertia, n), 1.0
        else:
            p[:, dc.J], r = default_inertia(workspace_mass_matrices(model) if mass_samples is None else mass_samples)
        self.inertia_reduction = r
        p[:, dc.KV] = _per_joint("bandwidth", cfg.bandwidth, n)
        p[:, dc.KI] = _per_joint("integral_corner", 60.0 / r if cfg.integral_corner is None else cfg.integral_corner, n)
        p[:, dc.KP] = _per_joint("position_gain", 60.0 / r if cfg.position_gain is None else cfg.position_gain, n)
        p[:, dc.KA] = 1.0 if cfg.acceleration_feedforward else 0.0
        if cfg.friction_feedforward:
            p[:, dc.FC], p[:, dc.FV] = model.drive[:, 1], model.drive[:, 2]
        p[:, dc.VS] = 0.01
        p[:, dc.QLO], p[:, dc.QHI] = model.q_min, model.q_max
        p[:, dc.TMAX] = model.tau_max
        p[:, dc.VMAX] = model.qd_max
        p[:, dc.AMAX] = model.qdd_max
        p[:, dc.FEW] = _per_joint("following_error_window", cfg.following_error_window, n)
        p[:, dc.FET] = _per_joint("following_error_timeout", cfg.following_error_timeout, n)
        qsd = cfg.quick_stop_deceleration
        if qsd is None:
            qsd = np.where(np.isfinite(model.qdd_max), model.qdd_max, 10.0)
        p[:, dc.QSD] = _per_joint("quick_stop_deceleration", qsd, n)
        p[:, dc.VSTOP] = _per_joint("standstill_velocity", cfg.standstill_velocity, n)
        self.quick_stop_option = [cfg.quick_stop_option] * n
        self.st = np.zeros((n, dc.NSTATE))
        self.state = [State.NOT_READY_TO_SWITCH_ON] * n
        self.code = np.full(n, _CODE[State.NOT_READY_TO_SWITCH_ON], dtype=np.int64)
        self.error_code = np.zeros(n, dtype=np.uint16)
        self.mode = np.zeros(n, dtype=np.int8)           # modes of operation (0x6060) as written
        self.mode_display = np.zeros(n, dtype=np.int8)   # 0x6061
        self.kind = np.zeros(n, dtype=np.int8)
        self.tau = np.zeros(n)
        self.ferr = np.zeros(n)
        self.velocity = np.zeros(n)
        self.flags = np.zeros(n, dtype=np.int64)
        self._no_ff = np.zeros(n)
        self._cw_seen = np.full(n, -1, dtype=np.int64)
        self._reset_bit = np.zeros(n, dtype=bool)
        self._dirty = np.ones(n, dtype=bool)
        self._todo = np.zeros(n, dtype=bool)
        self._edge = np.zeros(n, dtype=bool)
        self._sticky_fault: dict[int, int] = {}           # joint -> code of a fault that reset cannot clear
        self._fe_fault = np.zeros(n, dtype=bool)

    # -- configuration (what a host sets by SDO) -------------------------------------------------
    def configure(self, joint: int, *, following_error_window: float | None = None,
                  following_error_timeout: float | None = None, position_limits: tuple[float, float] | None = None,
                  max_torque: float | None = None, quick_stop_deceleration: float | None = None,
                  quick_stop_option: int | None = None) -> None:
        """Set one drive's protection parameters (SI). Limits must lie within the model's."""
        j = self._joint(joint)
        name = self.model.joint_names[j]
        p = self.params

        def positive(label, v):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise InputError(f"drive {j + 1} ({name}): {label}: expected a positive number, got {v!r}")
            return float(v)

        if following_error_window is not None:
            p[j, dc.FEW] = positive("following_error_window", following_error_window)
        if following_error_timeout is not None:
            p[j, dc.FET] = positive("following_error_timeout", following_error_timeout)
        if quick_stop_deceleration is not None:
            p[j, dc.QSD] = positive("quick_stop_deceleration", quick_stop_deceleration)
        if max_torque is not None:
            v = positive("max_torque", max_torque)
            if v > self.model.tau_max[j]:
                raise InputError(f"drive {j + 1} ({name}): max_torque: {v:g} N m is above the model's {self.model.tau_max[j]:g}")
            p[j, dc.TMAX] = v
        if position_limits is not None:
            lo, hi = (float(x) for x in position_limits)
            if not (lo < hi and lo >= self.model.q_min[j] and hi <= self.model.q_max[j]):
                raise InputError(f"drive {j + 1} ({name}): position_limits: expected lo < hi within the model's "
                                 f"[{self.model.q_min[j]:g}, {self.model.q_max[j]:g}] rad, got {position_limits!r}")
            p[j, dc.QLO], p[j, dc.QHI] = lo, hi
        if quick_stop_option is not None:
            if quick_stop_option not in QUICK_STOP_OPTIONS:
                raise InputError(f"drive {j + 1} ({name}): quick_stop_option: expected one of {QUICK_STOP_OPTIONS}, got {quick_stop_option!r}")
            self.quick_stop_option[j] = int(quick_stop_option)

    def parameters(self, joint: int) -> dict:
        """Drive `joint`'s protection parameters as configure() takes them (SI)."""
        j = self._joint(joint)
        p = self.params[j]
        return {"following_error_window": float(p[dc.FEW]), "following_error_timeout": float(p[dc.FET]),
                "position_limits": (float(p[dc.QLO]), float(p[dc.QHI])), "max_torque": float(p[dc.TMAX]),
                "quick_stop_deceleration": float(p[dc.QSD]), "quick_stop_option": self.quick_stop_option[j]}

    def _joint(self, joint: int) -> int:
        return joint_index(joint, self.n, "drive")

    # -- faults ----------------------------------------------------------------------------------
    def fault(self, joint: int, code: int, *, sticky: bool = False) -> None:
        """Transition 13: the drive enters FAULT REACTION ACTIVE with `code` (torque off at once).
        A sticky fault cannot be reset until clear_sticky_fault()."""
        j = self._joint(joint)
        if sticky:
            self._sticky_fault[j] = int(code)
        if self.state[j] in (State.FAULT_REACTION_ACTIVE, State.FAULT):
            return
        self._set(j, State.FAULT_REACTION_ACTIVE)
        self.error_code[j] = code
        self.kind[j] = dc.OFF

    def _set(self, j: int, state: State) -> None:
        self.state[j] = state
        self.code[j] = _CODE[state]
        self._dirty[j] = True

    def clear_sticky_fault(self, joint: int) -> None:
        """The cause of a sticky fault is gone; a fault reset now clears it."""
        self._sticky_fault.pop(self._joint(joint), None)

    # -- the cycle -------------------------------------------------------------------------------
    def update(self, controlword: np.ndarray, mode: np.ndarray) -> None:
        """State machines and modes for this cycle's controlwords (n,) and modes of operation (n,).
        Only drives whose controlword, state or fault-reset bit changed are evaluated."""
        todo, edge = self._todo, self._edge
        if not dc.commands_pending(controlword, mode, self._cw_seen, self.mode_display, self._dirty,
                                   self._reset_bit, todo, edge):
            return
        self.mode_display[:] = mode
        self._cw_seen[:] = controlword
        for j in np.flatnonzero(todo):
            self._dirty[j] = False
            cw = int(controlword[j])
            state = self.state[j]
            if state is State.NOT_READY_TO_SWITCH_ON:
                state = State.SWITCH_ON_DISABLED                         # 0, 1
            elif state is State.FAULT_REACTION_ACTIVE:
                state = State.FAULT                                      # 14
            elif state is State.FAULT:
                if edge[j] and j not in self._sticky_fault:
                    state = State.SWITCH_ON_DISABLED                     # 15
                    self.error_code[j] = 0
                    self._fe_fault[j] = False
            for _ in range(2):                                           # 3 then 4 on enable operation
                nxt = next_state(state, cw, self.quick_stop_option[j])
                if nxt is state:
                    break
                state = nxt
            if state is not self.state[j]:
                self._set(j, state)
                self._dirty[j] = state is State.FAULT_REACTION_ACTIVE
        for j in range(self.n):
            s = self.state[j]
            if s is State.OPERATION_ENABLED:
                m = self.mode_display[j]
                self.kind[j] = dc.CSP if m == Mode.CSP else dc.CST if m == Mode.CST else dc.RAMP
            elif s is State.QUICK_STOP_ACTIVE:
                self.kind[j] = dc.RAMP
            else:
                self.kind[j] = dc.OFF

    def control(self, target_position: np.ndarray, target_torque: np.ndarray, position: np.ndarray,
                velocity_ff: np.ndarray | None = None, acceleration_ff: np.ndarray | None = None,
                torque_offset: np.ndarray | None = None) -> np.ndarray:
        """Torque (n,) N m from the targets and the measured position; fills ferr, velocity, flags.
        velocity_ff (rad/s), acceleration_ff (rad/s^2): the CSP feed-forward of an interpolated reference
        (both or neither; without them the drive differentiates target_position). torque_offset (n,) N m
        (0x60B2, default none): added to the position loop's torque in CSP, to the target torque in CST."""
        given = velocity_ff is not None
        dc.control(self.kind, target_position, target_torque, self._no_ff if torque_offset is None else torque_offset,
                   position, self.dt, self.params, self.st,
                   self.tau, self.ferr, self.velocity, self.flags, velocity_ff if given else self._no_ff,
                   acceleration_ff if given else self._no_ff, given)
        return self.tau

    def start_from(self, position: np.ndarray) -> None:
        """Initialise the velocity estimate at the first measured position."""
        self.st[:, dc.P_PREV] = position

    def after_control(self) -> None:
        """Faults from the control flags; transition 12 when a quick stop has brought a joint to rest."""
        if not self.flags.any():
            return
        for j in np.flatnonzero(self.flags):
            f = int(self.flags[j])
            if f & dc.F_FOLLOWING:
                self._fe_fault[j] = True
                self.fault(j, ERR_FOLLOWING)
            elif f & dc.F_LIMIT_FAULT:
                self.fault(j, ERR_POSITION_LIMIT)
            elif f & dc.F_STOPPED and self.state[j] is State.QUICK_STOP_ACTIVE and self.quick_stop_option[j] in (1, 2):
                self._set(j, State.SWITCH_ON_DISABLED)

    def powered(self, out: np.ndarray) -> np.ndarray:
        """(n,) bool: the drive makes torque (OPERATION ENABLED or QUICK STOP ACTIVE)."""
        np.take(_POWERED_TABLE, self.code, out=out)
        return out

    def statusword(self, out: np.ndarray) -> np.ndarray:
        """(n,) uint16 statuswords: the state's bits, remote, quick stop (bit 5 set unless quick stop is
        active), internal limit, following error, target reached (quick stop finished)."""
        dc.status_words(self.code, self.flags, self._fe_fault, _BASE_WORD, _POWERED_TABLE,
                        _CODE[State.QUICK_STOP_ACTIVE], out)
        return out
