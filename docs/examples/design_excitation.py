"""Design an optimal excitation trajectory for identification, check it against the limits and save it.

The trajectory is a finite Fourier series per joint that starts and ends at rest; the design minimises the
condition number of the base regressor while keeping every position, velocity, acceleration and torque
limit of the model. (`armid excite design` runs the same with more harmonics and iterations.)

usage: python design_excitation.py [OUT.toml]
"""
import sys

from ident.fit import excitation
from ident.model import load_model

out = sys.argv[1] if len(sys.argv) > 1 else "traj.toml"
model = load_model("generic6")
traj = excitation.design(model, harmonics=3, base_frequency=0.2, seed=1, max_iter=40, grid=40)
info = traj.info
print(f"{traj.n} joints, {traj.harmonics} harmonics of {traj.base_frequency:g} Hz, period {traj.period:g} s")
print(f"condition number: {info['start_cond']:.1f} at the random start, {info['cond']:.1f} designed")

excitation.check(model, traj, rate_hz=1000.0)      # LimitError naming joint, quantity and time otherwise
t, q, qd, qdd = traj.sample(rate_hz=1000.0)
print(f"within the limits; starts at rest: {excitation.at_rest(traj)}, "
      f"fastest joint speed {abs(qd).max():.2f} rad/s")

excitation.save(traj, out)                         # docs/reference/trajectory-file.md; `armid excite check` reads it
again = excitation.load(out)
print(f"saved {out}; reloads the same: {bool((again.a == traj.a).all() and (again.b == traj.b).all())}")
