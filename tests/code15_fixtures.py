"""Tiny CODE-15 corpora in the exact published layout, for the reader tests.

The layout is written by ecgpos.demo.synthetic, the one writer that tests and the demo share:

`exams.csv` (exam_id, age, is_male, nn_predicted_age, 1dAVb, RBBB, LBBB, SB, ST, AF, patient_id,
death, timey, normal_ecg, trace_file) and `exams_partN.hdf5` with `tracings` (N, 4096, 12)
float32 mV at 400 Hz (lead order DI, DII, DIII, AVR, AVL, AVF, V1..V6) and `exam_id` (N,);
shorter exams zero-padded symmetrically; the last row of every part is exam_id 0, all zeros.
"""

from __future__ import annotations

import numpy as np

from ecgpos.demo.synthetic import CODE15_FS as FS
from ecgpos.demo.synthetic import code15_padded as padded_trace
from ecgpos.demo.synthetic import code15_row as exam_row
from ecgpos.demo.synthetic import write_code15_csv as write_exams_csv
from ecgpos.demo.synthetic import write_code15_part as write_part
from ecgpos.ecg.limbs import derived_limb_leads

__all__ = ["FS", "ecg_like", "exam_row", "padded_trace", "write_exams_csv", "write_part"]


def ecg_like(n: int, fs: float, seed: int) -> np.ndarray:
    """(12, n) float32 mV: a 1.2 Hz fundamental with harmonics, lead-specific gains, a little noise;
    leads III, aVR, aVL, aVF derived from I and II, as recorders store them."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / fs
    beat = sum(np.sin(2 * np.pi * 1.2 * k * t + k) / k for k in range(1, 12))
    gains = rng.uniform(0.3, 1.5, size=(12, 1))
    x = gains * beat + rng.normal(0, 0.01, size=(12, n))
    x[2:6] = derived_limb_leads(x[0], x[1])
    return x.astype(np.float32)
