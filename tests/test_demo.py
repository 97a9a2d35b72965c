"""`ecgpos demo --quick` end to end, from the installed wheel alone: the README's main job, on the
synthetic corpus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from installed_wheel import build_wheel, installed_env

import ecgpos
from ecgpos.demo.demo import PROBE_TASK, QUICK
from ecgpos.ecg.limbs import derived_limb_leads


@pytest.mark.slow
def test_demo_quick_runs_every_level(tmp_path: Path) -> None:
    env = installed_env(build_wheel(tmp_path / "build"), tmp_path / "installed")
    out = tmp_path / "demo"
    # its own session, outside the checkout: a demo past the time limit is killed with its simulation workers
    proc = subprocess.Popen(
        [sys.executable, "-m", "ecgpos", "demo", "--quick", "--out", str(out)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:  # a few minutes on 2 idle cores; a loaded machine has taken 20
        stdout, stderr = proc.communicate(timeout=1800)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    assert f"Exported encoder: {out / 'export' / 'nested-encoder'}" in stdout and "demo finished in" in stderr

    # The real readers ran on the real layouts: every simulated record is accounted for.
    ningbo = json.loads((out / "shards" / "ningbo" / "preprocess.json").read_text())
    code15 = json.loads((out / "shards" / "code15" / "preprocess.json").read_text())
    assert pd.read_csv(out / "shards" / "ningbo" / "index.csv").shape[0] == QUICK.wfdb_records, ningbo
    assert pd.read_csv(out / "shards" / "code15" / "index.csv").shape[0] == QUICK.code15_exams, code15
    with h5py.File(next((out / "shards" / "code15").glob("shard-*.h5"))) as f:
        assert f["signals"].shape[1:2] == (12,) and f["signals"].shape[2] >= 2250
        assert int(f.attrs["fs"]) == 250

    # carve trained both levels to their step counts, measured the criterion after each and tabulated it.
    for level, steps in ((0, QUICK.level0_steps), (1, QUICK.latent_steps)):
        info = json.loads((out / "runs" / f"level{level}" / "run_info.json").read_text())
        assert info["finished"] and info["step"] == steps
        assert list((out / "runs" / f"level{level}" / "figures").glob("*.png"))
    carved = json.loads((out / "runs" / "carve.json").read_text())["levels"]
    assert [r["level"] for r in carved] == list(range(QUICK.levels))
    assert all(0 <= r["criterion"] <= 1 and 0 <= r["probe_auroc"] <= 1 for r in carved)
    assert set(carved[1]["geometry"]) == {"D_inter", "R", "S", "rho", "d_samp", "d_pool", "IC"}
    assert "# Carving to depth" in stdout and "Decision after level 1" in stdout
    assert all(r["perturbation_over_error"] > 0 and 0 <= r["pass_through"] for r in carved)
    # the default stop rules decided first (their verdict printed), and the join-anomaly AUROC sits beside the
    # criterion of every level
    table = (out / "scores" / "carving.md").read_text()
    assert "carve's default stop rules stopped after level" in stdout and table in stdout
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith(("| 0 |", "| 1 |"))]
    assert len(rows) == 2 and all(0 <= float(row[-1].rstrip(" |")) <= 1 for row in rows)
    assert len(pd.read_csv(out / "scores" / "join.csv")) == QUICK.probe_per_class

    # The probe table has all three encoders on the synthetic task, with AUROCs in [0, 1].
    results = pd.read_csv(out / "probes" / "summary" / "results.csv")
    assert set(results["encoder"]) == {"random-init", "level0", "level1"}
    assert results["task"].str.contains(PROBE_TASK).all()
    assert results["test_auroc"].between(0, 1).all()
    assert (out / "probes" / "summary" / "summary.png").stat().st_size > 1000
    assert "random-init" in stdout and "level1" in stdout
    assert "--quick: fine-tuning skipped" in stdout  # the full demo adds a fine-tuned row of the top level

    # Geometry between the levels and the per-level anomaly AUROCs were computed and printed.
    metrics = pd.read_csv(out / "runs" / "geometry" / "level1" / "metrics.csv")
    assert list(metrics["level"]) == [1] * 7
    assert list(metrics["metric"]) == ["D_inter", "R", "S", "rho", "d_samp", "d_pool", "IC"]
    assert np.isfinite(metrics[["x", "x_hat", "delta_pct"]].to_numpy()).all()
    geo = np.load(out / "runs" / "geometry" / "level1" / "features.npz")
    assert set(geo["labels"]) == {"brady", "normal", "tachy", "noisy"}
    scores = pd.read_csv(out / "scores" / "scores.csv")
    assert list(scores.columns) == ["record_id", "level0_score", "level1_score"]
    assert len(scores) == 3 * QUICK.probe_per_class
    assert "| level1 |" in (out / "scores" / "scores.summary.md").read_text()
    assert "Delta S > 0" in stdout and "AUROC" in stdout

    # The exported nested encoder loads and embeds a raw record.
    encoder = ecgpos.load_encoder(out / "export" / "nested-encoder")
    record = np.random.default_rng(0).normal(size=(12, 5000)).astype(np.float32)
    record[2:6] = derived_limb_leads(record[0], record[1])  # limb leads as a recorder stores them
    features = encoder.embed(record, fs=500, leads=list(encoder.spec.leads))
    assert features.shape == (encoder.width,) and np.isfinite(features).all()
