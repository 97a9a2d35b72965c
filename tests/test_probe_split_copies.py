"""Copies across a task's own splits: one recording under two file names, one in train (or val) and one
in val or test. The guard's fingerprints find them, the report says so, and --exclude-overlap drops the
later split's copy. A custom task over real PTB-XL records, a random-init tiny encoder, tiny
pretraining shards (which hold none of the task's records)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from refusal_helpers import run

PTBXL = "ptbxl/records500/00000"
ENCODER = "random:tiny/level0"
QUICK = ["--seeds", "1", "--epochs", "1", "--bootstrap", "0", "--device", "cpu", "--fractions", "100"]
COPIES = {  # split -> {copy: the record it copies}
    "val": {"dup/00002_hr": "00002_hr"},  # byte-for-byte, same name in another folder
    "test": {"c00001": "00001_hr", "c00009": "00009_hr"},  # the .dat byte-for-byte, the header renamed
}


def _copy_record(shared_data: Path, folder: Path, name: str, copy: str) -> None:
    source = shared_data / PTBXL / name
    target = folder / copy
    target.parent.mkdir(parents=True, exist_ok=True)
    stem = target.name.encode()
    for ext in ("hea", "dat"):
        data = (source.parent / f"{name}.{ext}").read_bytes()
        target.with_name(f"{target.name}.{ext}").write_bytes(
            data.replace(name.encode(), stem) if ext == "hea" else data
        )


def _task(folder: Path, shared_data: Path) -> Path:
    """train: PTB-XL 1-8; val: 9-11 and a copy of 2; test: 13, 14, a copy of 1 (train) and of 9 (val)."""
    folder.mkdir(parents=True)
    for copied in COPIES.values():
        for copy, name in copied.items():
            _copy_record(shared_data, folder, name, copy)
    keys = {
        "train": [str(shared_data / PTBXL / f"{n:05d}_hr") for n in range(1, 9)],
        "val": [str(shared_data / PTBXL / f"{n:05d}_hr") for n in (9, 10, 11)] + list(COPIES["val"]),
        "test": [str(shared_data / PTBXL / f"{n:05d}_hr") for n in (13, 14)] + list(COPIES["test"]),
    }
    for split, rows in keys.items():
        labels = [k % 2 for k in range(len(rows))]
        pd.DataFrame({"record": rows, "A": labels, "B": [1 - a for a in labels]}).to_csv(
            folder / f"{split}.csv", index=False
        )
    return folder


def _probe(capsys, tmp_path: Path, task: Path, out: str, *extra: object) -> str:
    args = ["probe", "--encoder", ENCODER, "--task", f"custom:{task}", "--out", tmp_path / out]
    rc, stdout, err = run(capsys, *args, "--cache-dir", tmp_path / "cache", *QUICK, *extra)
    assert rc == 0, err
    return stdout


def _records(folder: Path) -> list[str]:
    summary = (folder / "summary.md").read_text()
    return [line.split(" | ", 1)[1] for line in summary.splitlines() if line.startswith("| custom:task |")]


def test_copies_across_splits_are_reported_and_dropped_from_the_later_split(capsys, tmp_path, shared_data, tiny_shards):
    task = _task(tmp_path / "task", shared_data)
    guard = ["--pretraining-index", tiny_shards]
    out = _probe(capsys, tmp_path, task, "kept", *guard)
    assert "custom:task: 3 val or test records are copies of records of an earlier split" in out
    assert "(train/val 1, train/test 1, val/test 1)" in out and "kept: val and test scores include" in out
    _probe(capsys, tmp_path, task, "dropped", *guard, "--exclude-overlap")
    for name in ("kept", "dropped"):
        folder = tmp_path / name
        info = json.loads((folder / "probe.json").read_text())
        assert info["split_copies"] == {"custom:task": {"train/val": 1, "train/test": 1, "val/test": 1}}
        assert info["pretraining_overlap"] == {"custom:task": {"train": 0, "val": 0, "test": 0}}
        listed = pd.read_csv(folder / "split_copies.csv")
        pairs = {(r.split, r.record): (r.matches_split, Path(r.matches_record).name) for r in listed.itertuples()}
        assert pairs == {
            ("val", "dup/00002_hr"): ("train", "00002_hr"),
            ("test", "c00001"): ("train", "00001_hr"),
            ("test", "c00009"): ("val", "00009_hr"),
        }
        assert (listed["distance_bits"] == 0).all()  # the same samples: the same fingerprint
        assert "Copies across splits" in (folder / "summary.md").read_text()
    kept = pd.read_csv(tmp_path / "kept" / "results.csv").iloc[0]
    dropped = pd.read_csv(tmp_path / "dropped" / "results.csv").iloc[0]
    assert (kept.n_train, kept.n_val, kept.n_test) == (8, 4, 4)
    assert (dropped.n_train, dropped.n_val, dropped.n_test) == (8, 3, 2)
    with np.load(tmp_path / "dropped" / "test_scores.npz") as scores:
        assert not {"c00001", "c00009"} & set(scores["keys_0"].tolist()) and len(scores["keys_0"]) == 2
    # every split row in exactly one column: listed | not found | refused | pretraining overlap | copy | probed
    assert _records(tmp_path / "kept") == [
        "train | 8 | 0 | 0 | 0 | 0 | 8 |",
        "val | 4 | 0 | 0 | 0 | 0 | 4 |",
        "test | 4 | 0 | 0 | 0 | 0 | 4 |",
    ]
    assert _records(tmp_path / "dropped") == [
        "train | 8 | 0 | 0 | 0 | 0 | 8 |",
        "val | 4 | 0 | 0 | 0 | 1 | 3 |",
        "test | 4 | 0 | 0 | 0 | 2 | 2 |",
    ]
    assert (
        "dropped from their val or test split (--exclude-overlap)" in (tmp_path / "dropped" / "summary.md").read_text()
    )


def test_without_the_guard_nothing_is_said_about_copies(capsys, tmp_path, shared_data):
    task = _task(tmp_path / "task", shared_data)
    out = _probe(capsys, tmp_path, task, "plain")
    info = json.loads((tmp_path / "plain" / "probe.json").read_text())
    assert "split_copies" not in info and not (tmp_path / "plain" / "split_copies.csv").exists()
    assert "copies" not in out and "Copies across splits" not in (tmp_path / "plain" / "summary.md").read_text()
    assert _records(tmp_path / "plain")[2] == "test | 4 | 0 | 0 | 0 | 0 | 4 |"
