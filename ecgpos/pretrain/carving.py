"""The carving criterion (ecgpos.objectives.criterion) on the validation records of a shard pool.

Each validation record is one window, its centre (ShardDataset with train=False), named
(record id, 0). Records are dealt to processes by position (record i to process i mod P), so the
sum of their violations, reduced over processes, is the same for any process count and batch size.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn

from ecgpos.objectives.calibrated import CalibratedReading, level_reading
from ecgpos.objectives.criterion import CRITERION_SEED, record_violations
from ecgpos.pretrain.data import ShardDataset, eval_loader, model_input
from ecgpos.pretrain.records import RecordIndex, read_index, split_index


def validation_index(shards: object, val_fraction: float) -> RecordIndex | None:
    """The validation records `ecgpos pretrain` holds out of `shards` at `val_fraction` (None: none)."""
    return split_index(read_index(shards), val_fraction)[1]


def _batches(
    dataset: ShardDataset, rows: list[int], batch_size: int, device: torch.device | str
) -> Iterator[tuple[list[tuple[str, int]], torch.Tensor]]:
    chunks = [rows[s : s + batch_size] for s in range(0, len(rows), batch_size)]
    for chunk, x in zip(chunks, eval_loader(dataset, chunks, 0)):
        yield [(dataset.index.record_id[i], 0) for i in chunk], model_input(x, device)


def shard_violations(
    model: nn.Module,
    dataset: ShardDataset,
    batch_size: int,
    device: torch.device | str = "cpu",
    process_index: int = 0,
    num_processes: int = 1,
    seed: int = CRITERION_SEED,
) -> dict[str, float]:
    """Record id -> push-margin violation (0 or 1: one window) of this process's share of `dataset`."""
    rows = [int(i) for i in np.arange(process_index, len(dataset), num_processes)]
    was_training = model.training
    model.eval()
    try:
        return record_violations(model, _batches(dataset, rows, max(1, batch_size), device), seed)
    finally:
        model.train(was_training)


def shard_reading(
    model: nn.Module,
    dataset: ShardDataset,
    batch_size: int,
    device: torch.device | str = "cpu",
    choice: str = "trained",
    seed: int = CRITERION_SEED,
) -> CalibratedReading:
    """The calibrated criterion and pass-through of every family (ecgpos.objectives.calibrated) on all
    of `dataset`'s records, read through the level's map `choice`."""
    rows = list(range(len(dataset)))
    was_training = model.training
    model.eval()
    try:
        return level_reading(model, lambda: _batches(dataset, rows, max(1, batch_size), device), choice, seed)
    finally:
        model.train(was_training)
