"""The probe feature cache: a second run of a task is served from it, other windows or weights are other
entries; and on copies of real sample records, a record changed on disk after its features were cached
is extracted again, untouched records still come from the cache, and caches written before records were
stamped are recomputed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.probes.linear import features
from ecgpos.probes.linear.features import cache_file, encoder_source, extract_features, raw_source
from ecgpos.probes.linear.run import ProbeConfig, prepare_task
from ecgpos.probes.shared.datasets import RecordLocator
from ecgpos.probes.shared.tasks import resolve_task

PTBXL = [f"records500/00000/{n:05d}_hr" for n in (1, 2, 3, 4)]
CPSC = ["A1980", "A1981", "A1982"]


def _copy_records(shared_data: Path, root: Path, dataset: str) -> tuple[list[str], dict[str, Path]]:
    """Copies of a few real records under root (their own data root); keys and record paths."""
    if dataset == "ptbxl":
        paths = {k: root / "ptbxl" / k for k in PTBXL}
        for key, path in paths.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            for suffix in (".hea", ".dat"):
                shutil.copy(shared_data / "ptbxl" / f"{key}{suffix}", f"{path}{suffix}")
        return PTBXL, paths
    folder = root / "cpsc2018" / "TrainingSet1"
    folder.mkdir(parents=True)
    for key in CPSC:
        shutil.copy(shared_data / "cpsc2018" / "original" / "TrainingSet1" / f"{key}.mat", folder)
    return CPSC, {k: folder / k for k in CPSC}


def _overwrite(path: Path, source: Path, data_file: str) -> None:
    """Another record's samples written over `path`'s data file, with that record's header (renamed)
    where there is one: the checksums then hold, as after a re-download or a correction."""
    Path(f"{path}{data_file}").write_bytes(Path(f"{source}{data_file}").read_bytes())
    header = Path(f"{source}.hea")
    if header.is_file():
        Path(f"{path}.hea").write_text(header.read_text().replace(source.name, path.name))


@pytest.mark.parametrize("dataset,data_file", [("ptbxl", ".dat"), ("cpsc2018", ".mat")])
def test_a_record_changed_on_disk_gets_new_features_and_the_others_come_from_the_cache(
    shared_data, tmp_path, dataset, data_file
):
    """The cache was keyed by record key alone: a record corrected or replaced in place kept the
    features of its old content, and the probe trained on them without a word."""
    keys, paths = _copy_records(shared_data, tmp_path / "data", dataset)
    source, cache, lines = raw_source(DEFAULT_SPEC), tmp_path / "cache", []
    first, stats = extract_features(source, dataset, keys, RecordLocator(dataset, tmp_path / "data"), cache, 1)
    assert (stats.extracted, stats.cached, stats.changed) == (len(keys), 0, 0)

    # edited in place: the samples of another record written over the second one's data file
    edited, other = keys[1], keys[2]
    _overwrite(paths[edited], paths[other], data_file)
    again, stats = extract_features(
        source, dataset, keys, RecordLocator(dataset, tmp_path / "data"), cache, 1, log=lines.append
    )
    assert (stats.extracted, stats.cached, stats.changed) == (1, len(keys) - 1, 1)
    assert np.array_equal(again[edited], first[other]) and not np.array_equal(again[edited], first[edited])
    assert all(np.array_equal(again[k], first[k]) for k in keys if k != edited)
    assert any(f"{len(keys) - 1} cached, 1 re-extracted because their files changed" in s for s in lines)

    # the new features are cached with the new stamp: nothing is extracted a third time
    third, stats = extract_features(source, dataset, keys, RecordLocator(dataset, tmp_path / "data"), cache, 1)
    assert (stats.extracted, stats.cached, stats.changed) == (0, len(keys), 0)
    assert np.array_equal(third[edited], first[other])


def test_a_cached_record_that_no_longer_reads_is_refused_not_served(shared_data, tmp_path):
    keys, paths = _copy_records(shared_data, tmp_path / "data", "ptbxl")
    source, cache = raw_source(DEFAULT_SPEC), tmp_path / "cache"
    extract_features(source, "ptbxl", keys, RecordLocator("ptbxl", tmp_path / "data"), cache, 1)
    dat = Path(f"{paths[keys[0]]}.dat")
    dat.write_bytes(dat.read_bytes()[:1000])  # a download cut short, over the good copy
    feats, stats = extract_features(source, "ptbxl", keys, RecordLocator("ptbxl", tmp_path / "data"), cache, 1)
    assert sorted(feats) == keys[1:] and (stats.changed, stats.extracted, stats.cached) == (1, 0, 3)
    assert list(stats.failed) == [keys[0]] and stats.failed[keys[0]].startswith("truncated_signal")
    # nor is it served later: its stale features left the cache file
    with np.load(cache_file(cache, source, "ptbxl", 1)) as data:
        assert sorted(data["ids"].tolist()) == keys[1:]


def test_a_cache_written_before_records_were_stamped_is_recomputed(shared_data, tmp_path, monkeypatch):
    """Caches of version 2 hold no stamps: nothing in them can be trusted for records that may have
    changed since, so neither the old file nor one of that layout under the current name is read."""
    keys, _ = _copy_records(shared_data, tmp_path / "data", "ptbxl")
    source, cache = raw_source(DEFAULT_SPEC), tmp_path / "cache"
    fresh, _ = extract_features(source, "ptbxl", keys, RecordLocator("ptbxl", tmp_path / "data"), tmp_path / "ref", 1)
    wrong = np.zeros((len(keys), len(fresh[keys[0]])), np.float32)  # what the records held when cached
    current = cache_file(cache, source, "ptbxl", 1)
    monkeypatch.setattr(features, "CACHE_VERSION", 2)
    old = cache_file(cache, source, "ptbxl", 1)
    monkeypatch.undo()
    assert old != current
    cache.mkdir()
    for path in (old, current):  # version 2's layout: ids and features, no stamps
        np.savez(path, ids=np.array(keys, dtype=str), features=wrong)
    feats, stats = extract_features(source, "ptbxl", keys, RecordLocator("ptbxl", tmp_path / "data"), cache, 1)
    assert (stats.extracted, stats.cached, stats.changed) == (len(keys), 0, 0)
    assert all(np.array_equal(feats[k], fresh[k]) for k in keys)
    with np.load(current) as data:  # rewritten in the current layout
        assert sorted(data["ids"].tolist()) == keys and len(data["stamps"]) == len(keys)


def test_the_leakage_guard_fingerprints_a_changed_record_again(shared_data, tmp_path, monkeypatch):
    """Probe-record fingerprints were cached by record key alone as well: a record replaced on disk
    by a copy of a pretraining record kept its old fingerprint, and the guard reported no overlap."""
    from ecgpos.probes.shared import leakage
    from ecgpos.probes.shared.leakage import _cache_path, probe_fingerprints

    keys, paths = _copy_records(shared_data, tmp_path / "data", "ptbxl")
    cache = tmp_path / "cache"
    first = probe_fingerprints(keys, RecordLocator("ptbxl", tmp_path / "data"), DEFAULT_SPEC, cache, "ptbxl")
    assert len(set(first.values())) == len(keys)
    _overwrite(paths[keys[1]], paths[keys[2]], ".dat")
    again = probe_fingerprints(keys, RecordLocator("ptbxl", tmp_path / "data"), DEFAULT_SPEC, cache, "ptbxl")
    assert again == {**first, keys[1]: first[keys[2]]}

    # version 1's layout (record -> fingerprint, no stamp), under its own name and the current one
    current = _cache_path(cache, "ptbxl", DEFAULT_SPEC)
    monkeypatch.setattr(leakage, "CACHE_VERSION", 1)
    old = _cache_path(cache, "ptbxl", DEFAULT_SPEC)
    monkeypatch.undo()
    assert old != current
    for path in (old, current):
        path.write_text(json.dumps(dict.fromkeys(keys, "00" * 68)))
    assert probe_fingerprints(keys, RecordLocator("ptbxl", tmp_path / "data"), DEFAULT_SPEC, cache, "ptbxl") == again


class CountingEncoder(torch.nn.Module):
    """A small real encoder (strided conv + mean) that counts the windows it embeds."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(12, 16, 75, stride=75)
        self.windows = 0

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        self.windows += len(x)
        return self.conv(x).mean(-1)


def test_feature_cache_hit_on_second_run(shared_data, tmp_path):
    enc = CountingEncoder()
    source = encoder_source(enc, DEFAULT_SPEC, "counting")
    cfg = ProbeConfig()
    logged = []
    first, stats1 = prepare_task(
        resolve_task("cpsc2018"), source, shared_data, shared_data / "merl_splits", tmp_path, cfg, log=logged.append
    )
    # split rows without records are reported with their count and first ids, then left out
    assert logged[0].startswith("cpsc2018 train: 4931 of 4950 records not found under the data root, excluded (A4898, ")
    assert len(first.x["train"]) + len(first.x["val"]) + len(first.x["test"]) == 24
    assert stats1.extracted == 24 and stats1.cached == 0
    # long CPSC records give several windows each, averaged into one feature per record
    assert 24 < enc.windows <= 24 * cfg.windows_cpsc2018
    seen = enc.windows
    second, stats2 = prepare_task(
        resolve_task("cpsc2018"), source, shared_data, shared_data / "merl_splits", tmp_path, cfg, log=lambda s: None
    )
    assert stats2.extracted == 0 and stats2.cached == 24 and enc.windows == seen
    for split in ("train", "val", "test"):
        np.testing.assert_array_equal(first.x[split], second.x[split])
    # other window settings are another cache entry
    _, stats3 = prepare_task(
        resolve_task("cpsc2018"),
        source,
        shared_data,
        shared_data / "merl_splits",
        tmp_path,
        ProbeConfig(windows_cpsc2018=1),
        log=lambda s: None,
    )
    assert stats3.extracted == 24
    # other weights are another cache entry
    with torch.no_grad():
        enc.conv.bias += 1
    _, stats4 = prepare_task(
        resolve_task("cpsc2018"),
        encoder_source(enc, DEFAULT_SPEC, "counting"),
        shared_data,
        shared_data / "merl_splits",
        tmp_path,
        cfg,
        log=lambda s: None,
    )
    assert stats4.extracted == 24
