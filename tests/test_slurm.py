"""The slurm/ scripts against a real one-node Slurm cluster (slurmctld + slurmd + munged on this machine).

`-m slurm` runs these alone. The cluster is brought up once for this module by tests/slurm_cluster.py (which
installs Debian's slurm-wlm + munge through slurm/ci/install.sh when they are missing and we are root).
The launcher-rendering tests need no cluster and are not marked.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_cluster import ClusterError, SlurmCluster, missing_binaries

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


# -- the whole chain -------------------------------------------------------------------------------------------
@pytest.mark.slurm
def test_pipeline_runs_the_whole_chain(slurm_cluster: SlurmCluster, shared_data: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    probe_tasks = "ptbxl-super cpsc2018"
    steps = 50  # the tiny configs with fewer steps (200 each would add minutes to CI)
    env = _job_env(
        slurm_cluster,
        work,
        ECGPOS_PRETRAIN_SET=f"optim.steps={steps} train.checkpoint_every={steps // 2} train.figure_every={steps}",
        ECGPOS_SRC=str(shared_data / "ecg-arrhythmia"),
        ECGPOS_SUBSET="all",
        ECGPOS_PREPROCESS_PARTS="2",
        ECGPOS_PREPROCESS_ARGS="--records-per-shard 64",
        ECGPOS_DATA_ROOT=str(shared_data),
        ECGPOS_PROBE_TASKS=probe_tasks,
        ECGPOS_PROBE_ARGS=f"--seeds 1 --epochs 2 --fractions 100 --cache-dir {tmp_path / 'cache'}",
    )
    started = time.monotonic()
    jobs = _submit(slurm_cluster, env, tmp_path)
    assert list(jobs) == ["preprocess", "check", "stage0", "stage1", "probe", "merge", "export"]
    # the chain really is a chain: each job waits on the one before
    for prev, step in zip(jobs, list(jobs)[1:]):
        dep = _job_records(slurm_cluster, jobs[step])[0].get("Dependency", "")
        assert dep == "(null)" or f"afterok:{jobs[prev]}" in dep, (step, dep)
    _wait_all(slurm_cluster, jobs, work, timeout=900)
    print(f"chain finished in {time.monotonic() - started:.0f}s")

    # shards: every one of the 200 records stored or skipped, both array parts did work
    import pandas as pd

    shards = work / "shards"
    index = pd.read_csv(shards / "index.csv")
    skipped = pd.read_csv(shards / "skipped.csv")
    assert len(index) + len(skipped) == 200 and len(index) > 150
    assert index["record_id"].is_unique
    assert len(list(shards.glob("shard-*.h5"))) >= 2
    logs = "\n".join(p.read_text() for p in (work / "logs").glob("ecgpos-preprocess-*"))
    assert "--part 0 --num-parts 2" in logs and "--part 1 --num-parts 2" in logs

    # both stages finished at their configured step counts, with checkpoints
    for stage in (0, 1):
        run = work / "runs" / f"stage{stage}"
        info = json.loads((run / "run_info.json").read_text())
        assert info["finished"] is True and info["step"] == steps, info
        assert _checkpoint_steps(run) == [steps // 2, steps]
        assert (
            yaml.safe_load((run / "config.yaml").read_text())["encoder"]["width"]
            == yaml.safe_load((TINY / f"stage{stage}.yaml").read_text())["encoder"]["width"]
        )
        assert (run / "metrics.jsonl").stat().st_size > 0

    # probes: one row per task in the merged summary, each a real AUROC
    results = pd.read_csv(work / "probes" / "summary" / "results.csv")
    assert set(results["task"]) == set(probe_tasks.split())
    assert all(0.0 <= v <= 1.0 for v in results["test_auroc"]) and not any(math.isnan(v) for v in results["test_auroc"])
    assert (work / "probes" / "summary" / "summary.md").is_file()

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

    # one checkpoint written on the signal (before the end), then the final one
    ckpts = _checkpoint_steps(run)
    assert len(ckpts) >= 2 and signalled_at <= ckpts[0] < steps and ckpts[-1] == steps, ckpts
    # every step trained exactly once, in order, across the two runs of the job
    trained = _train_steps(run)
    assert trained == list(range(1, steps + 1)), trained
    info = json.loads((run / "run_info.json").read_text())
    assert info["finished"] is True and info["step"] == steps


# -- multi-node launcher command line (no cluster needed) --------------------------------------------------------
FAKE_2x4 = {
    "SLURM_JOB_ID": "4242",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu-a[07-08]",
    "SLURM_CPUS_PER_TASK": "16",
    "ECGPOS_GPUS_PER_NODE": "4",
    "ECGPOS_DRY_RUN": "1",
    "ECGPOS_WORK": "/scratch/ecg",
}


def _render(stage: str, extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
    env.update(extra)
    proc = subprocess.run(["bash", str(SLURM / "pretrain.sbatch"), stage], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_launcher_for_two_nodes_with_four_gpus_each(tmp_path: Path) -> None:
    srun = _render("1", FAKE_2x4)
    assert srun[0] == "srun" and "--nodes=2" in srun and "--ntasks-per-node=1" in srun
    assert "--cpus-per-task=16" in srun and srun[-3:-1] == ["bash", "-c"]
    inner = srun[-1]
    assert inner.startswith("trap '' USR1; exec accelerate launch ")
    launch = shlex.split(inner.split("exec ", 1)[1])
    assert _flag(launch, "--num_machines") == "2"
    assert _flag(launch, "--num_processes") == "8"
    assert _flag(launch, "--main_process_ip") == "gpu-a07"
    assert _flag(launch, "--main_process_port") == str(20000 + 4242 % 20000)
    assert "--multi_gpu" in launch and "--cpu" not in launch
    # left for each node's shell to expand, so node i gets machine rank i
    assert _flag(launch, "--machine_rank") == "$SLURM_PROCID"
    train = launch[launch.index("-m") :]
    assert train[:2] == ["-m", "ecgpos.pretrain"]
    assert _flag(train, "--stage") == "1" and _flag(train, "--resume") == "auto"
    assert _flag(train, "--run-dir") == "/scratch/ecg/runs/stage1"
    assert _flag(train, "--stage0") == "/scratch/ecg/runs/stage0"
    assert _flag(train, "--config") == str(REPO / "configs" / "stage1.yaml")

    # run the string as srun would on each node, with `accelerate` replaced by a program printing its argv
    fake = tmp_path / "accelerate"
    fake.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    for rank in ("0", "1"):
        env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "SLURM_PROCID": rank}
        proc = subprocess.run(["bash", "-c", inner], env=env, capture_output=True, text=True, check=True)
        argv = proc.stdout.split("\n")
        assert _flag(argv, "--machine_rank") == rank
        assert _flag(argv, "--main_process_ip") == "gpu-a07"


def _probe_data(root: Path) -> Path:
    """Empty stand-ins for the data folders pipeline.sh checks: data/raw, data/merl_splits."""
    data = root / "data"
    for sub in ("raw", "merl_splits"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    return data


def test_cpu_launcher_and_pipeline_gres(tmp_path: Path) -> None:
    srun = _render("0", {**FAKE_2x4, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "cpu01", "ECGPOS_GPUS_PER_NODE": "0"})
    launch = shlex.split(srun[-1].split("exec ", 1)[1])
    assert "--cpu" in launch and "--multi_gpu" not in launch and _flag(launch, "--num_processes") == "1"
    assert "--stage0" not in launch

    data = _probe_data(tmp_path)

    def pipeline(gpus: str) -> list[list[str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
        env.update(
            ECGPOS_DRY_RUN="1",
            ECGPOS_GPUS_PER_NODE=gpus,
            ECGPOS_NODES="2",
            ECGPOS_SRC=str(data / "raw"),
            ECGPOS_DATA_ROOT=str(data),
            ECGPOS_ACCOUNT="proj42",
        )
        proc = subprocess.run(
            ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
        )
        return [shlex.split(l[2:]) for l in proc.stdout.splitlines() if l.startswith("# sbatch")]

    gpu, cpu = pipeline("4"), pipeline("0")
    assert len(gpu) == 7 and all("--account=proj42" in cmd for cmd in gpu)
    stage_cmds = [c for c in gpu if "pretrain.sbatch" in c[-2]]
    assert len(stage_cmds) == 2 and all(
        "--gres=gpu:4" in c and "--nodes=2" in c and "--requeue" in c and "--signal=B:USR1@300" in c for c in stage_cmds
    )
    assert not any(a.startswith("--gres") for c in cpu for a in c)
    # each job depends on the one before it
    assert all(
        any(a == f"--dependency=afterok:<{step}>" for a in c)
        for c, step in zip(gpu[1:], ["preprocess", "check", "stage0", "stage1", "probe", "merge"])
    )
    assert not (tmp_path / "logs").exists()  # a dry run creates nothing


@pytest.mark.parametrize(
    "nodelist, first",
    [("gpu-a[07-08,11],cpu01", "gpu-a07"), ("n5,n6", "n5"), ("node[3]", "node3"), ("single", "single")],
)
def test_first_host_without_scontrol(nodelist: str, first: str) -> None:
    # the fallback for machines without a Slurm configuration (dry runs); scontrol is made to fail
    common = shlex.quote(str(SLURM / "common.sh"))
    script = f". {common}; scontrol() {{ return 1; }}; ecgpos_first_host {shlex.quote(nodelist)}"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert out == first


# -- settings refused before anything is submitted (no cluster needed) -------------------------------------------
def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No SLURM_*/ECGPOS_* from the caller; SLURM_CONF is an empty file, so no sbatch call can reach a cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
    env["SLURM_CONF"] = str(tmp_path / "empty-slurm.conf")
    Path(env["SLURM_CONF"]).touch()
    env["ECGPOS_SETUP"] = f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH"
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"ECGPOS_GPUS_PER_NODE": "four"}, "ECGPOS_GPUS_PER_NODE"),
        ({"ECGPOS_GPUS_PER_NODE": "4x"}, "ECGPOS_GPUS_PER_NODE"),
        ({"ECGPOS_PROBE_GPUS": "one"}, "ECGPOS_PROBE_GPUS"),
        ({"ECGPOS_NODES": "two"}, "ECGPOS_NODES"),
        ({"ECGPOS_PREPROCESS_PARTS": "0"}, "ECGPOS_PREPROCESS_PARTS"),
        ({"ECGPOS_SRC": ""}, "ECGPOS_SRC"),
        ({"ECGPOS_SRC": "{tmp}/no such corpus"}, "ECGPOS_SRC"),
        ({"ECGPOS_DATA_ROOT": "{tmp}/missing"}, "ECGPOS_DATA_ROOT"),
        ({"ECGPOS_SPLITS": "{tmp}/missing"}, "ECGPOS_SPLITS"),
        ({"ECGPOS_STAGE1_CONFIG": "configs/stage1.yml"}, "ECGPOS_STAGE1_CONFIG"),
        ({"ECGPOS_STEPS": "stage1 probes merge export"}, "ECGPOS_STEPS"),
        ({"ECGPOS_STEPS": " "}, "ECGPOS_STEPS"),
        ({"ECGPOS_PROBE_TASKS": "ptbxl-super ptbxl-rhytm"}, "ECGPOS_PROBE_TASKS"),
        ({"ECGPOS_PROBE_TASKS": " "}, "ECGPOS_PROBE_TASKS"),
        # a chain that starts later needs the earlier steps' outputs on disk
        ({"ECGPOS_STEPS": "stage1 probe merge export"}, "ECGPOS_SHARDS"),
        ({"ECGPOS_STEPS": "export"}, "ECGPOS_EXPORT_RUN"),
    ],
)
def test_pipeline_refuses_bad_settings_before_submitting(setting: dict[str, str], named: str, tmp_path: Path) -> None:
    data = _probe_data(tmp_path)
    settings = {"ECGPOS_SRC": str(data / "raw"), "ECGPOS_DATA_ROOT": str(data), "ECGPOS_WORK": str(tmp_path / "work")}
    settings.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in setting.items()})
    env = _clean_env(tmp_path, **settings)
    proc = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and named in lines[0], proc.stderr
    assert proc.stdout == ""  # no "STEP JOBID" line: nothing was submitted
    assert not (tmp_path / "logs").exists() and not (tmp_path / "work").exists()


def test_pipeline_accepts_shipped_config_names(tmp_path: Path) -> None:
    data = _probe_data(tmp_path)
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_STAGE0_CONFIG="tiny/stage0",
        ECGPOS_STAGE1_CONFIG="tiny/stage1.yaml",
        ECGPOS_PROBE_TASKS=f"ptbxl-super csn custom:{data}",
    )
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--array=0-2" in proc.stdout


def test_known_probe_tasks_match_the_probe_cli() -> None:
    from probes.tasks import TASKS

    common = shlex.quote(str(SLURM / "common.sh"))
    out = subprocess.run(
        ["bash", "-c", f'. {common}; echo "$ECGPOS_KNOWN_PROBE_TASKS"'], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == list(TASKS)


def test_pretrain_script_outside_a_job_says_it_needs_sbatch(tmp_path: Path) -> None:
    env = _clean_env(tmp_path, ECGPOS_GPUS_PER_NODE="0", ECGPOS_WORK=str(tmp_path / "work"))
    proc = subprocess.run(
        ["bash", str(SLURM / "pretrain.sbatch"), "0"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "sbatch" in lines[0], proc.stderr
    assert not (tmp_path / "work").exists()


def test_pretrain_script_refuses_a_gpu_count_that_is_not_a_number() -> None:
    # a count that is not a number must not quietly become a CPU run
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
    env.update({**FAKE_2x4, "ECGPOS_GPUS_PER_NODE": "4x"})
    proc = subprocess.run(["bash", str(SLURM / "pretrain.sbatch"), "0"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "ECGPOS_GPUS_PER_NODE" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# -- a submission refused half-way leaves nothing in the queue ---------------------------------------------------
@pytest.mark.slurm
def test_pipeline_cancels_submitted_jobs_when_a_later_submission_fails(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    data = _probe_data(tmp_path)
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
