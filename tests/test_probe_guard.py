"""The pretraining-leakage guard on real records: copies under other ids and formats, CSN, --exclude-overlap."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.io
import wfdb

from ecgpos.cli import main
from ecgpos.ecg.fingerprint import MAX_DISTANCE, distance
from ecgpos.ecg.shards import write_shard
from ecgpos.ecg.signal import preprocess_signal
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.probes.linear.run import ProbeConfig
from ecgpos.probes.shared.datasets import task_locator
from ecgpos.probes.shared.leakage import load_pretraining, recorded_pretraining, task_overlap
from ecgpos.probes.shared.task_data import dataset_key
from ecgpos.probes.shared.tasks import SPLITS, TASKS, read_split, resolve_task
from ecgpos.resources import config_dir

TINY = config_dir() / "tiny" / "level0.yaml"
LEADS = list(DEFAULT_SPEC.leads)


def _digital(path: Path) -> np.ndarray:
    """(T, 12) int16 stored samples of a WFDB record (1000 adu/mV, baseline 0 in every sample corpus)."""
    rec = wfdb.rdrecord(str(path), physical=False)
    assert set(rec.adc_gain) == {1000.0} and set(rec.baseline) == {0}
    return rec.d_signal.astype(np.int16)


def write_wfdb_dat(folder: Path, name: str, digital: np.ndarray) -> None:
    """A WFDB format-16 .dat record (PTB-XL's form)."""
    wfdb.wrsamp(
        name,
        fs=500,
        units=["mV"] * 12,
        sig_name=LEADS,
        d_signal=digital,
        fmt=["16"] * 12,
        adc_gain=[1000.0] * 12,
        baseline=[0] * 12,
        write_dir=str(folder),
    )


def write_cinc_mat(folder: Path, name: str, digital: np.ndarray) -> None:
    """A CinC-challenge record: MATLAB v4 `val` int16 (12, T) + a header pointing into it at byte 24."""
    scipy.io.savemat(folder / f"{name}.mat", {"val": np.ascontiguousarray(digital.T)}, format="4")
    lines = [f"{name} 12 500 {len(digital)}"]
    for lead, column in zip(LEADS, digital.T.astype(np.int64)):
        checksum = (int(column.sum()) + 32768) % 65536 - 32768
        lines.append(f"{name}.mat 16+24 1000/mV 16 0 {column[0]} {checksum} 0 {lead}")
    (folder / f"{name}.hea").write_text("\n".join(lines + ["#Dx: 426783006"]) + "\n")


@pytest.fixture(scope="module")
def guard_case(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Pretraining shards (new, with fingerprints; old, without) and a probe task holding copies of some of
    their records under other ids and in the other file format, among unrelated PTB-XL records."""
    root = tmp_path_factory.mktemp("guard")
    js = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010"
    ptb = shared_data / "ptbxl" / "records500" / "00000"
    # 1. pretraining corpus: six ecg-arrhythmia records, preprocessed by `ecgpos preprocess`
    src = root / "src" / "WFDBRecords" / "01" / "010"
    src.mkdir(parents=True)
    for header in sorted(js.glob("JS*.hea"))[:6]:  # JS00001, JS00002, JS00004, JS00005, ... (ids have gaps)
        for ext in ("hea", "mat"):
            shutil.copy(header.with_suffix(f".{ext}"), src / header.with_suffix(f".{ext}").name)
    assert (
        main(
            ["preprocess", "ecg-arrhythmia", "--src", str(root / "src"), "--subset", "all", "--out", str(root / "new")]
        )
        == 0
    )
    # 2. older shards (no fingerprint column): three PTB-XL records written directly
    old_ids = ["00020_hr", "00021_hr", "00022_hr"]
    signals = []
    for rid in old_ids:
        raw = read_wfdb_record(ptb / rid)
        signals.append(preprocess_signal(raw.signal, raw.fs, raw.leads, DEFAULT_SPEC))
    (root / "old").mkdir()
    write_shard(root / "old" / "shard-00000.h5", signals, old_ids, DEFAULT_SPEC, {"source": "ptbxl", "chunk": 0})
    pd.DataFrame({"shard": "shard-00000.h5", "row": range(3), "record_id": old_ids}).to_csv(
        root / "old" / "index.csv", index=False
    )
    # 3. the probe task: copies (other id; .mat -> .dat; .dat -> CinC .mat; same format renamed) + unrelated records
    task = root / "task"
    task.mkdir()
    write_wfdb_dat(task, "copy_dat", _digital(js / "JS00002"))  # ecg-arrhythmia .mat -> WFDB .dat
    for ext in ("hea", "mat"):  # same file, another id
        text = (js / f"JS00005.{ext}").read_bytes()
        (task / f"Q5.{ext}").write_bytes(text.replace(b"JS00005", b"Q5") if ext == "hea" else text)
    write_cinc_mat(task, "HR00020", _digital(ptb / "00020_hr"))  # PTB-XL .dat -> CinC .mat (CinC's id)
    unrelated = [f"{i:05d}_hr" for i in range(1, 12)]
    for rid in unrelated:
        write_wfdb_dat(task, f"p{rid}", _digital(ptb / rid))
    names = (
        [f"p{r}" for r in unrelated[:6]]
        + ["copy_dat"]
        + [f"p{r}" for r in unrelated[6:9]]
        + ["Q5"]
        + [f"p{r}" for r in unrelated[9:]]
        + ["HR00020"]
    )
    frame = pd.DataFrame({"record": names, "a": [i % 2 for i in range(len(names))]})
    frame["b"] = 1 - frame["a"]
    frame.iloc[:7].to_csv(task / "train.csv", index=False)  # copy_dat in train
    frame.iloc[7:11].to_csv(task / "val.csv", index=False)  # Q5 in val
    frame.iloc[11:].to_csv(task / "test.csv", index=False)  # HR00020 in test
    return {
        "root": root,
        "new": root / "new",
        "old": root / "old",
        "task": task,
        "copies": {"copy_dat": "new:JS00002", "Q5": "new:JS00005", "HR00020": "old:00020_hr"},
    }


def _overlap(task_name: str, data_root: Path, index, cache: Path):
    task = resolve_task(task_name)
    splits = {s: read_split(task, data_root / "merl_splits", s).records for s in SPLITS}
    return task_overlap(
        task.name, splits, task_locator(task, data_root), index, cache, dataset_key(task, data_root, ProbeConfig())
    )


def test_guard_finds_copies_under_other_ids_and_formats(guard_case, tmp_path):
    logged = []
    index = load_pretraining([guard_case["new"], guard_case["old"]], log=logged.append)
    assert len(index) == 9 and index.computed == 3  # the old shards were fingerprinted on the fly
    assert any("no fingerprints in index.csv" in line for line in logged)
    overlap = _overlap(f"custom:{guard_case['task']}", guard_case["root"], index, tmp_path / "cache")
    found = {key: (name, bits) for split in overlap.matches.values() for key, name, bits in split}
    assert {k: n for k, (n, _) in found.items()} == guard_case["copies"]
    assert all(bits <= 6 for _, bits in found.values())
    assert [k for k, _, _ in overlap.matches["train"]] == ["copy_dat"] and overlap.checked == 14
    # the index.csv fingerprint of the new shards equals the one computed from the stored signal
    prints = {r["record_id"]: r["fingerprint"] for r in csv.DictReader(open(guard_case["new"] / "index.csv"))}
    from ecgpos.ecg.fingerprint import fingerprint
    from ecgpos.ecg.shards import iter_shard_records

    for rid, x in iter_shard_records(guard_case["new"]):
        assert fingerprint(x, DEFAULT_SPEC.fs, DEFAULT_SPEC.window, DEFAULT_SPEC.dtype) == prints[rid]


def test_guard_finds_nothing_between_ptbxl_and_ecg_arrhythmia_but_all_of_csn(shared_data, arrhythmia_shards, tmp_path):
    index = load_pretraining([arrhythmia_shards], log=lambda s: None)
    assert len(index) == 200 and index.computed == 0
    for name in ("ptbxl-super", "ptbxl-form", "cpsc2018"):
        overlap = _overlap(name, shared_data, index, tmp_path / "cache")
        assert overlap.checked > 0 and overlap.keys == set(), (name, overlap.matches)
        assert overlap.copy_keys == set(), (name, overlap.copies)  # different recordings: no copy across splits
    csn = _overlap("csn", shared_data, index, tmp_path / "cache")
    assert csn.copy_counts() == {"train/val": 0, "train/test": 0, "val/test": 0}
    matched = [m for split in csn.matches.values() for m in split]
    assert csn.checked == 123 and len(matched) == 123  # every sample record in MERL's CSN splits
    assert all(Path(key).stem == name.split(":")[1] and bits == 0 for key, name, bits in matched)
    assert {s: len(v) for s, v in csn.matches.items()} == {"train": 86, "val": 10, "test": 27}


def test_fingerprints_separate_different_recordings(shared_data):
    from ecgpos.ecg.fingerprint import fingerprint

    prints = []
    for base in sorted((shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010").glob("JS*.hea"))[:20]:
        raw = read_wfdb_record(base.with_suffix(""))
        prints.append(fingerprint(preprocess_signal(raw.signal, raw.fs, raw.leads, DEFAULT_SPEC), 250, 2250))
    gaps = [distance(a, b) for i, a in enumerate(prints) for b in prints[i + 1 :]]
    assert min(gaps) > 2 * MAX_DISTANCE


@pytest.mark.skipif(not TINY.is_file(), reason="configs/tiny/level0.yaml not written yet")
def test_exclude_overlap_removes_exactly_the_overlapping_records(guard_case, tmp_path, capsys):
    task = f"custom:{guard_case['task']}"
    common = [
        "probe",
        "--encoder",
        f"random:{TINY}",
        "--task",
        task,
        "--seeds",
        "2",
        "--epochs",
        "2",
        "--fractions",
        "100",
        "--bootstrap",
        "50",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--pretraining-index",
        str(guard_case["new"]),
        str(guard_case["old"]),
    ]
    assert main([*common, "--out", str(tmp_path / "kept")]) == 0
    assert main([*common, "--exclude-overlap", "--out", str(tmp_path / "dropped")]) == 0
    out = capsys.readouterr().out
    assert "3 of 14 located records match pretraining records (train 1, val 1, test 1)" in out
    kept = pd.read_csv(tmp_path / "kept" / "results.csv").iloc[0]
    dropped = pd.read_csv(tmp_path / "dropped" / "results.csv").iloc[0]
    assert (kept.n_train, kept.n_val, kept.n_test) == (7, 4, 3)
    assert (dropped.n_train, dropped.n_val, dropped.n_test) == (6, 3, 2)
    listed = pd.read_csv(tmp_path / "dropped" / "overlap.csv")
    assert dict(zip(listed["record"], listed["pretraining_record"])) == guard_case["copies"]
    with np.load(tmp_path / "dropped" / "test_scores.npz") as scores:
        assert "HR00020" not in scores["keys_0"].tolist() and len(scores["keys_0"]) == 2
    with np.load(tmp_path / "kept" / "test_scores.npz") as scores:
        assert "HR00020" in scores["keys_0"].tolist()
    summary = (tmp_path / "dropped" / "summary.md").read_text()
    assert "## Pretraining overlap (leakage guard)" in summary and "excluded from the probe" in summary
    records = [line for line in summary.splitlines() if line.startswith("| custom:")]
    assert [line.split(" | ", 1)[1] for line in records] == [
        "train | 7 | 0 | 0 | 1 | 0 | 6 |",
        "val | 4 | 0 | 0 | 1 | 0 | 3 |",
        "test | 3 | 0 | 0 | 1 | 0 | 2 |",
    ]
    # copies of three different pretraining records: none of the splits holds another's recording
    assert (
        "custom:task: no copies across splits" in out and pd.read_csv(tmp_path / "dropped" / "split_copies.csv").empty
    )
    # a merged summary (what `export --probe-results` puts in the model card) keeps each folder's findings
    merged = tmp_path / "merged"
    assert main(["probe", "--compare", str(tmp_path / "kept"), str(tmp_path / "dropped"), "--out", str(merged)]) == 0
    assert main(["probe", "--compare", str(merged), "--out", str(tmp_path / "merged-again")]) == 0
    for folder in (merged, tmp_path / "merged-again"):
        text = (folder / "summary.md").read_text()
        assert "## Pretraining overlap and copies across splits (leakage guard), per merged folder" in text
        assert (
            "- **kept**, custom:task: records matching pretraining records: train 1, val 1, test 1; val/test "
            "copies of an earlier split: train/val 0, train/test 0, val/test 0; kept" in text
        )
        assert "- **dropped**, custom:task: records matching pretraining records: train 1" in text
        assert "dropped (--exclude-overlap)" in text


@pytest.mark.parametrize("base_key", ["base", "stage0"])  # a run's base, as written and as a two-level run wrote it
def test_pretraining_folders_come_from_the_run_and_its_level0(tmp_path, base_key):
    (tmp_path / "s0").mkdir()
    (tmp_path / "s1").mkdir()
    (tmp_path / "s0" / "run_info.json").write_text(json.dumps({"shards": ["/data/ningbo", "/data/code15"]}))
    (tmp_path / "s1" / "run_info.json").write_text(
        json.dumps({"shards": ["/data/ningbo"], base_key: str(tmp_path / "s0")})
    )
    assert recorded_pretraining(str(tmp_path / "s1"), {}) == [Path("/data/ningbo"), Path("/data/code15")]
    assert recorded_pretraining("export-folder", {"shards": ["/x"]}) == [Path("/x")]
    assert recorded_pretraining("random:cfg.yaml", {}) == []


def test_csn_task_reads_merls_split_files(shared_data):
    task = TASKS["csn"]
    assert len(task.classes) == 38
    table = read_split(task, shared_data / "merl_splits", "train")
    assert len(table.records) == 16546 and table.labels.shape == (16546, 38)
    found = task_locator(task, shared_data).locate("/chapman/WFDBRecords/01/010/JS00001.mat")
    assert found is not None and found[0].name == "JS00001"


def test_guard_threshold_follows_the_window_and_short_windows_are_refused(tmp_path):
    from dataclasses import replace

    from shard_fixtures import write_tiny_shards

    from ecgpos.ecg.fingerprint import fingerprint, max_distance
    from ecgpos.errors import EcgposError

    # the same fraction of the bits for every window: 40 of 540 at 9 s, twice that at 18 s
    assert max_distance(250, 2250) == MAX_DISTANCE and max_distance(250, 4500) == 2 * MAX_DISTANCE
    assert max_distance(500, 4500) == MAX_DISTANCE  # same 9 s at another rate: same blocks
    # 1 s windows give 60 bits: no fingerprint, and the guard says so instead of matching nothing
    short = replace(DEFAULT_SPEC, window=250)
    assert fingerprint(np.ones((12, 250), np.float32), 250, 250) == ""
    folder = write_tiny_shards(tmp_path / "short", n_records=4, spec=short)
    with pytest.raises(EcgposError, match="1 s windows, shorter than the 2 s"):
        load_pretraining([folder], log=lambda s: None)
