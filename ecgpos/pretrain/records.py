"""Which records a pretraining run trains and validates on: the record index of the shard folders,
the validation split by record id, and the digest that ties a checkpoint to its records.

- `read_index` reads every shard's `lengths` and `record_id` once (files closed) and refuses
  pooled folders that share record ids: those records would be seen twice as often.
- The optional validation split is by record id (the shards' `record_id`, the same ids as
  index.csv): a record is held out when a hash of its id falls below val_fraction, so the split
  does not depend on the seed, the shard layout or which folders are pooled.
- Checkpoints carry `records_digest`; `check_resumed_records` compares it on resume, because the
  sampler's order (`ecgpos.pretrain.data`) holds only for the same records in the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ecgpos.ecg.shards import shard_files
from ecgpos.errors import ConfigError


@dataclass(frozen=True)
class RecordIndex:
    """Where each record lives: shard file, row, true length and id (read once, files closed)."""

    paths: tuple[Path, ...]
    shard: np.ndarray  # (n,) int index into paths
    row: np.ndarray  # (n,) int row in that shard
    length: np.ndarray  # (n,) int true length in samples
    record_id: tuple[str, ...]
    dtype: np.dtype = np.dtype(np.float32)  # storage precision of the windows: the widest of the shards'

    def __len__(self) -> int:
        return len(self.record_id)

    def subset(self, keep: np.ndarray) -> RecordIndex:
        keep = np.asarray(keep, dtype=np.int64)
        return RecordIndex(
            self.paths,
            self.shard[keep],
            self.row[keep],
            self.length[keep],
            tuple(self.record_id[i] for i in keep),
            self.dtype,
        )


def read_index(folders: str | Path | Sequence[str | Path]) -> RecordIndex:
    """Record locations of one or more shard folders (e.g. the paper's Ningbo + CODE-15 pool), from
    the shards' `lengths` and `record_id`; every file is closed before returning."""
    folders = [folders] if isinstance(folders, (str, Path)) else list(folders)
    paths = [p for folder in folders for p in shard_files(folder)]
    if len({p.resolve() for p in paths}) != len(paths):
        raise ConfigError("the same shard folder is given more than once")
    shard, row, length, ids, dtypes = [], [], [], [], []
    for k, path in enumerate(paths):
        try:
            with h5py.File(path, "r") as f:
                lengths = np.asarray(f["lengths"][:], dtype=np.int64)
                names = [str(x) for x in f["record_id"].asstr()[:]]
                stored = f["signals"].shape
                dtypes.append(f["signals"].dtype)
        except (OSError, KeyError) as err:
            raise ConfigError(f"{path} is not a readable shard: {str(err).splitlines()[0]}") from None
        if stored[0] != len(lengths) or len(names) != len(lengths) or (lengths > stored[-1]).any():
            raise ConfigError(f"{path}: signals, lengths and record_id disagree")
        shard += [k] * len(lengths)
        row += list(range(len(lengths)))
        length += list(lengths)
        ids += names
    if not ids:
        raise ConfigError(f"shard folder(s) {', '.join(map(str, folders))} hold no records")
    _refuse_repeated_records(ids, [paths[k] for k in shard])
    dtype = np.result_type(*dtypes)
    if dtype not in (np.float16, np.float32):
        found = ", ".join(sorted({str(d) for d in dtypes}))
        raise ConfigError(f"shard signals must be float16 or float32, not {found}")
    return RecordIndex(tuple(paths), np.array(shard), np.array(row), np.array(length), tuple(ids), dtype)


def _refuse_repeated_records(ids: list[str], where: list[Path]) -> None:
    """ConfigError when a record id occurs twice (ids[i] is stored in where[i]): pooled folders that
    overlap, e.g. a corpus's subset beside the whole corpus, or one shard set under two names, would
    train on those records twice as often as on the others."""
    first: dict[str, int] = {}
    repeated = []
    for i, record_id in enumerate(ids):
        if first.setdefault(record_id, i) != i:
            repeated.append(i)
    if repeated:
        i = repeated[0]
        raise ConfigError(
            f"{len(repeated)} record id(s) occur more than once in the shards, e.g. {ids[i]} in "
            f"{where[first[ids[i]]]} and {where[i]}: pool shard folders that do not overlap"
        )


def records_digest(index: RecordIndex) -> str:
    """sha256 of the record ids in index order: the sampler's order depends on it, so a run resumes
    only on these records in this order (wherever the shard folders now live)."""
    digest = hashlib.sha256()
    for record_id in index.record_id:
        digest.update(record_id.encode() + b"\0")
    return digest.hexdigest()


def check_resumed_records(state: dict, num_records: int, digest: str) -> None:
    """ConfigError unless a checkpoint's trainer state was written for these training records in this
    order (`records_digest`; a checkpoint written before the digest existed is checked by count)."""
    if state.get("num_train_records") != num_records:
        raise ConfigError(
            f"the shards hold {num_records} training records but the run was started on "
            f"{state.get('num_train_records')}: resume on the same shards"
        )
    if state.get("train_records_sha256", digest) != digest:
        raise ConfigError(
            "the shards hold other training records than the run was started on (or the same ones "
            "in another order, e.g. --shards folders swapped): resume on the same shards, in the same order"
        )


def is_validation(record_id: str, val_fraction: float) -> bool:
    """Held-out membership from a hash of the record id: stable across runs, seeds and shard layouts."""
    if val_fraction <= 0:
        return False
    h = int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:8], "big")
    return h / 2.0**64 < val_fraction


def split_index(index: RecordIndex, val_fraction: float) -> tuple[RecordIndex, RecordIndex | None]:
    """(train, val or None) split by record id."""
    if val_fraction <= 0:
        return index, None
    val = np.array([is_validation(r, val_fraction) for r in index.record_id])
    if val.all() or not val.any():
        return index, None  # too few records to hold any out (or to train on): no validation
    return index.subset(np.flatnonzero(~val)), index.subset(np.flatnonzero(val))
