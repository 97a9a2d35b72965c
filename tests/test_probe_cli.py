"""`ecgpos probe`: bad inputs, feature cache, custom tasks, --compare, and a full run on the sample data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import wfdb
from tiny_runs import cli, pretrain_tiny

from ecgpos.ecg.limbs import derived_limb_leads
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.resources import config_dir
from probes.features import encoder_source, raw_source
from probes.report import write_outputs, write_results
from probes.run import ProbeConfig, make_jobs, prepare_task, run_jobs
from probes.tasks import resolve_task

CONFIG_DIR = config_dir()

TINY = CONFIG_DIR / "tiny" / "stage0.yaml"


def _probe(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli("probe", *map(str, args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _probe_task(capsys, encoder, task: str, data_root: Path, splits: Path, out: Path, *extra) -> tuple[int, str, str]:
    """`ecgpos probe` on one task: exit code, stdout, stderr."""
    args = ("--encoder", encoder, "--task", task, "--data-root", data_root, "--splits", splits, "--out", out)
    return _probe(capsys, *args, *extra)


def _one_line_error(rc: int, err: str, needle: str) -> None:
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ecgpos probe: error:"), err
    assert needle in lines[0]


def test_unknown_task_is_one_line(capsys, shared_data, tmp_path):
    rc, _, err = _probe_task(
        capsys, f"random:{TINY}", "ptbxl-diagnostic", shared_data, shared_data / "merl_splits", tmp_path
    )
    _one_line_error(rc, err, "unknown task 'ptbxl-diagnostic'")


def test_splits_folder_without_files_is_one_line(capsys, shared_data, tmp_path):
    rc, _, err = _probe_task(capsys, f"random:{TINY}", "cpsc2018", shared_data, tmp_path, tmp_path / "out")
    _one_line_error(rc, err, "icbeb/icbeb_train.csv not found")


def test_class_column_mismatch_is_one_line(capsys, shared_data, tmp_path):
    shutil.copytree(shared_data / "merl_splits" / "icbeb", tmp_path / "icbeb")
    frame = pd.read_csv(tmp_path / "icbeb" / "icbeb_val.csv").rename(columns={"STD": "STDX"})
    frame.to_csv(tmp_path / "icbeb" / "icbeb_val.csv", index=False)
    rc, _, err = _probe_task(capsys, f"random:{TINY}", "cpsc2018", shared_data, tmp_path, tmp_path / "out")
    _one_line_error(rc, err, "missing STD; unexpected STDX")


def test_merl_splits_share_no_patient_and_a_shared_patient_is_one_line(capsys, shared_data, tmp_path):
    """PTB-XL's folds are drawn by patient; a val or test recording of a training patient was probed."""
    from probes.tasks import read_splits

    for name in ("ptbxl-super", "ptbxl-sub", "ptbxl-form", "ptbxl-rhythm", "cpsc2018"):
        tables = read_splits(resolve_task(name), shared_data / "merl_splits")  # MERL's files as published
        frames = {s: pd.read_csv(t.path, usecols=["patient_id"]) for s, t in tables.items()}
        ids = {s: set(f["patient_id"]) for s, f in frames.items()}
        assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"]), name
    folder = tmp_path / "ptbxl" / "super_class"
    shutil.copytree(shared_data / "merl_splits" / "ptbxl" / "super_class", folder)
    train = pd.read_csv(folder / "ptbxl_super_class_train.csv")
    test = pd.read_csv(folder / "ptbxl_super_class_test.csv")
    test.loc[5, "patient_id"] = train.loc[0, "patient_id"]  # another recording of a training patient
    test.to_csv(folder / "ptbxl_super_class_test.csv", index=False)
    rc, _, err = _probe_task(capsys, f"random:{TINY}", "ptbxl-super", shared_data, tmp_path, tmp_path / "out")
    _one_line_error(rc, err, f"patient {train.loc[0, 'patient_id']} has records in both train and test")


def test_unloadable_encoder_is_one_line(capsys, shared_data, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("not: a run\n")
    rc, _, err = _probe_task(
        capsys, tmp_path / "run", "cpsc2018", shared_data, shared_data / "merl_splits", tmp_path / "out"
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_require_complete_refuses_missing_records(capsys, shared_data, tmp_path):
    rc, _, err = _probe_task(
        capsys, f"random:{TINY}", "cpsc2018", shared_data, shared_data / "merl_splits", tmp_path, "--require-complete"
    )
    _one_line_error(rc, err, "cpsc2018 train: 4931 of 4950 records not found")


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


def _custom_task(folder: Path, n: int = 30) -> Path:
    """Synthetic WFDB records and a custom split folder: class 'fast' = higher heart rate."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    rows = []
    for i in range(n):
        fast = i % 2
        t = np.arange(5000) / 500.0
        beat = np.sin(2 * np.pi * (1.0 + fast) * t) ** 15
        sig = np.stack([beat * (1 + 0.1 * k) for k in range(12)], axis=1) + rng.normal(0, 0.05, (5000, 12))
        sig[:, 2:6] = derived_limb_leads(sig[:, 0], sig[:, 1]).T  # limb leads as a recorder stores them
        wfdb.wrsamp(
            f"r{i:03d}",
            fs=500,
            units=["mV"] * 12,
            sig_name=list(DEFAULT_SPEC.leads),
            p_signal=sig,
            fmt=["16"] * 12,
            write_dir=str(folder),
        )
        rows.append({"record": f"r{i:03d}", "fast": fast, "slow": 1 - fast})
    (folder / "r000.dat").write_bytes(b"\x00" * 10)  # one corrupt record: reported, not fatal
    frame = pd.DataFrame(rows)
    frame.iloc[:16].to_csv(folder / "train.csv", index=False)
    frame.iloc[16:23].to_csv(folder / "val.csv", index=False)
    frame.iloc[23:].to_csv(folder / "test.csv", index=False)
    return folder


def test_custom_task_with_raw_baseline_reports_failed_records(tmp_path):
    folder = _custom_task(tmp_path / "task")
    logged = []
    data, stats = prepare_task(
        resolve_task(f"custom:{folder}"),
        raw_source(DEFAULT_SPEC),
        tmp_path,
        None,
        tmp_path / "cache",
        ProbeConfig(),
        log=logged.append,
    )
    assert list(stats.failed) == ["r000"] and any("r000" in line for line in logged)
    assert len(data.x["train"]) == 15 and data.x["train"].shape[1] == 12 * 225
    cfg = ProbeConfig(seeds=2, fractions=(1.0,))
    rows = run_jobs(make_jobs("raw signal", data, cfg), workers=1)
    assert len(rows) == 2 and all(r["test_auroc"] > 0.9 for r in rows)


def test_compare_merges_result_folders(capsys, tmp_path):
    rng = np.random.default_rng(0)
    for name, signal in (("a", 2.0), ("b", 0.0)):
        rows = []
        for task in ("ptbxl-super", "cpsc2018"):
            for seed in range(2):
                rows.append(
                    {
                        "encoder": f"enc-{name}",
                        "task": task,
                        "fraction": 1.0,
                        "seed": seed,
                        "best_epoch": 3,
                        "val_auroc": 0.5 + signal / 5,
                        "test_auroc": 0.5 + signal / 5 + rng.normal(0, 0.01),
                        "excluded_val": "",
                        "excluded_test": "",
                        "test_auroc_per_class": "{}",
                        "note": "",
                    }
                )
        (tmp_path / name).mkdir()
        write_outputs(write_results(rows, tmp_path / name), tmp_path / name)
    rc, out, _ = _probe(capsys, "--compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "both")
    assert rc == 0
    summary = (tmp_path / "both" / "summary.md").read_text()
    assert "| enc-a |" in summary and "| enc-b |" in summary and "| Super | CPSC2018 |" in summary
    assert "Mean ± population std (ddof 0) over" in summary  # says which std a reviewer reads
    assert (tmp_path / "both" / "summary.png").stat().st_size > 1000
    assert len(pd.read_csv(tmp_path / "both" / "results.csv")) == 8
    assert "enc-a" in out


def _result_folder(folder: Path, encoder: str, tasks: tuple[str, ...], auroc: float) -> Path:
    """A probe output folder written by the report code from hand-made rows (2 seeds per task)."""
    rows = [
        {
            "encoder": encoder,
            "task": task,
            "fraction": 1.0,
            "seed": seed,
            "best_epoch": 2,
            "val_auroc": auroc,
            "test_auroc": auroc + seed / 100,
            "excluded_val": "",
            "excluded_test": "",
            "test_auroc_per_class": "{}",
            "note": "",
        }
        for task in tasks
        for seed in range(2)
    ]
    folder.mkdir(parents=True)
    write_outputs(write_results(rows, folder), folder)
    return folder


def test_compare_keeps_one_encoder_across_task_folders(capsys, tmp_path):
    # an array job: one folder per task, all probed with --name stage1
    super_ = _result_folder(tmp_path / "out" / "ptbxl-super", "stage1", ("ptbxl-super",), 0.8)
    cpsc = _result_folder(tmp_path / "out" / "cpsc2018", "stage1", ("cpsc2018",), 0.7)
    rc, out, err = _probe(capsys, "--compare", super_, cpsc, "--out", tmp_path / "merged")
    assert rc == 0, err
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "| Encoder | Super | CPSC2018 |" in summary
    assert "| stage1 | 0.8050 ± 0.0050 | 0.7050 ± 0.0050 |" in summary
    assert "[" not in summary and summary in out
    assert (tmp_path / "merged" / "summary.png").stat().st_size > 1000
    merged = pd.read_csv(tmp_path / "merged" / "results.csv")
    assert set(merged["encoder"]) == {"stage1"} and len(merged) == 4


def test_compare_renames_only_a_repeated_encoder_task_fraction(capsys, tmp_path):
    first = _result_folder(tmp_path / "run1", "stage1", ("ptbxl-super", "cpsc2018"), 0.8)
    other = _result_folder(tmp_path / "other", "stage1", ("ptbxl-rhythm",), 0.9)
    again = _result_folder(tmp_path / "run2", "stage1", ("ptbxl-super",), 0.6)
    rc, out, err = _probe(capsys, "--compare", first, other, again, "--out", tmp_path / "merged")
    assert rc == 0, err
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "| Encoder | Super | Rhythm | CPSC2018 |" in summary
    assert "| stage1 | 0.8050 ± 0.0050 | 0.9050 ± 0.0050 | 0.8050 ± 0.0050 |" in summary
    assert "| stage1 [run2] | 0.6050 ± 0.0050 | — | — |" in summary
    assert "stage1 [run2]: rows of" in summary  # the rename is explained under Notes
    assert (tmp_path / "merged" / "summary.png").stat().st_size > 1000
    merged = pd.read_csv(tmp_path / "merged" / "results.csv")
    assert merged.groupby("encoder").size().to_dict() == {"stage1": 6, "stage1 [run2]": 2}


@pytest.mark.skipif(not TINY.is_file(), reason="configs/tiny/stage0.yaml not written yet")
def test_done_when_run_on_sample_data(capsys, shared_data, tmp_path):
    args = [
        "--encoder",
        f"random:{TINY}",
        "--task",
        "all",
        "--data-root",
        shared_data,
        "--splits",
        shared_data / "merl_splits",
        "--fractions",
        "100",
        "--seeds",
        "2",
        "--epochs",
        "3",
        "--workers",
        "1",
        "--cache-dir",
        tmp_path / "cache",
        "--out",
        tmp_path / "out",
        "--raw-baseline",
    ]
    rc, out, err = _probe(capsys, *args)
    assert rc == 0, err
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(results) == 2 * 5 * 2  # (encoder + raw) x tasks x seeds
    assert set(results["task"]) == {"ptbxl-super", "ptbxl-sub", "ptbxl-form", "ptbxl-rhythm", "cpsc2018"}
    assert (results[results["task"] == "ptbxl-super"]["n_train"] == 124).all()
    assert "| Encoder | Super | Sub | Form | Rhythm | CPSC2018 |" in (tmp_path / "out" / "summary.md").read_text()
    assert "| Encoder | Super |" in out
    assert (tmp_path / "out" / "summary.png").is_file()
    info = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert sum(v["extracted"] for v in info["extraction"].values()) > 0
    rc, _, err = _probe(capsys, *args[:-2], tmp_path / "again", "--raw-baseline")
    assert rc == 0, err
    again = json.loads((tmp_path / "again" / "probe.json").read_text())
    assert sum(v["extracted"] for v in again["extraction"].values()) == 0
    pd.testing.assert_frame_equal(results, pd.read_csv(tmp_path / "again" / "results.csv"))


@pytest.mark.skipif(not TINY.is_file(), reason="configs/tiny/stage0.yaml not written yet")
def test_custom_task_through_the_cli(capsys, tmp_path):
    folder = _custom_task(tmp_path / "synthetic")
    rc, out, err = _probe(
        capsys,
        "--encoder",
        f"random:{TINY}",
        "--task",
        f"custom:{folder}",
        "--seeds",
        "2",
        "--epochs",
        "3",
        "--fractions",
        "100",
        "--cache-dir",
        tmp_path / "cache",
        "--out",
        tmp_path / "out",
    )
    assert rc == 0, err
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(results["task"].unique()) == ["custom:synthetic"] and len(results) == 2
    assert (results["n_train"] == 15).all()  # r000 is corrupt: reported, the rest evaluated
    assert "r000" in out and "| Encoder | synthetic |" in out


def test_random_baseline_twin_has_same_arch_fresh_weights_and_its_own_row(capsys, tmp_path, arrhythmia_shards):
    from ecgpos.export.format import weights_hash
    from probes.encoder import load_probe_encoder, random_twin

    enc = load_probe_encoder(f"random:{TINY}")
    before = torch.get_rng_state()
    twin = random_twin(enc, seed=1)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is left as it was
    assert type(twin.module) is type(enc.module) and twin.arch == enc.arch
    assert weights_hash(twin.module) != weights_hash(enc.module)
    assert weights_hash(twin.module) == weights_hash(random_twin(enc, seed=1).module)  # seeded
    assert not any(p.requires_grad for p in twin.module.parameters())

    run = tmp_path / "run"
    pretrain_tiny(
        0,
        arrhythmia_shards,
        run,
        "--set",
        "optim.steps=2",
        "--set",
        "train.batch_size=4",
        "--set",
        "train.num_workers=0",
    )
    folder = _custom_task(tmp_path / "synthetic")
    rc, out, err = _probe(
        capsys,
        "--encoder",
        run,
        "--name",
        "trained",
        "--random-baseline",
        "--task",
        f"custom:{folder}",
        "--seeds",
        "1",
        "--epochs",
        "2",
        "--fractions",
        "100",
        "--cache-dir",
        tmp_path / "cache",
        "--out",
        tmp_path / "out",
    )
    assert rc == 0, err
    encoders = set(pd.read_csv(tmp_path / "out" / "results.csv")["encoder"])
    assert len(encoders) == 2 and "trained" in encoders, encoders
    assert any(name.startswith("random-init (") for name in encoders), encoders
