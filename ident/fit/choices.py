"""The automatic choices of a batch identification, each with the reason for it (`armid identify` prints
them on stderr unless --quiet): resampling, the low-pass cut-off, the decimation, the rows left out as slow,
the effort delay and the covariance. Each is one line "NAME: VALUE (REASON)"."""
from __future__ import annotations

import numpy as np

from ident.fit.preprocess import CUTOFF_PER_BANDWIDTH, NOISE_CUTOFF_HZ, cutoff_for_bandwidth


def automatic_choices(rows, *, cutoff_given: bool, decimate_given: bool, slow_velocity: float,
                      delay_given: bool, used: np.ndarray, covariance: str) -> list[str]:
    """The lines for the Rows of one recording (ident.fit.batch.Rows) and the fit's rows used per joint."""
    out = []
    mended = rows.mended.note() if rows.mended is not None else ""
    out.append(f"resampling: {mended or 'none'} ("
               + ("the time stamps were uneven or repeated" if mended else
                  f"the samples are on a uniform {rows.rate_hz:g} Hz clock") + ")")
    source = {"trajectory": "the trajectory file's harmonics", "given": "given",
              "estimated": "estimated from the positions' spectrum"}.get(rows.bandwidth_source, rows.bandwidth_source)
    if cutoff_given:
        out.append(f"cut-off: {rows.cutoff_hz:.4g} Hz (given)")
    else:
        auto = cutoff_for_bandwidth(rows.bandwidth_hz, rows.rate_hz)
        why = (f"{CUTOFF_PER_BANDWIDTH:g} x the motion's bandwidth {rows.bandwidth_hz:.3g} Hz ({source})"
               if auto > NOISE_CUTOFF_HZ else f"the noise filter's floor {NOISE_CUTOFF_HZ:g} Hz, above "
               f"{CUTOFF_PER_BANDWIDTH:g} x the bandwidth {rows.bandwidth_hz:.3g} Hz ({source})")
        out.append(f"cut-off: {rows.cutoff_hz:.4g} Hz ({why})")
    new_rate = rows.rate_hz / rows.factor
    out.append(f"decimation: {rows.factor} to {new_rate:.4g} Hz ("
               + ("given" if decimate_given else
                  f"its filter's cut-off {0.4 * new_rate:.3g} Hz about 20 x the bandwidth, or fewer rows would be "
                  "left per parameter") + ")")
    total = len(rows.t)
    left = ", ".join(f"{100 * (1 - u / max(total, 1)):.0f} %" for u in used)
    out.append(f"slow rows: below {slow_velocity:g} rad/s or with a reversal in the decimation window, left out "
               f"per joint {left} (Coulomb friction near rest is not fc sign(qd))")
    out.append(f"effort delay: {1e3 * rows.effort_delay:.3g} ms ("
               + ("given" if delay_given else "as the recording states it (its drives' sampling of the effort)")
               + ")")
    out.append(f"covariance: {covariance} ("
               + ("the rows' noise correlated by the low-pass and the decimation, sum K = "
                  f"{float(np.sum(rows.noise_correlation()) * 2 - 1):.3g}" if covariance == "correlated" else "asked for")
               + ")")
    return out
