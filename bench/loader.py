"""Benchmark: samples/s the pretraining DataLoader delivers, per worker count, vs what training consumes.

Runs the trainer's own loader (ShardDataset random 2250-sample windows from float16 shards,
StepBatchSampler, persistent workers) over a shard folder, without a model, for each worker count,
after one warm-up batch (worker start-up excluded). The training consumption rate is
--train-samples-per-s (e.g. the paper config's samples/s from bench/train_step.py on the target
GPU); the ratio loader/training must stay above 1 for the loader not to be the bottleneck.
The last line is the figure.

    python bench/loader.py --shards DIR [--workers 0 1 2] [--batch 64] [--batches 30]
                           [--train-samples-per-s X]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.pretrain.data import ShardDataset, StepBatchSampler, read_index, train_loader  # noqa: E402


def loader_rate(shards: list[Path], workers: int, batch: int, batches: int, window: int) -> float:
    """Samples/s over `batches` batches after one warm-up batch."""
    index = read_index(shards)
    dataset = ShardDataset(index, window, train=True, seed=0)
    sampler = StepBatchSampler(len(index), batch, 1, 1, 0, seed=0)
    iterator = iter(train_loader(dataset, sampler, workers))
    next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    rate = batches * batch / (time.perf_counter() - start)
    del iterator
    return rate


def main() -> None:
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
    args = parser.parse_args()
    rates = {}
    for workers in args.workers:
        rates[workers] = loader_rate(args.shards, workers, args.batch, args.batches, args.window)
        per_worker = rates[workers] / max(workers, 1)
        print(f"workers {workers}: {rates[workers]:.0f} samples/s ({per_worker:.0f} per worker process)")
    best = max(rates, key=rates.get)
    per_worker = rates[best] / max(best, 1)
    ratio = ""
    if args.train_samples_per_s:
        ratio = (
            f" train_samples_per_s={args.train_samples_per_s:.0f}"
            f" ratio={rates[best] / args.train_samples_per_s:.1f}"
            f" workers_needed={args.train_samples_per_s / per_worker:.2f}"
        )
    print(f"loader best_workers={best} samples_per_s={rates[best]:.0f} per_worker={per_worker:.0f}{ratio}")


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
