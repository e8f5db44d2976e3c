"""Where a result came from: the armid version, the SHA-256 of every input file and of the model, the command
line, the arm's id and the UTC time, with paths relative to the directory the result is written to, so that a
result directory moved or copied elsewhere still names its inputs (docs/reference/result-file.md, "Provenance")."""
from __future__ import annotations

import hashlib
import os
import sys
from datetime import datetime, timezone
from importlib import metadata, resources
from pathlib import Path

FORMAT = "armid-provenance/1"
_CHUNK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """The SHA-256 (hex) of a file's bytes, read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def armid_version() -> str:
    """The installed armid's version ("unknown" when armid is not installed as a distribution)."""
    try:
        return metadata.version("armid")
    except metadata.PackageNotFoundError:
        return "unknown"


def relative_path(path: str | Path, out_dir: str | Path) -> str:
    """path relative to out_dir (with "/" separators), as result files store it; an absolute path where
    no relative one exists (another drive on Windows)."""
    try:
        return Path(os.path.relpath(Path(path).resolve(), Path(out_dir).resolve())).as_posix()
    except ValueError:
        return Path(path).resolve().as_posix()


def _model_file(spec: str | Path) -> tuple[Path | None, str | None]:
    """(file, shipped name): a model given by path, or by the name of a model shipped with armid."""
    p = Path(spec)
    if p.is_file():
        return p, None
    shipped = resources.files("ident") / "models" / f"{spec}.toml"
    if shipped.is_file():
        with resources.as_file(shipped) as f:
            return Path(f), str(spec)
    return None, None


def file_entry(path: str | Path, out_dir: str | Path) -> dict:
    """{"path": relative to out_dir, "sha256": of its bytes} for an input file."""
    return {"path": relative_path(path, out_dir), "sha256": sha256_file(path)}


def provenance(out_dir: str | Path, inputs: dict[str, str | Path | None], model: str | Path | None = None, *,
               arm_id: str | None = None, argv: list[str] | None = None,
               now: datetime | None = None) -> dict:
    """The provenance block of a result written into out_dir.

    Parameters
    ----------
    out_dir : str or Path
        The directory the result is written to; every path is stored relative to it.
    inputs : dict
        Role -> input file (e.g. {"recording": ..., "validation": ...}); None entries are left out.
    model : str or Path, optional
        The model file, or the name of a shipped model (its file inside armid is hashed).
    arm_id : str, optional
        The arm's id (None: not given).
    argv : list of str, optional
        The command line; default: this process's (``sys.argv``), with the program's name shortened to "armid"
        when armid's console command runs.
    now : datetime, optional
        The time to record (default: now), stored as UTC ISO 8601.

    Returns
    -------
    dict
        format, armid_version, created_utc, command_line, arm_id, inputs {role: {path, sha256}} and model
        {path, sha256[, shipped]} (or None).
    """
    when = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    if argv is None:
        argv = list(sys.argv)
        if argv and Path(argv[0]).name == "armid":
            argv[0] = "armid"
    files = {role: file_entry(path, out_dir) for role, path in inputs.items() if path is not None}
    model_doc = None
    if model is not None:
        path, shipped = _model_file(model)
        if path is not None:
            model_doc = ({"shipped": shipped, "sha256": sha256_file(path)} if shipped
                         else file_entry(path, out_dir))
    return {"format": FORMAT, "armid_version": armid_version(),
            "created_utc": when.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "command_line": [str(a) for a in argv], "arm_id": arm_id, "inputs": files, "model": model_doc}


def for_toml(doc):
    """The provenance block (or any JSON-like value) without its null entries, which TOML cannot hold.

    Parameters
    ----------
    doc : dict, list or scalar
        A provenance block of `provenance`.

    Returns
    -------
    dict, list or scalar
        The same without None values at any depth: a missing key in calibration.toml's [provenance] means
        what null means in result.json.
    """
    if isinstance(doc, dict):
        return {k: for_toml(v) for k, v in doc.items() if v is not None}
    if isinstance(doc, list):
        return [for_toml(v) for v in doc if v is not None]
    return doc
