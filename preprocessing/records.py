"""What every corpus reader hands to shard building, and the checks every record goes through.

A reader lists `RecordRef`s (cheap, picklable, sorted: the order fixes shard contents) and loads
one into a `LoadedRecord` (raw mV, source rate, lead names as written, index metadata). `validate`
screens a loaded record or raises `SignalError(reason)` (the reason becomes the `skipped.csv` row),
and `prepare_many` turns validated records into the stored signals. Skip reasons (one word each,
documented in docs/data.md):

unreadable, truncated_signal, corrupt_signal, header_mismatch, missing_lead, duplicate_lead,
unknown_lead, units, sampling_rate, unexpected_fs, empty, non_finite, all_zero, flat, dead_leads,
lead_mismatch, too_short, missing_metadata, unreadable_part, duplicate_record, duplicate_exam_rows (and `dtype`,
`shape`, `bad_record_id` for what `embed` and `score` are given).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.screening import Screened, ScreenPolicy, screen_record
from ecgpos.ecg.signal import preprocess_batch
from ecgpos.ecg.spec import PreprocessSpec


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
    total: int = -1  # samples of the whole record when `signal` is the span a reader read (`RawRecord.total`)
    uncalibrated: tuple[str, ...] = ()  # leads read in made-up mV (`RawRecord.uncalibrated`)


RecordPolicy = ScreenPolicy
"""Preprocessing's policy is the shared screening policy (expected_fs: the corpus's rate)."""


@dataclass
class Prepared:
    """A record ready for a shard: float32 (12, length) at spec.fs, canonical order."""

    signal: np.ndarray
    length: int
    dead: list[str]


Validated = Screened


def validate(record: LoadedRecord, spec: PreprocessSpec, policy: RecordPolicy) -> Validated:
    """Every skip check of a record (raises SignalError(reason)), without the signal processing:
    `ecgpos.ecg.screening.screen_record`, the same function `embed` and probes call."""
    return screen_record(record.signal, record.fs, record.leads, spec, policy, record.total, record.uncalibrated)


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
        while stop < len(records) and records[stop].fs == first.fs and records[stop].signal.shape == first.signal.shape:
            stop += 1
        run = records[start:stop]
        x = np.stack([r.signal for r in run]) if len(run) > 1 else run[0].signal[None]
        y = preprocess_batch(x, first.fs, spec, np.stack([r.dead for r in run]))
        for r, signal in zip(run, y):
            out.append(
                Prepared(
                    signal=signal,
                    length=int(signal.shape[-1]),
                    dead=[CANONICAL_LEADS[i] for i in np.flatnonzero(r.dead)],
                )
            )
        start = stop
    return out
