"""Benchmark: the full linear-probe protocol on features of the real split sizes, on 2 CPU cores.

5 tasks x 3 label fractions x 5 seeds x 100 epochs at batch 16, on random (N, 768) features with
the real MERL labels (from the split files under the sample data; features do not change the cost),
then the stratified bootstrap intervals (per seed and seed mean, --bootstrap resamples) of every
(task, fraction), as `ecgpos probe` computes them; the timed figure includes both.
Compares with the plain one-run-at-a-time loop (DataLoader + nn.Linear + torch.optim.Adam):
that loop would take far too long in full, so it is timed for one epoch of every task at 100% (the
faster of two tries) and extrapolated to the whole protocol (stated in the output). The last line is the figure.

    python bench/probe.py [--splits DIR] [--epochs 100] [--seeds 5] [--workers 2] [--bootstrap 1000]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.probes.linear.run import ProbeConfig, make_jobs, merge_jobs, run_jobs  # noqa: E402
from ecgpos.probes.linear.train import ProtocolConfig, epoch_permutations, reference_run  # noqa: E402
from ecgpos.probes.shared.intervals import add_intervals, collect_scores  # noqa: E402
from ecgpos.probes.shared.task_data import TaskData, label_fraction_rows  # noqa: E402
from ecgpos.probes.shared.tasks import PAPER_TASKS, SPLITS, read_split, resolve_task  # noqa: E402
from ecgpos.resources import sample_data_root  # noqa: E402

DIM = 768
FRACTIONS = (0.01, 0.1, 1.0)


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children (the worker processes)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def task_data(name: str, splits: Path, features: dict[str, np.ndarray], rng: np.random.Generator) -> TaskData:
    """Real MERL rows and labels of a task; one random (768,) feature per record, shared across tasks."""
    task = resolve_task(name)
    x, y, keys, patients = {}, {}, {}, {}
    for split in SPLITS:
        table = read_split(task, splits, split)
        for key in table.records:
            if key not in features:
                features[key] = rng.standard_normal(DIM, dtype=np.float32)
        x[split] = np.stack([features[k] for k in table.records])
        y[split], keys[split] = table.labels, table.records
        if table.patients is not None:
            patients[split] = table.patients
    n = len(y["train"])
    return TaskData(task, x, y, np.arange(n), n, {}, {}, keys, patients=patients)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--splits", type=Path, default=sample_data_root() / "merl_splits")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bootstrap", type=int, default=1000, help="resamples per interval (0: no bootstrap)")
    return p


def main() -> None:
    args = build_parser().parse_args()
    torch.set_num_threads(2)
    cfg = ProtocolConfig(epochs=args.epochs)
    rng = np.random.default_rng(0)
    features: dict[str, np.ndarray] = {}
    tasks = {name: task_data(name, args.splits, features, rng) for name in PAPER_TASKS}
    data = {name: (t.x["train"], t.y["train"], t.x["val"], t.y["val"]) for name, t in tasks.items()}
    probe_cfg = ProbeConfig(protocol=cfg, fractions=FRACTIONS, seeds=args.seeds)
    jobs = [job for t in tasks.values() for job in make_jobs("random", t, probe_cfg)]
    steps = sum(-(-len(j.arrays[0]) // cfg.batch_size) for j in jobs) * args.epochs * args.seeds
    print(
        f"{len(jobs)} probes ({len(merge_jobs(jobs))} layers: tasks on the same rows share one) x {args.seeds} "
        f"seeds x {args.epochs} epochs = {steps:,} optimiser steps; train rows per task: "
        + ", ".join(f"{n} {len(d[0])}" for n, d in data.items())
    )
    start, cpu0 = time.perf_counter(), _cpu_seconds()
    rows = run_jobs(jobs, workers=args.workers)
    trained = time.perf_counter()
    tests = {("random", n): (t.keys["test"], t.y["test"], t.patients.get("test")) for n, t in tasks.items()}
    add_intervals(rows, collect_scores(rows, tests), args.bootstrap)
    batched, cpu = time.perf_counter() - start, _cpu_seconds() - cpu0
    boot = time.perf_counter() - trained
    assert len(rows) == len(jobs) * args.seeds and all(np.isfinite(r["test_auroc"]) for r in rows)
    assert args.bootstrap == 0 or all(r["mean_auroc_low"] <= r["mean_auroc_high"] for r in rows)
    print(
        f"batched protocol ({args.workers} single-threaded workers): {batched:.1f} s wall, {cpu:.1f} s CPU "
        f"(= {cpu / args.workers:.1f} s wall on {args.workers} cores nobody else uses); of which bootstrap "
        f"({args.bootstrap} resamples, {len(rows)} seed intervals + {len(rows) // args.seeds} seed-mean "
        f"intervals): {boot:.1f} s"
    )

    # plain loop: one epoch per task at 100%, one seed, then scaled to every fraction, seed and epoch
    naive_total = 0.0
    x_tr, y_tr, x_va, y_va = data["cpsc2018"][:4]  # warm-up: first-call costs are not the loop's
    reference_run(x_tr[:512], y_tr[:512], x_va, y_va, seed=0, cfg=ProtocolConfig(epochs=1))
    for name, (x_tr, y_tr, x_va, y_va) in data.items():
        one, times = ProtocolConfig(epochs=1), []
        for _ in range(2):  # the faster of two epochs: other jobs on the machine only ever add time
            t0 = time.perf_counter()
            reference_run(x_tr, y_tr, x_va, y_va, seed=0, cfg=one, permutations=epoch_permutations(0, len(x_tr), 1))
            times.append(time.perf_counter() - t0)
        epoch_s = min(times)
        train_steps = sum(-(-len(label_fraction_rows(len(x_tr), f)) // 16) for f in FRACTIONS)
        scaled = epoch_s * train_steps / -(-len(x_tr) // 16) * args.epochs * args.seeds
        naive_total += scaled
        print(
            f"  plain loop {name}: {epoch_s:.2f} s per epoch at 100% -> {scaled:.0f} s for all fractions/seeds/epochs"
        )
    print(
        f"plain one-run-at-a-time DataLoader loop (extrapolated from 1 epoch per task): {naive_total:.0f} s, "
        f"{naive_total / batched:.1f}x the batched time"
    )
    print(
        f"full probe protocol on 2 CPU cores: {batched:.1f} s wall with {args.bootstrap} bootstrap resamples "
        f"(limit 120 s; {cpu:.1f} s CPU; bootstrap {boot:.1f} s), {naive_total / batched:.1f}x faster than the "
        "plain loop"
    )


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
