"""Small shard sets in the documented layout, written directly (no WFDB reading, no filtering),
and single WFDB records in mV for the readers.

Signals are cheap ECG-like waveforms: a periodic train of Gaussian "QRS" and "T" bumps per lead
with a per-record heart rate, per-lead gain and noise, standardised per lead, stored as float16
like `ecgpos preprocess` writes them. Lengths vary, so readers must use `lengths`. `smooth_like`
signals (one slow sinusoid per record, a gain per lead) are the ones a tiny model learns in a few
hundred CPU steps: the learning checks train on them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import wfdb

from ecgpos.ecg.shards import shard_name, write_shard
from ecgpos.ecg.spec import DEFAULT_SPEC, PreprocessSpec


def ecg_like(length: int, fs: int, rng: np.random.Generator) -> np.ndarray:
    """(12, length) float32 standardised ECG-like signal."""
    t = np.arange(length) / fs
    rate = rng.uniform(50, 120) / 60.0
    phase = (t * rate + rng.uniform()) % 1.0
    gains = rng.uniform(0.5, 1.5, size=(12, 1))
    qrs = np.exp(-((phase - 0.3) ** 2) / (2 * 0.012**2))
    tw = np.exp(-((phase - 0.6) ** 2) / (2 * 0.05**2))
    mix = rng.uniform(-1, 1, size=(12, 2))
    x = gains * (mix[:, :1] * qrs + 0.4 * mix[:, 1:] * tw) + 0.05 * rng.standard_normal((12, length))
    x = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
    return x.astype(np.float32)


def smooth_like(length: int, fs: int, rng: np.random.Generator) -> np.ndarray:
    """(12, length) float32: one sinusoid of 0.5-1.5 Hz per record, a signed gain per lead, a little
    noise, standardised per lead. A masked patch is predictable from the visible ones of its lead."""
    t = np.arange(length) / fs
    wave = np.sin(2 * np.pi * rng.uniform(0.5, 1.5) * t + rng.uniform(0, 2 * np.pi))
    x = rng.uniform(-1.5, 1.5, size=(12, 1)) * wave + 0.02 * rng.standard_normal((12, length))
    x = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
    return x.astype(np.float32)


def write_tiny_shards(
    folder: Path,
    n_records: int = 48,
    records_per_shard: int = 20,
    seed: int = 0,
    spec: PreprocessSpec = DEFAULT_SPEC,
    min_length: int | None = None,
    max_length: int | None = None,
    nan_records: set[int] | None = None,
    signal=ecg_like,  # noqa: ANN001 - (length, fs, rng) -> (12, length): ecg_like or smooth_like
) -> Path:
    """Write shard-*.h5, index.csv and preprocess.json into `folder`; returns it.

    nan_records: record numbers (0-based, over the whole set) whose signal is all NaN (bad-data tests).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lo = min_length or spec.window
    hi = max_length or spec.window + 750
    rows = []
    for chunk, first in enumerate(range(0, n_records, records_per_shard)):
        ids = [f"TINY{seed:02d}{i:05d}" for i in range(first, min(n_records, first + records_per_shard))]
        signals = [signal(int(rng.integers(lo, hi + 1)), spec.fs, rng) for _ in ids]
        signals = [np.full_like(s, np.nan) if first + k in (nan_records or ()) else s for k, s in enumerate(signals)]
        write_shard(folder / shard_name(chunk), signals, ids, spec, {"source": "tiny", "chunk": chunk})
        rows += [
            {
                "shard": shard_name(chunk),
                "row": r,
                "source": "tiny",
                "record_id": rid,
                "patient_id": rid,
                "age": "",
                "sex": "",
                "length": s.shape[-1],
                "labels": "",
            }
            for r, (rid, s) in enumerate(zip(ids, signals))
        ]
    with open(folder / "index.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (folder / "preprocess.json").write_text(
        json.dumps({"spec": spec.to_dict(), "source": "tiny", "counts": {"written": n_records}, "version": "test"})
    )
    return folder


def write_mv_record(folder: Path, name: str, signal: np.ndarray, fs: float, leads: list[str]) -> None:
    """A WFDB format-16 record of a (leads, time) mV signal at 1 uV resolution, as PTB-XL stores them."""
    wfdb.wrsamp(
        name,
        fs=fs,
        units=["mV"] * len(leads),
        sig_name=list(leads),
        p_signal=signal.T.astype(np.float64),
        fmt=["16"] * len(leads),
        adc_gain=[1000.0] * len(leads),
        baseline=[0] * len(leads),
        write_dir=str(folder),
    )
