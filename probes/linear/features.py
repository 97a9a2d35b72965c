"""Frozen features of probe records, extracted once and cached on disk.

A feature source is an encoder (through `ecgpos.models.features`, with the encoder's own
PreprocessSpec) or the raw-signal baseline. The cache is one file per (source, dataset,
settings) key: source = the encoder's weights hash and architecture (or 'raw' + its settings),
dataset = the dataset name and data root, settings = the preprocessing spec and the window count. Inside, features
are stored per record key (the split CSV's record column), so the four PTB-XL tasks and their
three splits share one extraction and a second run with the same encoder extracts nothing.
Each feature vector is stored with the stamp of its record's files (`ecgpos.probes.shared.datasets.record_stamp`:
path, form, size and mtime_ns): a record edited or replaced on disk since is extracted again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ecgpos.ecg.signal import pad_to
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError, Interrupted
from ecgpos.export.format import weights_hash
from ecgpos.files import atomic_path
from ecgpos.models.features import record_means, record_windows, window_features
from ecgpos.probes.shared.datasets import RecordLocator, prepared_record, record_stamp

# 2: records are screened as in preprocessing (earlier caches may hold refused records)
# 3: a stamp of the record's files beside each feature vector (earlier caches cannot tell a changed record)
CACHE_VERSION = 3


@dataclass
class FeatureSource:
    """Turns raw records into (D,) feature vectors; `key` identifies it in the cache."""

    name: str  # row label in the tables
    key: dict
    spec: PreprocessSpec
    embed: Callable[[list[np.ndarray], int], np.ndarray]  # preprocessed (12, T) records, windows -> (n, D)
    # the encoder's architecture, part of the cache key: weights of one shape serve several
    # architectures (a head count changes no tensor), so the weights hash alone cannot tell them apart
    arch: dict | None = None


def encoder_source(
    module: torch.nn.Module,
    spec: PreprocessSpec,
    name: str,
    batch_size: int = 64,
    device: str = "cpu",
    arch: dict | None = None,
) -> FeatureSource:
    """Features = mean of `forward_features` over each record's windows (ecgpos.models.features);
    `arch` (ecgpos.models.factory) keys the cache together with the weights."""
    key = {"encoder": weights_hash(module)}  # hashed on CPU before moving: the same key on any device
    module.eval().to(device)

    def features(windows: np.ndarray) -> dict[str, np.ndarray]:
        return {"features": window_features(module, windows, batch_size=batch_size, device=device)}

    def embed(records: list[np.ndarray], windows: int) -> np.ndarray:
        per_record = ((k, record_windows(pad_to(x, spec.window), spec.window, windows)) for k, x in enumerate(records))
        return np.stack([means["features"] for _, means in record_means(per_record, features, batch_size)])

    return FeatureSource(name, key, spec, embed, arch)


def raw_source(spec: PreprocessSpec, raw_fs: float = 25.0, name: str = "raw signal") -> FeatureSource:
    """Baseline: the preprocessed centre window, block-averaged down to raw_fs and flattened
    -> (12 * window * raw_fs / fs,) features (2700 at the defaults)."""
    factor = max(1, int(round(spec.fs / raw_fs)))

    def embed(records: list[np.ndarray], windows: int) -> np.ndarray:
        out = []
        for x in records:
            w = record_windows(pad_to(x, spec.window), spec.window, 1)[0]  # (12, window), centre
            usable = w.shape[-1] // factor * factor
            out.append(w[:, :usable].reshape(w.shape[0], -1, factor).mean(axis=-1).reshape(-1))
        return np.stack(out).astype(np.float32)

    return FeatureSource(name, {"raw": {"raw_fs": raw_fs}}, spec, embed)


@dataclass
class FeatureStats:
    """What one `extract_features` call did; failed maps record key -> reason."""

    extracted: int = 0
    cached: int = 0
    changed: int = 0  # cached, but their files changed since: extracted again (or failed)
    failed: dict[str, str] = field(default_factory=dict)
    padded: list[str] = field(default_factory=list)  # records shorter than the window, zero-padded
    mismatched: list[str] = field(default_factory=list)  # limb leads that break Einthoven's relations, kept


def cache_file(cache_dir: Path, source: FeatureSource, dataset: str, windows: int) -> Path:
    key = {
        "version": CACHE_VERSION,
        "source": source.key if source.arch is None else {**source.key, "arch": source.arch},
        "dataset": dataset,
        "spec": source.spec.to_dict(),
        "windows": windows,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    return cache_dir / f"{dataset.split(':')[0].replace('/', '_')}-{digest}.npz"


Store = dict[str, tuple[str, np.ndarray]]  # record key -> (stamp of its files, features)


def _load_cache(path: Path) -> Store:
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as data:  # NaN rows (written before they were refused) are redone
            rows = zip(data["ids"].tolist(), data["stamps"].tolist(), data["features"])
            return {k: (str(stamp), v) for k, stamp, v in rows if np.isfinite(v).all()}
    except Exception:  # a truncated cache file, or one without stamps, is recomputed, never trusted
        return {}


def _save_cache(path: Path, store: Store) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = sorted(store)
    with atomic_path(path, suffix=".npz") as tmp:  # a concurrent reader sees the old or the new file
        np.savez(
            tmp,
            ids=np.array(ids, dtype=str),
            stamps=np.array([store[i][0] for i in ids], dtype=str),
            features=np.stack([store[i][1] for i in ids]).astype(np.float32) if ids else np.zeros((0, 0), np.float32),
        )


def _embed_chunk(
    source: FeatureSource,
    keys: Sequence[str],
    locator: RecordLocator,
    windows: int,
    store: Store,
    stamps: dict[str, str | None],
    stats: FeatureStats,
) -> bool:
    """Embed the readable records among `keys` into `store` with their `stamps` (failures into
    `stats`); True if any was."""
    names, signals = [], []
    for key in keys:
        found = locator.locate(key)
        if found is None or stamps[key] is None:
            stats.failed[key] = "missing"
            continue
        try:
            limbs: list[str] = []
            x = prepared_record(*found, source.spec, mismatched=limbs)
            if x.shape[-1] < source.spec.window:
                stats.padded.append(key)
            if limbs:
                stats.mismatched.append(key)
            signals.append(x)
            names.append(key)
        except EcgposError as err:
            stats.failed[key] = str(err)
    if signals:
        for key, vec in zip(names, source.embed(signals, windows)):
            vec = np.asarray(vec, dtype=np.float32)
            if not np.isfinite(vec).all():  # never cached: a probe would train on NaN and crash
                stats.failed[key] = "non-finite features (NaN or inf) from the encoder"
                continue
            store[key] = (str(stamps[key]), vec)
            stats.extracted += 1
    return bool(signals)


def cached_note(cache_dir: Path) -> str:
    """What an interrupted probe says when features of its records are in `cache_dir`."""
    return f"the features extracted so far are cached in {cache_dir}; the same command reuses them"


def extract_features(
    source: FeatureSource,
    dataset: str,
    keys: Sequence[str],
    locator: RecordLocator,
    cache_dir: Path,
    windows: int,
    chunk: int = 32,
    log: Callable[[str], None] = lambda s: None,
) -> tuple[dict[str, np.ndarray], FeatureStats]:
    """Features of the located records `keys` (record key -> (D,)), from the cache where present
    and the record's files are unchanged since (same `record_stamp`).

    Records that fail to read or are refused by the screening (PROBE_POLICY) are left out and
    listed in stats.failed with their reason; stats.changed counts the cached records extracted
    again because their files changed. Interrupted (KeyboardInterrupt) after some records were
    extracted, it saves them to the cache and raises Interrupted saying so.
    """
    path = cache_file(cache_dir, source, dataset, windows)
    store = _load_cache(path)
    stats = FeatureStats()
    # stamped before reading: a file changed during the extraction is extracted again next time
    stamps = {k: (record_stamp(*found) if (found := locator.locate(k)) else None) for k in dict.fromkeys(keys)}
    todo = [k for k, stamp in stamps.items() if k not in store or store[k][0] != stamp]
    for key in todo:
        if key in store:  # stale: never served, and dropped from the cache even if it now fails to read
            stats.changed += int(stamps[key] is not None)
            del store[key]
    stats.cached = len(stamps) - len(todo)
    if todo:
        changed = f", {stats.changed} re-extracted because their files changed" if stats.changed else ""
        log(
            f"  extracting {len(todo)} {dataset.split(':')[0]} records ({stats.cached} cached{changed}) "
            f"with {source.name}"
        )
    try:
        for start in range(0, len(todo), chunk):
            embedded = _embed_chunk(source, todo[start : start + chunk], locator, windows, store, stamps, stats)
            if embedded and (start // chunk) % 50 == 49:  # a killed full-size run keeps most of its work
                _save_cache(path, store)
    except KeyboardInterrupt:  # Ctrl-C keeps everything extracted: the rerun extracts only the rest
        if stats.extracted:
            _save_cache(path, store)
            raise Interrupted(cached_note(cache_dir)) from None
        raise
    if stats.padded:
        log(f"  {_listed(stats.padded)} shorter than the {source.spec.window}-sample window zero-padded")
    if stats.mismatched:  # kept: the published splits are evaluated whole (ecgpos.probes.shared.datasets.PROBE_POLICY)
        log(f"  {_listed(stats.mismatched)} kept, though their limb leads break Einthoven's relations (lead_mismatch)")
    if stats.extracted or stats.changed:
        _save_cache(path, store)
    return {k: store[k][1] for k in keys if k in store}, stats


def _listed(keys: list[str]) -> str:
    """'N records (a, b, c, d, e ...)': the count and the first five keys."""
    return f"{len(keys)} record{'' if len(keys) == 1 else 's'} ({', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''})"
