"""Custom probe tasks (`--task custom:FOLDER`) on synthetic WFDB records: the raw baseline, a corrupt
record reported and left out, the CLI end to end, and the random-init twin of a trained encoder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import wfdb
from refusal_helpers import FAST, TINY0, run
from tiny_runs import pretrain_tiny

from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.probes.linear.features import raw_source
from ecgpos.probes.linear.run import ProbeConfig, make_jobs, prepare_task, run_jobs
from ecgpos.probes.shared.tasks import resolve_task


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


def probe_custom(capsys, folder: Path, tmp_path: Path, *flags) -> tuple[int, str, str]:
    """`ecgpos probe` on the custom task in `folder`, the 100 % fraction, cache and results under tmp_path."""
    common = ("--task", f"custom:{folder}", "--fractions", "100", "--cache-dir", tmp_path / "cache")
    return run(capsys, "probe", *flags, *common, "--out", tmp_path / "out")


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


@pytest.mark.skipif(not TINY0.is_file(), reason="configs/tiny/level0.yaml not written yet")
def test_custom_task_through_the_cli(capsys, tmp_path):
    folder = _custom_task(tmp_path / "synthetic")
    flags = ("--encoder", f"random:{TINY0}", "--seeds", "2", "--epochs", "3")
    rc, out, err = probe_custom(capsys, folder, tmp_path, *flags)
    assert rc == 0, err
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(results["task"].unique()) == ["custom:synthetic"] and len(results) == 2
    assert (results["n_train"] == 15).all()  # r000 is corrupt: reported, the rest evaluated
    assert "r000" in out and "| Encoder | synthetic |" in out


@pytest.mark.skipif(not TINY0.is_file(), reason="configs/tiny/stage0.yaml not written yet")
def test_probe_called_from_python_returns_what_results_csv_holds(tmp_path):
    from ecgpos.errors import EcgposError
    from ecgpos.probes.linear.cli import probe

    folder = _custom_task(tmp_path / "synthetic")
    out = tmp_path / "out"
    common = ["--task", f"custom:{folder}", "--fractions", "100", "--cache-dir", str(tmp_path / "cache")]
    done = probe(["--encoder", f"random:{TINY0}", "--seeds", "2", "--epochs", "3", *common, "--out", str(out)])
    results = pd.read_csv(out / "results.csv")
    assert done.out == out and [s.seed for s in done.scores] == list(results["seed"])
    assert [s.test_auroc for s in done.scores] == pytest.approx(list(results["test_auroc"]))
    assert done.mean_test_auroc() == pytest.approx(results["test_auroc"].mean())
    low, high = done.mean_interval()
    assert (low, high) == pytest.approx((results["mean_auroc_low"][0], results["mean_auroc_high"][0]))
    with pytest.raises(EcgposError, match="--compare"):
        probe(["--compare", str(out), "--out", str(tmp_path / "merged")])


def test_random_baseline_twin_has_same_arch_fresh_weights_and_its_own_row(capsys, tmp_path, arrhythmia_shards):
    from ecgpos.export.format import weights_hash
    from ecgpos.probes.shared.encoder import load_probe_encoder, random_twin

    enc = load_probe_encoder(f"random:{TINY0}")
    before = torch.get_rng_state()
    twin = random_twin(enc, seed=1)
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG is left as it was
    assert type(twin.module) is type(enc.module) and twin.arch == enc.arch
    assert weights_hash(twin.module) != weights_hash(enc.module)
    assert weights_hash(twin.module) == weights_hash(random_twin(enc, seed=1).module)  # seeded
    assert not any(p.requires_grad for p in twin.module.parameters())

    run_dir = tmp_path / "run"
    pretrain_tiny(0, arrhythmia_shards, run_dir, *FAST)
    folder = _custom_task(tmp_path / "synthetic")
    flags = ("--encoder", run_dir, "--name", "trained", "--random-baseline", "--seeds", "1", "--epochs", "2")
    rc, out, err = probe_custom(capsys, folder, tmp_path, *flags)
    assert rc == 0, err
    encoders = set(pd.read_csv(tmp_path / "out" / "results.csv")["encoder"])
    assert len(encoders) == 2 and "trained" in encoders, encoders
    assert any(name.startswith("random-init (") for name in encoders), encoders


@pytest.mark.skipif(not TINY0.is_file(), reason="configs/tiny/level0.yaml not written yet")
def test_custom_task_with_patients(capsys, tmp_path):
    """A `patient_id` column before `record`: a patient in two splits is refused, and a test split with
    patients of several recordings is bootstrapped by patient."""
    folder = _custom_task(tmp_path / "patients")
    for split in ("train", "val", "test"):
        frame = pd.read_csv(folder / f"{split}.csv")
        frame.insert(0, "patient_id", [f"{split}-{i // 2}" for i in range(len(frame))])  # two recordings each
        frame.to_csv(folder / f"{split}.csv", index=False)
    flags = ("--encoder", f"random:{TINY0}", "--seeds", "1", "--epochs", "2", "--bootstrap", "100")
    rc, _, err = probe_custom(capsys, folder, tmp_path, *flags)
    assert rc == 0, err
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert list(results["bootstrap_unit"]) == ["patient"]
    test = pd.read_csv(folder / "test.csv")
    test.loc[0, "patient_id"] = "train-3"
    test.to_csv(folder / "test.csv", index=False)
    rc, _, err = probe_custom(capsys, folder, tmp_path, *flags)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "patient train-3 has records in both train and test" in err
