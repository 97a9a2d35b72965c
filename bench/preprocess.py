"""Preprocessing throughput on one core: `ecgpos preprocess` vs a naive per-lead baseline.

Both read the same ecg-arrhythmia records (the real samples in ../shared/data, or --src) and
produce the same kind of output (12 leads band-passed 0.67-40 Hz, z-scored, 250 Hz, float16 on
disk). The naive baseline does it the textbook way, per record and per lead: `wfdb.rdrecord`,
`scipy.signal.butter` + `filtfilt`, z-score, FFT `scipy.signal.resample`, one HDF5 dataset per
record. Peak memory of the real pipeline is measured in fresh processes on the corpus and on a
corpus --scale times larger (renamed copies), to show it does not grow with corpus size.

    python bench/preprocess.py [--src DIR] [--scale 4]

The last line is the ratio (pipeline records/s over baseline records/s).
"""
from __future__ import annotations

import os

os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")  # one core

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import wfdb
from scipy import signal as sps

from ecgpos.paths import sample_data_root
from ecgpos.spec import DEFAULT_SPEC


def naive(records: list[Path], out: Path) -> float:
    """The baseline over `records`; returns seconds."""
    start = time.perf_counter()
    with h5py.File(out, "w") as f:
        for path in records:
            rec = wfdb.rdrecord(str(path))
            n_out = int(round(rec.sig_len * DEFAULT_SPEC.fs / rec.fs))
            leads = []
            for lead in rec.p_signal.T:
                b, a = sps.butter(DEFAULT_SPEC.filter_order, [DEFAULT_SPEC.highpass_hz, DEFAULT_SPEC.lowpass_hz],
                                  btype="bandpass", fs=rec.fs)
                y = sps.filtfilt(b, a, lead)
                y = (y - y.mean()) / (y.std() + 1e-8)
                leads.append(sps.resample(y, n_out))
            f.create_dataset(path.name, data=np.stack(leads).astype(np.float16))
    return time.perf_counter() - start


def naive_read_per_lead(records: list[Path]) -> float:
    """The literal reading of "per lead: wfdb.rdrecord": one rdrecord(channels=[i]) per lead (info only)."""
    start = time.perf_counter()
    for path in records:
        for i in range(12):
            rec = wfdb.rdrecord(str(path), channels=[i])
            b, a = sps.butter(DEFAULT_SPEC.filter_order, [DEFAULT_SPEC.highpass_hz, DEFAULT_SPEC.lowpass_hz],
                              btype="bandpass", fs=rec.fs)
            y = sps.filtfilt(b, a, rec.p_signal[:, 0])
            sps.resample((y - y.mean()) / (y.std() + 1e-8), int(round(rec.sig_len * DEFAULT_SPEC.fs / rec.fs)))
    return time.perf_counter() - start


def ours(src: Path, out: Path, records_per_shard: int = 1000) -> float:
    """`ecgpos preprocess ecg-arrhythmia --subset all` in this process, one worker; returns seconds."""
    from preprocessing.build import BuildRequest, run

    req = BuildRequest(dataset="ecg-arrhythmia", src=src, out=out, spec=DEFAULT_SPEC, subset="all",
                       records_per_shard=records_per_shard)
    with open(os.devnull, "w") as quiet:
        start = time.perf_counter()
        run(req, quiet)
        return time.perf_counter() - start


def scaled_copy(records: list[Path], dest: Path, scale: int) -> None:
    """`scale` renamed copies of every record (ids shifted by 50000 per copy)."""
    for copy in range(scale):
        folder = dest / "WFDBRecords" / f"c{copy:02d}"
        folder.mkdir(parents=True)
        for path in records:
            new = f"JS{int(path.name[2:]) + 50000 * (copy + 1):06d}"
            header = path.with_suffix(".hea").read_bytes().replace(path.name.encode(), new.encode())
            (folder / f"{new}.hea").write_bytes(header)
            shutil.copyfile(path.with_suffix(".mat"), folder / f"{new}.mat")


_PEAK = ("import resource, sys, json; from pathlib import Path; sys.path.insert(0, {root!r});"
         "from bench.preprocess import ours; t = ours(Path({src!r}), Path({out!r}), {rps});"
         "print(json.dumps({{'seconds': t, 'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))")


def peak_memory(src: Path, out: Path, records_per_shard: int) -> dict:
    """Peak RSS of a fresh process preprocessing src (one shard's records are held at a time)."""
    root = str(Path(__file__).resolve().parents[1])
    code = _PEAK.format(root=root, src=str(src), out=str(out), rps=records_per_shard)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=sample_data_root() / "ecg-arrhythmia")
    parser.add_argument("--scale", type=int, default=4, help="size of the larger corpus for the memory check")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    records = sorted(p.with_suffix("") for p in args.src.rglob("JS*.hea"))
    if not records:
        sys.exit(f"no ecg-arrhythmia records under {args.src}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ours(args.src, tmp / "warm")  # imports and one-time set-up outside the timing, for both
        naive(records[:2], tmp / "warm.h5")
        t_naive = naive(records, tmp / "naive.h5")
        t_ours = ours(args.src, tmp / "ours")
        few = records[:50]
        t_literal = naive_read_per_lead(few)
        rps = max(1, len(records) // 4)  # several shards in both corpora
        small = peak_memory(args.src, tmp / "mem-small", rps)
        scaled_copy(records, tmp / "big", args.scale)
        big = peak_memory(tmp / "big", tmp / "mem-big", rps)
    n = len(records)
    print(f"records: {n} ecg-arrhythmia (500 Hz, 10 s, 12 leads), one core")
    print(f"naive baseline: {n / t_naive:.1f} records/s ({1e3 * t_naive / n:.2f} ms/record)")
    print(f"(info) naive reading each lead with its own rdrecord: {len(few) / t_literal:.1f} records/s "
          f"(ratio {len(few) / t_literal and (t_literal / len(few)) / (t_ours / n):.1f}x)")
    print(f"ecgpos preprocess: {n / t_ours:.1f} records/s ({1e3 * t_ours / n:.2f} ms/record)")
    print(f"peak RSS ({rps} records per shard): {small['peak_mb']:.0f} MB for {n} records, "
          f"{big['peak_mb']:.0f} MB for {n * args.scale} records")
    print(f"ratio: {t_naive / t_ours:.2f}x records/s of ecgpos preprocess over the naive baseline")


if __name__ == "__main__":
    main()
