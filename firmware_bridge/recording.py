"""Read an `armid record` MCAP file back, complete or cut short, and convert it for identification.

    log = read_recording("run.mcap")              # every /armid/state message, in file order
    arrays, notes = identification_arrays(log, effort="torque")
    write_identification(arrays, "run.csv")       # or run.npz (docs/reference/data-files.md)

The file is read as a stream (mcap's StreamReader), never through its summary, so a file that a killed
recorder left without summary and footer reads up to its last complete chunk; the rest is reported, not
guessed. Every CRC the file carries is checked: each chunk's, the data section's (DataEnd: the metadata and
everything else before it) and, in a complete file, the summary section's (Footer). A file that is not MCAP,
is corrupt before its end, or holds no /armid/state messages gives one RecordingError naming the file.
"""
from __future__ import annotations

import math
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard
from mcap.exceptions import McapError
from mcap.records import Channel, Chunk, Footer, Message, Metadata, Schema
from mcap.stream_reader import StreamReader, breakup_chunk
from mcap.writer import MCAP0_MAGIC

from firmware_bridge import mcap_schema as schema
from firmware_bridge import stream
from firmware_bridge.runtime.errors import InputError

# what a damaged or cut file makes the mcap reader raise (its own errors, CRC mismatches as ValueError,
# short reads as struct.error, damaged compressed chunks)
_READ_ERRORS = (McapError, ValueError, struct.error, EOFError, zstandard.ZstdError, RuntimeError,
                # and, should a damaged length still get past the bounds below, what a huge one raises
                MemoryError, OverflowError)
MAX_DECODE_TRIES = 100
MAX_CHUNK_BYTES = 256 << 20   # a chunk's uncompressed size: 60 s of a 1 kHz, 12-joint stream is ~80 MB


class DamagedLength(ValueError):
    """A length field asks for more bytes than the file has left, or a chunk larger than any recording
    writes: damage, refused before anything is allocated."""


class _Bounded:
    """The file as the mcap reader sees it: no read may ask for more than what is left of the file, so a
    damaged length field (up to 2**64 - 1) is an error, never a huge allocation."""

    def __init__(self, f, size: int):
        self._f, self._size = f, size

    def read(self, n: int = -1) -> bytes:
        left = self._size - self._f.tell()
        if n is None or n < 0:
            n = left
        if n > left:
            raise DamagedLength(f"a length of {n} bytes at byte {self._f.tell()}, beyond the end of the file "
                                   f"({left} bytes left)")
        return self._f.read(n)


def _records(reader: StreamReader):
    """The reader's records with each chunk broken up here, after its uncompressed size is checked (mcap's
    own breakup hands that size to zstandard as the output buffer to allocate)."""
    for record in reader.records:
        if isinstance(record, Chunk):
            if record.uncompressed_size > MAX_CHUNK_BYTES:
                raise DamagedLength(f"a chunk of {record.uncompressed_size} bytes uncompressed, above the "
                                       f"{MAX_CHUNK_BYTES} bytes a chunk may hold")
            yield from breakup_chunk(record, validate_crc=True)
        else:
            yield record


class RecordingError(InputError):
    """A recording that cannot be read or converted; the message names the file."""


@dataclass(frozen=True)
class StateLog:
    """The state messages of one recording. `states` is a structured array (N,) with the fields of the state
    message (seq, flags, device_time_ns, host_time_ns, q, qd, current, torque, tau_ext (N, n), statusword,
    error_code, mode); units as in docs/reference/stream.md. tau_ext comes from the /external_torque message
    written with each state (the same log time and sequence); `external_torque` counts the states that had one
    (0 for a recording made before the stream carried it: tau_ext is then 0)."""

    path: str
    joint_names: tuple[str, ...]
    states: np.ndarray
    complete: bool           # the file has its footer (a clean stop)
    skipped: int             # /armid/state messages that did not fit the layout of the first one
    cut_note: str            # why reading ended early ('' for a complete file)
    metadata: dict
    external_torque: int = 0  # states whose tau_ext was read from /external_torque

    @property
    def n(self) -> int:
        return len(self.joint_names)

    def seq_gaps(self) -> tuple[int, int]:
        """(missing messages, gaps) from the jumps in seq."""
        dseq = np.diff(self.states["seq"].astype(np.int64))
        jumps = dseq[dseq > 1]
        return int((jumps - 1).sum()), int(jumps.size)


def _fail(path: Path, text: str) -> RecordingError:
    return RecordingError(f"{path}: {text}")


def _decoder(found: Schema):
    from mcap_ros2.decoder import DecoderFactory

    return DecoderFactory().decoder_for(schema.MESSAGE_ENCODING, found)


def read_recording(path: str | Path) -> StateLog:
    """Read the /armid/state messages (and the joint names of /joint_states) of an MCAP recording."""
    path = Path(path)
    if not path.is_file():
        raise _fail(path, "no such file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(len(MCAP0_MAGIC))
        if head != MCAP0_MAGIC:
            raise _fail(path, "empty file, not an MCAP recording" if not head else
                        "not an MCAP file (it does not start with the MCAP magic bytes)")
        f.seek(0)
        schemas: dict[int, Schema] = {}
        channels: dict[int, Channel] = {}
        blobs: list[bytes] = []
        keys: list[tuple[int, int]] = []          # (log_time, sequence) of each state message
        ext_blobs: list[bytes] = []
        ext_keys: list[tuple[int, int]] = []
        state_schema: Schema | None = None
        names_message: tuple[Schema, bytes] | None = None
        topics: dict[str, int] = {}
        metadata: dict[str, dict[str, str]] = {}
        complete = False
        footer: Footer | None = None
        cut_note = ""
        reader = StreamReader(_Bounded(f, size), validate_crcs=True, emit_chunks=True,
                              record_size_limit=min(size, 1 << 30))
        try:
            for record in _records(reader):
                if isinstance(record, Schema):
                    schemas[record.id] = record
                elif isinstance(record, Channel):
                    channels[record.id] = record
                elif isinstance(record, Message):
                    channel = channels.get(record.channel_id)
                    if channel is None:
                        raise _fail(path, f"a message on channel {record.channel_id}, which no Channel record defines")
                    topics[channel.topic] = topics.get(channel.topic, 0) + 1
                    found = schemas.get(channel.schema_id)
                    if channel.topic == schema.TOPIC_STATE and found is not None and found.name == schema.ARM_STATE[0] \
                            and channel.message_encoding == schema.MESSAGE_ENCODING:
                        state_schema = state_schema or found
                        blobs.append(record.data)
                        keys.append((record.log_time, record.sequence))
                    elif channel.topic == schema.TOPIC_EXTERNAL_TORQUE and found is not None \
                            and found.name == schema.JOINT_STATE[0]:
                        ext_blobs.append(record.data)
                        ext_keys.append((record.log_time, record.sequence))
                    elif channel.topic == schema.TOPIC_JOINT_STATES and names_message is None and found is not None:
                        names_message = (found, record.data)
                elif isinstance(record, Metadata):
                    metadata[record.name] = dict(record.metadata)
                elif isinstance(record, Footer):
                    complete, footer = True, record
        except RecordingError:
            raise
        except _READ_ERRORS as exc:
            if footer is not None or (f.seek(-len(MCAP0_MAGIC), os.SEEK_END) >= 0 and f.read() == MCAP0_MAGIC
                                      and size > 2 * len(MCAP0_MAGIC)):
                raise _fail(path, f"corrupt MCAP ({type(exc).__name__}: {exc}) after {len(blobs)} state messages") from None
            cut_note = (f"the file ends without its footer ({type(exc).__name__}: {exc or 'end of file'}): it was cut short "
                        f"(a killed recorder?); read {len(blobs)} state messages from its complete chunks")
        if footer is not None and footer.summary_crc != 0 and footer.summary_start != 0:
            # the summary section's CRC: its bytes through the footer's summary_offset_start field
            end = size - len(MCAP0_MAGIC) - 4
            if not 2 * len(MCAP0_MAGIC) <= footer.summary_start < end:
                raise _fail(path, f"corrupt MCAP (Footer summary_start {footer.summary_start} is not within the file)")
            f.seek(footer.summary_start)
            crc = zlib.crc32(f.read(end - footer.summary_start))
            if crc != footer.summary_crc:
                raise _fail(path, f"corrupt MCAP (Footer summary_crc {footer.summary_crc:#010x}, the summary section's "
                                  f"is {crc:#010x})")
    if not blobs:
        found_topics = ", ".join(f"{t} ({k})" for t, k in sorted(topics.items())) or "none"
        raise _fail(path, f"no {schema.TOPIC_STATE} messages ({schema.ARM_STATE[0]}); topics found: {found_topics}"
                    + (f"; {cut_note}" if cut_note else ""))
    n = _joint_count(path, state_schema, blobs)
    records, index = schema.arm_state_layout(n).decode(blobs)
    states = np.zeros(len(records), dtype=stream.state_dtype(n))
    states["magic"] = stream.MAGIC
    states["n"] = n
    for name in states.dtype.names:
        if name not in ("magic", "n") and name in records.dtype.names:
            states[name] = records[name]
    names = _joint_names(names_message, n)
    matched = _external_torque(states, np.array(keys, dtype=np.int64).reshape(-1, 2)[index], ext_blobs,
                               np.array(ext_keys, dtype=np.int64).reshape(-1, 2), names)
    return StateLog(str(path), names, states, complete, len(blobs) - len(index), cut_note, metadata, matched)


def _external_torque(states: np.ndarray, keys: np.ndarray, blobs: list[bytes], ext_keys: np.ndarray,
                     names: tuple[str, ...]) -> int:
    """tau_ext of the states from the /external_torque messages of the same (log time, sequence); the count set.
    Messages of another layout (other joints) are left out; states without one keep tau_ext 0."""
    if not blobs:
        return 0
    records, index = schema.joint_state_layout(list(names), position=False, velocity=False).decode(blobs)
    if not len(index):
        return 0
    ext = ext_keys[index]
    order = np.lexsort((ext[:, 1], ext[:, 0]))
    ext, effort = ext[order], records["effort"][order]
    at = np.minimum(np.searchsorted(ext[:, 0], keys[:, 0]), len(ext) - 1)
    hit = (ext[at, 0] == keys[:, 0]) & (ext[at, 1] == keys[:, 1])
    states["tau_ext"][hit] = effort[at[hit]]
    return int(hit.sum())


def _joint_count(path: Path, found: Schema, blobs: list[bytes]) -> int:
    """n from the first state message the generic ROS 2 decoder reads."""
    decode = _decoder(found)
    for data in blobs[:MAX_DECODE_TRIES]:
        try:
            msg = decode(data)
        except Exception:   # noqa: BLE001 - a damaged message: try the next one
            continue
        if len(msg.q) > 0:
            return len(msg.q)
    raise _fail(path, f"none of the first {min(len(blobs), MAX_DECODE_TRIES)} {schema.TOPIC_STATE} messages decodes")


def _joint_names(names_message, n: int) -> tuple[str, ...]:
    if names_message is not None:
        try:
            names = list(_decoder(names_message[0])(names_message[1]).name)
        except Exception:   # noqa: BLE001 - names are a nicety; the numbers come from /armid/state
            names = []
        if len(names) == n:
            return tuple(names)
    return tuple(f"j{k + 1}" for k in range(n))


# -- conversion ----------------------------------------------------------------------------------------
EFFORTS = {"torque": ("tau", "tau"), "current": ("current", "i")}   # effort -> (NPZ array, CSV prefix)


def identification_arrays(log: StateLog, effort: str = "torque") -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of the identification layout (docs/reference/data-files.md): t (s, from the device timestamps,
    starting at 0), q (rad), tau (N m) or current (A), qd (rad/s), effort_delay (s, () array: the driver's
    configured lag of the effort behind the positions, from the recording's metadata, 0 if it says nothing),
    lost_samples (() array: the device samples the driver never received, the sum of the messages' lost-sample
    counts; absent when a message of stream version 1, which has no such count, is among them), late ((N,) bool,
    only when some message has the LATE flag: the drives got the target answering that sample too late); and
    notes on what was left out.

    STALE samples (no new device data: the values repeat) and samples whose device time does not
    increase are dropped; seq gaps are reported, never filled in."""
    if effort not in EFFORTS:
        raise InputError(f"effort {effort!r}: expected one of {', '.join(EFFORTS)}")
    s = log.states
    notes = []
    if log.cut_note:
        notes.append(log.cut_note)
    if log.skipped:
        notes.append(f"{log.skipped} {schema.TOPIC_STATE} messages did not fit the {log.n}-joint layout and were skipped")
    missing, gaps = log.seq_gaps()
    if gaps:
        notes.append(f"{missing} messages missing in {gaps} seq gaps (dropped before or while recording); "
                     f"the samples around them are kept as they are")
    if (s["version"] < 2).any():          # version 1 has no lost-sample count: unknown, not zero
        lost = None
        notes.append(f"{int((s['version'] < 2).sum())} messages of stream version 1, which carries no lost-sample "
                     f"count: the device samples the driver lost are unknown")
    else:
        lost = int((s["flags"].astype(np.int64) >> stream.LOST_SHIFT).sum())
    if lost:
        notes.append(f"{lost} device samples lost by the driver (never published: flags >> 16 of the messages "
                     f"after them); the samples around them are kept as they are")
    fresh = (s["flags"] & stream.FLAG_STALE) == 0
    if (~fresh).any():
        notes.append(f"{int((~fresh).sum())} STALE samples (no new device data) left out")
    late = (s["flags"] & stream.FLAG_LATE) != 0
    s, late = s[fresh], _carried(late, fresh)
    dev = s["device_time_ns"]
    later = np.ones(len(s), dtype=bool)
    later[1:] = dev[1:] > np.maximum.accumulate(dev)[:-1]
    if (~later).any():
        notes.append(f"{int((~later).sum())} samples whose device time does not increase left out")
    s, late = s[later], _carried(late, later)
    if late.any():
        notes.append(f"{int(late.sum())} samples marked LATE (the drives got their targets too late and held a stale "
                     f"one): kept, marked in the array late, cut out by identification")
    if len(s) == 0:
        raise RecordingError(f"{log.path}: no fresh samples to convert")
    array, _ = EFFORTS[effort]
    out = {"t": (s["device_time_ns"] - s["device_time_ns"][0]).astype(np.float64) / 1e9,
           "q": np.ascontiguousarray(s["q"], dtype=np.float64),
           array: np.ascontiguousarray(s[effort], dtype=np.float64),
           "qd": np.ascontiguousarray(s["qd"], dtype=np.float64),
           "effort_delay": np.array(_effort_delay(log))}
    if lost is not None:
        out["lost_samples"] = np.array(lost)
    if late.any():
        out["late"] = late
    return out, notes


def _carried(marks: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """marks (N,) at the kept samples (keep (N,) bool); a left-out sample's mark goes to the next kept one (the
    last one at the end), so that no mark is lost with the samples left out."""
    kept = np.flatnonzero(keep)
    out = np.zeros(len(kept), dtype=bool)
    if len(kept):
        out[np.minimum(np.searchsorted(kept, np.flatnonzero(marks)), len(kept) - 1)] = True
    return out


def _effort_delay(log: StateLog) -> float:
    text = log.metadata.get("armid", {}).get("effort_delay_s", "0")
    try:
        delay = float(text)
    except ValueError:
        raise RecordingError(f"{log.path}: metadata armid.effort_delay_s: expected seconds, got {text!r}") from None
    if not math.isfinite(delay):
        raise RecordingError(f"{log.path}: metadata armid.effort_delay_s: expected a finite number, got {text!r}")
    return delay


def csv_header(arrays: dict[str, np.ndarray]) -> list[str]:
    """Column names of the identification CSV for these arrays: t, q1..qn, tau1..taun or i1..in, qd1..qdn, and
    late (0 or 1) when the arrays carry the LATE marks."""
    n = arrays["q"].shape[1]
    effort = "tau" if "tau" in arrays else "current"
    prefix = EFFORTS["torque" if effort == "tau" else "current"][1]
    return (["t"] + [f"q{j + 1}" for j in range(n)] + [f"{prefix}{j + 1}" for j in range(n)]
            + [f"qd{j + 1}" for j in range(n)] + (["late"] if "late" in arrays else []))


def write_identification(arrays: dict[str, np.ndarray], out: str | Path) -> None:
    """Write the arrays as CSV (every float with 17 significant digits: exact) or NPZ, by the suffix of
    `out`; the file appears complete or not at all. NPZ keeps effort_delay and lost_samples when the arrays have
    them, and late; CSV states lost_samples in a comment line before its header, has a column late (0 or 1) when
    there are marks, and leaves effort_delay out (give `armid identify --effort-delay`)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".csv", ".npz"):
        raise RecordingError(f"{out}: unknown output format {out.suffix!r}: expected .csv or .npz")
    effort = "tau" if "tau" in arrays else "current"
    try:
        fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=suffix)
    except OSError as exc:
        raise RecordingError(f"{out}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            if suffix == ".npz":
                extra = {k: arrays[k] for k in ("effort_delay", "lost_samples", "late") if k in arrays}
                np.savez(f, t=arrays["t"], q=arrays["q"], qd=arrays["qd"], **{effort: arrays[effort]}, **extra)
            else:
                late = [arrays["late"].astype(np.float64)] if "late" in arrays else []
                table = np.column_stack([arrays["t"], arrays["q"], arrays[effort], arrays["qd"], *late])
                lead = f"# lost_samples = {int(arrays['lost_samples'])}\n" if "lost_samples" in arrays else ""
                np.savetxt(f, table, fmt="%.17g", delimiter=",", header=lead + ",".join(csv_header(arrays)),
                           comments="")
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def convert(recording: str | Path, out: str | Path, effort: str = "torque") -> tuple[dict[str, np.ndarray], list[str]]:
    """read_recording + identification_arrays + write_identification; returns the arrays and the notes."""
    arrays, notes = identification_arrays(read_recording(recording), effort)
    write_identification(arrays, out)
    return arrays, notes
