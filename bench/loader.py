"""Benchmark: samples/s the pretraining DataLoader delivers, per worker count, vs what training consumes.

Runs the trainer's own loader (ShardDataset random 2250-sample windows from the shards, in their
float16, StepBatchSampler, persistent workers, pinned memory on CUDA) over a shard folder, without a
model, for each worker count, after a warm-up (worker start-up and the batches queued meanwhile).
Each batch is handed over as the trainer does (`model_input`: copied to the GPU and widened to float32
there; on a CPU-only machine widened in place). The training consumption rate is
--train-samples-per-s (e.g. the paper config's samples/s from bench/train_step.py on the target GPU);
the ratio loader/training must stay above 1 for the loader not to be the bottleneck. The last line is
the figure: the configured worker count's (train.num_workers of --config), or the best one's if that
count was not run.

    python bench/loader.py --shards DIR [--workers 0 1 2] [--batch 64] [--batches 30]
                           [--train-samples-per-s X] [--config level0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.pretrain.data import ShardDataset, StepBatchSampler, model_input, train_loader  # noqa: E402
from ecgpos.pretrain.records import read_index  # noqa: E402
from ecgpos.runs.run_config import load_run_config  # noqa: E402


class SpreadBatches:
    """The sampler's batches over `drawn` records, record i read as record i * stride: as many distinct
    windows whatever the corpus size, from all of its shards."""

    def __init__(self, sampler: StepBatchSampler, stride: int) -> None:
        self.sampler, self.stride = sampler, stride

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        for batch in self.sampler:
            yield [(i * self.stride, epoch) for i, epoch in batch]


def loader_rate(
    shards: list[Path],
    workers: int,
    batch: int,
    batches: int,
    window: int,
    timings: dict | None = None,
    drawn: int | None = None,
) -> float:
    """Samples/s over `batches` batches after the warm-up, each handed over as the trainer does.
    `timings`, when given, receives first_batch_s (from starting the workers to the first batch) and
    cpu_s (CPU seconds of the workers and this process over the timed batches: the loader's cost
    whatever else the machine runs). With `drawn`, windows come from that many records spread evenly
    over the corpus (the data touched stays the same size while the index, dataset and open shards grow)."""
    index = read_index(shards)
    dataset = ShardDataset(index, window, train=True, seed=0)
    drawn = min(drawn or len(index), len(index))
    sampler = StepBatchSampler(drawn, batch, 1, 1, 0, seed=0)
    if drawn < len(index):
        sampler = SpreadBatches(sampler, len(index) // drawn)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = train_loader(dataset, sampler, workers)
    started = time.perf_counter()
    iterator = iter(loader)
    model_input(next(iterator), device)
    if timings is not None:
        timings["first_batch_s"] = time.perf_counter() - started
    # Worker start-up and the batches the workers queued meanwhile are drained first: timed from
    # there, the rate is what the workers produce, not a queue filled while nothing was timed.
    for _ in range(workers * (loader.prefetch_factor or 0)):
        model_input(next(iterator), device)
    cpu = _cpu_seconds()
    start = time.perf_counter()
    for _ in range(batches):
        x = model_input(next(iterator), device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    rate = batches * batch / (time.perf_counter() - start)
    if timings is not None:
        timings["cpu_s"] = _cpu_seconds() - cpu
    del iterator, loader, x
    return rate


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and its children (the loader's workers) so far."""
    import psutil

    total = 0.0
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


SPREAD_RECORDS = 1000  # records the spread run of `loader_costs` reads windows from


def _page_cache(shards: list[Path], keep: bool) -> None:
    """Read the shards through once (keep: into the page cache) or drop their pages from it (posix_fadvise
    DONTNEED, after their writes are on disk: dirty pages cannot be dropped)."""
    for path in shards:
        with open(path, "rb", buffering=0) as handle:
            if keep:
                while handle.read(1 << 23):
                    pass
            else:
                os.fdatasync(handle.fileno())
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _cached_share(shards: list[Path]) -> float:
    """Fraction of the shards' bytes in the page cache (util-linux `fincore`; NaN without it)."""
    if shutil.which("fincore") is None:
        return float("nan")
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES,SIZE", *map(str, shards)],
        capture_output=True, text=True,
    ).stdout  # fmt: skip
    pairs = np.array([[int(v) for v in line.split()] for line in out.splitlines() if line.strip()], dtype=np.int64)
    return float(pairs[:, 0].sum() / max(1, pairs[:, 1].sum())) if len(pairs) else float("nan")


def loader_costs(corpus: Path, n: int, batches: int, workers: int, window: int) -> dict[str, float]:
    """`loader_rate` of a shard folder of n records three ways: windows from SPREAD_RECORDS records spread
    over all the shards, corpus cached (the project's cost: the n-record index, dataset and open shards,
    the same data touched at every n); from all n records in the page cache (adds the memory's cost of
    data spread over n records); and from all n records dropped from the page cache (every window a
    random read from the disk). The cached run of all n is skipped (NaN) when the corpus would not fit
    in the free memory. Each run's samples/s and CPU seconds per sample; the first batch's start-up."""
    shards = sorted(corpus.glob("shard-*.h5"))
    fits = sum(p.stat().st_size for p in shards) < 0.7 * psutil.virtual_memory().available
    got = {name: float("nan") for name in ("loader", "loader_all_cpu", "cached_share")}
    batch, timings = min(64, n), {}
    if fits:
        _page_cache(shards, keep=True)
        got["cached_share"] = _cached_share(shards)
    got["loader_spread"] = loader_rate([corpus], workers, batch, batches, window, timings, drawn=SPREAD_RECORDS)
    got["first_batch"], got["loader_cpu"] = timings["first_batch_s"], timings["cpu_s"] / (batches * batch)
    if fits:
        got["loader"] = loader_rate([corpus], workers, batch, batches, window, timings)
        got["loader_all_cpu"] = timings["cpu_s"] / (batches * batch)
    _page_cache(shards, keep=False)
    got["uncached_share"] = _cached_share(shards)
    got["loader_disk"] = loader_rate([corpus], workers, batch, batches, window, timings)
    got["loader_disk_cpu"] = timings["cpu_s"] / (batches * batch)
    return got


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=Path, nargs="+", required=True)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--window", type=int, default=2250)
    parser.add_argument(
        "--train-samples-per-s",
        type=float,
        default=None,
        help="training consumption to compare with (bench/train_step.py, paper config)",
    )
    parser.add_argument(
        "--config", default="level0", help="run config whose train.num_workers is the figure (default: level0)"
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()
    configured = load_run_config(args.config).train.num_workers
    rates = {}
    for workers in args.workers:
        rates[workers] = loader_rate(args.shards, workers, args.batch, args.batches, args.window)
        per_worker = rates[workers] / max(workers, 1)
        print(f"workers {workers}: {rates[workers]:.0f} samples/s ({per_worker:.0f} per worker process)")
    best = configured if configured in rates else max(rates, key=rates.get)
    per_worker = rates[best] / max(best, 1)
    ratio = ""
    if args.train_samples_per_s:
        ratio = (
            f" train_samples_per_s={args.train_samples_per_s:.0f}"
            f" ratio={rates[best] / args.train_samples_per_s:.1f}"
            f" workers_needed={args.train_samples_per_s / per_worker:.2f}"
        )
    which = "configured" if best == configured else "best"
    print(f"loader {which}_workers={best} samples_per_s={rates[best]:.0f} per_worker={per_worker:.0f}{ratio}")


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
