"""Configs and the pretraining command line at their edges: YAML keys that are not names, integers
written as PyYAML text, `--set` of a whole section, empty sections, resuming a run whose config.yaml
is gone, models and worker counts no machine can hold, and `preprocess --num-parts 0`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from refusal_helpers import FAST, PRETRAIN, TINY0, one_line_error, run

from ecgpos.errors import ConfigError
from ecgpos.runs.run_config import load_run_config


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text", ["1: 2\n", "? null\n: 3\n", "optim:\n  ? [a]\n  : 1\n", "optim:\n  0.5: 1\n"])
def test_yaml_keys_that_are_not_names_are_one_line(capsys, tmp_path, tiny_shards, text):
    path = _yaml(tmp_path, "level: 0\n" + text)
    with pytest.raises(ConfigError, match="is not a name"):
        load_run_config(path)
    run_dir = tmp_path / "run"
    rc, _, err = run(capsys, *PRETRAIN, "--config", path, "--shards", tiny_shards, "--run-dir", run_dir, *FAST)
    one_line_error(rc, err, "pretrain", "is not a name")
    assert not run_dir.exists()


def test_integers_written_in_exponent_notation_are_read_exactly(tmp_path):
    # PyYAML reads `1.5e5` and `1e2` as text; they are exact integers all the same
    cfg = load_run_config(_yaml(tmp_path, "optim:\n  steps: 1.5e5\n  warmup_steps: 1e2\n"))
    assert (cfg.optim.steps, cfg.optim.warmup_steps) == (150_000, 100)
    assert load_run_config("tiny/level0", ["optim.steps=2e3"]).optim.steps == 2000
    for bad in ("2.5", "1e-3", "1e400", "ten", "nan"):
        with pytest.raises(ConfigError, match="optim.steps: expected an integer"):
            load_run_config("tiny/level0", [f"optim.steps={bad}"])


def test_set_of_a_whole_section_changes_only_the_keys_it_names():
    cfg = load_run_config("tiny/level0", ["optim={lr: 0.002}", "train={seed: 3}"])
    assert (cfg.optim.lr, cfg.optim.steps, cfg.optim.warmup_steps) == (0.002, 200, 20)  # steps stay the file's
    assert (cfg.train.seed, cfg.train.batch_size) == (3, 16)
    assert load_run_config("tiny/level0", ["optim={}"]).optim == load_run_config("tiny/level0").optim
    with pytest.raises(ConfigError, match="optim: expected a mapping, got 3"):
        load_run_config("tiny/level0", ["optim=3"])


def test_a_section_whose_keys_are_all_commented_out_takes_its_defaults(tmp_path):
    path = _yaml(tmp_path, "level: 0\noptim:\n  # lr: 1.0e-3\ntrain:\n")
    cfg = load_run_config(path, ["optim.steps=7"])
    defaults = load_run_config(None)
    assert cfg.optim.steps == 7 and cfg.optim.lr == defaults.optim.lr and cfg.train == defaults.train


@pytest.mark.parametrize("edit", ["missing", "empty"])
def test_resume_refuses_a_run_without_its_config(capsys, tmp_path, tiny_shards, tiny_run, edit):
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    if edit == "missing":
        (copy / "config.yaml").unlink()
    else:
        (copy / "config.yaml").write_text("")
    before = (copy / "metrics.jsonl").read_text()
    steps = ["--set", "optim.steps=6", "--set", "train.checkpoint_every=2", "--set", "optim.lr=0.005"]
    args = [*PRETRAIN, "--shards", tiny_shards, "--run-dir", copy, *FAST, *steps, "--resume", "auto"]
    rc, _, err = run(capsys, *args)
    one_line_error(rc, err, "pretrain", f"config.yaml is {edit}")
    assert (copy / "metrics.jsonl").read_text() == before
    assert not (copy / "config.yaml").exists() or (copy / "config.yaml").read_text() == ""


@pytest.mark.parametrize(
    "override, needle",
    [
        ("encoder.width=1000000000000", "more than this machine's"),
        ("encoder.depth=100000000000", "more than this machine's"),
        ("decoder.width=1000000000000", "more than this machine's"),
        ("encoder.mlp_ratio=1.0e12", "more than this machine's"),
        (f"encoder.width={10**400}", "an overflowing number of parameters"),
        ("train.num_workers=100000", "train.num_workers 100000"),
    ],
)
def test_sizes_no_machine_can_hold_are_refused_before_the_run(capsys, tmp_path, tiny_shards, override, needle):
    run_dir = tmp_path / "run"
    rc, _, err = run(capsys, *PRETRAIN, "--shards", tiny_shards, "--run-dir", run_dir, *FAST, "--set", override)
    one_line_error(rc, err, "pretrain", needle)
    assert not run_dir.exists()


def test_preprocess_refuses_zero_parts(capsys, tmp_path, shared_data):
    out = tmp_path / "shards"
    src = shared_data / "ecg-arrhythmia"
    rc, _, err = run(capsys, "preprocess", "ecg-arrhythmia", "--src", src, "--out", out, "--num-parts", "0")
    one_line_error(rc, err, "preprocess", "--num-parts must be at least 1, got 0")
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, needle",
    [
        # scipy took hours on the design, or every record was skipped as `unreadable` (order 1e20),
        # `too_short` (a singular filter) or `sampling_rate` (an output rate no record reaches)
        (["--set", "filter_order=99999999999999999999"], "preprocess.filter_order must be at most 100"),
        (["--set", "highpass_hz=1e-300"], "no usable Butterworth band-pass of order 4"),
        (["--set", "fs=99999999999999999999"], "above the highest supported rate"),
        (["--spec", "{tmp}"], "is a folder, not a YAML file"),  # was "config file not found"
    ],
    ids=["filter-order", "highpass", "fs", "spec-folder"],
)
def test_preprocess_refuses_a_spec_no_record_can_be_filtered_with(capsys, tmp_path, shared_data, extra, needle):
    out = tmp_path / "shards"
    src = shared_data / "ecg-arrhythmia"
    extra = [str(a).replace("{tmp}", str(tmp_path)) for a in extra]
    rc, _, err = run(capsys, "preprocess", "ecg-arrhythmia", "--src", src, "--subset", "all", "--out", out, *extra)
    one_line_error(rc, err, "preprocess", needle)
    assert not out.exists()


def test_preprocess_refuses_more_workers_than_the_machine_serves(capsys, tmp_path, shared_data, monkeypatch):
    """The worker pool starts every process at once: `--workers 99999999999999999999` forked until the
    machine gave out. The limit is the pretraining one (4 per CPU, at least 16); lowered here so that
    the code under test never starts more than 3 processes."""
    import ecgpos.preprocessing.build

    monkeypatch.setattr(ecgpos.preprocessing.build, "max_workers", lambda: 2)
    out = tmp_path / "shards"
    args = ["preprocess", "ecg-arrhythmia", "--src", shared_data / "ecg-arrhythmia", "--out", out, "--workers", "3"]
    rc, _, err = run(capsys, *args)
    one_line_error(rc, err, "preprocess", "--workers 3 is more than this machine's")
    assert not out.exists()


@contextlib.contextmanager
def unreadable(path: Path) -> Iterator[None]:
    """`path` unreadable inside the block: mode 000 and, for root (which reads any file), the effective
    uid of nobody."""
    path.chmod(0)
    as_root = os.geteuid() == 0
    if as_root:
        os.seteuid(65534)
    try:
        yield
    finally:
        if as_root:
            os.seteuid(0)
        path.chmod(0o644)


def test_a_file_the_user_may_not_read_is_one_line(capsys, tmp_path):
    config = tmp_path / "level0.yaml"
    shutil.copy(TINY0, config)
    with unreadable(config):
        rc, _, err = run(capsys, *PRETRAIN[:3], "--config", config, "--check-config")
    one_line_error(rc, err, "pretrain", f"permission denied: {config}")


def test_weights_the_user_may_not_read_say_so():
    from safetensors.torch import save_file

    from ecgpos.errors import EcgposError
    from ecgpos.files import read_safetensors

    folder = Path(tempfile.mkdtemp(dir="/tmp"))  # a folder anyone may enter (pytest's own are owner-only)
    try:
        folder.chmod(0o755)
        path = folder / "model.safetensors"
        save_file({"w": torch.zeros(2)}, str(path))
        with unreadable(path), pytest.raises(EcgposError, match="permission denied: .* is not readable"):
            read_safetensors(path)  # safetensors itself reports "No such file or directory"
    finally:
        shutil.rmtree(folder)
