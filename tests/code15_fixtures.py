"""Tiny CODE-15 corpora in the exact published layout, for the reader tests.

`exams.csv` (exam_id, age, is_male, nn_predicted_age, 1dAVb, RBBB, LBBB, SB, ST, AF, patient_id,
death, timey, normal_ecg, trace_file) and `exams_partN.hdf5` with `tracings` (N, 4096, 12)
float32 mV at 400 Hz (lead order DI, DII, DIII, AVR, AVL, AVF, V1..V6) and `exam_id` (N,);
shorter exams zero-padded symmetrically; the last row of every part is exam_id 0, all zeros.
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np

FS, SAMPLES = 400, 4096
COLUMNS = ["exam_id", "age", "is_male", "nn_predicted_age", "1dAVb", "RBBB", "LBBB", "SB", "ST", "AF",
           "patient_id", "death", "timey", "normal_ecg", "trace_file"]


def ecg_like(n: int, fs: float, seed: int) -> np.ndarray:
    """(12, n) float32 mV: a 1.2 Hz fundamental with harmonics, lead-specific gains, a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / fs
    beat = sum(np.sin(2 * np.pi * 1.2 * k * t + k) / k for k in range(1, 12))
    gains = rng.uniform(0.3, 1.5, size=(12, 1))
    return (gains * beat + rng.normal(0, 0.01, size=(12, n))).astype(np.float32)


def padded_trace(x: np.ndarray) -> np.ndarray:
    """(12, n <= 4096) canonical-order mV -> (4096, 12) with symmetric zero padding, as CODE-15 stores it."""
    trace = np.zeros((SAMPLES, 12), np.float32)
    start = (SAMPLES - x.shape[1]) // 2
    trace[start:start + x.shape[1]] = x.T  # canonical order == DI, DII, DIII, AVR, AVL, AVF, V1..V6
    return trace


def write_part(root: Path, part: int, exam_ids: Sequence[int], traces: Sequence[np.ndarray]) -> Path:
    """exams_part{part}.hdf5 with the given (4096, 12) traces plus the final exam_id 0 all-zero row."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"exams_part{part}.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("tracings", data=np.stack([*traces, np.zeros((SAMPLES, 12), np.float32)]).astype(np.float32))
        f.create_dataset("exam_id", data=np.array([*exam_ids, 0], dtype=np.int64))
    return path


def exam_row(exam_id: int, part: int, **values) -> dict:
    """One exams.csv row; labels default to False, age to 50, patient_id to exam_id + 7."""
    row = {"exam_id": exam_id, "age": 50, "is_male": True, "nn_predicted_age": 51.5, "1dAVb": False,
           "RBBB": False, "LBBB": False, "SB": False, "ST": False, "AF": False, "patient_id": exam_id + 7,
           "death": "", "timey": "", "normal_ecg": True, "trace_file": f"exams_part{part}.hdf5"}
    row.update(values)
    return row


def write_exams_csv(root: Path, rows: Sequence[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "exams.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path
