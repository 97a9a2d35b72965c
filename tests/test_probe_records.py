"""Probe inputs against MERL's split files: class columns and their order, what became of every split
row (records accounting) and the protocol stated in summary.md."""

from __future__ import annotations

import dataclasses
import shutil

import pandas as pd

from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.probes.linear.features import raw_source
from ecgpos.probes.linear.report import protocol_markdown
from ecgpos.probes.linear.run import ProbeConfig, prepare_task
from ecgpos.probes.shared.results import records_markdown
from ecgpos.probes.shared.task_data import RECORD_COUNTS
from ecgpos.probes.shared.tasks import PAPER_TASKS, SPLITS, TASKS, read_split, resolve_task

CLASS_COUNTS = {"ptbxl-super": 5, "ptbxl-sub": 23, "ptbxl-form": 19, "ptbxl-rhythm": 12, "cpsc2018": 9}


def test_task_classes_are_the_merl_train_columns_in_order(shared_data):
    splits = shared_data / "merl_splits"
    for name in PAPER_TASKS:
        task = TASKS[name]
        header = list(pd.read_csv(splits / task.files["train"], nrows=0).columns)
        assert header[: len(task.meta)] == list(task.meta), name
        assert tuple(header[len(task.meta) :]) == task.classes, name
        assert len(task.classes) == CLASS_COUNTS[name], name
        for split in SPLITS:  # MERL dropped records without a positive label when it wrote the files
            assert read_split(task, splits, split).labels.sum(axis=1).min() >= 1, (name, split)


def test_sub_class_val_and_test_are_read_by_name_not_position(shared_data):
    task = TASKS["ptbxl-sub"]
    for split in ("val", "test"):
        frame = pd.read_csv(shared_data / "merl_splits" / task.files[split])
        by_position = frame.iloc[:, len(task.meta) :].to_numpy()
        ours = read_split(task, shared_data / "merl_splits", split).labels
        assert (ours == frame[list(task.classes)].to_numpy()).all()
        assert (ours != by_position).any(), "the files no longer differ in order: update the protocol note"


def test_every_split_row_is_counted_once(shared_data, tmp_path):
    # the ten original-form CPSC2018 records, one of them truncated, one treated as pretraining overlap and
    # one as a copy of an earlier split's record (A1986 as both: counted once, as pretraining overlap)
    root = tmp_path / "data" / "cpsc2018" / "TrainingSet1"
    shutil.copytree(shared_data / "cpsc2018" / "original" / "TrainingSet1", root)
    (root / "A1983.mat").write_bytes(b"MATLAB 5.0 MAT-file, truncated")
    task = resolve_task("cpsc2018")
    tables = {s: read_split(task, shared_data / "merl_splits", s) for s in SPLITS}
    where = {k: s for s, t in tables.items() for k in t.records}
    data, _ = prepare_task(
        task,
        raw_source(DEFAULT_SPEC),
        tmp_path / "data",
        shared_data / "merl_splits",
        tmp_path / "cache",
        ProbeConfig(),
        log=lambda _: None,
        exclude={"A1986"},
        copies={"A1986", "A1988"},
    )
    for split, c in data.counts.items():
        assert set(c) == set(RECORD_COUNTS)
        assert c["listed"] == len(tables[split].records)
        assert c["listed"] == c["not_found"] + c["refused"] + c["overlap"] + c["split_copy"] + c["probed"], split
        assert c["probed"] == len(data.x[split])
        present = sorted(k for k in tables[split].records if k.startswith("A198"))
        assert c["not_found"] == c["listed"] - len(present)
        assert c["refused"] == int(where["A1983"] == split)
        assert c["overlap"] == int(where["A1986"] == split)
        assert c["split_copy"] == int(where["A1988"] == split)
    frame = pd.DataFrame(
        [{"encoder": "raw signal", "task": "cpsc2018", "fraction": 0.1, "n_train": 1, "test_auroc": 0.5}]
    )
    text = records_markdown({"raw signal": {"cpsc2018": data.counts}}, frame)
    train = data.counts["train"]
    assert f"| cpsc2018 | train | {train['listed']} | {train['not_found']} |" in text
    assert f"| {train['probed']} (10%: 1) |" in text


def test_summary_states_the_protocol_a_reviewer_needs():
    cfg = ProbeConfig(seeds=5, windows_cpsc2018=4)
    text = protocol_markdown(cfg, ["ptbxl-sub", "cpsc2018"], DEFAULT_SPEC.window, DEFAULT_SPEC.fs)
    for needle in (
        "windows of 2250 samples (9 s)",
        "CPSC2018 (6-60 s records) up to 4 windows",
        "MERL itself embeds the first 5 s",
        "lr x 0.1 from epoch 41",
        "highest validation macro-AUROC",
        "at least one positive and one negative",
        "Seeds 0-4",
        "random_state=42",
        "matched by name",
        "ISC, AVB and RAO/RAE",
    ):
        assert needle in text, needle
    assert "ISC" not in protocol_markdown(cfg, ["cpsc2018"], 2250, 250.0)
    assert "Raw-signal" not in text
    raw = protocol_markdown(cfg, ["cpsc2018"], 2250, 250.0, raw_baseline=True)
    assert "- Raw-signal baseline: the centre window only" in raw and "(2700 features)" in raw
    short = ProbeConfig(protocol=dataclasses.replace(cfg.protocol, epochs=40))  # the drop would come after the end
    assert "constant lr" in protocol_markdown(short, ["cpsc2018"], 2250, 250.0)


def test_blank_record_cells_are_each_a_row_not_found(shared_data, tmp_path):
    """Blank record cells all read as one key; the Records table counts rows, so each is a row."""
    folder = tmp_path / "task"
    folder.mkdir()
    record = shared_data / "ptbxl" / "records500" / "00000"
    rows = {"train": [1, 2, 3, 4], "val": [5, 6, None, None], "test": [7, 8, 9, 10]}
    for split, numbers in rows.items():
        lines = [f"{record / f'{n:05d}_hr' if n else ''},{(n or 0) % 2},{1 - (n or 0) % 2}" for n in numbers]
        (folder / f"{split}.csv").write_text("\n".join(["record,A,B", *lines]) + "\n")
    task = resolve_task(f"custom:{folder}")
    data, _ = prepare_task(
        task, raw_source(DEFAULT_SPEC), tmp_path, None, tmp_path / "cache", ProbeConfig(), log=lambda _: None
    )
    val = data.counts["val"]
    assert (val["listed"], val["not_found"], val["probed"]) == (4, 2, 2)


def test_merged_folders_keep_their_protocol_and_guard_counts_apart(tmp_path):
    """Two folders that differ only in how they ran (workers) still share one protocol, and two folders
    of one name (runs/a/probe, runs/b/probe) keep their own leakage-guard counts."""
    from ecgpos.config import to_dict
    from ecgpos.probes.linear.report import shared_protocol
    from ecgpos.probes.shared.provenance import merged_guard

    def info(workers: int, overlap: int) -> dict:
        return {
            "config": to_dict(ProbeConfig(workers=workers)),
            "spec": DEFAULT_SPEC.to_dict(),
            "tasks": ["cpsc2018"],
            "exclude_overlap": False,
            "pretraining_overlap": {"cpsc2018": {"train": overlap, "val": 0, "test": 0}},
        }

    infos = {tmp_path / "a" / "probe": info(1, 3), tmp_path / "b" / "probe": info(8, 5)}
    assert shared_protocol(infos).startswith("## Protocol")
    guard = merged_guard(infos)
    assert [g["pretraining_overlap"]["cpsc2018"]["train"] for g in guard.values()] == [3, 5]
    assert set(guard) == {str(tmp_path / "a" / "probe"), str(tmp_path / "b" / "probe")}
