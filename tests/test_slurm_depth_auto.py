"""slurm/pipeline.sh --depth auto without a cluster: what it submits (stage0 and the decide job after it), the
decide job's `ecgpos carve --decide` command line, and the settings it refuses before submitting anything.
The chain itself runs on the test cluster in tests/test_slurm.py."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from slurm_cluster import probe_data_stand_ins
from test_slurm_scripts import _clean_env, _dependency, _flag

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "slurm"


def _pipeline(tmp_path: Path, *args: str, **settings: str) -> subprocess.CompletedProcess:
    data = probe_data_stand_ins(tmp_path)
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_WORK=str(tmp_path / "work"),
        # no ecgpos after the set-up: the stage configs' check (tested on its own) is left to the jobs
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
    assert steps == ["preprocess", "check", "stage0", "decide0"]
    cmds = dict(zip(steps, (shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("# "))))
    assert _dependency(cmds["decide0"]) == ["stage0"] and "--requeue" in cmds["decide0"]
    assert cmds["decide0"][-2:] == [str(SLURM / "decide.sbatch"), "0"]
    assert cmds["stage0"][-2:] == [str(SLURM / "pretrain.sbatch"), "0"]
    assert not (tmp_path / "logs").exists()  # a dry run creates nothing


def test_decide_job_runs_carve_on_the_pipelines_runs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    env = _clean_env(tmp_path, ECGPOS_DRY_RUN="1", ECGPOS_WORK=str(work), ECGPOS_STOP_BELOW="0", ECGPOS_MAX_LEVELS="3")
    proc = subprocess.run(["bash", str(SLURM / "decide.sbatch"), "2"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout)
    assert argv[:4] == ["ecgpos", "carve", "--decide", "2"] and _flag(argv, "--level-prefix") == "stage"
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
        ({"ECGPOS_STEPS": "probe merge export"}, "ECGPOS_STEPS"),  # the decide jobs carve from stage0
        ({"ECGPOS_STEPS": "stage0 stage1 export"}, "ECGPOS_STEPS"),  # the decide jobs submit stage1
        ({"ECGPOS_STAGE0_RUN": "{tmp}"}, "ECGPOS_STAGE0_RUN"),
    ],
)
def test_auto_refuses_bad_settings_before_submitting(setting: dict[str, str], named: str, tmp_path: Path) -> None:
    proc = _pipeline(tmp_path, **{"ECGPOS_DEPTH": "auto", **setting})
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and named in lines[0], proc.stderr
