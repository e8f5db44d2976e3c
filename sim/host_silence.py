"""How long a device's host has been silent, for the device's host watchdog (serial, gateway).

A real device counts the host's silence on its own clock, and it is never stopped. A simulated one is: its
process may not be scheduled for a while (then its own clock stands still while the host's runs on), and it then
runs the ticks it missed faster than real time (then its clock runs ahead of the host's, while the host's frames
wait to be read). Either alone would read as the host's silence. So the silence is the shorter of the two: the
time on the device's own clock (Simulator.device_time) and on the host's monotonic clock since the host was last
heard. A host that is silent while the device runs is silent on both, and trips the watchdog as before.
"""
from __future__ import annotations

import time


class HostSilence:
    """The host's silence (s) as a device's watchdog sees it: heard() when a frame from the host arrives (any
    thread), silent() in the device's cycle."""

    def __init__(self, sim):
        self.sim = sim
        self.heard()

    def heard(self) -> None:
        """The host was heard now."""
        self._device, self._host = self.sim.device_time(), time.monotonic()

    def silent(self) -> float:
        """Seconds since the host was last heard, on the device's clock and the host's, whichever is shorter."""
        return min(self.sim.device_time() - self._device, time.monotonic() - self._host)
