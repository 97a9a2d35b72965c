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
from typing import TYPE_CHECKING

import numpy as np

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError, EcgposError
from ecgpos.files import atomic_path

if TYPE_CHECKING:  # h5py is imported where a shard is opened: `embed` of WFDB records or arrays runs without it
    import h5py

SHARD_GLOB = "shard-*.h5"
_WRITE_BLOCK = 64  # records padded and written at a time


def shard_name(chunk: int) -> str:
    return f"shard-{chunk:05d}.h5"


def write_shard(
    path: Path,
    signals: Sequence[np.ndarray],
    record_ids: Sequence[str],
    spec: PreprocessSpec,
    attrs: dict | None = None,
) -> None:
    """Write float32 (12, length_i) signals as one shard, atomically (temporary name, then rename)."""
    import h5py

    if not signals:
        raise ValueError("a shard needs at least one record")
    lengths = np.array([s.shape[-1] for s in signals], dtype=np.int32)
    width = max(int(lengths.max()), spec.window)
    leads = signals[0].shape[0]
    # h5py does not record object times by default: the same input gives the same bytes
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for key, value in {**spec.to_h5_attrs(), **(attrs or {})}.items():
            f.attrs[key] = value
        data = f.create_dataset(
            "signals", shape=(len(signals), leads, width), dtype=spec.dtype, chunks=(1, leads, width)
        )
        for start in range(0, len(signals), _WRITE_BLOCK):  # padded blocks: memory stays O(block)
            part = signals[start : start + _WRITE_BLOCK]
            block = np.zeros((len(part), leads, width), dtype=spec.dtype)
            for i, s in enumerate(part):
                block[i, :, : s.shape[-1]] = s
            data[start : start + len(part)] = block
        f.create_dataset("lengths", data=lengths)
        f.create_dataset("record_id", data=list(record_ids), dtype=h5py.string_dtype())


def shard_paths(folder: str | Path) -> list[Path]:
    """The shard files of a set, in chunk order."""
    return sorted(Path(folder).glob(SHARD_GLOB))


def shard_files(folder: str | Path) -> list[Path]:
    """The shard files of a folder; ConfigError when the folder is missing or holds none."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"shard folder {folder} is a file, not a folder (give the folder holding {SHARD_GLOB})")
    if not folder.is_dir():
        raise ConfigError(f"shard folder {folder} does not exist")
    paths = sorted(folder.glob(SHARD_GLOB))
    if not paths:
        raise ConfigError(f"shard folder {folder} holds no {SHARD_GLOB} files (run `ecgpos preprocess` first)")
    return paths


def _one_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def open_shard(path: str | Path) -> h5py.File:
    """Open a shard read-only; a truncated, empty or non-HDF5 file is an EcgposError (one line)."""
    import h5py

    try:
        return h5py.File(path, "r")
    except (OSError, ValueError) as err:
        raise EcgposError(f"{path} is not a readable shard (truncated, empty or not HDF5: {_one_line(err)})") from None


def check_shard(path: str | Path) -> tuple[PreprocessSpec, int]:
    """The spec and record count of one shard, after checking its layout (see the module docstring).

    EcgposError naming the file for anything else: unreadable, no spec, missing datasets, a lead
    count other than the spec's, signals / lengths / record_id that disagree, or ids that are not text.
    """
    import h5py

    with open_shard(path) as f:
        try:
            spec = PreprocessSpec.from_h5_attrs(f.attrs)
            missing = [k for k in ("signals", "lengths", "record_id") if k not in f]
            if missing:
                raise EcgposError(f"lacks dataset(s) {', '.join(missing)}")
            signals, lengths, ids = f["signals"], np.asarray(f["lengths"][:]), f["record_id"]
            if signals.ndim != 3 or signals.shape[1] != len(spec.leads):
                raise EcgposError(f"signals have shape {signals.shape}, expected (n, {len(spec.leads)}, time)")
            n, _, width = signals.shape
            if lengths.shape != (n,) or ids.shape != (n,) or width < spec.window:
                raise EcgposError(
                    f"signals {signals.shape}, lengths {lengths.shape} and record_id {ids.shape} "
                    f"disagree (or time < window {spec.window})"
                )
            if n and (lengths.min() < 0 or lengths.max() > width):
                raise EcgposError(f"lengths outside 0..{width}")
            if h5py.check_string_dtype(ids.dtype) is None:  # readers decode ids as text
                raise EcgposError(f"record_id has dtype {ids.dtype}, expected strings")
        except EcgposError as err:
            raise EcgposError(f"{path}: {err}") from None
        except (OSError, KeyError, ValueError, TypeError) as err:  # damaged datasets or attributes
            raise EcgposError(f"{path} is not a readable shard: {_one_line(err)}") from None
    return spec, int(n)


def read_shard_spec(folder: str | Path) -> PreprocessSpec:
    """The preprocessing spec a shard set was written with (all shards must agree and be readable)."""
    paths = shard_paths(folder)
    if not paths:
        raise ConfigError(f"no {SHARD_GLOB} files in {folder}: not a shard folder (run `ecgpos preprocess`)")
    spec = None
    for path in paths:
        this, _ = check_shard(path)
        if spec is None:
            spec = this
        elif this != spec:
            raise ConfigError(f"{path.name} was written with a different preprocessing spec than {paths[0].name}")
    return spec


_RMS_RANGE = (0.5, 2.0)
"""A standardised lead (or record, with standardise: record) has RMS 1 up to resampling edge effects."""


def check_shard_contents(path: str | Path) -> None:
    """Every stored signal looks like preprocess output: finite, zero after its length, and each
    lead either exactly zero (dead) or standardised (RMS within _RMS_RANGE; per record when the
    spec standardises per record). EcgposError naming the first bad record otherwise."""
    spec, n = check_shard(path)
    with open_shard(path) as f:
        signals, lengths = f["signals"], np.asarray(f["lengths"][:])
        ids = f["record_id"].asstr()[:]
        for start in range(0, n, _WRITE_BLOCK):
            block = np.asarray(signals[start : start + _WRITE_BLOCK], dtype=np.float64)
            for i, x in enumerate(block):
                row = start + i
                length = int(lengths[row])
                problem = _signal_problem(x, length, spec.standardise)
                if problem:
                    raise EcgposError(
                        f"{path}: record {ids[row]} (row {row}) {problem}: not what `ecgpos preprocess` writes"
                    )


def _signal_problem(x: np.ndarray, length: int, mode: str) -> str:
    if not np.isfinite(x).all():
        return "holds NaN/inf samples"
    if np.any(x[:, length:]):
        return "has non-zero samples after its length"
    real = x[:, :length]
    if length == 0:
        return "has length 0"
    rms = np.sqrt(np.mean(real**2, axis=-1))
    if mode == "record":
        alive = rms > 0
        rms = np.array([np.sqrt(np.mean(real[alive] ** 2))]) if alive.any() else np.zeros(0)
    low, high = _RMS_RANGE
    bad = (rms != 0) & ((rms < low) | (rms > high))
    if bad.any():
        return f"has RMS {float(rms[bad][0]):.3g} (standardised leads have RMS ~1)"
    return ""


def iter_shard_records(folder: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (record_id, float32 (12, length)) for every stored record, shard by shard, row by row."""
    for path in shard_paths(folder):
        with open_shard(path) as f:
            signals, lengths = f["signals"], f["lengths"][:]
            ids = f["record_id"].asstr()[:]
            for row, (record_id, length) in enumerate(zip(ids, lengths)):
                yield str(record_id), np.asarray(signals[row, :, : int(length)], dtype=np.float32)
