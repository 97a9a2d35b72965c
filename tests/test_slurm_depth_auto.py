"""slurm/pipeline.sh --depth auto without a cluster: what it submits (level0 and the decide job after it), the
decide job's `ecgpos carve --decide` command line, and the settings it refuses before submitting anything;
then the chain itself on the test cluster (marker `slurm`; tests/slurm_jobs.py)."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from slurm_cluster import SlurmCluster, probe_data_stand_ins
from slurm_jobs import FINAL_STATES, SLURM, job_env, job_logs, job_records, submit_pipeline, train_steps, wait_all
from test_slurm_scripts import _clean_env, _dependency, _flag


def _pipeline(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess:
    data = probe_data_stand_ins(tmp_path)
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_WORK=str(tmp_path / "work"),
        # no ecgpos after the set-up: the level configs' check (tested on its own) is left to the jobs
        ECGPOS_SETUP="export PATH=/usr/bin:/bin",
    )
    env.update({k: v.replace("{tmp}", str(tmp_path)) for k, v in settings.items()})
    return subprocess.run(
        ["bash", str(SLURM / "pipeline.sh"), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


def test_auto_submits_level_zero_and_its_decide_job(tmp_path: Path) -> None:
    proc = _pipeline(tmp_path, "--depth", "auto", ECGPOS_PRETRAIN_SET="optim.steps=4")
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert steps == ["preprocess", "check", "level0", "decide0"]
    cmds = dict(zip(steps, (shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("# "))))
    assert _dependency(cmds["decide0"]) == ["level0"] and "--requeue" in cmds["decide0"]
    assert cmds["decide0"][-2:] == [str(SLURM / "decide.sbatch"), "0"]
    assert cmds["level0"][-2:] == [str(SLURM / "pretrain.sbatch"), "0"]
    assert not (tmp_path / "logs").exists()  # a dry run creates nothing


def test_decide_job_runs_carve_on_the_pipelines_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = _clean_env(tmp_path, ECGPOS_DRY_RUN="1", ECGPOS_WORK=str(work), ECGPOS_STOP_BELOW="0", ECGPOS_MAX_LEVELS="3")
    proc = subprocess.run(["bash", str(SLURM / "decide.sbatch"), "2"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[:4] == ["ecgpos", "carve", "--decide", "2"] and "--level-prefix" not in argv  # runs named level<l>
    assert _flag(argv, "--run-dir") == str(work / "runs") and _flag(argv, "--shards") == str(work / "shards")
    assert (_flag(argv, "--stop-below"), _flag(argv, "--min-drop"), _flag(argv, "--max-levels")) == ("0", "0.01", "3")
    assert _flag(argv, "--val-fraction") == "0.1"
    bad = subprocess.run(["bash", str(SLURM / "decide.sbatch"), "x"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "LEVEL" in bad.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"ECGPOS_DEPTH": "three"}, "ECGPOS_DEPTH"),
        ({"ECGPOS_MAX_LEVELS": "0"}, "ECGPOS_MAX_LEVELS"),
        ({"ECGPOS_STOP_BELOW": "1.5"}, "ECGPOS_STOP_BELOW"),
        ({"ECGPOS_STOP_BELOW": "five percent"}, "ECGPOS_STOP_BELOW"),
        ({"ECGPOS_MIN_DROP": "0.01x"}, "ECGPOS_MIN_DROP"),
        ({"ECGPOS_VAL_FRACTION": "0"}, "ECGPOS_VAL_FRACTION"),
        ({"ECGPOS_DECIDE_CPUS": "0"}, "ECGPOS_DECIDE_CPUS"),
        ({"ECGPOS_PROBE_GPUS": "one"}, "ECGPOS_PROBE_GPUS"),  # the decide jobs' default, named as itself
        ({"ECGPOS_STEPS": "probe merge export"}, "ECGPOS_STEPS"),  # the decide jobs carve from level0
        ({"ECGPOS_STEPS": "level0 level1 export"}, "ECGPOS_STEPS"),  # the decide jobs submit level1
        ({"ECGPOS_LEVEL0_RUN": "{tmp}"}, "ECGPOS_LEVEL0_RUN"),
    ],
)
def test_auto_refuses_bad_settings_before_submitting(setting: dict[str, str], named: str, tmp_path: Path) -> None:
    proc = _pipeline(tmp_path, **{"ECGPOS_DEPTH": "auto", **setting})
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and named in lines[0], proc.stderr


# -- --depth auto: decide jobs carve on until the criterion says stop ---------------------------------------------
def _auto_env(cluster: SlurmCluster, work: Path, shards: Path, data: Path, cache: Path, **extra: str) -> dict[str, str]:
    """pipeline.sh --depth auto on ready shards: tiny levels of 4 steps, one probe task, two epochs."""
    return job_env(
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
            wait_all(cluster, steps, work, timeout=max(1.0, deadline - time.monotonic()))
            jobs = _chain_jobs(cluster, work)
            if all(len(ids) == 1 for ids in jobs.values()):
                return {n.removeprefix("ecgpos-"): ids[0] for n, ids in jobs.items()}
            pytest.fail(f"a step was submitted twice: {jobs}")
        states = {n: job_records(cluster, ids[0])[0].get("JobState") for n, ids in jobs.items()}
        failed = {n: s for n, s in states.items() if s in FINAL_STATES and s != "COMPLETED"}
        if failed or time.monotonic() > deadline:
            pytest.fail(f"steps not submitted: {names} vs {states}\n{job_logs(work)}")
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
    env["ECGPOS_STEPS"] = "level0 probe export"
    assert list(submit_pipeline(slurm_cluster, env, tmp_path)) == ["level0", "decide0"]
    jobs = _wait_chain(slurm_cluster, work, ["level0", "decide0", "probe-level0", "export"], timeout=600)
    assert sorted(jobs) == ["decide0", "export", "level0", "probe-level0"]
    carve = json.loads((runs / "carve.json").read_text())
    assert [r["decision"]["rule"] for r in carve["levels"]] == ["below"]
    assert (
        "Decision after level 0: stopped, criterion 0.0000 is below --stop-below 0.05"
        in (runs / "carve.md").read_text()
    )
    assert not (runs / "level1").exists()
    assert json.loads((work / "export" / "config.json").read_text())["arch"]["kind"] == "level0"

    decide = jobs["decide0"]
    slurm_cluster.run("scontrol", "requeue", decide)
    deadline = time.monotonic() + 300
    while (rec := job_records(slurm_cluster, decide)[0]).get("Restarts") != "1" or rec["JobState"] not in FINAL_STATES:
        assert time.monotonic() < deadline, f"requeued decide job not done\n{job_logs(work)}"
        time.sleep(2)
    assert rec["JobState"] == "COMPLETED", rec
    assert {n: len(ids) for n, ids in _chain_jobs(slurm_cluster, work).items()} == {f"ecgpos-{n}": 1 for n in jobs}
    log = (work / "logs" / f"ecgpos-decide0-{decide}.out").read_text()
    assert log.count("submitted by an earlier run of this job") == 2, log

    # pipeline.sh again on the same work folder, with rules that never stop before three levels
    trained = train_steps(runs / "level0")
    env.update(
        ECGPOS_STEPS="level0 probe merge export", ECGPOS_MAX_LEVELS="3", ECGPOS_STOP_BELOW="0", ECGPOS_MIN_DROP="-1"
    )
    assert list(submit_pipeline(slurm_cluster, env, tmp_path)) == ["level0", "decide0"]
    deadline = time.monotonic() + 900
    while len(_chain_jobs(slurm_cluster, work).get("ecgpos-export", [])) < 2:  # the second chain's export
        failed = [r for ids in _chain_jobs(slurm_cluster, work).values() for r in job_records(slurm_cluster, ids[-1])]
        assert not [r for r in failed if r.get("JobState") in FINAL_STATES - {"COMPLETED"}], job_logs(work)
        assert time.monotonic() < deadline, f"the second chain did not reach its export\n{job_logs(work)}"
        time.sleep(2)
    chain = _chain_jobs(slurm_cluster, work)
    wait_all(slurm_cluster, {n: ids[-1] for n, ids in chain.items()}, work, timeout=600)
    twice = {f"ecgpos-{n}" for n in ("level0", "decide0", "probe-level0", "export")}
    assert {n: len(ids) for n, ids in _chain_jobs(slurm_cluster, work).items()} == {
        f"ecgpos-{n}": 1 + (f"ecgpos-{n}" in twice)
        for n in ("level0", "decide0", "probe-level0", "export", "level1", "decide1", "level2", "decide2")
        + ("probe-level1", "probe-level2", "probe-merge")
    }
    assert train_steps(runs / "level0") == trained
    for level in range(3):  # each level on the one below, with the held-out records the criterion reads
        info = json.loads((runs / f"level{level}" / "run_info.json").read_text())
        assert info["finished"] is True and info["step"] == 4, info
        assert yaml.safe_load((runs / f"level{level}" / "config.yaml").read_text())["train"]["val_fraction"] == 0.1
    levels = json.loads((runs / "carve.json").read_text())["levels"]
    assert [(r["level"], r["run_dir"], r["decision"]["rule"]) for r in levels] == [
        (0, str(runs / "level0"), "continue"),
        (1, str(runs / "level1"), "continue"),
        (2, str(runs / "level2"), "max-levels"),
    ]
    assert levels[0]["criterion"] == carve["levels"][0]["criterion"] and all(r["records"] == 22 for r in levels)
    assert "carve level 1" in levels[0]["decision"]["reason"]
    text = (runs / "carve.md").read_text()
    assert "| 2 | `" in text and "Decision after level 2: stopped, reached --max-levels 3" in text
    results = pd.read_csv(work / "probes" / "summary" / "results.csv")
    assert sorted(results["encoder"]) == ["level0", "level1", "level2"]
    exported = json.loads((work / "export" / "config.json").read_text())
    assert len(exported["arch"]["levels"]) == 3
