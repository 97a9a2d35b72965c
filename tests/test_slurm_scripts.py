"""The slurm/ scripts without a cluster: the launcher command lines pretrain.sbatch renders for
multi-node and CPU jobs, and the settings pipeline.sh and pretrain.sbatch refuse before any submission."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from slurm_cluster import probe_data_stand_ins

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "slurm"


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


def _render(level: str, extra: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
    env.update(extra)
    proc = subprocess.run(["bash", str(SLURM / "pretrain.sbatch"), level], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return shlex.split(proc.stdout)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _dependency(sbatch: list[str]) -> list[str]:
    """The steps a dry-run sbatch line waits on (its fake ids are "<step>")."""
    deps = [a.split(":", 1)[1] for a in sbatch if a.startswith("--dependency=afterok:")]
    return [d.strip("<>") for d in deps[0].split(":")] if deps else []


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
    assert _flag(train, "--level") == "1" and _flag(train, "--resume") == "auto"
    assert _flag(train, "--run-dir") == "/scratch/ecg/runs/level1"
    assert _flag(train, "--base") == "/scratch/ecg/runs/level0"
    assert _flag(train, "--config") == str(REPO / "configs" / "level1.yaml")

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


def test_settings_under_their_stage_names_are_read_as_the_level_ones() -> None:
    """ECGPOS_STAGE0_CONFIG, ECGPOS_STAGE1_CONFIG, ECGPOS_STAGE0_RUN and ECGPOS_STAGE are the other names of
    ECGPOS_LEVEL0_CONFIG, ECGPOS_LATENT_CONFIG, ECGPOS_LEVEL0_RUN and ECGPOS_LEVEL; the run folder is level<l>."""
    names = {"ECGPOS_STAGE1_CONFIG": "/cfg/latent.yaml", "ECGPOS_STAGE0_RUN": "/elsewhere/base", "ECGPOS_STAGE": "1"}
    srun = _render("", {**FAKE_2x4, **names})
    train = shlex.split(srun[-1].split("exec ", 1)[1])
    assert _flag(train, "--level") == "1" and _flag(train, "--config") == "/cfg/latent.yaml"
    assert _flag(train, "--base") == "/elsewhere/base" and _flag(train, "--run-dir") == "/scratch/ecg/runs/level1"
    level0 = shlex.split(_render("0", {**FAKE_2x4, "ECGPOS_STAGE0_CONFIG": "/cfg/zero.yaml"})[-1].split("exec ", 1)[1])
    assert _flag(level0, "--config") == "/cfg/zero.yaml" and "stage" not in " ".join(level0)


def test_cpu_launcher_on_two_nodes_gives_each_node_its_rank() -> None:
    """accelerate's --cpu launcher reads the ranks from MPI's variables, which srun does not set: two CPU
    nodes go through torchrun (--multi_gpu), one process each, as the GPU jobs do."""
    launch = shlex.split(_render("0", {**FAKE_2x4, "ECGPOS_GPUS_PER_NODE": "0"})[-1].split("exec ", 1)[1])
    assert "--multi_gpu" in launch and "--cpu" not in launch
    assert _flag(launch, "--num_processes") == "2" and _flag(launch, "--num_machines") == "2"
    assert _flag(launch, "--num_cpu_threads_per_process") == "16"


def test_cpu_launcher_and_pipeline_gres(tmp_path: Path) -> None:
    srun = _render("0", {**FAKE_2x4, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "cpu01", "ECGPOS_GPUS_PER_NODE": "0"})
    launch = shlex.split(srun[-1].split("exec ", 1)[1])
    assert "--cpu" in launch and "--multi_gpu" not in launch and _flag(launch, "--num_processes") == "1"
    assert "--base" not in launch and "--base" not in launch

    data = probe_data_stand_ins(tmp_path)

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
    assert len(gpu) == 8 and all("--account=proj42" in cmd for cmd in gpu)
    level_cmds = [c for c in gpu if "pretrain.sbatch" in c[-2]]
    assert len(level_cmds) == 2 and all(
        "--gres=gpu:4" in c and "--nodes=2" in c and "--requeue" in c and "--signal=B:USR1@300" in c for c in level_cmds
    )
    assert not any(a.startswith("--gres") for c in cpu for a in c)
    # each job depends on the one it reads from: every level is probed, each after its own level
    assert [_dependency(c) for c in gpu] == [
        [],
        ["preprocess"],
        ["check"],
        ["level0"],
        ["level0"],  # the level-0 probes run while level 1 trains
        ["level1"],
        ["probe-level0", "probe-level1"],
        ["merge"],
    ]
    assert not (tmp_path / "logs").exists()  # a dry run creates nothing


@pytest.mark.slow  # resolves each level's config with `ecgpos pretrain --check-config`
def test_pipeline_of_three_levels_chains_each_level_on_the_one_below(tmp_path: Path) -> None:
    """--depth 3: level2 trains on level1's run with the latent config, each level is probed after its own
    level, and the export is the top level's run; pretrain.sbatch renders level 2 on level 1."""
    train = _render("2", FAKE_2x4)
    launch = shlex.split(train[-1].split("exec ", 1)[1])
    assert _flag(launch, "--level") == "2" and _flag(launch, "--base") == "/scratch/ecg/runs/level1"
    assert _flag(launch, "--run-dir") == "/scratch/ecg/runs/level2"
    assert _flag(launch, "--config") == str(REPO / "configs" / "level1.yaml")
    data = probe_data_stand_ins(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
    env.update(ECGPOS_DRY_RUN="1", ECGPOS_SRC=str(data / "raw"), ECGPOS_DATA_ROOT=str(data))
    proc = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh"), "--depth", "3"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith("#")]
    cmds = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("# sbatch")]
    assert steps[2:6] == ["level0", "level1", "level2", "probe-level0"] and steps[-2:] == ["merge", "export"]
    deps = dict(zip(steps, map(_dependency, cmds)))
    assert deps["level2"] == ["level1"] and deps["probe-level2"] == ["level2"] and deps["probe-level1"] == ["level1"]
    assert [c[-1] for c in cmds if "pretrain.sbatch" in c[-2]] == ["0", "1", "2"]
    bad = subprocess.run(
        ["bash", str(SLURM / "pipeline.sh"), "--depth", "0"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "ECGPOS_DEPTH" in bad.stderr.strip().splitlines()[-1]


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
        ({"ECGPOS_LATENT_CONFIG": "configs/level1.yml"}, "ECGPOS_LATENT_CONFIG"),
        ({"ECGPOS_STEPS": "level1 probes merge export"}, "ECGPOS_STEPS"),
        ({"ECGPOS_STEPS": " "}, "ECGPOS_STEPS"),
        ({"ECGPOS_PROBE_TASKS": "ptbxl-super ptbxl-rhytm"}, "ECGPOS_PROBE_TASKS"),
        ({"ECGPOS_PROBE_TASKS": " "}, "ECGPOS_PROBE_TASKS"),
        # a chain that starts later needs the earlier steps' outputs on disk
        ({"ECGPOS_STEPS": "level1 probe merge export"}, "ECGPOS_SHARDS"),
        ({"ECGPOS_STEPS": "export"}, "ECGPOS_EXPORT_RUN"),
        # what the jobs would run first, and the overrides of `ecgpos pretrain`, resolved by its own config loader
        ({"ECGPOS_SETUP": "source {tmp}/env.sh; if then"}, "ECGPOS_SETUP"),
        ({"ECGPOS_PRETRAIN_SET": "train.batch_size=256 optim.stpes=1000"}, "optim.stpes"),
        ({"ECGPOS_PRETRAIN_SET": "train.batch_size=many"}, "ECGPOS_PRETRAIN_SET"),
        # a list setting the jobs would fail to split, hours later in the queue
        ({"ECGPOS_PROBE_ARGS": "--cache-dir '/scratch/my cache"}, "ECGPOS_PROBE_ARGS"),
        # the corpora to pool: dataset=path words, each a known layout given once, each folder there
        ({"ECGPOS_SRC": "", "ECGPOS_CORPORA": "code15 '{tmp}/data/raw'"}, "ECGPOS_CORPORA"),
        ({"ECGPOS_SRC": "", "ECGPOS_CORPORA": "ptbxl={tmp}/data/raw"}, "ECGPOS_CORPORA"),
        ({"ECGPOS_SRC": "", "ECGPOS_CORPORA": "code15={tmp}/data/raw code15={tmp}/data"}, "ECGPOS_CORPORA"),
        ({"ECGPOS_SRC": "", "ECGPOS_CORPORA": "code15={tmp}/no such code15"}, "ECGPOS_CORPORA"),
        ({"ECGPOS_SRC": "", "ECGPOS_CORPORA": "'code15={tmp}/data/raw"}, "ECGPOS_CORPORA"),
        ({"ECGPOS_CORPORA": "code15={tmp}/data/raw"}, "ECGPOS_SRC"),  # two answers to "which corpus"
        ({"ECGPOS_DATASET": "code-15"}, "ECGPOS_DATASET"),
        ({"ECGPOS_SUBSET": "nigbo"}, "ECGPOS_SUBSET"),
        ({"ECGPOS_DATASET": "code15", "ECGPOS_SUBSET": "ningbo"}, "ECGPOS_SUBSET"),  # code15 refuses --subset
        # the encoders to probe: one setting or the other, folders that exist or that the chain trains,
        # folder names that keep their probes apart
        ({"ECGPOS_PROBE_ENCODER": "random:tiny/level1", "ECGPOS_PROBE_ENCODERS": "{tmp}"}, "ECGPOS_PROBE_ENCODERS"),
        ({"ECGPOS_STEPS": "probe merge"}, "ECGPOS_PROBE_ENCODERS"),
        ({"ECGPOS_STEPS": "probe merge", "ECGPOS_PROBE_ENCODER": "{tmp}/run"}, "ECGPOS_PROBE_ENCODER"),
        ({"ECGPOS_PROBE_ENCODERS": "{tmp}/data/raw {tmp}/work/runs/level0 {tmp}/data/raw/"}, "ECGPOS_PROBE_ENCODERS"),
        ({"ECGPOS_PROBE_ENCODERS": "{tmp}/summary"}, "ECGPOS_PROBE_ENCODERS"),  # probes/summary is the merge's
        ({"ECGPOS_PROBE_REFERENCE": "papr"}, "ECGPOS_PROBE_REFERENCE"),
    ],
)
def test_pipeline_refuses_bad_settings_before_submitting(setting: dict[str, str], named: str, tmp_path: Path) -> None:
    data = probe_data_stand_ins(tmp_path)
    (tmp_path / "summary").mkdir()
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
    data = probe_data_stand_ins(tmp_path)
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_LEVEL0_CONFIG="tiny/level0",
        ECGPOS_LATENT_CONFIG="tiny/level1.yaml",
        ECGPOS_PROBE_TASKS=f"ptbxl-super csn custom:{data}",
    )
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "--array=0-2" in proc.stdout


def test_pipeline_notes_setup_files_missing_here_and_submits(tmp_path: Path) -> None:
    """The jobs run ECGPOS_SETUP on the compute nodes, where node-local paths differ and the set-up may
    create what it sources: a file missing on the submitting machine is a note, never a refusal."""
    data = probe_data_stand_ins(tmp_path)
    setup = (
        f"module load cuda; source {tmp_path}/no-such-env/bin/activate  # the usual typo\n"
        "[ -f ~/.no-such-rc ] && source ~/.no-such-rc\n"
        "source $(dirname /opt/no-such)/env.sh"
    )
    env = _clean_env(
        tmp_path, ECGPOS_DRY_RUN="1", ECGPOS_SRC=str(data / "raw"), ECGPOS_DATA_ROOT=str(data), ECGPOS_SETUP=setup
    )
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and "level1 <level1>" in proc.stdout, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "note: ECGPOS_SETUP" in line]
    assert len(notes) == 1 and f"source {tmp_path}/no-such-env/bin/activate: no such file here" in notes[0], notes


def test_pipeline_checks_pretrain_overrides_with_the_config_loader(tmp_path: Path, capsys) -> None:
    """A misspelt ECGPOS_PRETRAIN_SET key was found only when the level job started, hours later in the
    queue; `ecgpos pretrain --check-config` resolves the config as the job will, and nothing more."""
    from ecgpos.cli import main

    assert (
        main(["pretrain", "--level", "0", "--config", "tiny/level0", "--set", "optim.steps=7", "--check-config"]) == 0
    )
    assert "  steps: 7\n" in capsys.readouterr().out
    data = probe_data_stand_ins(tmp_path)
    setup = tmp_path / "env.sh"
    setup.write_text(f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH\n")
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_SETUP=f"source {setup}",
        ECGPOS_PRETRAIN_SET="optim.steps=3 train.batch_size=8",
    )
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and "level1 <level1>" in proc.stdout, proc.stderr
    env["ECGPOS_PRETRAIN_SET"] = "optim.steps=3 train.batch_sise=8"
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: level 0 config ECGPOS_LEVEL0_CONFIG=" in lines[0], proc.stderr
    assert 'ECGPOS_PRETRAIN_SET="optim.steps=3 train.batch_sise=8"' in lines[0] and "train.batch_sise" in lines[0]


def test_list_settings_keep_quoted_blanks_inside_one_word(tmp_path: Path) -> None:
    """List settings are split as a shell splits a command line, so a path or YAML value holding a blank
    stays one argument instead of becoming two wrong ones."""
    srun = _render("0", {**FAKE_2x4, "ECGPOS_PRETRAIN_SET": "optim.steps=9 'optim.betas=[0.9, 0.95]'"})
    train = shlex.split(srun[-1].split("exec ", 1)[1])
    assert [train[i + 1] for i, a in enumerate(train) if a == "--set"] == ["optim.steps=9", "optim.betas=[0.9, 0.95]"]

    data = probe_data_stand_ins(tmp_path)
    custom = tmp_path / "my tasks"
    custom.mkdir()
    lists = {
        "ECGPOS_PROBE_TASKS": f"ptbxl-super 'custom:{custom}'",
        "ECGPOS_PROBE_ARGS": f"--seeds 1 --cache-dir \"{tmp_path}/my cache\" --fractions '*'",
    }
    encoders = f"'{tmp_path}/my run'"
    env = _clean_env(tmp_path, ECGPOS_DRY_RUN="1", ECGPOS_DATA_ROOT=str(data), ECGPOS_PROBE_ENCODERS=encoders, **lists)
    proc = subprocess.run(
        ["bash", str(SLURM / "probe.sbatch")], env=env, cwd=tmp_path, capture_output=True, text=True, check=True
    )
    probes = [shlex.split(line) for line in proc.stdout.splitlines()]
    assert [_flag(argv, "--task") for argv in probes] == ["ptbxl-super", f"custom:{custom}"]
    assert all(_flag(argv, "--encoder") == f"{tmp_path}/my run" for argv in probes)
    assert all(_flag(argv, "--cache-dir") == f"{tmp_path}/my cache" for argv in probes)
    assert all(_flag(argv, "--fractions") == "*" for argv in probes)  # nothing is expanded

    # pipeline.sh: the probe array has one index per task, and the config loader gets each override whole
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_STEPS="probe merge",
        ECGPOS_PROBE_ENCODER="random:tiny/level1",
        **lists,
    )
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "--array=0-1" in proc.stdout
    env.update(ECGPOS_LEVEL0_CONFIG="tiny/level0", ECGPOS_PRETRAIN_SET="optim.steps=3 'optim.betas=[0.9, 0.95]'")
    check = f". {shlex.quote(str(SLURM / 'common.sh'))}; ecgpos_check_pretrain_config 0"
    proc = subprocess.run(["bash", "-c", check], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_known_probe_tasks_match_the_probe_cli() -> None:
    from ecgpos.probes.shared.tasks import TASKS

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


def test_counts_written_with_leading_zeros_are_decimal(tmp_path: Path) -> None:
    # bash arithmetic reads "010" as octal 8 and fails on "08": the launcher must still get 2 x 10 processes
    srun = _render("0", {**FAKE_2x4, "ECGPOS_GPUS_PER_NODE": "010"})
    assert _flag(shlex.split(srun[-1].split("exec ", 1)[1]), "--num_processes") == "20"
    srun = _render("0", {**FAKE_2x4, "ECGPOS_GPUS_PER_NODE": "08"})
    assert _flag(shlex.split(srun[-1].split("exec ", 1)[1]), "--num_processes") == "16"
    data = probe_data_stand_ins(tmp_path)
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_STEPS="preprocess check",  # the level steps would only add their slow config checks
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_PREPROCESS_PARTS="08",
        ECGPOS_GPUS_PER_NODE="08",  # the probes' GPU count is derived from it
    )
    proc = subprocess.run(["bash", str(SLURM / "pipeline.sh")], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "--array=0-7" in proc.stdout


def test_pretrain_script_leaves_a_finished_run_to_the_trainer(tmp_path: Path) -> None:
    # the trainer compares the config (ECGPOS_PRETRAIN_SET may have changed since) with the finished run's;
    # the script must not report the old run as this job's result without asking it
    run_dir = tmp_path / "work" / "runs" / "level0"
    run_dir.mkdir(parents=True)
    (run_dir / "run_info.json").write_text('{"finished": true}')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(f"#!/bin/sh\necho srun started >> {shlex.quote(str(tmp_path / 'srun.log'))}\n")
    srun.chmod(0o755)
    env = _clean_env(
        tmp_path,
        SLURM_JOB_ID="77",
        ECGPOS_GPUS_PER_NODE="0",
        ECGPOS_WORK=str(tmp_path / "work"),
        ECGPOS_PRETRAIN_SET="optim.steps=9",
    )
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    proc = subprocess.run(
        ["bash", str(SLURM / "pretrain.sbatch"), "0"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "level 0 finished" in proc.stderr, proc.stderr
    assert (tmp_path / "srun.log").read_text() == "srun started\n"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_pipeline_help_prints_its_usage_and_submits_nothing(flag: str) -> None:
    done = subprocess.run(["bash", str(SLURM / "pipeline.sh"), flag], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == ""
    assert "Usage:  ECGPOS_CORPORA=" in done.stdout and "--depth N|auto" in done.stdout
    assert "set -euo" not in done.stdout and not done.stdout.startswith("#")
