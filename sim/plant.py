"""The simulated arm's mechanics and sensors: rigid-body dynamics from ident, rotor inertia, friction, brakes,
a payload, motor-side encoders and current sensors.

What the plant integrates (per joint j, SI units, joint side):

    (M(q) + diag Ia) qdd = tau_motor - C(q, qd) qd - G(q) - f(qd)
    f_j(v) = (fc_j + fs_j exp(-(v/vs)^2)) tanh(v/veps) + fv_j v + offset_j

M, C, G and Ia are ident's (ident.model.kernels with the model's inertial parameters and Ia; `drive=True`
with fc = fv = offset zeroed, so that with friction off the plant is exactly
ident.model.dynamics.forward_dynamics of the model without friction). f replaces ident's
fc sign(v) + fv v + offset by a smooth curve: tanh smoothing of width veps and a Stribeck excess fs
decaying over vs. For |v| >> veps, vs it is ident's friction model exactly. The offset is a constant load
torque (as in the identification model tau = ... + offset). Locked joints (brake engaged or stalled)
have qd = qdd = 0: their rows and columns leave the solve, and engaging a lock stops the joint at once.

Sensors: the encoder is on the motor, `encoder_counts` counts per motor revolution, so the joint-side
position step is 2 pi / (encoder_counts * gear_ratio) (for a prismatic joint gear_ratio is motor rad per m).
Position noise (rad, joint side) is added before quantisation. The motor current is
i = tau_motor / (gear_ratio * torque_constant) plus current noise (A).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ident.model import dynamics
from ident.model import kernels as model_kernels
from ident.payload import payload_parameters  # noqa: F401  (re-exported: sim users attach payloads)
from firmware_bridge.runtime.errors import InputError
from ident.model import Model
from sim import plant_kernels as pk

INTEGRATORS = {"rk4": pk.RK4, "semi-implicit": pk.SEMI_IMPLICIT}
# largest h * stiffness for which each integrator stays stable on qd' = -lambda qd, with margin
_STABLE_H_LAMBDA = {"rk4": 2.0, "semi-implicit": 1.0}


@dataclass(frozen=True)
class FrictionConfig:
    """Friction of every joint, from the model's fc, fv and offset plus the smooth zone near zero speed.

    enabled=False removes friction and offset (the plant is then conservative).
    stribeck_ratio: fs / fc, the extra breakaway torque at zero speed; stribeck_velocity vs (rad/s) its
    decay speed; smoothing_velocity veps (rad/s) the width of the tanh that replaces sign(qd).
    """

    enabled: bool = True
    stribeck_ratio: float = 0.25
    stribeck_velocity: float = 0.05
    smoothing_velocity: float = 0.01
    offset: bool = True

    def table(self, model: Model) -> np.ndarray:
        """(n, 6) kernel table: fc, fs, vs, veps, fv, offset."""
        for name in ("stribeck_velocity", "smoothing_velocity"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise InputError(f"friction: {name}: expected a positive number of rad/s, got {v!r}")
        if not (math.isfinite(self.stribeck_ratio) and self.stribeck_ratio >= 0):
            raise InputError(f"friction: stribeck_ratio: expected a number >= 0, got {self.stribeck_ratio!r}")
        fr = np.zeros((model.n, 6))
        fr[:, pk.VS] = self.stribeck_velocity
        fr[:, pk.VEPS] = self.smoothing_velocity
        if self.enabled:
            fc, fv, offset = model.drive[:, 1], model.drive[:, 2], model.drive[:, 3]
            fr[:, pk.FC] = fc
            fr[:, pk.FS] = self.stribeck_ratio * fc
            fr[:, pk.FV] = fv
            if self.offset:
                fr[:, pk.OFFSET] = offset
        return fr


@dataclass(frozen=True)
class NoiseConfig:
    """Sensor imperfections. position_std (rad, joint side, before quantisation) and current_std (A) are
    Gaussian; encoder_counts is per motor revolution (None: no quantisation)."""

    position_std: float = 0.0
    current_std: float = 0.002
    encoder_counts: int | None = 2 ** 17

    @classmethod
    def off(cls) -> "NoiseConfig":
        """Perfect sensors: no noise, no quantisation."""
        return cls(position_std=0.0, current_std=0.0, encoder_counts=None)

    def check(self) -> None:
        for name in ("position_std", "current_std"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise InputError(f"noise: {name}: expected a number >= 0, got {v!r}")
        c = self.encoder_counts
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c <= 0):
            raise InputError(f"noise: encoder_counts: expected a positive integer or None, got {c!r}")


def mismatched_model(model: Model, amount: float, seed: int | None = 0) -> Model:
    """The model with its dynamics off by `amount` (a fraction, e.g. 0.1 for 10 %): each link's inertial
    parameters (all ten: the body scaled, so it stays one that can exist), each rotor inertia, Coulomb and
    viscous friction coefficient multiplied by 1 + amount or 1 - amount (the sign drawn per value from seed).
    Geometry, gear ratios and torque constants stay. 0 returns the model itself."""
    if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not 0.0 <= amount < 1.0:
        raise InputError(f"mismatch: expected a fraction 0 <= amount < 1, got {amount!r}")
    if amount == 0:
        return model
    rng = np.random.default_rng(seed)
    chi = model.standard_parameters().reshape(model.n, 14).copy()
    chi[:, :10] *= (1.0 + amount * rng.choice((-1.0, 1.0), model.n))[:, None]
    chi[:, 10:13] *= 1.0 + amount * rng.choice((-1.0, 1.0), (model.n, 3))
    return model.with_parameters(chi.reshape(-1))


def workspace_mass_matrices(model: Model, samples: int = 256, seed: int = 12345) -> np.ndarray:
    """M(q) + diag Ia (samples, n, n) at random poses within the joint limits (+-pi where unbounded)."""
    rng = np.random.default_rng(seed)
    lo = np.where(np.isfinite(model.q_min), model.q_min, -math.pi)
    hi = np.where(np.isfinite(model.q_max), model.q_max, math.pi)
    return dynamics.mass_matrix(model, rng.uniform(lo, hi, (samples, model.n)))


def largest_generalised_eigenvalue(d: np.ndarray, mass_samples: np.ndarray) -> float:
    """max over the samples of the largest eigenvalue of M^-1 diag(d): how much faster than d/M_jj the
    coupled joints can respond. mass_samples (samples, n, n) are done as one stack (numpy's batched LAPACK
    calls, the same routines per matrix as one by one)."""
    if len(mass_samples) == 0:
        return 0.0
    Li = np.linalg.inv(np.linalg.cholesky(mass_samples))
    return max(0.0, float(np.linalg.eigvalsh(Li @ np.diag(d) @ np.swapaxes(Li, 1, 2)).max()))


class Plant:
    """The arm's mechanics and sensors, stepped one control period at a time with a held torque.

    Not thread-safe by itself: the Simulator serialises access. Arrays are (n,) float64, SI units.
    """

    def __init__(self, model: Model, *, dt: float = 1e-3, substeps: int | None = None,
                 integrator: str = "rk4", friction: FrictionConfig | None = None,
                 noise: NoiseConfig | None = None, seed: int | None = 0, q0=None, qd0=None):
        if integrator not in INTEGRATORS:
            raise InputError(f"integrator: expected one of {', '.join(INTEGRATORS)}, got {integrator!r}")
        if not (math.isfinite(dt) and dt > 0):
            raise InputError(f"dt: expected a positive number of seconds, got {dt!r}")
        self.model = model
        self.n = model.n
        self.dt = float(dt)
        self.integrator = integrator
        self.friction = friction or FrictionConfig()
        self.noise = noise or NoiseConfig()
        self.noise.check()
        self._fr = self.friction.table(model)
        self._chain = (model.joint_type, model.placement_R, model.placement_p, model.axis,
                       np.ascontiguousarray(model.gravity))
        self._method = INTEGRATORS[integrator]
        self.payload = np.zeros(10)
        self._P = self._rigid_params(model)
        self.mass_samples = workspace_mass_matrices(model)
        self.substeps = self._check_substeps(substeps)
        self.rng = np.random.default_rng(seed)
        # true state
        self.q = self._initial("q0", q0, np.clip(np.zeros(self.n), model.q_min, model.q_max))
        self.qd = self._initial("qd0", qd0, np.zeros(self.n))
        self.qdd = np.zeros(self.n)
        self.tau = np.zeros(self.n)           # motor torque held over the last period (joint side, N m)
        self.brake = np.zeros(self.n, dtype=bool)
        self.stalled = np.zeros(self.n, dtype=bool)
        self._locked = np.zeros(self.n, dtype=bool)
        self._tau_in = np.zeros(self.n)
        # an external wrench (set_wrench): link (0-based, -1: none), point (link frame), [force; moment] base axes
        self.wrench_link = -1
        self._wrench_point = np.zeros(3)
        self._wrench = np.zeros(6)
        self.tau_ext = np.zeros(self.n)       # the joint torques it made over the last period (N m)
        self._tau_ext_rows = self.tau_ext.reshape(1, self.n)
        # sensors
        self._nm_per_amp = model.joint_torque_per_amp()
        c = self.noise.encoder_counts
        self.counts_per_rad = None if c is None else c * model.gear_ratio / (2.0 * math.pi)
        self._noise_buf = np.zeros(self.n)

    # -- construction helpers ------------------------------------------------------------------------
    def _initial(self, name: str, value, default: np.ndarray) -> np.ndarray:
        if value is None:
            return default.astype(float)
        arr = np.array(value, dtype=float)
        if arr.shape != (self.n,) or not np.isfinite(arr).all():
            raise InputError(f"{name}: expected {self.n} finite numbers, got {np.asarray(value).tolist()!r}")
        return arr

    @staticmethod
    def _rigid_params(model: Model) -> np.ndarray:
        """(n, 14) kernel parameters: the rigid body and Ia; fc, fv, offset zeroed (the sim has its own)."""
        P = model.params_matrix().copy()
        P[:, 11:] = 0.0
        return P

    def friction_stiffness(self) -> tuple[float, int]:
        """The largest eigenvalue (1/s) of M(q)^-1 diag(d friction / d qd at zero speed) over the workspace
        samples (what an integrator substep must resolve), and the joint with the largest share."""
        fr = self._fr
        slope = (fr[:, pk.FC] + fr[:, pk.FS]) / fr[:, pk.VEPS] + fr[:, pk.FV]
        lam = largest_generalised_eigenvalue(slope, self.mass_samples)
        diag_min = np.diagonal(self.mass_samples, axis1=1, axis2=2).min(axis=0)
        return lam, int(np.argmax(slope / diag_min))

    def _check_substeps(self, substeps: int | None) -> int:
        lam, j = self.friction_stiffness()
        limit = _STABLE_H_LAMBDA[self.integrator]
        needed = max(1, math.ceil(self.dt * lam / limit))
        if substeps is None:
            return needed
        if isinstance(substeps, bool) or not isinstance(substeps, int) or substeps < 1:
            raise InputError(f"substeps: expected a positive integer, got {substeps!r}")
        if substeps < needed:
            raise InputError(
                f"substeps: {substeps} is unstable with this friction: joint {j + 1} "
                f"({self.model.joint_names[j]}) needs >= {needed} substeps of {self.dt:g} s with the "
                f"{self.integrator} integrator (widen friction.smoothing_velocity or add substeps)")
        return substeps

    # -- dynamics ------------------------------------------------------------------------------------
    def acceleration(self, q, qd, tau) -> np.ndarray:
        """qdd (n,) of the plant at (q, qd) under the motor torque tau, with the current locks."""
        q, qd, tau = (np.ascontiguousarray(x, dtype=float) for x in (q, qd, tau))
        out = np.empty(self.n)
        self._update_locks()
        ok = pk.acceleration(*self._chain, self._P, self._fr, q, qd, tau, self._locked, out, pk.workspace(self.n))
        if not ok:
            raise ValueError("plant: mass matrix is not positive definite (check the inertial parameters)")
        return out

    def friction_torques(self, qd) -> np.ndarray:
        """The friction torque (n,) N m that the joints feel at the velocity qd (includes the offset)."""
        out = np.empty(self.n)
        pk.friction_torques(self._fr, np.ascontiguousarray(qd, dtype=float), out)
        return out

    def _update_locks(self) -> None:
        np.logical_or(self.brake, self.stalled, out=self._locked)

    def advance(self, tau) -> None:
        """Hold the motor torque tau (n,) N m for one period dt and integrate (q, qd)."""
        self._tau_in[:] = tau
        self.tau[:] = self._tau_in
        if self.wrench_link >= 0:     # J(q)^T w at the start of the period, held over it as the motor torque is
            model_kernels.wrench_torques(*self._chain[:4], self.q.reshape(1, self.n), self.wrench_link,
                                         self._wrench_point, self._wrench, self._tau_ext_rows)
            self._tau_in += self.tau_ext
        self._update_locks()
        ok = pk.advance(*self._chain, self._P, self._fr, self._tau_in, self._locked, self.dt, self.substeps,
                        self._method, self.q, self.qd, self.qdd)
        if not ok:
            raise ValueError("plant: mass matrix is not positive definite (check the inertial parameters)")

    def set_state(self, q, qd=None) -> None:
        """Place the arm at q (rad), moving at qd (rad/s, default rest)."""
        self.q[:] = self._initial("q", q, self.q)
        self.qd[:] = self._initial("qd", qd, np.zeros(self.n))

    # -- external wrench ------------------------------------------------------------------------------
    def set_wrench(self, link: int, point, force, moment=(0.0, 0.0, 0.0)) -> None:
        """Push the arm: a force (N) and moment (N m), base axes, at `point` (m) of link `link` (1..n, the
        link joint `link` moves; point in its frame), from the next period on until clear_wrench(). The joints
        feel J(q)^T [force; moment] (ident.model.dynamics.wrench_torques) on top of the motor torque."""
        if isinstance(link, bool) or not isinstance(link, (int, np.integer)) or not 1 <= link <= self.n:
            raise InputError(f"wrench: link: expected an integer 1..{self.n}, got {link!r}")
        vectors = []
        for name, v in (("point", point), ("force", force), ("moment", moment)):
            arr = np.asarray(v, dtype=float) if np.ndim(v) == 1 else np.full(0, np.nan)
            if arr.shape != (3,) or not np.isfinite(arr).all():
                raise InputError(f"wrench: {name}: expected 3 finite numbers, got {v!r}")
            vectors.append(arr)
        self._wrench_point[:] = vectors[0]
        self._wrench[:3], self._wrench[3:] = vectors[1], vectors[2]
        self.wrench_link = int(link) - 1

    def clear_wrench(self) -> None:
        """Nothing pushes the arm any more."""
        self.wrench_link = -1
        self.tau_ext[:] = 0.0

    # -- payload -------------------------------------------------------------------------------------
    def attach_payload(self, chi_load) -> None:
        """Rigidly fix a payload (10 standard parameters about the flange origin, flange axes) to the
        flange, replacing any previous one. The kernels are unchanged; only the parameter table is."""
        chi = np.asarray(chi_load, dtype=float)
        if chi.shape != (10,) or not np.isfinite(chi).all():
            raise InputError(f"payload: expected 10 finite standard parameters, got {chi.tolist()!r}")
        self._P = self._rigid_params(dynamics.merge_payload(self.model, chi))
        self.payload = chi.copy()

    def detach_payload(self) -> None:
        """Remove the payload."""
        self._P = self._rigid_params(self.model)
        self.payload = np.zeros(10)

    # -- sensors -------------------------------------------------------------------------------------
    def measure_position(self, position_out: np.ndarray, counts_out: np.ndarray) -> None:
        """Encoder reading: position (rad, joint side) and motor counts (int64; 0 without quantisation)."""
        if self.noise.position_std > 0:
            self.rng.standard_normal(out=self._noise_buf)
            np.multiply(self._noise_buf, self.noise.position_std, out=self._noise_buf)
            np.add(self._noise_buf, self.q, out=position_out)
        else:
            position_out[:] = self.q
        if self.counts_per_rad is None:
            counts_out[:] = 0
            return
        np.multiply(position_out, self.counts_per_rad, out=position_out)
        np.rint(position_out, out=position_out)
        counts_out[:] = position_out
        np.divide(position_out, self.counts_per_rad, out=position_out)

    def measure_current(self, current_out: np.ndarray) -> None:
        """Motor current (A) of the torque held over the last period: tau / (gear * kt) + noise."""
        np.divide(self.tau, self._nm_per_amp, out=current_out)
        if self.noise.current_std > 0:
            self.rng.standard_normal(out=self._noise_buf)
            current_out += self.noise.current_std * self._noise_buf
