"""The slurm/ scripts against a real one-node Slurm cluster (slurmctld + slurmd + munged on this machine).

`-m slurm` runs these alone. The cluster is brought up once for this module (tests/conftest.py's
`slurm_cluster`) by tests/slurm_cluster.py, which installs Debian's slurm-wlm + munge through
slurm/ci/install.sh when they are missing and we are root. The scripts' checks that need no cluster are in
tests/test_slurm_scripts.py; `--depth auto` on the cluster is in tests/test_slurm_depth_auto.py.
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from code15_fixtures import FS as CODE15_FS
from code15_fixtures import ecg_like, exam_row, padded_trace, write_exams_csv, write_part
from slurm_cluster import PAPER_CHAIN, SlurmCluster, probe_data_stand_ins
from slurm_jobs import SLURM, TINY, job_env, job_logs, job_records, submit_pipeline, train_steps, wait_all


def _checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*") if p.name[5:].isdigit())


def _tiny_code15(root: Path, exams: int = 80) -> Path:
    """A one-part CODE-15 corpus of `exams` 10 s exams (ids 2000001...), written as the published layout."""
    ids = list(range(2_000_001, 2_000_001 + exams))
    traces = [padded_trace(ecg_like(int(10 * CODE15_FS), CODE15_FS, seed=i)) for i in range(exams)]
    write_part(root, 0, ids, traces)
    write_exams_csv(root, [exam_row(i, 0) for i in ids])
    return root


# -- the whole chain -------------------------------------------------------------------------------------------
@pytest.mark.slurm
def test_pipeline_runs_the_whole_chain(slurm_cluster: SlurmCluster, shared_data: Path, tmp_path: Path) -> None:
    """The paper's workflow: Ningbo-style ecg-arrhythmia + CODE-15 preprocessed side by side and pooled for
    every level, every level probed, and the merged summary comparing level 1 with level 0."""
    work = tmp_path / "work"
    probe_tasks = "ptbxl-super cpsc2018"
    steps = 50  # the tiny configs with fewer steps (200 each would add minutes to CI)
    code15 = _tiny_code15(tmp_path / "code15")
    env = job_env(
        slurm_cluster,
        work,
        ECGPOS_PRETRAIN_SET=f"optim.steps={steps} train.checkpoint_every={steps // 2} train.figure_every={steps}",
        # the samples are Chapman records: --subset all (the default, ningbo, is the paper's pool)
        ECGPOS_CORPORA=f"ecg-arrhythmia={shared_data / 'ecg-arrhythmia'} code15={code15}",
        ECGPOS_SUBSET="all",
        ECGPOS_PREPROCESS_PARTS="2",
        ECGPOS_PREPROCESS_ARGS="--records-per-shard 64",
        ECGPOS_DATA_ROOT=str(shared_data),
        ECGPOS_PROBE_TASKS=probe_tasks,
        ECGPOS_PROBE_ARGS=f"--seeds 1 --epochs 2 --fractions 100 --cache-dir {tmp_path / 'cache'}",
    )
    started = time.monotonic()
    jobs = submit_pipeline(slurm_cluster, env, tmp_path)
    assert list(jobs) == list(PAPER_CHAIN)
    # each job waits on the ones it reads from: a corpus's check on its parts, level 0 on both checks, each
    # encoder's probes on the level that makes it, the merge on all probes
    for step, before in PAPER_CHAIN.items():
        if not before:
            continue
        dep = job_records(slurm_cluster, jobs[step])[0].get("Dependency", "")
        # a dependency already satisfied is dropped from the record
        assert dep == "(null)" or all(jobs[b] in dep for b in before), (step, dep)
    wait_all(slurm_cluster, jobs, work, timeout=900)
    print(f"chain finished in {time.monotonic() - started:.0f}s")

    # shards: every record of each corpus stored or skipped, in its own folder, both array parts did work
    import pandas as pd

    for corpus, found in (("ecg-arrhythmia", 200), ("code15", 80)):  # 64 records a shard
        shards = work / "shards" / corpus
        index = pd.read_csv(shards / "index.csv")
        skipped = pd.read_csv(shards / "skipped.csv")
        assert len(index) + len(skipped) == found and len(index) > 0.75 * found, (corpus, skipped)
        assert index["record_id"].is_unique
        assert len(list(shards.glob("shard-*.h5"))) >= 2
        logs = "\n".join(p.read_text() for p in (work / "logs").glob(f"ecgpos-preprocess-{corpus}-*"))
        assert "--part 0 --num-parts 2" in logs and "--part 1 --num-parts 2" in logs, corpus
    pooled = [str((work / "shards" / corpus).resolve()) for corpus in ("ecg-arrhythmia", "code15")]

    # every level finished at their configured step counts, with checkpoints, on the pool of both corpora
    for level in (0, 1):
        run = work / "runs" / f"level{level}"
        info = json.loads((run / "run_info.json").read_text())
        assert info["finished"] is True and info["step"] == steps, info
        assert info["shards"] == pooled, info["shards"]
        assert _checkpoint_steps(run) == [steps // 2, steps]
        assert (
            yaml.safe_load((run / "config.yaml").read_text())["encoder"]["width"]
            == yaml.safe_load((TINY / f"level{level}.yaml").read_text())["encoder"]["width"]
        )
        assert (run / "metrics.jsonl").stat().st_size > 0

    # probes: each encoder's folder per task, one row per encoder and task in the merged summary, each a real
    # AUROC, and level 1 minus level 0 on every task with its paired interval
    probes = work / "probes"
    for encoder in ("level0", "level1"):
        for task in probe_tasks.split():
            assert (probes / encoder / task / "results.csv").is_file(), (encoder, task)
    results = pd.read_csv(probes / "summary" / "results.csv")
    assert set(zip(results["encoder"], results["task"])) == {
        (e, t) for e in ("level0", "level1") for t in probe_tasks.split()
    }
    assert all(0.0 <= v <= 1.0 for v in results["test_auroc"]) and not any(math.isnan(v) for v in results["test_auroc"])
    diffs = pd.read_csv(probes / "summary" / "differences.csv")
    assert set(zip(diffs["encoder"], diffs["baseline"], diffs["task"])) == {
        ("level1", "level0", t) for t in probe_tasks.split()
    }
    assert all(low <= d <= high for d, low, high in zip(diffs["difference"], diffs["low"], diffs["high"]))
    summary = (probes / "summary" / "summary.md").read_text()
    assert "Paired differences" in summary and "(published)" in summary  # the merge's --reference paper

    # export: a loadable nested encoder that embeds a signal
    import torch

    from ecgpos.export.load import load_encoder

    export = work / "export"
    config = json.loads((export / "config.json").read_text())
    assert config["format"] == "ecgpos-encoder" and config["arch"]["kind"] == "nested"
    encoder = load_encoder(export)
    feats = encoder.forward_features(torch.zeros(1, 12, encoder.spec.window))
    assert feats.shape == (1, encoder.width) and torch.isfinite(feats).all()


# -- preemption: USR1 -> checkpoint -> requeue -> resume ---------------------------------------------------------
@pytest.mark.slurm
def test_preempted_pretraining_resumes_without_losing_or_repeating_steps(
    slurm_cluster: SlurmCluster, arrhythmia_shards: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    steps = 150  # ~25 s of tiny steps on one CPU: time to see progress and signal mid-run
    env = job_env(
        slurm_cluster,
        work,
        ECGPOS_STEPS="level0",
        ECGPOS_SHARDS=str(arrhythmia_shards),
        # log every step; no periodic checkpoint, so the only one before the end is the preemption's
        ECGPOS_PRETRAIN_SET=f"optim.steps={steps} optim.warmup_steps=5 train.log_every=1 "
        f"train.checkpoint_every={steps} train.figure_every={steps}",
    )
    jobs = submit_pipeline(slurm_cluster, env, tmp_path)
    job = jobs["level0"]
    run = work / "runs" / "level0"

    # wait for real progress, then preempt the way Slurm does before a time limit: USR1 to the batch shell
    deadline = time.monotonic() + 300
    while not ((run / "metrics.jsonl").is_file() and len(train_steps(run)) >= 3):
        state = job_records(slurm_cluster, job)[0].get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} {state} before training\n{job_logs(work)}"
        assert time.monotonic() < deadline, f"no training progress\n{job_logs(work)}"
        time.sleep(0.5)
    signalled_at = train_steps(run)[-1]
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)

    wait_all(slurm_cluster, jobs, work, timeout=600)
    record = job_records(slurm_cluster, job)[0]
    assert int(record["Restarts"]) == 1, record
    log = "\n".join(p.read_text() for p in (work / "logs").glob("ecgpos-level0-*.out"))
    assert "requeueing" in log, log
    assert f"compiled kernels (train.compile) are cached in {work / 'compile-cache'}" in log, log

    # one checkpoint written on the signal (before the end), then the final one
    ckpts = _checkpoint_steps(run)
    assert len(ckpts) >= 2 and signalled_at <= ckpts[0] < steps and ckpts[-1] == steps, ckpts
    # every step trained exactly once, in order, across the two runs of the job
    trained = train_steps(run)
    assert trained == list(range(1, steps + 1)), trained
    info = json.loads((run / "run_info.json").read_text())
    assert info["finished"] is True and info["step"] == steps


# -- a submission refused half-way leaves nothing in the queue ---------------------------------------------------
@pytest.mark.slurm
def test_pipeline_cancels_submitted_jobs_when_a_later_submission_fails(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    data = probe_data_stand_ins(tmp_path)
    # the test node has no GPUs, so sbatch refuses the level-0 job's --gres=gpu:1 after preprocess and check
    env = job_env(
        slurm_cluster,
        work,
        ECGPOS_STEPS="preprocess check level0",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_GPUS_PER_NODE="1",
    )
    proc = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "level0" in proc.stderr.strip().splitlines()[-1], proc.stderr
    jobs = dict(line.split() for line in proc.stdout.splitlines())
    assert list(jobs) == ["preprocess", "check"], proc.stdout
    deadline = time.monotonic() + 60
    while True:
        states = {r.get("JobState") for jid in jobs.values() for r in job_records(slurm_cluster, jid)}
        if states == {"CANCELLED"}:
            break
        assert time.monotonic() < deadline, f"jobs of the refused chain still in the queue: {states}"
        time.sleep(1)


# -- one chain per work folder at a time -------------------------------------------------------------------------
@pytest.mark.slurm
def test_pipeline_refuses_a_second_chain_for_a_work_folder_still_in_the_queue(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    (work / "shards").mkdir(parents=True)
    # held jobs stay in the queue, like a chain whose level 0 is still training
    env = job_env(slurm_cluster, work, ECGPOS_STEPS="check", ECGPOS_SBATCH_ARGS="--hold")
    first = submit_pipeline(slurm_cluster, env, tmp_path)
    try:
        proc = subprocess.run(
            ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and first["check"] in lines[0] and "ECGPOS_WORK" in lines[0], proc.stderr
        # another work folder is another chain
        other = submit_pipeline(slurm_cluster, {**env, "ECGPOS_WORK": str(tmp_path / "other")}, tmp_path)
        slurm_cluster.run("scancel", other["check"])
    finally:
        slurm_cluster.run("scancel", first["check"])
