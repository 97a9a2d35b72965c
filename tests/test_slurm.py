"""The slurm/ scripts against a real one-node Slurm cluster (slurmctld + slurmd + munged on this machine).

`-m slurm` runs these alone. The cluster is brought up once for this module by tests/slurm_cluster.py (which
installs Debian's slurm-wlm + munge through slurm/ci/install.sh when they are missing and we are root).
The scripts' checks that need no cluster are in tests/test_slurm_scripts.py.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from code15_fixtures import FS as CODE15_FS
from code15_fixtures import ecg_like, exam_row, padded_trace, write_exams_csv, write_part
from slurm_cluster import PAPER_CHAIN, ClusterError, SlurmCluster, missing_binaries, probe_data_stand_ins

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "slurm"
TINY = REPO / "configs" / "tiny"
CI = os.environ.get("CI", "").lower() == "true"
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running one-node cluster for this module's tests; skipped where it cannot run (a failure under CI)."""
    reason = None
    if os.geteuid() != 0:
        reason = "the test Slurm cluster needs root"
    elif missing_binaries() and not (SLURM / "ci" / "install.sh").exists():
        reason = "slurm-wlm/munge missing"
    if reason:
        if CI:
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = SlurmCluster()
    try:
        cluster.start()
    except ClusterError as err:
        pytest.fail(f"could not bring up the Slurm cluster: {err}")
    yield cluster
    cluster.stop()


# -- helpers ---------------------------------------------------------------------------------------------------
def _job_env(cluster: SlurmCluster, work: Path, **extra: str) -> dict[str, str]:
    """Environment for pipeline.sh: this interpreter's ecgpos, CPU only, one CPU per job, outputs in `work`."""
    env = dict(cluster.env)
    # torch writes Inductor's default cache folder into this process's environment once Inductor has run;
    # a login shell has none, and the jobs then use the scripts' default
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.update(
        {
            "ECGPOS_SETUP": f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH",
            "ECGPOS_WORK": str(work),
            "ECGPOS_LOG_DIR": str(work / "logs"),
            "ECGPOS_GPUS_PER_NODE": "0",
            "ECGPOS_PREPROCESS_CPUS": "1",
            "ECGPOS_PRETRAIN_CPUS": "1",
            "ECGPOS_PROBE_CPUS": "1",
            "ECGPOS_STAGE0_CONFIG": str(TINY / "stage0.yaml"),
            "ECGPOS_STAGE1_CONFIG": str(TINY / "stage1.yaml"),
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra)
    return env


def _submit(cluster: SlurmCluster, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Run slurm/pipeline.sh; returns {step: job id} from its "STEP JOBID" lines."""
    proc = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"pipeline.sh failed:\n{proc.stdout}\n{proc.stderr}"
    jobs = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
    assert all(v.isdigit() for v in jobs.values()), proc.stdout
    return jobs


def _job_records(cluster: SlurmCluster, job_id: str) -> list[dict[str, str]]:
    """`scontrol -o show job` as dicts, one per job (an array gives one per task)."""
    out = cluster.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
    records = []
    for line in out.splitlines():
        fields = {}
        for token in line.split():
            if "=" in token:
                k, v = token.split("=", 1)
                fields[k] = v
        records.append(fields)
    return records


def _logs(work: Path, n: int = 40) -> str:
    parts = []
    for log in sorted((work / "logs").glob("*.out")):
        lines = log.read_text(errors="replace").splitlines()[-n:]
        parts.append(f"== {log.name}\n" + "\n".join(lines))
    return "\n".join(parts)


def _wait_all(cluster: SlurmCluster, jobs: dict[str, str], work: Path, timeout: float) -> None:
    """Wait until every job reached a final state; assert all COMPLETED with exit code 0."""
    deadline = time.monotonic() + timeout
    while True:
        records = {step: _job_records(cluster, jid) for step, jid in jobs.items()}
        pending = [s for s, rs in records.items() if not rs or any(r.get("JobState") not in FINAL_STATES for r in rs)]
        if not pending:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"jobs still not done after {timeout:.0f}s: {pending}\n{_logs(work)}\n{cluster.log_tail()}")
        time.sleep(2)
    bad = {
        s: [(r.get("JobId"), r.get("JobState"), r.get("ExitCode"), r.get("Reason")) for r in rs]
        for s, rs in records.items()
        if any(r["JobState"] != "COMPLETED" or r.get("ExitCode") != "0:0" for r in rs)
    }
    assert not bad, f"jobs did not complete: {bad}\n{_logs(work)}"


def _train_steps(run_dir: Path) -> list[int]:
    """Steps of the training records (those with a loss) in metrics.jsonl, in file order."""
    lines = (run_dir / "metrics.jsonl").read_text().split("\n")
    steps = []
    for line in lines[:-1]:  # the part after the last newline may still be being written
        rec = json.loads(line)
        if "loss" in rec:
            steps.append(int(rec["step"]))
    return steps


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
    both stages, both stages probed, and the merged summary comparing Stage 1 with Stage 0."""
    work = tmp_path / "work"
    probe_tasks = "ptbxl-super cpsc2018"
    steps = 50  # the tiny configs with fewer steps (200 each would add minutes to CI)
    code15 = _tiny_code15(tmp_path / "code15")
    env = _job_env(
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
    jobs = _submit(slurm_cluster, env, tmp_path)
    assert list(jobs) == list(PAPER_CHAIN)
    # each job waits on the ones it reads from: a corpus's check on its parts, Stage 0 on both checks, each
    # encoder's probes on the stage that makes it, the merge on all probes
    for step, before in PAPER_CHAIN.items():
        if not before:
            continue
        dep = _job_records(slurm_cluster, jobs[step])[0].get("Dependency", "")
        # a dependency already satisfied is dropped from the record
        assert dep == "(null)" or all(jobs[b] in dep for b in before), (step, dep)
    _wait_all(slurm_cluster, jobs, work, timeout=900)
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

    # both stages finished at their configured step counts, with checkpoints, on the pool of both corpora
    for stage in (0, 1):
        run = work / "runs" / f"stage{stage}"
        info = json.loads((run / "run_info.json").read_text())
        assert info["finished"] is True and info["step"] == steps, info
        assert info["shards"] == pooled, info["shards"]
        assert _checkpoint_steps(run) == [steps // 2, steps]
        assert (
            yaml.safe_load((run / "config.yaml").read_text())["encoder"]["width"]
            == yaml.safe_load((TINY / f"stage{stage}.yaml").read_text())["encoder"]["width"]
        )
        assert (run / "metrics.jsonl").stat().st_size > 0

    # probes: each encoder's folder per task, one row per encoder and task in the merged summary, each a real
    # AUROC, and Stage 1 minus Stage 0 on every task with its paired interval
    probes = work / "probes"
    for encoder in ("stage0", "stage1"):
        for task in probe_tasks.split():
            assert (probes / encoder / task / "results.csv").is_file(), (encoder, task)
    results = pd.read_csv(probes / "summary" / "results.csv")
    assert set(zip(results["encoder"], results["task"])) == {
        (e, t) for e in ("stage0", "stage1") for t in probe_tasks.split()
    }
    assert all(0.0 <= v <= 1.0 for v in results["test_auroc"]) and not any(math.isnan(v) for v in results["test_auroc"])
    diffs = pd.read_csv(probes / "summary" / "differences.csv")
    assert set(zip(diffs["encoder"], diffs["baseline"], diffs["task"])) == {
        ("stage1", "stage0", t) for t in probe_tasks.split()
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
    env = _job_env(
        slurm_cluster,
        work,
        ECGPOS_STEPS="stage0",
        ECGPOS_SHARDS=str(arrhythmia_shards),
        # log every step; no periodic checkpoint, so the only one before the end is the preemption's
        ECGPOS_PRETRAIN_SET=f"optim.steps={steps} optim.warmup_steps=5 train.log_every=1 "
        f"train.checkpoint_every={steps} train.figure_every={steps}",
    )
    jobs = _submit(slurm_cluster, env, tmp_path)
    job = jobs["stage0"]
    run = work / "runs" / "stage0"

    # wait for real progress, then preempt the way Slurm does before a time limit: USR1 to the batch shell
    deadline = time.monotonic() + 300
    while not ((run / "metrics.jsonl").is_file() and len(_train_steps(run)) >= 3):
        state = _job_records(slurm_cluster, job)[0].get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} {state} before training\n{_logs(work)}"
        assert time.monotonic() < deadline, f"no training progress\n{_logs(work)}"
        time.sleep(0.5)
    signalled_at = _train_steps(run)[-1]
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)

    _wait_all(slurm_cluster, jobs, work, timeout=600)
    record = _job_records(slurm_cluster, job)[0]
    assert int(record["Restarts"]) == 1, record
    log = "\n".join(p.read_text() for p in (work / "logs").glob("ecgpos-stage0-*.out"))
    assert "requeueing" in log, log
    assert f"compiled kernels (train.compile) are cached in {work / 'compile-cache'}" in log, log

    # one checkpoint written on the signal (before the end), then the final one
    ckpts = _checkpoint_steps(run)
    assert len(ckpts) >= 2 and signalled_at <= ckpts[0] < steps and ckpts[-1] == steps, ckpts
    # every step trained exactly once, in order, across the two runs of the job
    trained = _train_steps(run)
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
    # the test node has no GPUs, so sbatch refuses the Stage-0 job's --gres=gpu:1 after preprocess and check
    env = _job_env(
        slurm_cluster,
        work,
        ECGPOS_STEPS="preprocess check stage0",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_GPUS_PER_NODE="1",
    )
    proc = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "stage0" in proc.stderr.strip().splitlines()[-1], proc.stderr
    jobs = dict(line.split() for line in proc.stdout.splitlines())
    assert list(jobs) == ["preprocess", "check"], proc.stdout
    deadline = time.monotonic() + 60
    while True:
        states = {r.get("JobState") for jid in jobs.values() for r in _job_records(slurm_cluster, jid)}
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
    # held jobs stay in the queue, like a chain whose Stage 0 is still training
    env = _job_env(slurm_cluster, work, ECGPOS_STEPS="check", ECGPOS_SBATCH_ARGS="--hold")
    first = _submit(slurm_cluster, env, tmp_path)
    try:
        proc = subprocess.run(
            ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and first["check"] in lines[0] and "ECGPOS_WORK" in lines[0], proc.stderr
        # another work folder is another chain
        other = _submit(slurm_cluster, {**env, "ECGPOS_WORK": str(tmp_path / "other")}, tmp_path)
        slurm_cluster.run("scancel", other["check"])
    finally:
        slurm_cluster.run("scancel", first["check"])


# -- --depth auto: decide jobs carve on until the criterion says stop ---------------------------------------------
def _auto_env(cluster: SlurmCluster, work: Path, shards: Path, data: Path, cache: Path, **extra: str) -> dict[str, str]:
    """pipeline.sh --depth auto on ready shards: tiny levels of 4 steps, one probe task, two epochs."""
    return _job_env(
        cluster,
        work,
        ECGPOS_DEPTH="auto",
        ECGPOS_SHARDS=str(shards),
        ECGPOS_PRETRAIN_SET="optim.steps=4 train.batch_size=4 train.checkpoint_every=4 train.figure_every=4",
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_PROBE_TASKS="ptbxl-super",
        ECGPOS_PROBE_ARGS=f"--seeds 1 --epochs 2 --fractions 100 --cache-dir {cache}",
        ECGPOS_DECIDE_CPUS="1",
        **extra,
    )


def _chain_jobs(cluster: SlurmCluster, work: Path) -> dict[str, list[str]]:
    """Job name -> the ids of this work folder's jobs (its comment) that the controller still knows."""
    tag = f"ecgpos:{work.resolve()}"
    jobs: dict[str, list[str]] = {}
    for line in cluster.run("scontrol", "-o", "show", "job").stdout.splitlines():
        fields = dict(t.split("=", 1) for t in line.split() if "=" in t)
        if fields.get("Comment") == tag and fields.get("ArrayTaskId") in (None, "0", "(null)"):
            jobs.setdefault(fields["JobName"], []).append(fields["JobId"])
    return jobs


def _wait_chain(cluster: SlurmCluster, work: Path, names: list[str], timeout: float) -> dict[str, str]:
    """Wait until jobs of all `names` were submitted (by the decide jobs) and every job of the chain finished."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = _chain_jobs(cluster, work)
        if all(f"ecgpos-{n}" in jobs for n in names):
            steps = {n: jobs[f"ecgpos-{n}"][0] for n in names}
            _wait_all(cluster, steps, work, timeout=max(1.0, deadline - time.monotonic()))
            jobs = _chain_jobs(cluster, work)
            if all(len(ids) == 1 for ids in jobs.values()):
                return {n.removeprefix("ecgpos-"): ids[0] for n, ids in jobs.items()}
            pytest.fail(f"a step was submitted twice: {jobs}")
        states = {n: _job_records(cluster, ids[0])[0].get("JobState") for n, ids in jobs.items()}
        failed = {n: s for n, s in states.items() if s in FINAL_STATES and s != "COMPLETED"}
        if failed or time.monotonic() > deadline:
            pytest.fail(f"steps not submitted: {names} vs {states}\n{_logs(work)}")
        time.sleep(2)


@pytest.mark.slurm
@pytest.mark.slow
def test_depth_auto_stops_then_carves_on_when_rerun_and_a_requeued_decide_job_submits_nothing_twice(
    slurm_cluster: SlurmCluster, arrhythmia_shards: Path, shared_data: Path, tmp_path: Path
) -> None:
    """The default threshold: the tiny level 0's criterion (0) is below 0.05, so the chain is one level deep,
    level 0 probed and exported; its decide job requeued submits nothing again. pipeline.sh run again with
    rules that never stop: level 0 is not trained again, each decide job submits the next level on the one
    below up to ECGPOS_MAX_LEVELS, the last one the probes of the three levels, the merge and the export."""
    work = tmp_path / "work"
    runs = work / "runs"
    env = _auto_env(slurm_cluster, work, arrhythmia_shards, shared_data, tmp_path / "cache")
    env["ECGPOS_STEPS"] = "stage0 probe export"
    assert list(_submit(slurm_cluster, env, tmp_path)) == ["stage0", "decide0"]
    jobs = _wait_chain(slurm_cluster, work, ["stage0", "decide0", "probe-stage0", "export"], timeout=600)
    assert sorted(jobs) == ["decide0", "export", "probe-stage0", "stage0"]
    carve = json.loads((runs / "carve.json").read_text())
    assert [r["decision"]["rule"] for r in carve["levels"]] == ["below"]
    assert (
        "Decision after level 0: stopped, criterion 0.0000 is below --stop-below 0.05"
        in (runs / "carve.md").read_text()
    )
    assert not (runs / "stage1").exists()
    assert json.loads((work / "export" / "config.json").read_text())["arch"]["kind"] == "stage0"

    decide = jobs["decide0"]
    slurm_cluster.run("scontrol", "requeue", decide)
    deadline = time.monotonic() + 300
    while (rec := _job_records(slurm_cluster, decide)[0]).get("Restarts") != "1" or rec["JobState"] not in FINAL_STATES:
        assert time.monotonic() < deadline, f"requeued decide job not done\n{_logs(work)}"
        time.sleep(2)
    assert rec["JobState"] == "COMPLETED", rec
    assert {n: len(ids) for n, ids in _chain_jobs(slurm_cluster, work).items()} == {f"ecgpos-{n}": 1 for n in jobs}
    log = (work / "logs" / f"ecgpos-decide0-{decide}.out").read_text()
    assert log.count("submitted by an earlier run of this job") == 2, log

    # pipeline.sh again on the same work folder, with rules that never stop before three levels
    trained = _train_steps(runs / "stage0")
    env.update(
        ECGPOS_STEPS="stage0 probe merge export", ECGPOS_MAX_LEVELS="3", ECGPOS_STOP_BELOW="0", ECGPOS_MIN_DROP="-1"
    )
    assert list(_submit(slurm_cluster, env, tmp_path)) == ["stage0", "decide0"]
    deadline = time.monotonic() + 900
    while len(_chain_jobs(slurm_cluster, work).get("ecgpos-export", [])) < 2:  # the second chain's export
        failed = [r for ids in _chain_jobs(slurm_cluster, work).values() for r in _job_records(slurm_cluster, ids[-1])]
        assert not [r for r in failed if r.get("JobState") in FINAL_STATES - {"COMPLETED"}], _logs(work)
        assert time.monotonic() < deadline, f"the second chain did not reach its export\n{_logs(work)}"
        time.sleep(2)
    chain = _chain_jobs(slurm_cluster, work)
    _wait_all(slurm_cluster, {n: ids[-1] for n, ids in chain.items()}, work, timeout=600)
    twice = {f"ecgpos-{n}" for n in ("stage0", "decide0", "probe-stage0", "export")}
    assert {n: len(ids) for n, ids in _chain_jobs(slurm_cluster, work).items()} == {
        f"ecgpos-{n}": 1 + (f"ecgpos-{n}" in twice)
        for n in ("stage0", "decide0", "probe-stage0", "export", "stage1", "decide1", "stage2", "decide2")
        + ("probe-stage1", "probe-stage2", "probe-merge")
    }
    assert _train_steps(runs / "stage0") == trained
    for level in range(3):  # each level on the one below, with the held-out records the criterion reads
        info = json.loads((runs / f"stage{level}" / "run_info.json").read_text())
        assert info["finished"] is True and info["step"] == 4, info
        assert yaml.safe_load((runs / f"stage{level}" / "config.yaml").read_text())["train"]["val_fraction"] == 0.1
    levels = json.loads((runs / "carve.json").read_text())["levels"]
    assert [(r["level"], r["run_dir"], r["decision"]["rule"]) for r in levels] == [
        (0, str(runs / "stage0"), "continue"),
        (1, str(runs / "stage1"), "continue"),
        (2, str(runs / "stage2"), "max-levels"),
    ]
    assert levels[0]["criterion"] == carve["levels"][0]["criterion"] and all(r["records"] == 22 for r in levels)
    assert "carve level 1" in levels[0]["decision"]["reason"]
    text = (runs / "carve.md").read_text()
    assert "| 2 | `" in text and "Decision after level 2: stopped, reached --max-levels 3" in text
    import pandas as pd

    results = pd.read_csv(work / "probes" / "summary" / "results.csv")
    assert sorted(results["encoder"]) == ["stage0", "stage1", "stage2"]
    exported = json.loads((work / "export" / "config.json").read_text())
    assert len(exported["arch"]["levels"]) == 3
