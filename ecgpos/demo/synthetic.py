"""Synthetic 12-lead ECGs (neurokit2's multi-lead ECGSYN) written in the real corpora's on-disk layouts.

The demo and the tests use these so that the real readers run on them: an ecg-arrhythmia style
WFDB tree (`WFDBRecords/NN/NNN/JSxxxxx.{hea,mat}`, MATLAB v4 `val` int16 at 1000 adu/mV), a CODE-15
style `exams.csv` + `exams_part0.hdf5`, and a labelled probe set (bradycardia / normal / tachycardia
by simulated heart rate, plus noisy vs clean) with train/val/test split files.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import scipy.io
from scipy import signal as sps

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.limbs import derived_limb_leads
from ecgpos.workers import mapped_in_workers, usable_cpus

CODE15_LEADS = ("DI", "DII", "DIII", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6")
CODE15_FS, CODE15_SAMPLES = 400, 4096
NINGBO_FIRST_ID = 10647  # JS10647.. is the Ningbo part of ecg-arrhythmia (the paper's pretraining pool)
RHYTHM_CLASSES = ("brady", "normal", "tachy")
PROBE_CLASSES = RHYTHM_CLASSES + ("noisy",)
# neurokit2 seeds a legacy RandomState: below 2**32 (the same seeds as before for every seed that fitted)
SEED_RANGE = 2**32


@dataclass(frozen=True)
class SimulationParams:
    """One simulated recording: rate, variability and noise are what the labels are made from."""

    seed: int
    heart_rate: float
    heart_rate_std: float
    noise: float
    duration: float = 10.0
    fs: int = 500


def simulate(params: SimulationParams) -> np.ndarray:
    """A (12, duration*fs) float32 ECG in mV, canonical lead order, from neurokit2's ECGSYN."""
    import neurokit2 as nk  # imported here: slow to import and only needed when simulating

    frame = nk.ecg_simulate(
        duration=params.duration,
        sampling_rate=params.fs,
        heart_rate=params.heart_rate,
        heart_rate_std=params.heart_rate_std,
        noise=0.0,
        method="multileads",
        random_state=params.seed,
    )
    x = frame[list(CANONICAL_LEADS)].to_numpy(dtype=np.float32).T
    rng = np.random.default_rng(params.seed + 7919)
    # Lead-specific gain, baseline wander and white noise: what real recordings vary in.
    x = x * rng.uniform(0.7, 1.4, size=(12, 1)).astype(np.float32)
    t = np.arange(x.shape[1], dtype=np.float32) / params.fs
    wander = 0.15 * np.sin(2 * np.pi * rng.uniform(0.05, 0.3) * t + rng.uniform(0, 2 * np.pi))
    x = x + wander.astype(np.float32) + rng.normal(0, params.noise, size=x.shape).astype(np.float32)
    # ECGSYN simulates every lead on its own: derive III, aVR, aVL, aVF from I and II as recorders
    # do, so the limb leads obey Einthoven's and Goldberger's relations (screening checks them)
    x[2:6] = derived_limb_leads(x[0], x[1])
    return x.astype(np.float32)


def simulate_many(params: Sequence[SimulationParams], workers: int | None = None) -> list[np.ndarray]:
    """Simulate in parallel processes (ECGSYN solves one ODE per lead: ~1 s a record). Ctrl-C and a
    job-wide SIGTERM stop them as `ecgpos.workers.mapped_in_workers` does: one line, no worker left."""
    workers = workers or min(len(params), usable_cpus())
    if workers <= 1 or len(params) <= 1:
        return [simulate(p) for p in params]
    with mapped_in_workers(simulate, params, workers) as simulated:
        return list(simulated)


def random_params(
    count: int, seed: int, heart_rates: tuple[float, float] = (45, 150), noise: tuple[float, float] = (0.0, 0.08)
) -> list[SimulationParams]:
    """Recordings spread over heart rate, heart-rate variability and noise level."""
    rng = np.random.default_rng(seed)
    return [
        SimulationParams(
            seed=int((seed * 100_003 + i) % SEED_RANGE),
            heart_rate=float(rng.uniform(*heart_rates)),
            heart_rate_std=float(rng.uniform(0.5, 8.0)),
            noise=float(rng.uniform(*noise)),
        )
        for i in range(count)
    ]


# --- ecg-arrhythmia layout -------------------------------------------------------------------


def _checksum(values: np.ndarray) -> int:
    """WFDB per-signal checksum: the 16-bit two's-complement sum of the samples."""
    total = int(values.astype(np.int64).sum()) & 0xFFFF
    return total - 0x10000 if total >= 0x8000 else total


def write_arrhythmia_record(
    folder: Path, record_id: str, x: np.ndarray, fs: int, age: int, sex: str, dx: Iterable[str] = ("426783006",)
) -> Path:
    """Write `record_id`.{hea,mat} exactly as ecg-arrhythmia stores them (CRLF header, 1000 adu/mV)."""
    folder.mkdir(parents=True, exist_ok=True)
    digital = np.clip(np.round(x * 1000.0), -32768, 32767).astype(np.int16)
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, {"val": digital}, format="4")
    (folder / f"{record_id}.mat").write_bytes(buffer.getvalue())
    lines = [f"{record_id} 12 {fs} {digital.shape[1]}"]
    for lead, row in zip(CANONICAL_LEADS, digital):
        lines.append(f"{record_id}.mat 16+24 1000/mV 16 0 {int(row[0])} {_checksum(row)} 0 {lead}")
    lines += [f"#Age: {age}", f"#Sex: {sex}", f"#Dx: {','.join(dx)}", "#Rx: Unknown", "#Hx: Unknown", "#Sx: Unknown"]
    (folder / f"{record_id}.hea").write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return folder / record_id


def write_arrhythmia_tree(
    root: Path,
    signals: Sequence[np.ndarray],
    fs: int = 500,
    seed: int = 0,
    first_id: int = NINGBO_FIRST_ID,
    per_folder: int = 100,
) -> list[str]:
    """A `WFDBRecords/NN/NNN/` tree with RECORDS files; ids start in the Ningbo range by default."""
    rng = np.random.default_rng(seed)
    ids = []
    for i, x in enumerate(signals):
        record_id = f"JS{first_id + i:05d}"
        bucket = (first_id + i) // per_folder
        folder = root / "WFDBRecords" / f"{bucket // 10:02d}" / f"{bucket:03d}"
        write_arrhythmia_record(
            folder, record_id, x, fs, age=int(rng.integers(20, 90)), sex=str(rng.choice(["Male", "Female"]))
        )
        with open(folder / "RECORDS", "a") as handle:
            handle.write(record_id + "\n")
        ids.append(record_id)
    return ids


# --- CODE-15 layout --------------------------------------------------------------------------

CODE15_COLUMNS = (
    "exam_id",
    "age",
    "is_male",
    "nn_predicted_age",
    "1dAVb",
    "RBBB",
    "LBBB",
    "SB",
    "ST",
    "AF",
    "patient_id",
    "death",
    "timey",
    "normal_ecg",
    "trace_file",
)


def code15_padded(x: np.ndarray) -> np.ndarray:
    """(12, n <= 4096) canonical-order mV at 400 Hz -> (4096, 12), zero-padded symmetrically like CODE-15.

    Canonical order is CODE-15's own (DI, DII, DIII, AVR, AVL, AVF, V1..V6).
    """
    trace = np.zeros((CODE15_SAMPLES, 12), np.float32)
    start = (CODE15_SAMPLES - x.shape[1]) // 2
    trace[start : start + x.shape[1]] = x.T
    return trace


def to_code15_trace(x: np.ndarray, fs: float) -> np.ndarray:
    """(12, T) canonical mV at fs -> (4096, 12) at 400 Hz, as CODE-15 stores an exam."""
    return code15_padded(sps.resample_poly(x, CODE15_FS, int(fs), axis=-1).astype(np.float32)[:, :CODE15_SAMPLES])


def write_code15_part(root: Path, part: int, exam_ids: Sequence[int], traces: Sequence[np.ndarray]) -> Path:
    """`exams_part{part}.hdf5`: `tracings` (N + 1, 4096, 12) float32 and `exam_id`, ending with exam_id 0 (zeros)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"exams_part{part}.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset(
            "tracings", data=np.stack([*traces, np.zeros((CODE15_SAMPLES, 12), np.float32)]).astype(np.float32)
        )
        f.create_dataset("exam_id", data=np.array([*exam_ids, 0], dtype=np.int64))
    return path


def code15_row(exam_id: int, part: int, **values: object) -> dict:
    """One `exams.csv` row: labels False, age 50, patient_id exam_id + 7 unless given."""
    row = {
        "exam_id": exam_id,
        "age": 50,
        "is_male": True,
        "nn_predicted_age": 51.5,
        "1dAVb": False,
        "RBBB": False,
        "LBBB": False,
        "SB": False,
        "ST": False,
        "AF": False,
        "patient_id": exam_id + 7,
        "death": "",
        "timey": "",
        "normal_ecg": True,
        "trace_file": f"exams_part{part}.hdf5",
    }
    row.update(values)
    return row


def write_code15_csv(root: Path, rows: Sequence[dict]) -> Path:
    """`exams.csv` with CODE-15's columns (missing values left empty)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "exams.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CODE15_COLUMNS, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_code15(
    root: Path,
    traces: Sequence[np.ndarray],
    first_exam_id: int = 1_000_001,
    part: int = 0,
    seed: int = 0,
    heart_rates: Sequence[float] | None = None,
) -> list[int]:
    """A one-part CODE-15 corpus: `exams.csv` + `exams_part{part}.hdf5` with varied metadata.

    traces: (4096, 12) float32 arrays (see `to_code15_trace`); heart_rates, when given, set the SB/ST
    label columns (sinus brady-/tachycardia). Returns the exam ids written.
    """
    rng = np.random.default_rng(seed)
    exam_ids = [first_exam_id + i for i in range(len(traces))]
    write_code15_part(root, part, exam_ids, traces)
    rows = []
    for i, exam_id in enumerate(exam_ids):
        age = int(rng.integers(20, 90))
        rhythm = rhythm_class(heart_rates[i]) if heart_rates is not None else "normal"
        rows.append(
            code15_row(
                exam_id,
                part,
                age=age,
                is_male=bool(rng.integers(0, 2)),
                nn_predicted_age=round(age + rng.normal(0, 5), 2),
                SB=rhythm == "brady",
                ST=rhythm == "tachy",
                normal_ecg=rhythm == "normal",
                patient_id=int(rng.integers(1, 10**6)),
            )
        )
    write_code15_csv(root, rows)
    return exam_ids


# --- labelled probe set ----------------------------------------------------------------------


def rhythm_class(heart_rate: float) -> str:
    """Bradycardia below 60 bpm, tachycardia above 100 bpm."""
    return "brady" if heart_rate < 60 else "tachy" if heart_rate > 100 else "normal"


def probe_params(per_class: int, seed: int) -> list[SimulationParams]:
    """Balanced over brady / normal / tachy; every second recording of a class is noisy."""
    rng = np.random.default_rng(seed)
    ranges = {"brady": (40, 55), "normal": (65, 95), "tachy": (105, 150)}
    params = []
    for c, (lo, hi) in enumerate(ranges.values()):
        for i in range(per_class):
            noisy = i % 2 == 1
            params.append(
                SimulationParams(
                    seed=int((seed * 100_003 + 1000 * c + i) % SEED_RANGE),
                    heart_rate=float(rng.uniform(lo, hi)),
                    heart_rate_std=float(rng.uniform(0.5, 5.0)),
                    noise=float(rng.uniform(0.15, 0.25) if noisy else rng.uniform(0.0, 0.02)),
                )
            )
    return params


def write_probe_set(
    root: Path,
    params: Sequence[SimulationParams],
    signals: Sequence[np.ndarray],
    seed: int = 0,
    fractions: tuple[float, float] = (0.6, 0.2),
) -> dict[str, int]:
    """WFDB records under `root/records/` and `root/{train,val,test}.csv` (stratified by rhythm class).

    Split columns: record (path relative to root, no extension), then one 0/1 column per class in
    PROBE_CLASSES — the layout of `ecgpos probe --task custom:<root>`. The simulated heart rates are
    kept in `root/metadata.csv`. Returns the row count of each split.
    """
    import wfdb

    records = root / "records"
    records.mkdir(parents=True, exist_ok=True)
    rows, metadata = [], []
    for i, (p, x) in enumerate(zip(params, signals)):
        name = f"synth{i:05d}"
        wfdb.wrsamp(
            name,
            fs=p.fs,
            units=["mV"] * 12,
            sig_name=list(CANONICAL_LEADS),
            p_signal=x.T.astype(np.float64),
            fmt=["16"] * 12,
            adc_gain=[1000.0] * 12,
            baseline=[0] * 12,
            write_dir=str(records),
        )
        rhythm = rhythm_class(p.heart_rate)
        rows.append(
            {"record": f"records/{name}", **{c: int(c == rhythm) for c in RHYTHM_CLASSES}, "noisy": int(p.noise > 0.1)}
        )
        metadata.append(
            {
                "record": f"records/{name}",
                "heart_rate": round(p.heart_rate, 1),
                "heart_rate_std": round(p.heart_rate_std, 2),
                "noise_mv": round(p.noise, 3),
            }
        )
    return write_probe_tables(root, rows, metadata, seed, fractions)


def write_probe_tables(
    root: Path,
    rows: Sequence[dict],
    metadata: Sequence[dict],
    seed: int = 0,
    fractions: tuple[float, float] = (0.6, 0.2),
) -> dict[str, int]:
    """`root/{train,val,test}.csv` from one row per record (record, then a 0/1 column per class of
    PROBE_CLASSES), stratified by rhythm class, and `root/metadata.csv`; returns each split's row count."""
    rng = np.random.default_rng(seed)
    splits: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for label in RHYTHM_CLASSES:  # stratified: every split gets every rhythm class
        group = [r for r in rows if r[label]]
        order = rng.permutation(len(group))
        n_train, n_val = int(round(fractions[0] * len(group))), int(round(fractions[1] * len(group)))
        for rank, index in enumerate(order):
            split = "train" if rank < n_train else "val" if rank < n_train + n_val else "test"
            splits[split].append(group[index])
    tables = {**{f"{split}.csv": split_rows for split, split_rows in splits.items()}, "metadata.csv": metadata}
    for name, table in tables.items():
        with open(root / name, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(table[0]) if table else ["record"])
            writer.writeheader()
            writer.writerows(table)
    return {split: len(split_rows) for split, split_rows in splits.items()}
