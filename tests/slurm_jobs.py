"""Running slurm/pipeline.sh on the test cluster (tests/slurm_cluster.py): the cluster's lifetime, the jobs'
environment, submitting the chain and waiting for its jobs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
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


def job_env(cluster: SlurmCluster, work: Path, **extra: str) -> dict[str, str]:
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
            "ECGPOS_LEVEL0_CONFIG": str(TINY / "level0.yaml"),
            "ECGPOS_LATENT_CONFIG": str(TINY / "level1.yaml"),
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra)
    return env


def submit_pipeline(cluster: SlurmCluster, env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Run slurm/pipeline.sh; returns {step: job id} from its "STEP JOBID" lines."""
    proc = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh")], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"pipeline.sh failed:\n{proc.stdout}\n{proc.stderr}"
    jobs = dict(line.split() for line in proc.stdout.splitlines() if line.strip())
    assert all(v.isdigit() for v in jobs.values()), proc.stdout
    return jobs


def job_records(cluster: SlurmCluster, job_id: str) -> list[dict[str, str]]:
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


def job_logs(work: Path, n: int = 40) -> str:
    parts = []
    for log in sorted((work / "logs").glob("*.out")):
        lines = log.read_text(errors="replace").splitlines()[-n:]
        parts.append(f"== {log.name}\n" + "\n".join(lines))
    return "\n".join(parts)


def wait_all(cluster: SlurmCluster, jobs: dict[str, str], work: Path, timeout: float) -> None:
    """Wait until every job reached a final state; assert all COMPLETED with exit code 0."""
    deadline = time.monotonic() + timeout
    while True:
        records = {step: job_records(cluster, jid) for step, jid in jobs.items()}
        pending = [s for s, rs in records.items() if not rs or any(r.get("JobState") not in FINAL_STATES for r in rs)]
        if not pending:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"jobs still not done after {timeout:.0f}s: {pending}\n{job_logs(work)}\n{cluster.log_tail()}")
        time.sleep(2)
    bad = {
        s: [(r.get("JobId"), r.get("JobState"), r.get("ExitCode"), r.get("Reason")) for r in rs]
        for s, rs in records.items()
        if any(r["JobState"] != "COMPLETED" or r.get("ExitCode") != "0:0" for r in rs)
    }
    assert not bad, f"jobs did not complete: {bad}\n{job_logs(work)}"


def train_steps(run_dir: Path) -> list[int]:
    """Steps of the training records (those with a loss) in metrics.jsonl, in file order."""
    lines = (run_dir / "metrics.jsonl").read_text().split("\n")
    steps = []
    for line in lines[:-1]:  # the part after the last newline may still be being written
        rec = json.loads(line)
        if "loss" in rec:
            steps.append(int(rec["step"]))
    return steps


def running_cluster() -> Iterator[SlurmCluster]:
    """A running one-node cluster until the generator is closed; skipped where it cannot run (a failure
    under CI). tests/conftest.py's `slurm_cluster` fixture brings one up per test module."""
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
