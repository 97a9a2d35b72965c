"""What ecgpos refuses, run by run: bad shards, edited exports, corrupt checkpoints, bad --set values
and unwritable outputs stop in one line (exit 2) before anything is written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from refusal_helpers import (
    FAST,
    PRETRAIN,
    TINY0,
    copy_record,
    one_line_error,
    run,
)
from safetensors.torch import load_file

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.runs.run_folder import checkpoint_name, newest_checkpoint


def _broken_shards(tmp_path: Path, tiny_shards: Path) -> dict[str, Path]:
    """Shard folders broken the ways a disk or a hand edit breaks them."""
    good = sorted(tiny_shards.glob("shard-*.h5"))[0]
    cases = {}
    for name in ("truncated", "garbage_header", "empty", "eight_leads"):
        folder = tmp_path / name
        folder.mkdir()
        target = folder / good.name
        data = good.read_bytes()
        if name == "truncated":
            target.write_bytes(data[: len(data) // 2])
        elif name == "garbage_header":
            target.write_bytes(b"\x00garbage" * 8 + data[64:])
        elif name == "empty":
            target.write_bytes(b"")
        else:
            shutil.copyfile(good, target)
            with h5py.File(target, "r+") as f:
                signals = f["signals"][:, :8]
                del f["signals"]
                f.create_dataset("signals", data=signals)
        cases[name] = folder
    return cases


def test_unreadable_shards_are_one_line_for_pretrain_and_embed(capsys, tmp_path, tiny_shards, export):
    for name, folder in _broken_shards(tmp_path, tiny_shards).items():
        run_dir = tmp_path / f"run-{name}"
        rc, _, err = run(capsys, *PRETRAIN, "--shards", folder, "--run-dir", run_dir, *FAST)
        one_line_error(rc, err, "pretrain", "shard")
        assert not run_dir.exists(), name
        rc, _, err = run(
            capsys, "embed", "--encoder", export, "--input", folder, "--out", tmp_path / f"{name}.csv", "--no-progress"
        )
        one_line_error(rc, err, "embed", "shard")


def test_edited_export_config_is_refused(capsys, tmp_path, export, real_record):
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    embed = ["--input", tmp_path / "x.npy", "--fs", "500", "--leads", ",".join(CANONICAL_LEADS), "--no-progress"]
    edits = {
        "heads": lambda c: c["arch"]["encoder"].update(heads=c["arch"]["encoder"]["heads"] * 2),
        "fs": lambda c: c["preprocess"].update(fs=200),
        "lowpass": lambda c: c["preprocess"].update(lowpass_hz=30.0),
    }
    for name, edit in edits.items():
        copy = tmp_path / f"enc-{name}"
        shutil.copytree(export, copy)
        config = json.loads((copy / "config.json").read_text())
        edit(config)
        (copy / "config.json").write_text(json.dumps(config, indent=2))
        rc, _, err = run(capsys, "embed", "--encoder", copy, *embed, "--out", tmp_path / f"{name}.csv")
        one_line_error(rc, err, "embed", "was edited after export")
        rc, out, _ = run(capsys, "verify", copy)
        assert rc == 1 and "FAIL weights" in out
    # an export written before config_sha256 existed still loads, with one warning
    old = tmp_path / "enc-old"
    shutil.copytree(export, old)
    config = json.loads((old / "config.json").read_text())
    del config["config_sha256"]
    (old / "config.json").write_text(json.dumps(config, indent=2))
    rc, _, err = run(capsys, "embed", "--encoder", old, *embed, "--out", tmp_path / "old.csv")
    assert rc == 0 and err.count("has no config_sha256") == 1, err
    assert run(capsys, "verify", export)[0] == 0


def test_score_refuses_an_edited_export_with_decoders(capsys, tmp_path, tiny_run, real_record):
    """score read an export's encoder weights and config.json unchecked: other weights, an edited
    preprocess or edited decoder settings gave other scores without a word, and verify passed them."""
    from safetensors.torch import load_file, save_file

    full = tmp_path / "full"
    assert run(capsys, "export", "--run-dir", tiny_run, "--out", full, "--with-decoders")[0] == 0
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    score = ["score", "--input", tmp_path / "x.npy", "--fs", "500", "--leads", ",".join(CANONICAL_LEADS)]

    def weights(folder: Path) -> None:
        state = load_file(folder / "model.safetensors")
        name = sorted(state)[0]
        save_file({**state, name: state[name] + 0.5}, str(folder / "model.safetensors"))

    def config(edit):
        def apply(folder: Path) -> None:
            data = json.loads((folder / "config.json").read_text())
            edit(data)
            (folder / "config.json").write_text(json.dumps(data, indent=2))

        return apply

    cases = {
        "weights": (weights, "does not match config.json"),
        "highpass": (config(lambda c: c["preprocess"].update(highpass_hz=5.0)), "edited after export"),
        "mask_ratio": (config(lambda c: c["decoders"]["level0"].update(mask_ratio=0.1)), "decoders settings"),
        "norm_target": (config(lambda c: c["decoders"]["level0"].update(norm_target=False)), "decoders settings"),
    }
    for name, (edit, needle) in cases.items():
        copy = tmp_path / name
        shutil.copytree(full, copy)
        edit(copy)
        out = tmp_path / f"{name}.csv"
        rc, _, err = run(capsys, *score, "--run", copy, "--out", out, "--no-progress")
        one_line_error(rc, err, "score", needle)
        assert not out.exists()
        rc, report, _ = run(capsys, "verify", copy)  # verify passed edited decoder settings
        assert rc == 1 and needle in report, report
    rc, report, _ = run(capsys, "verify", full)
    assert rc == 0 and "PASS decoders.safetensors" in report, report
    # an export written before settings_sha256 existed still scores
    config(lambda c: c["decoders"].pop("settings_sha256"))(full)
    assert run(capsys, *score, "--run", full, "--out", tmp_path / "old.csv", "--no-progress")[0] == 0
    # a decoders entry that names no level: score has nothing to score, so verify must not pass it
    config(lambda c: [c["decoders"].pop(level, None) for level in ("level0", "level1")])(full)
    rc, report, _ = run(capsys, "verify", full)
    assert rc == 1 and "FAIL decoders.safetensors" in report and "names no level" in report, report


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")  # the corrupt file is written on purpose
def test_corrupt_newest_checkpoint_falls_back_then_refuses(capsys, tmp_path, tiny_run, tiny_shards):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    assert [c.name for c in ckpts] == ["step-0000002", "step-0000004"]
    (ckpts[1] / "model.safetensors").write_bytes(b"not a safetensors file")
    args = [
        *PRETRAIN,
        "--shards",
        tiny_shards,
        "--run-dir",
        run_dir,
        *FAST,
        "--set",
        "optim.steps=4",
        "--set",
        "train.checkpoint_every=2",
        "--resume",
        "auto",
    ]
    rc, _, err = run(capsys, *args)
    assert rc == 0 and "Traceback" not in err, err
    assert "checkpoint step-0000004 does not load" in err and "resuming from step-0000002" in err
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["resumed_from"].endswith("step-0000002") and info["finished"] is True
    assert info["skipped_checkpoints"][0]["checkpoint"].endswith("step-0000004")
    aside = run_dir / "checkpoints" / "step-0000004.corrupt"  # kept, but never again taken for the newest
    assert info["skipped_checkpoints"][0]["moved_to"] == str(aside)
    assert (aside / "model.safetensors").read_bytes() == b"not a safetensors file"
    # the resumed run rewrote step 4: the same weights as the uninterrupted run (bit-identical resume)
    want, got = (load_file(str(d / "checkpoints" / "step-0000004" / "model.safetensors")) for d in (tiny_run, run_dir))
    assert all(torch.equal(want[k], got[k]) for k in want)
    # now every optimizer state is corrupt: one line, exit 2
    for ckpt in sorted((run_dir / "checkpoints").glob("step-*")):
        (ckpt / "optimizer.bin").write_bytes(b"\x80\x04garbage")
    rc, _, err = run(capsys, *args)
    one_line_error(rc, err.replace("does not load", "warning does not load"), "pretrain", "none of the")


def test_incomplete_newest_checkpoint_is_set_aside_not_overwritten(capsys, tmp_path, tiny_run, tiny_shards):
    """A step-N folder that lost its trainer state is renamed step-N.corrupt with its files, and the run
    resumes from the one before: the save of step N then writes a new folder instead of replacing it."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    newest = run_dir / "checkpoints" / "step-0000004"
    (newest / "trainer_state.json").unlink()
    weights = (newest / "model.safetensors").read_bytes()
    args = [*PRETRAIN, "--shards", tiny_shards, "--run-dir", run_dir, *FAST, "--set", "optim.steps=4"]
    rc, _, err = run(capsys, *args, "--set", "train.checkpoint_every=2", "--resume", "auto")
    assert rc == 0 and "Traceback" not in err, err
    assert "checkpoint step-0000004 is incomplete (lacks trainer_state.json); renamed step-0000004.corrupt" in err
    aside = run_dir / "checkpoints" / "step-0000004.corrupt"
    assert (aside / "model.safetensors").read_bytes() == weights and not (aside / "trainer_state.json").exists()
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["resumed_from"].endswith("step-0000002")
    assert info["skipped_checkpoints"][0] == {
        "checkpoint": str((run_dir / "checkpoints" / "step-0000004").resolve()),
        "reason": "incomplete: lacks trainer_state.json",
        "moved_to": str(aside.resolve()),
    }
    assert (run_dir / "checkpoints" / "step-0000004" / "trainer_state.json").is_file()


@pytest.mark.parametrize(
    "value",
    [
        "train.seed=-1",
        "train.seed=99999999999999999999",
        "optim.lr=!!python/object/apply:os.system [id]",
        "optim.lr=.inf",
    ],
)
def test_bad_set_values_are_one_line_before_the_run_folder(capsys, tmp_path, tiny_shards, value):
    run_dir = tmp_path / "run"
    rc, _, err = run(capsys, *PRETRAIN, "--shards", tiny_shards, "--run-dir", run_dir, *FAST, "--set", value)
    one_line_error(rc, err, "pretrain", value.split("=")[0])
    assert not run_dir.exists()


def test_unwritable_outputs_are_one_line(capsys, tmp_path, real_record, export):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    (tmp_path / "a-file").write_text("x")
    for out in (tmp_path / "a-file", Path("/proc/ecgpos-test/out")):
        rc, _, err = run(
            capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", out
        )
        one_line_error(rc, err, "preprocess", str(out))
    rc, _, err = run(
        capsys, "embed", "--encoder", export, "--input", src / "JS00001", "--out", "/proc/x.csv", "--no-progress"
    )
    one_line_error(rc, err, "embed", "not writable")


def test_exporting_an_unfinished_run_warns(capsys, tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    info = json.loads((run_dir / "run_info.json").read_text())
    (run_dir / "run_info.json").write_text(json.dumps({**info, "finished": False, "step": 2}))
    rc, _, err = run(capsys, "export", "--run-dir", run_dir, "--out", tmp_path / "enc")
    # the line probe and geometry print for such a run (the step is the loaded checkpoint's)
    expected = f"{run_dir.resolve()} is not finished (step 4 of 4): its newest checkpoint {checkpoint_name(4)} is used"
    expected = f"ecgpos export: warning: {expected}\n"
    assert rc == 0 and expected in err, err


def test_resume_refuses_other_records_but_not_moved_shards(capsys, tmp_path, tiny_run, tiny_shards, monkeypatch):
    """The sampler's order is a function of the records and their order: a resume on other records of
    the same count, or on pooled folders given in another order, would repeat some records and skip
    others. The same records in the same order in another place are the same run."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    monkeypatch.chdir(tmp_path)
    run_dir = Path("run")  # given relative: run_info.json still names absolute paths
    shutil.rmtree(run_dir / "checkpoints" / checkpoint_name(4))  # resume from step 2
    before = (run_dir / "metrics.jsonl").read_text()
    parts = []
    for k, shard in enumerate(sorted(tiny_shards.glob("shard-*.h5"))):  # the same records, now in two folders
        (tmp_path / f"part{k}").mkdir()
        parts.append(shutil.copy(shard, tmp_path / f"part{k}"))
    first, second = (str(Path(p).parent) for p in parts)
    steps = ["--set", "optim.steps=4", "--set", "train.checkpoint_every=2", "--resume", "auto"]
    args = [*PRETRAIN, "--run-dir", run_dir, *FAST, *steps]
    rc, _, err = run(capsys, *args, "--shards", second, first)
    one_line_error(rc, err, "pretrain", "other training records than the run was started on")
    assert (run_dir / "metrics.jsonl").read_text() == before and newest_checkpoint(run_dir).name == checkpoint_name(2)
    rc, _, err = run(capsys, *args, "--shards", first, second)
    assert rc == 0, err
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["checkpoint"] == str(tmp_path / "run" / "checkpoints" / checkpoint_name(4))
    assert info["resumed_from"] == str(tmp_path / "run" / "checkpoints" / checkpoint_name(2))
    want, got = (
        load_file(str(d / "checkpoints" / checkpoint_name(4) / "model.safetensors")) for d in (tiny_run, run_dir)
    )
    assert all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.parametrize("recorded", [True, False], ids=["grad_accum-in-checkpoint", "older-checkpoint"])
def test_resume_with_another_grad_accum_on_as_many_processes_is_refused(
    capsys, tmp_path, tiny_run, tiny_shards, recorded
):
    """train.grad_accum may change on resume only where the processes make up for it (same slices
    per step, same masks); on one process another accumulation is one line, before anything is
    written. A checkpoint that does not record grad_accum is read with the run's config.yaml."""
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    shutil.rmtree(run_dir / "checkpoints" / checkpoint_name(4))
    state_file = run_dir / "checkpoints" / checkpoint_name(2) / "trainer_state.json"
    state = json.loads(state_file.read_text())
    assert state["grad_accum"] == 1
    if not recorded:
        state_file.write_text(json.dumps({k: v for k, v in state.items() if k != "grad_accum"}))
    before = (run_dir / "metrics.jsonl").read_text()
    args = [*PRETRAIN, "--shards", tiny_shards, "--run-dir", run_dir, *FAST, "--set", "optim.steps=4"]
    args += ["--set", "train.checkpoint_every=2", "--resume", "auto"]
    rc, _, err = run(capsys, *args, "--set", "train.grad_accum=2")
    one_line_error(rc, err, "pretrain", "processes x train.grad_accum = 1 x 1, this run has 1 x 2")
    assert "resume with --set train.grad_accum=1" in err
    assert (run_dir / "metrics.jsonl").read_text() == before and newest_checkpoint(run_dir).name == checkpoint_name(2)
    rc, _, err = run(capsys, *args)
    assert rc == 0, err
    assert json.loads((run_dir / "run_info.json").read_text())["finished"]


def test_run_dir_that_is_an_export_is_refused(capsys, tmp_path, tiny_shards, export):
    # e.g. Level 1 given its --base export as --run-dir too: the export would turn into a run folder
    copy = tmp_path / "enc"
    shutil.copytree(export, copy)
    before = sorted(p.name for p in copy.iterdir())
    rc, _, err = run(capsys, *PRETRAIN, "--shards", tiny_shards, "--run-dir", copy, *FAST)
    one_line_error(rc, err, "pretrain", "is an export folder")
    assert sorted(p.name for p in copy.iterdir()) == before


def test_a_val_fraction_that_holds_out_no_record_is_said(capsys, tmp_path, tiny_shards):
    # the split is by a hash of the record id: 0.1 % of 24 records holds out none, and no val_loss comes
    run_dir = tmp_path / "run"
    rc, _, err = run(
        capsys, *PRETRAIN, "--shards", tiny_shards, "--run-dir", run_dir, *FAST, "--set", "train.val_fraction=0.001"
    )
    assert rc == 0 and "warning: train.val_fraction 0.001 holds out none (or all) of the 24 records" in err, err
    assert "val_loss" not in (run_dir / "metrics.jsonl").read_text()


def test_export_of_a_file_given_as_run_folder_says_it_is_a_file(capsys, tmp_path):
    not_a_folder = tmp_path / "run.yaml"
    not_a_folder.write_text("optim: {}\n")
    rc, _, err = run(capsys, "export", "--run-dir", not_a_folder, "--out", tmp_path / "enc")
    one_line_error(rc, err, "export", "is a file, not a run folder")
    assert not (tmp_path / "enc").exists()


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (lambda info: [], "is damaged: a JSON list, not the run's record"),
        (lambda info: {**info, "chain": [{**info["chain"][0], "encoder": "x"}]}, "is damaged: chain[0].encoder is not"),
        (
            lambda info: {
                **info,
                "chain": [{**info["chain"][0], "encoder": {**info["chain"][0]["encoder"], "bogus": 1}}],
            },
            "is damaged: unknown config key(s): chain[0].encoder.bogus",
        ),
        (
            lambda info: {
                **info,
                "chain": [{**info["chain"][0], "encoder": {**info["chain"][0]["encoder"], "depth": "x"}}],
            },
            "is damaged: chain[0].encoder.depth: expected an integer",
        ),
        (lambda info: {**info, "chain": [{**info["chain"][0], "level": 1}]}, "is damaged: its chain does not list"),
        (
            lambda info: {**info, "chain": [{**info["chain"][0], "weights_sha256": "0" * 64}]},
            "holds other level-0 weights than its run_info.json records",
        ),
    ],
)
def test_a_damaged_run_record_is_one_line(capsys, tmp_path, level1_run, damage, needle):
    """run_info.json that is JSON but not the run's record: every command reading the run says so."""
    run_dir = tmp_path / "run"
    shutil.copytree(level1_run, run_dir)
    info = json.loads((run_dir / "run_info.json").read_text())
    (run_dir / "run_info.json").write_text(json.dumps(damage(info)))
    rc, _, err = run(capsys, "export", "--run-dir", run_dir, "--out", tmp_path / "export")
    one_line_error(rc, err, "export", needle)
    assert not (tmp_path / "export").exists()


def test_damaged_recorded_shards_name_no_folder(capsys, tmp_path, level1_run):
    """A `shards` entry that is not a list of folders is descriptive only: the export goes on without it."""
    run_dir = tmp_path / "run"
    shutil.copytree(level1_run, run_dir)
    info = json.loads((run_dir / "run_info.json").read_text())
    (run_dir / "run_info.json").write_text(json.dumps({**info, "shards": 5}))
    rc, _, err = run(capsys, "export", "--run-dir", run_dir, "--out", tmp_path / "export")
    assert rc == 0, err
    training = json.loads((tmp_path / "export" / "config.json").read_text())["training"]
    assert all(str(f) != "5" for f in training.get("shards") or [])


def test_results_are_not_written_into_a_run_or_an_export_folder(capsys, tiny_run, export, shared_data):
    data = ["--data-root", shared_data, "--splits", shared_data / "merl_splits"]
    probe = ["--encoder", f"random:{TINY0}", "--task", "ptbxl-super"]
    before = {folder: sorted(p.name for p in folder.iterdir()) for folder in (tiny_run, export)}
    for folder, kind in ((export, "an exported encoder"), (tiny_run, "a training run")):
        rc, _, err = run(capsys, "probe", *probe, *data, "--out", folder)
        one_line_error(rc, err, "probe", f"--out {folder} is {kind} folder")
        geometry = ["--encoder", export, "--task", "ptbxl-rhythm", "--nominal", "SR,STACH", "--anomalous", "AFIB"]
        rc, _, err = run(capsys, "geometry", *geometry, *data, "--out", folder)
        one_line_error(rc, err, "geometry", f"--out {folder} is {kind} folder")
    assert {folder: sorted(p.name for p in folder.iterdir()) for folder in (tiny_run, export)} == before
