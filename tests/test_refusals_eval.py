"""Odd inputs to the evaluation commands (`probe`, `geometry`, `score`) on tiny real runs and real
PTB-XL records: broken weights, a run still training, degenerate classes, a wrong data root and
settings out of range each get one line (exit 2) before any result is written, or a warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from refusal_helpers import copy_record, one_line_error, run
from safetensors.torch import load_file, save_file
from tiny_runs import pretrain_tiny

from ecgpos.runs.run_folder import WEIGHTS_FILE, checkpoint_name

PTBXL = "ptbxl/records500/00000"
FAST = ["--set", "train.batch_size=4", "--set", "train.num_workers=0"]
QUICK = ["--seeds", "1", "--epochs", "2", "--fractions", "100", "--bootstrap", "0", "--device", "cpu"]


@pytest.fixture(scope="module")
def runs(tiny_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A level-0 run and a 4-step level-1 run on it, checkpointed at steps 2 and 4."""
    root = tmp_path_factory.mktemp("eval-runs")
    pretrain_tiny(0, tiny_shards, root / "s0", *FAST, "--set", "optim.steps=2")
    steps = ["--set", "optim.steps=4", "--set", "train.checkpoint_every=2"]
    pretrain_tiny(1, tiny_shards, root / "s1", *FAST, *steps, base=root / "s0")
    return {"level0": root / "s0", "level1": root / "s1"}


def _task(folder: Path, shared_data: Path, labels: dict[str, str], records: dict[str, Path] | None = None) -> Path:
    """A custom task: the same rows (record -> class) in train, val and test; records are real
    PTB-XL records by number ("3") unless `records` maps a name to another path."""
    classes = sorted(set(labels.values()))
    rows = ["record," + ",".join(classes)]
    for name, label in labels.items():
        path = records[name] if records else shared_data / PTBXL / f"{int(name):05d}_hr"
        rows.append(f"{path}," + ",".join(str(int(c == label)) for c in classes))
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        (folder / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return folder


def _probe_task(folder: Path, shared_data: Path) -> Path:
    """A custom probe task over real PTB-XL records 1-16 (train 8, val 4, test 4), classes A/B alternating."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, numbers in (("train", range(1, 9)), ("val", range(9, 13)), ("test", range(13, 17))):
        rows = ["record,A,B"] + [f"{shared_data / PTBXL / f'{n:05d}_hr'},{n % 2},{1 - n % 2}" for n in numbers]
        (folder / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return folder


def _geometry(task: Path, encoder: Path, out: Path, *extra: object) -> list[object]:
    return ["geometry", "--encoder", encoder, "--task", f"custom:{task}", "--nominal", "A,B", "--anomalous", "X"] + [
        "--out",
        out,
        "--device",
        "cpu",
        *extra,
    ]


def _with_nan_weights(run_dir: Path, dest: Path) -> Path:
    """A copy of a run whose newest checkpoint's level-1 encoder weights are NaN (a diverged run)."""
    shutil.copytree(run_dir, dest)
    weights = dest / "checkpoints" / checkpoint_name(4) / WEIGHTS_FILE
    state = load_file(str(weights))
    for name, tensor in state.items():
        if name.startswith("encoder."):
            state[name] = torch.full_like(tensor, float("nan"))
    save_file(state, str(weights))
    return dest


def test_nan_weights_are_one_line_in_geometry_score_and_probe(capsys, tmp_path, runs, shared_data):
    """A checkpoint holding NaN weights loaded silently: geometry wrote metrics.csv and features.npz
    full of NaN, then died in the PCA with a ValueError traceback; score wrote NaN scores with exit
    0; probe cached NaN features and died in roc_auc_score. Each now refuses at load, in one line."""
    broken = _with_nan_weights(runs["level1"], tmp_path / "nan-run")
    labels = {"1": "A", "2": "A", "3": "B", "4": "B", "5": "X"}
    task = _task(tmp_path / "task", shared_data, labels)
    rc, _, err = run(capsys, *_geometry(task, broken, tmp_path / "g"))
    one_line_error(rc, err, "geometry", "hold NaN or inf values")
    assert not (tmp_path / "g").exists()
    rc, _, err = run(
        capsys, "score", "--run", broken, "--input", shared_data / PTBXL / "00001_hr", "--out", tmp_path / "s.csv"
    )
    one_line_error(rc, err, "score", "the run diverged or the file is damaged")
    assert not (tmp_path / "s.csv").exists()
    args = ["probe", "--encoder", broken, "--task", f"custom:{_probe_task(tmp_path / 'pt', shared_data)}"]
    args += ["--out", tmp_path / "p"]
    rc, _, err = run(capsys, *args, "--cache-dir", tmp_path / "cache", *QUICK)
    one_line_error(rc, err, "probe", "hold NaN or inf values")
    assert not (tmp_path / "p").exists() and not (tmp_path / "cache").exists()


def test_geometry_refuses_classes_whose_ratios_divide_by_zero(capsys, tmp_path, runs, shared_data, real_record):
    """One record per nominal class, or records whose features are identical, give each class a
    radius of 0: S and rho were computed against EPS alone (S = 1.6e9, "5 of 5 predictions hold",
    or every metric 0), written and printed with exit 0."""
    single = _task(tmp_path / "single", shared_data, {"1": "A", "2": "B", "3": "X"})
    rc, _, err = run(capsys, *_geometry(single, runs["level1"], tmp_path / "g1"))
    one_line_error(rc, err, "geometry", "nominal class A, B each have a single record")
    # the same real record under four names: four identical feature vectors per level
    names = {f"r{i}": copy_record(real_record, tmp_path / "copies", f"r{i}") for i in range(1, 6)}
    same = _task(tmp_path / "same", shared_data, {"r1": "A", "r2": "A", "r3": "B", "r4": "B", "r5": "X"}, names)
    rc, _, err = run(capsys, *_geometry(same, runs["level1"], tmp_path / "g2"))
    one_line_error(rc, err, "geometry", "have identical level 0 features (radius 0)")
    assert not (tmp_path / "g1").exists() and not (tmp_path / "g2").exists()


def test_geometry_batch_size_below_one_is_refused(capsys, tmp_path, runs, shared_data):
    """--batch-size 0 or -3 was accepted and silently ran one record per pass."""
    task = _task(tmp_path / "task", shared_data, {"1": "A", "2": "A", "3": "B", "4": "B", "5": "X"})
    for size in ("0", "-3"):
        rc, _, err = run(capsys, *_geometry(task, runs["level1"], tmp_path / "g", "--batch-size", size))
        one_line_error(rc, err, "geometry", f"--batch-size must be at least 1, got {size}")
    assert not (tmp_path / "g").exists()


def test_a_data_root_holding_another_dataset_is_named(capsys, tmp_path, runs, shared_data):
    """--data-root at the CPSC2018 folder for a PTB-XL task: geometry said only "found 0 (NORM: 0,
    MI: 0)", and probe trained nothing and wrote a table of NaN rows with exit 0."""
    splits = shared_data / "merl_splits"
    root = shared_data / "cpsc2018"
    args = ["geometry", "--encoder", runs["level1"], "--task", "ptbxl-super", "--data-root", root]
    args += ["--splits", splits, "--nominal", "NORM,MI", "--anomalous", "CD", "--out", tmp_path / "g"]
    rc, _, err = run(capsys, *args)
    one_line_error(rc, err, "geometry", f"1565 not found under --data-root {root}")
    args = ["probe", "--encoder", runs["level1"], "--task", "ptbxl-super,cpsc2018", "--data-root", root]
    rc, _, err = run(capsys, *args, "--splits", splits, "--out", tmp_path / "p", "--cache-dir", tmp_path / "c", *QUICK)
    line = one_line_error(rc, err, "probe", "ptbxl-super: none of the 21388 records of its splits was found")
    assert f"--data-root {root} must be the folder holding ptbxl/" in line
    assert not (tmp_path / "p").exists()
    # a data root with only the 100 Hz folder: the message names the flag that reads it
    (tmp_path / "lr" / "ptbxl").mkdir(parents=True)
    (tmp_path / "lr" / "ptbxl" / "records100").symlink_to(shared_data / "ptbxl" / "records100")
    args = ["probe", "--encoder", runs["level1"], "--task", "ptbxl-super", "--data-root", tmp_path / "lr"]
    rc, _, err = run(capsys, *args, "--splits", splits, "--out", tmp_path / "p", "--cache-dir", tmp_path / "c", *QUICK)
    one_line_error(rc, err, "probe", "(it holds ptbxl/records100/: --records100?)")


@pytest.mark.parametrize(
    "setting, needle",
    [
        ("extract_batch_size=0", "extract_batch_size=0: must be at least 1"),  # was range() ValueError
        ("windows_custom=0", "windows_custom=0: must be at least 1"),  # was embedded as 1, recorded as 0
        ("windows_ptbxl=-2", "windows_ptbxl=-2: must be at least 1"),
        ("raw_fs=0", "raw_fs=0.0: the raw-signal baseline's rate must be above 0 Hz"),  # ZeroDivisionError
        ("raw_fs=-25", "raw_fs=-25.0"),  # was no downsampling at all, recorded as -25
        ("workers=-1", "workers=-1: probe training processes must be 0 or more"),  # ran in-process
    ],
)
def test_probe_settings_out_of_range_are_one_line(capsys, tmp_path, runs, shared_data, setting, needle):
    task = _probe_task(tmp_path / "task", shared_data)
    args = ["probe", "--encoder", runs["level1"], "--task", f"custom:{task}", "--out", tmp_path / "p", "--raw-baseline"]
    rc, _, err = run(capsys, *args, "--cache-dir", tmp_path / "c", *QUICK, "--set", setting)
    one_line_error(rc, err, "probe", needle)
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--set", "protocol.batch_size=0"], "protocol batch_size=0"),  # ZeroDivisionError after the extraction
        (["--set", "protocol.lr=-1"], "protocol lr=-1.0"),  # trained the probes away from the labels
        (["--set", "protocol.weight_decay=-1"], "protocol weight_decay=-1.0"),
        (["--set", "protocol.lr_drop_factor=0"], "protocol lr_drop_factor=0.0"),
        (["--set", "protocol.lr_drop_epochs=[-5]"], "protocol lr_drop_epochs=[-5]"),
        (["--set", "protocol.betas=[0.9, 1.5]"], "protocol betas=[0.9, 1.5]"),
        (["--seeds", "99999999999999999999"], "at most 1000 seeds"),  # OverflowError after the extraction
        (["--epochs", "99999999999999999999"], "100000 epochs"),  # numpy ValueError after the extraction
        (["--bootstrap", "99999999999999999999"], "up to 100000"),  # numpy ValueError after every probe trained
        (["--fractions", ""], "--fractions is empty"),  # an empty flag was the default, silently
        (["--device", ""], "--device is empty"),
        (["--name", " "], "--name is empty"),  # a blank row label in every table
        (["--reference", ""], "--reference is empty"),
        (["--pretraining-index", "{tmp}/nowhere"], "nowhere is not a folder"),  # after --out was made
    ],
)
def test_probe_counts_protocol_and_empty_flags_are_one_line(capsys, tmp_path, runs, shared_data, extra, needle):
    task = _probe_task(tmp_path / "task", shared_data)
    args = ["probe", "--encoder", runs["level1"], "--task", f"custom:{task}", "--out", tmp_path / "p"]
    extra = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    rc, _, err = run(capsys, *args, "--cache-dir", tmp_path / "c", *QUICK, *extra)
    one_line_error(rc, err, "probe", needle)
    assert not (tmp_path / "p").exists() and not (tmp_path / "c").exists()


def test_geometry_refuses_a_data_root_or_splits_that_is_no_folder(capsys, tmp_path, runs, shared_data):
    """A custom task reads neither, so a mistyped --data-root or --splits was ignored without a word
    (`ecgpos probe` refuses both)."""
    task = _task(tmp_path / "task", shared_data, {"1": "A", "2": "B", "3": "X"})
    for flag in ("--data-root", "--splits"):
        rc, _, err = run(capsys, *_geometry(task, runs["level1"], tmp_path / "g", flag, tmp_path / "nowhere"))
        one_line_error(rc, err, "geometry", f"{flag} {tmp_path / 'nowhere'} is not a folder")
    assert not (tmp_path / "g").exists()


def test_a_run_still_training_is_named_by_probe_and_geometry(capsys, tmp_path, runs, shared_data):
    """A level-1 run with only its step-2 checkpoint of 4 (still training, or stopped) was probed
    and measured as if it were the trained model, with no word about it."""
    partial = tmp_path / "partial"
    shutil.copytree(runs["level1"], partial)
    shutil.rmtree(partial / "checkpoints" / checkpoint_name(4))
    expected = f"{partial} is not finished (step 2 of 4): its newest checkpoint {checkpoint_name(2)} is used"
    task = _task(tmp_path / "task", shared_data, {"1": "A", "2": "A", "3": "B", "4": "B", "5": "X", "6": "X"})
    rc, out, err = run(capsys, *_geometry(task, partial, tmp_path / "g"))
    assert rc == 0 and f"ecgpos geometry: warning: {expected}" in err
    assert expected in (tmp_path / "g" / "summary.md").read_text()
    assert "the appendix's own x_hat" in (tmp_path / "g" / "summary.md").read_text()  # which space is measured
    args = ["probe", "--encoder", partial, "--task", f"custom:{_probe_task(tmp_path / 'pt', shared_data)}"]
    args += ["--out", tmp_path / "p"]
    rc, out, err = run(capsys, *args, "--cache-dir", tmp_path / "c", *QUICK)
    assert rc == 0 and f"ecgpos probe: warning: {expected}" in err
    assert expected in (tmp_path / "p" / "summary.md").read_text()
    # the finished run gets no such line
    rc, out, err = run(capsys, *_geometry(task, runs["level1"], tmp_path / "g2"))
    assert rc == 0 and "not finished" not in err + (tmp_path / "g2" / "summary.md").read_text()


def test_non_finite_features_are_neither_cached_nor_trusted_from_a_cache(tmp_path, shared_data):
    """A record whose features came out NaN was cached and probed (roc_auc_score then raised); a
    cache holding such a row (written before) was reused as it was."""
    from ecgpos.ecg.spec import PreprocessSpec
    from ecgpos.probes.linear.features import FeatureSource, cache_file, extract_features, raw_source
    from ecgpos.probes.shared.datasets import RecordLocator

    keys = [f"records500/00000/{n:05d}_hr" for n in (1, 2, 3)]
    locator = RecordLocator("ptbxl", shared_data)
    raw = raw_source(PreprocessSpec())

    def broken(records: list[np.ndarray], windows: int) -> np.ndarray:
        out = raw.embed(records, windows)
        out[1] = np.nan  # the second record of the batch
        return out

    source = FeatureSource("nan-second", {"test": "nan-second"}, raw.spec, broken)
    feats, stats = extract_features(source, "ptbxl:t", keys, locator, tmp_path, windows=1)
    assert sorted(feats) == [keys[0], keys[2]] and stats.failed == {
        keys[1]: "non-finite features (NaN or inf) from the encoder"
    }
    with np.load(cache_file(tmp_path, source, "ptbxl:t", 1)) as data:
        assert sorted(data["ids"].tolist()) == [keys[0], keys[2]]
    # a cache written with a NaN row: that row is extracted again, the others are reused
    path = cache_file(tmp_path, raw, "ptbxl:t", 1)
    first, _ = extract_features(raw, "ptbxl:t", keys, locator, tmp_path, windows=1)
    with np.load(path) as data:
        cached = dict(data)
    cached["features"][cached["ids"].tolist().index(keys[0])] = np.nan
    np.savez(path, **cached)
    again, stats = extract_features(raw, "ptbxl:t", keys, locator, tmp_path, windows=1)
    assert stats.cached == 2 and stats.extracted == 1
    assert all(np.array_equal(again[k], first[k]) for k in keys)


def test_encoders_with_equal_weights_but_other_architectures_do_not_share_a_cache(tmp_path, capsys, shared_data):
    """Two random-init encoders that differ only in their head count have the same tensors (a head
    count changes no shape) but different features; their cache key was the weights hash alone, so
    the second probe silently read the first one's features."""
    from ecgpos.resources import config_dir

    tiny = config_dir() / "tiny" / "level0.yaml"
    other = tmp_path / "heads8.yaml"
    other.write_text(tiny.read_text().replace("heads: 4", "heads: 8"))
    assert "heads: 8" in other.read_text()
    task = _probe_task(tmp_path / "task", shared_data)
    for config in (tiny, other):
        args = ["probe", "--encoder", f"random:{config}", "--task", f"custom:{task}", "--out", tmp_path / config.stem]
        rc, _, err = run(capsys, *args, "--cache-dir", tmp_path / "cache", *QUICK)
        assert rc == 0, err

    extraction = [json.loads((tmp_path / c.stem / "probe.json").read_text())["extraction"] for c in (tiny, other)]
    assert [next(iter(e.values()))["extracted"] for e in extraction] == [16, 16]
    assert len(list((tmp_path / "cache").glob("custom-*.npz"))) == 2


def test_score_labels_named_unlike_the_folder_records_say_so(capsys, tmp_path, runs, real_record):
    """Records of one name in two subfolders are scored as two records (a/r1, b/r1); --labels that
    name them by bare name matched nothing and the error said only "0 nominal and 0 anomalous"."""
    for sub, name in (("a", "r1"), ("b", "r1"), ("b", "r2")):
        copy_record(real_record, tmp_path / "in" / sub, name)
    (tmp_path / "labels.csv").write_text("record_id,label\nr1,N\nr2,A\n")
    args = ["score", "--run", runs["level1"], "--input", tmp_path / "in", "--out", tmp_path / "s.csv", "--no-progress"]
    rc, _, err = run(capsys, *args, "--labels", tmp_path / "labels.csv", "--nominal", "N", "--anomalous", "A")
    one_line_error(rc, err, "score", "none of its 2 record ids is a scored record (scored ids look like 'a/r1'")
    with (tmp_path / "s.csv").open() as handle:
        assert [line.split(",")[0] for line in handle.read().splitlines()] == ["record_id", "a/r1", "b/r1", "b/r2"]


def test_a_cache_dir_that_is_a_file_is_one_line_before_extraction(capsys, tmp_path, runs, shared_data):
    """--cache-dir naming a file (or a folder below one) extracted every record, then died saving
    the cache with a FileExistsError traceback."""
    (tmp_path / "file").write_text("not a folder\n")
    task = _probe_task(tmp_path / "task", shared_data)
    for cache, needle in ((tmp_path / "file", "is a file, not a folder"), (tmp_path / "file" / "sub", "is a file")):
        args = ["probe", "--encoder", runs["level1"], "--task", f"custom:{task}", "--out", tmp_path / "p"]
        rc, _, err = run(capsys, *args, "--cache-dir", cache, *QUICK)
        one_line_error(rc, err, "probe", f"--cache-dir {cache}")
        assert needle in err and not (tmp_path / "p").exists()


def test_a_task_none_of_whose_records_can_be_read_is_one_line(capsys, tmp_path, runs, real_record):
    """Every record of a task found but unreadable (here truncated): the probe trained nothing and
    wrote a table of NaN rows with exit 0."""
    for n in range(1, 9):
        path = copy_record(real_record, tmp_path / "rec", f"r{n}")
        path.with_suffix(".mat").write_bytes(path.with_suffix(".mat").read_bytes()[:500])
    for split, numbers in (("train", range(1, 5)), ("val", range(5, 7)), ("test", range(7, 9))):
        rows = ["record,A,B"] + [f"../rec/r{n},{n % 2},{1 - n % 2}" for n in numbers]
        (tmp_path / "task").mkdir(exist_ok=True)
        (tmp_path / "task" / f"{split}.csv").write_text("\n".join(rows) + "\n")
    args = ["probe", "--encoder", runs["level1"], "--task", f"custom:{tmp_path / 'task'}", "--out", tmp_path / "p"]
    rc, _, err = run(capsys, *args, "--cache-dir", tmp_path / "c", *QUICK)
    one_line_error(rc, err, "probe", "none of its 8 located records could be read (8 truncated_signal; e.g. ")
    assert not (tmp_path / "p" / "results.csv").exists()
