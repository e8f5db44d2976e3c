"""Reading the recordings that identification commands take: CSV/NPZ (docs/reference/data-files.md) or an MCAP file
of `armid record`, converted on the fly as `armid record convert` converts it (driver.recording)."""
from __future__ import annotations

from pathlib import Path


def is_mcap(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".mcap"


def load_run(path: str | Path, n: int | None = None, effort: str = "torque"):
    """A recording with n joints (None: any) as ident.preprocess.Recording. An MCAP file of `armid record`
    gives its fresh samples at the drives' times, the joint torques (effort "torque") or motor currents
    ("current"), the driver's effort delay from its metadata and the device samples it lost, as `armid record
    convert` writes them."""
    from ident.preprocess import Recording, load_recording

    if not is_mcap(path):
        return load_recording(path, n=n)
    from driver import recording
    from ident.errors import InputError

    arrays, _ = recording.identification_arrays(recording.read_recording(path), effort)
    rec = Recording(t=arrays["t"], q=arrays["q"], tau=arrays.get("tau"), current=arrays.get("current"),
                    qd=arrays["qd"], source=str(path), effort_delay=float(arrays["effort_delay"]),
                    lost_samples=int(arrays["lost_samples"]) if "lost_samples" in arrays else None)
    if n is not None and rec.n != n:
        raise InputError(f"{path}: {rec.n} joints recorded, expected {n}")
    return rec
