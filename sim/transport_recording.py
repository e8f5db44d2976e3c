"""A simulated recording as the driver records it through one transport, without running the processes: the
transport's cycle rate and clocking (armid's demo chain: serial 1 kHz, CAN 250 Hz on the master's SYNC, the
gateway 1 kHz in lockstep and 250 Hz free-running) and every sample through its wire encoding and back (serial
STATE frames, CAN TPDO1 and TPDO2 of each drive, the gateway's input image: firmware_bridge's codecs, positions
in encoder counts, currents in uA), converted to SI as the driver converts it (counts per rad of the wire gear
ratio; torque = current x the model's gear ratio x torque constant).

Clocking (CLOCKINGS):
- "lockstep": the simulator steps once per driver cycle (every transport's chain in lockstep; CAN always, its
  drives step on the SYNC);
- "free": serial, a logger on its own clock writes the stream (time stamps drifting by LOGGER_DRIFT, jittered by
  up to LOGGER_JITTER of a period, a share LOGGER_STALE of stale repeats: what ident.fit.resample mends); the
  gateway at 250 Hz, the host's timer (FREE_DRIFT_PPM against the device's crystal, FREE_JITTER_US of latency)
  sends the targets and reads the image: a device cycle without a new target holds the last one and a host cycle
  between two device cycles replaces it (the drives' kicks), an image read twice is dropped and one never read is
  a lost sample (bridged by identification across short gaps); CAN as lockstep.

The recording's times are the device's (a recording from the driver stamps samples with the device time).
"""
from __future__ import annotations

import dataclasses

import numpy as np

TRANSPORTS = ("serial", "can", "gateway")
CLOCKINGS = ("lockstep", "free")
RATES = {("serial", "lockstep"): 1000.0, ("serial", "free"): 1000.0, ("can", "lockstep"): 250.0,
         ("can", "free"): 250.0, ("gateway", "lockstep"): 1000.0, ("gateway", "free"): 250.0}
FREE_DRIFT_PPM = 100.0       # the host's clock against the device's (armid.chain.FREE_DRIFT_PPM)
FREE_JITTER_US = 20.0        # the host's wake-up latency, standard deviation (armid.chain.FREE_JITTER_US)
LOGGER_DRIFT = 50e-6
LOGGER_JITTER = 0.2
LOGGER_STALE = 0.02


def rate_of(transport: str, clocking: str) -> float:
    """The driver's cycle rate (Hz) of a transport and clocking (ValueError for unknown names)."""
    try:
        return RATES[(transport, clocking)]
    except KeyError:
        raise ValueError(f"transport {transport!r} / clocking {clocking!r}: expected one of {TRANSPORTS} and "
                         f"{CLOCKINGS}") from None


def wire_scaling(model):
    """firmware_bridge.units.JointScaling of the model's gear ratios as the wire carries them."""
    from firmware_bridge.units import JointScaling, wire_gear_ratio

    return JointScaling.from_gear([float(wire_gear_ratio(g)) for g in model.gear_ratio])


def through_wire(transport: str, q: np.ndarray, current: np.ndarray, scaling) -> tuple[np.ndarray, np.ndarray]:
    """q (N, n) rad and current (N, n) A as the driver decodes them after `transport`'s encoding, sample by
    sample: (q, current) in SI."""
    counts = scaling.position_to_counts(q)
    raw = scaling.current_to_raw(current)
    N, n = q.shape
    out_counts = np.empty_like(counts)
    out_raw = np.empty_like(raw)
    encode, decode = _CODECS[transport]
    for i in range(N):
        out_counts[i], out_raw[i] = decode(encode(counts[i], raw[i], i), n)
    return scaling.counts_to_position(out_counts), scaling.raw_to_current(out_raw)


def _serial_encode(counts, raw, i):
    from firmware_bridge import serial_protocol as sp

    n = len(counts)
    zero = np.zeros(n, dtype=np.int64)
    return sp.encode(sp.State(timestamp_us=1000 * i, cycle=i, statusword=zero, mode_display=zero, error_code=zero,
                              position=counts, velocity=zero, current=raw))


def _serial_decode(wire, n):
    from firmware_bridge import serial_protocol as sp

    msg = sp.decode(wire)
    return np.asarray(msg.position), np.asarray(msg.current)


def _can_encode(counts, raw, i):
    from firmware_bridge import canopen_map as cm

    return [(cm.TPDO1.pack([0, int(c), 8]), cm.TPDO2.pack([0, int(r)])) for c, r in zip(counts, raw)]


def _can_decode(frames, n):
    from firmware_bridge import canopen_map as cm

    pos = [cm.TPDO1.unpack_dict(a)["position_actual"] for a, _ in frames]
    cur = [cm.TPDO2.unpack_dict(b)["current_actual"] for _, b in frames]
    return np.asarray(pos), np.asarray(cur)


def _gateway_encode(counts, raw, i):
    from firmware_bridge import gateway as gw

    n = len(counts)
    zero = np.zeros(n, dtype=np.int64)
    return gw.encode_inputs(gw.InputImage(gateway_status=gw.STATUS_DATA_VALID, refused_writes=0,
                                          cycle_counter=i & 0xFFFFFFFF, timestamp_us=(4000 * i) & 0xFFFFFFFF,
                                          statusword=zero, mode_display=zero + 8, error_code=zero, position=counts,
                                          velocity=zero, current=raw, torque=zero))


def _gateway_decode(words, n):
    from firmware_bridge import gateway as gw

    image = gw.decode_inputs(words, n)
    return np.asarray(image.position), np.asarray(image.current)


_CODECS = {"serial": (_serial_encode, _serial_decode), "can": (_can_encode, _can_decode),
           "gateway": (_gateway_encode, _gateway_decode)}


def record(model, traj, seconds: float, transport: str, clocking: str, *, seed: int, current_noise: float,
           payload: tuple | None = None):
    """The Recording (torques, N m) of `seconds` of the excitation on the simulated arm as the driver records it
    through `transport` with `clocking` (see the module docstring); seed sets the sensors' noise and the clocks."""
    from ident.fit.preprocess import Recording
    from sim.recording import simulate

    from sim.recording import LEAD_IN

    rate = rate_of(transport, clocking)
    rng = np.random.default_rng(seed + 7919)
    host = None
    if transport == "gateway" and clocking == "free":
        host = _HostClock(rate, rng, -LEAD_IN, seconds)
    rec = simulate(model, traj, seconds, seed=seed, current_noise=current_noise, currents=True, payload=payload,
                   rate_hz=rate, target_times=None if host is None else host.target_times)
    q, current = through_wire(transport, rec.q, rec.current, wire_scaling(model))
    t, lost = rec.t, None
    if host is not None:
        index = host.images_read(rec.t)
        t, q, current, lost = rec.t[index], q[index], current[index], int(index[-1] + 1 - len(index) - index[0])
    tau = current * model.joint_torque_per_amp()
    out = Recording(t, q, tau, None, None, f"simulated {transport} ({clocking})", rec.effort_delay)
    if lost is not None:
        out = dataclasses.replace(out, lost_samples=lost)
    if transport == "serial" and clocking == "free":
        out = logger_clock(out, rng)
    return out


class _HostClock:
    """The gateway host's timer: cycle k wakes at ((k + phase) / rate) (1 + drift) + latency (latency >= 0, the
    phase against the device's cycles uniform), writes its set-point and reads the image in that exchange."""

    def __init__(self, rate: float, rng: np.random.Generator, first: float, last: float):
        self.rate = rate
        self.k = np.arange(int(np.floor(first * rate)) - 4, int(np.ceil(last * rate)) + 4)
        latency = np.abs(rng.normal(0.0, FREE_JITTER_US * 1e-6, self.k.size))
        self.wake = (self.k + rng.uniform()) / rate * (1.0 + FREE_DRIFT_PPM * 1e-6) + latency
        self.wake = np.maximum.accumulate(self.wake)

    def target_times(self, t_cycles: np.ndarray) -> np.ndarray:
        """For each device cycle ending at t_cycles (s), the time of the set-point it latches: the newest one the
        host sent before the cycle began (host cycle k sends the set-point for (k + 1) / rate)."""
        newest = np.searchsorted(self.wake, t_cycles - 1.0 / self.rate, side="right") - 1
        return (self.k[np.maximum(newest, 0)] + 1) / self.rate

    def images_read(self, t: np.ndarray) -> np.ndarray:
        """Indices of the device samples at times t the host reads, each once (an image read again is dropped,
        one never read is lost)."""
        latest = np.searchsorted(t, self.wake, side="right") - 1
        return np.unique(latest[(latest >= 0) & (self.wake <= t[-1])])


def logger_clock(rec, rng: np.random.Generator):
    """The recording as a logger on its own clock writes it: time stamps drifting by LOGGER_DRIFT and jittered by
    up to LOGGER_JITTER of a period, a share LOGGER_STALE of entries repeating the one before."""
    dt = np.median(np.diff(rec.t))
    t = rec.t * (1.0 + LOGGER_DRIFT) + rng.uniform(-LOGGER_JITTER, LOGGER_JITTER, rec.t.size) * dt
    t[0] = rec.t[0]
    q, tau = rec.q.copy(), rec.tau.copy()
    stale = rng.random(t.size) < LOGGER_STALE
    stale[0] = False
    for i in np.flatnonzero(stale):
        q[i], tau[i] = q[i - 1], tau[i - 1]
    return dataclasses.replace(rec, t=t, q=q, tau=tau)
