"""What every corpus reader hands to shard building, and the checks every record goes through.

A reader lists `RecordRef`s (cheap, picklable, sorted: the order fixes shard contents) and loads
one into a `LoadedRecord` (raw mV, source rate, lead names as written, index metadata). `prepare`
turns a loaded record into the stored signal or raises `SignalError(reason)`; the reason becomes the
`skipped.csv` row. Skip reasons (one word each, documented in preprocessing/README.md):

unreadable, truncated_signal, corrupt_signal, header_mismatch, missing_lead, duplicate_lead,
unknown_lead, unexpected_fs, non_finite, all_zero, flat, dead_leads, too_short, missing_metadata,
unreadable_part, duplicate_record.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ecgpos.ecg.leads import CANONICAL_LEADS, to_canonical_order
from ecgpos.ecg.signal import preprocess_batch, resampled_length, screen
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import SignalError

DEFAULT_MAX_DEAD_LEADS = 2
"""Records with up to this many dead (flat) leads are kept, the dead leads stored as exact zeros."""


@dataclass(frozen=True)
class RecordRef:
    """Where one input record lives. `problem` = (reason, detail) known already when listing."""

    record_id: str
    location: str  # path relative to --src (WFDB record without extension, or HDF5 part file)
    row: int = -1  # row inside an HDF5 part
    problem: tuple[str, str] | None = None


@dataclass
class LoadedRecord:
    """A raw record: (leads, time) float32 mV at `fs`, lead names as written, index metadata."""

    signal: np.ndarray
    fs: float
    leads: list[str]
    meta: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordPolicy:
    """What to do with records that are short or have dead leads (stored in preprocess.json)."""

    expected_fs: float
    pad_short: bool = False
    max_dead_leads: int = DEFAULT_MAX_DEAD_LEADS


@dataclass
class Prepared:
    """A record ready for a shard: float32 (12, length) at spec.fs, canonical order."""

    signal: np.ndarray
    length: int
    dead: list[str]


@dataclass
class Validated:
    """A record that passed every check: canonical-order raw (12, time) mV, its rate and dead leads."""

    signal: np.ndarray
    fs: float
    dead: np.ndarray  # (12,) bool


def validate(record: LoadedRecord, spec: PreprocessSpec, policy: RecordPolicy) -> Validated:
    """Every skip check of a record (raises SignalError(reason)), without the signal processing."""
    x = to_canonical_order(np.asarray(record.signal), record.leads)  # raises missing/duplicate/unknown lead
    if abs(record.fs - policy.expected_fs) > 1e-6:
        raise SignalError("unexpected_fs", f"{record.fs:g} Hz, this corpus is {policy.expected_fs:g} Hz")
    if x.shape[-1] == 0:  # e.g. a CODE-15 trace that is zero padding only
        raise SignalError("all_zero", "every sample is zero")
    dead = screen(x)  # raises non_finite; the dead-lead mask of the same max/min pass
    if dead.all():  # an all-zero trace is also flat: tell the two apart only here, off the common path
        if not np.any(x):
            raise SignalError("all_zero", "every sample is zero")
        raise SignalError("flat", "every lead is flat (peak-to-peak below 10 uV)")
    names = [CANONICAL_LEADS[i] for i in np.flatnonzero(dead)]
    if len(names) > policy.max_dead_leads:
        raise SignalError("dead_leads", f"{len(names)} dead leads ({' '.join(names)}) > {policy.max_dead_leads}")
    length = resampled_length(x.shape[-1], record.fs, spec.fs)
    if length < spec.window and not policy.pad_short:
        raise SignalError("too_short", f"{length} samples at {spec.fs} Hz < window {spec.window}")
    return Validated(signal=x, fs=float(record.fs), dead=dead)


def prepare_many(records: list[Validated], spec: PreprocessSpec) -> list[Prepared]:
    """Preprocess validated records; runs of equal rate and length go through scipy as one batch.

    Record i's signal is bit-for-bit what `preprocess_signal` gives for it alone (per-lead and
    per-record maths only), so batching changes speed, not output.
    """
    out: list[Prepared] = []
    start = 0
    while start < len(records):
        first = records[start]
        stop = start + 1
        while (stop < len(records) and records[stop].fs == first.fs
               and records[stop].signal.shape == first.signal.shape):
            stop += 1
        run = records[start:stop]
        x = np.stack([r.signal for r in run]) if len(run) > 1 else run[0].signal[None]
        y = preprocess_batch(x, first.fs, spec, np.stack([r.dead for r in run]))
        for r, signal in zip(run, y):
            out.append(Prepared(signal=signal, length=int(signal.shape[-1]),
                                dead=[CANONICAL_LEADS[i] for i in np.flatnonzero(r.dead)]))
        start = stop
    return out
