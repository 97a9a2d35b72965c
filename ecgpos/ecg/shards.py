"""The HDF5 shard format: writing one shard atomically, and reading shard sets back.

A shard `shard-KKKKK.h5` holds
- `signals` (n, 12, T) float16 (or float32), chunked one record per chunk (1, 12, T). T is the
  longest record in that shard (at least spec.window); shorter records are zero-padded at the end
  and `lengths` says how many samples are real, so T may differ between shards;
- `lengths` (n,) int32 (a record padded with --pad-short has length < spec.window);
- `record_id` (n,) UTF-8 strings;
- file attributes: spec.to_h5_attrs() (`fs`, `leads`, `spec` JSON) plus `source` and `chunk`.
Shard numbers are chunk numbers: a chunk whose records were all skipped leaves no shard, so
readers list `shard-*.h5` rather than counting.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError
from ecgpos.files import atomic_path

SHARD_GLOB = "shard-*.h5"
_WRITE_BLOCK = 64  # records padded and written at a time


def shard_name(chunk: int) -> str:
    return f"shard-{chunk:05d}.h5"


def write_shard(path: Path, signals: Sequence[np.ndarray], record_ids: Sequence[str], spec: PreprocessSpec,
                attrs: dict | None = None) -> None:
    """Write float32 (12, length_i) signals as one shard, atomically (temporary name, then rename)."""
    if not signals:
        raise ValueError("a shard needs at least one record")
    lengths = np.array([s.shape[-1] for s in signals], dtype=np.int32)
    width = max(int(lengths.max()), spec.window)
    leads = signals[0].shape[0]
    # h5py does not record object times by default: the same input gives the same bytes
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for key, value in {**spec.to_h5_attrs(), **(attrs or {})}.items():
            f.attrs[key] = value
        data = f.create_dataset("signals", shape=(len(signals), leads, width), dtype=spec.dtype,
                                chunks=(1, leads, width))
        for start in range(0, len(signals), _WRITE_BLOCK):  # padded blocks: memory stays O(block)
            part = signals[start:start + _WRITE_BLOCK]
            block = np.zeros((len(part), leads, width), dtype=spec.dtype)
            for i, s in enumerate(part):
                block[i, :, : s.shape[-1]] = s
            data[start:start + len(part)] = block
        f.create_dataset("lengths", data=lengths)
        f.create_dataset("record_id", data=list(record_ids), dtype=h5py.string_dtype())


def shard_paths(folder: str | Path) -> list[Path]:
    """The shard files of a set, in chunk order."""
    return sorted(Path(folder).glob(SHARD_GLOB))


def shard_files(folder: str | Path) -> list[Path]:
    """The shard files of a folder; ConfigError when the folder is missing or holds none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"shard folder {folder} does not exist")
    paths = sorted(folder.glob(SHARD_GLOB))
    if not paths:
        raise ConfigError(f"shard folder {folder} holds no {SHARD_GLOB} files (run `ecgpos preprocess` first)")
    return paths


def read_shard_spec(folder: str | Path) -> PreprocessSpec:
    """The preprocessing spec a shard set was written with (all shards must agree)."""
    paths = shard_paths(folder)
    if not paths:
        raise ConfigError(f"no {SHARD_GLOB} files in {folder}: not a shard folder (run `ecgpos preprocess`)")
    spec = None
    for path in paths:
        with h5py.File(path, "r") as f:
            this = PreprocessSpec.from_h5_attrs(f.attrs)
        if spec is None:
            spec = this
        elif this != spec:
            raise ConfigError(f"{path.name} was written with a different preprocessing spec than {paths[0].name}")
    return spec


def iter_shard_records(folder: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (record_id, float32 (12, length)) for every stored record, shard by shard, row by row."""
    for path in shard_paths(folder):
        with h5py.File(path, "r") as f:
            signals, lengths = f["signals"], f["lengths"][:]
            ids = f["record_id"].asstr()[:]
            for row, (record_id, length) in enumerate(zip(ids, lengths)):
                yield str(record_id), np.asarray(signals[row, :, : int(length)], dtype=np.float32)
