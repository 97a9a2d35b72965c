"""The slurm/ scripts on the paper's workflow, without a cluster: several corpora preprocessed side by side
(ECGPOS_CORPORA) and pooled for every level, every level probed (ECGPOS_PROBE_ENCODERS) and the merge
comparing them; the one-corpus and one-encoder forms keep their old command lines and folders."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from slurm_cluster import PAPER_CHAIN, probe_data_stand_ins
from test_slurm_scripts import _clean_env, _dependency, _flag

REPO = Path(__file__).resolve().parents[1]
SLURM = REPO / "slurm"


def _run(script: str, env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SLURM / script), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def _sbatch_lines(stdout: str) -> list[list[str]]:
    return [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("# sbatch")]


def test_pipeline_preprocesses_each_corpus_and_probes_every_level(tmp_path: Path) -> None:
    data = probe_data_stand_ins(tmp_path)
    code15 = tmp_path / "code 15"  # a blank in a path: quoted in the list
    code15.mkdir()
    work = tmp_path / "work"
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_CORPORA=f"ecg-arrhythmia={data / 'raw'} 'code15={code15}'",
        ECGPOS_SUBSET="all",
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_WORK=str(work),
        ECGPOS_LEVEL0_CONFIG="tiny/level0",
        ECGPOS_LATENT_CONFIG="tiny/level1",
        ECGPOS_PROBE_TASKS="ptbxl-super cpsc2018",
        # no ecgpos after the set-up: the level configs' check (tested on its own) is left to the jobs
        ECGPOS_SETUP="export PATH=/usr/bin:/bin",
    )
    proc = _run("pipeline.sh", env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert steps == list(PAPER_CHAIN)
    cmds = dict(zip(steps, _sbatch_lines(proc.stdout)))
    # the corpora are preprocessed side by side; level 0 waits for both checks
    assert {s: _dependency(cmds[s]) for s in steps} == PAPER_CHAIN
    assert cmds["preprocess-code15"][-2:] == [str(SLURM / "preprocess.sbatch"), "code15"]
    assert cmds["check-code15"][-3:] == [str(SLURM / "preprocess.sbatch"), "check", "code15"]
    assert "--array=0-3" in cmds["preprocess-code15"]
    # one array over the probe tasks per encoder, the encoder as the script's argument
    for level in ("level0", "level1"):
        probe = cmds[f"probe-{level}"]
        assert probe[-2:] == [str(SLURM / "probe.sbatch"), str(work / "runs" / level)] and "--array=0-1" in probe

    # every level train on the pool of both corpora's shard folders
    pretrain_env = {**env, "ECGPOS_GPUS_PER_NODE": "0"}
    srun = shlex.split(_run("pretrain.sbatch", pretrain_env, tmp_path, "1").stdout)
    train = shlex.split(srun[-1].split("exec ", 1)[1])
    shards = train[train.index("--shards") + 1 : train.index("--run-dir")]
    assert shards == [str(work / "shards" / "ecg-arrhythmia"), str(work / "shards" / "code15")]

    # a chain that starts at level 0 needs every corpus's shards
    later = {**env, "ECGPOS_STEPS": "level0 level1 probe merge export"}
    (work / "shards" / "ecg-arrhythmia").mkdir(parents=True)
    (work / "shards" / "ecg-arrhythmia" / "index.csv").touch()
    proc = _run("pipeline.sh", later, tmp_path)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "ECGPOS_SHARDS" in lines[0] and str(work / "shards" / "code15") in lines[0], lines
    (work / "shards" / "code15").mkdir()
    (work / "shards" / "code15" / "index.csv").touch()
    proc = _run("pipeline.sh", later, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert _dependency(_sbatch_lines(proc.stdout)[0]) == []


def test_one_corpus_and_one_encoder_keep_their_chain(tmp_path: Path) -> None:
    data = probe_data_stand_ins(tmp_path)
    run = tmp_path / "my run"
    run.mkdir()
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_SRC=str(data / "raw"),
        ECGPOS_DATA_ROOT=str(data),
        ECGPOS_STEPS="preprocess check probe merge",
        ECGPOS_PROBE_ENCODER=str(run),
    )
    proc = _run("pipeline.sh", env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert steps == ["preprocess", "check", "probe", "merge"]
    cmds = _sbatch_lines(proc.stdout)
    assert cmds[0][-1] == str(SLURM / "preprocess.sbatch")
    assert cmds[1][-2:] == [str(SLURM / "preprocess.sbatch"), "check"]
    assert cmds[2][-1] == str(SLURM / "probe.sbatch")
    assert [_dependency(c) for c in cmds] == [[], ["preprocess"], ["check"], ["probe"]]


def test_probe_script_runs_each_encoder_on_each_task_and_merges_them_in_order(tmp_path: Path) -> None:
    data = probe_data_stand_ins(tmp_path)
    work = tmp_path / "work"
    probes = work / "probes"
    tasks = ["ptbxl-super", "cpsc2018"]
    env = _clean_env(tmp_path, ECGPOS_DRY_RUN="1", ECGPOS_DATA_ROOT=str(data), ECGPOS_WORK=str(work))
    env["ECGPOS_PROBE_TASKS"] = " ".join(tasks)

    def outs(stdout: str) -> list[tuple[str, str, str]]:
        argv = [shlex.split(line) for line in stdout.splitlines()]
        return [(_flag(a, "--encoder"), _flag(a, "--task"), _flag(a, "--out")) for a in argv]

    pairs = [(str(work / "runs" / e), t, str(probes / e / t)) for e in ("level0", "level1") for t in tasks]
    proc = _run("probe.sbatch", env, tmp_path)  # no array: every encoder x task
    assert proc.returncode == 0 and outs(proc.stdout) == pairs, proc.stderr
    # an array over both encoders: task i = encoder i / T, task i % T
    array = {**env, "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "4"}
    for i, pair in enumerate(pairs):
        proc = _run("probe.sbatch", {**array, "SLURM_ARRAY_TASK_ID": str(i)}, tmp_path)
        assert outs(proc.stdout) == [pair], proc.stderr
    # one encoder as the argument: the array runs over the tasks only
    one = {**env, "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_ID": "1"}
    proc = _run("probe.sbatch", one, tmp_path, str(work / "runs" / "level1"))
    assert outs(proc.stdout) == [pairs[3]], proc.stderr
    # an array of the old size would leave the level-1 probes undone: refused, naming the size to submit
    proc = _run("probe.sbatch", {**one, "SLURM_ARRAY_TASK_ID": "0"}, tmp_path)
    assert proc.returncode == 2 and proc.stdout == "" and "--array=0-3" in proc.stderr, proc.stderr

    # merge: Level 0's folders first, so the paired differences are level 1 minus level 0
    for _, _, out in pairs[:3]:
        Path(out).mkdir(parents=True)
        (Path(out) / "results.csv").touch()
    proc = _run("probe.sbatch", env, tmp_path, "merge")
    assert proc.returncode == 2 and pairs[3][2] in proc.stderr, proc.stderr  # a missing folder is named
    Path(pairs[3][2]).mkdir(parents=True)
    (Path(pairs[3][2]) / "results.csv").touch()
    merge = shlex.split(_run("probe.sbatch", env, tmp_path, "merge").stdout)
    assert merge[:3] == ["ecgpos", "probe", "--compare"]
    assert merge[3:7] == [out for _, _, out in pairs]
    assert _flag(merge, "--out") == str(probes / "summary") and _flag(merge, "--reference") == "paper"
    merge = shlex.split(_run("probe.sbatch", {**env, "ECGPOS_PROBE_REFERENCE": ""}, tmp_path, "merge").stdout)
    assert "--reference" not in merge

    # Level 1 trained on another level-0 encoder (ECGPOS_LEVEL0_RUN): that one is probed beside it
    proc = _run("probe.sbatch", {**env, "ECGPOS_LEVEL0_RUN": str(tmp_path / "export0")}, tmp_path)
    assert [(e, o) for e, _, o in outs(proc.stdout)][:2] == [
        (str(tmp_path / "export0"), str(probes / "export0" / t)) for t in tasks
    ]

    # ECGPOS_PROBE_ENCODER: one encoder, its probes in probes/<task>/ as before
    single = {**env, "ECGPOS_PROBE_ENCODER": "random:tiny/level1"}
    proc = _run("probe.sbatch", single, tmp_path)
    assert outs(proc.stdout) == [("random:tiny/level1", t, str(probes / t)) for t in tasks], proc.stderr


def test_preprocess_script_runs_the_corpus_it_is_given(tmp_path: Path) -> None:
    data = probe_data_stand_ins(tmp_path)
    work = tmp_path / "work"
    env = _clean_env(
        tmp_path,
        ECGPOS_DRY_RUN="1",
        ECGPOS_WORK=str(work),
        ECGPOS_CORPORA=f"ecg-arrhythmia={data / 'raw'} code15={data}",
        ECGPOS_SUBSET="all",
        SLURM_ARRAY_TASK_ID="1",
        SLURM_ARRAY_TASK_COUNT="2",
    )
    code15 = shlex.split(_run("preprocess.sbatch", env, tmp_path, "code15").stdout)
    assert code15[:3] == ["ecgpos", "preprocess", "code15"] and _flag(code15, "--src") == str(data)
    assert _flag(code15, "--out") == str(work / "shards" / "code15") and _flag(code15, "--part") == "1"
    assert "--subset" not in code15  # the id range of ecg-arrhythmia; code15 refuses it
    arrhythmia = shlex.split(_run("preprocess.sbatch", env, tmp_path, "ecg-arrhythmia").stdout)
    assert _flag(arrhythmia, "--subset") == "all"
    assert _flag(arrhythmia, "--out") == str(work / "shards" / "ecg-arrhythmia")
    check = shlex.split(_run("preprocess.sbatch", env, tmp_path, "check", "code15").stdout)
    assert check == ["ecgpos", "preprocess", "--check", "--out", str(work / "shards" / "code15")]
    for args in ((), ("check",), ("ptbxl",)):  # which corpus: refused unless named, and named right
        proc = _run("preprocess.sbatch", env, tmp_path, *args)
        assert proc.returncode == 2 and proc.stdout == "" and "ECGPOS_CORPORA" in proc.stderr, (args, proc.stderr)


def test_known_datasets_and_subsets_match_the_preprocess_cli() -> None:
    from ecgpos.preprocessing.build import SOURCES
    from ecgpos.preprocessing.ecg_arrhythmia import SUBSETS

    common = shlex.quote(str(SLURM / "common.sh"))
    script = f'. {common}; echo "$ECGPOS_KNOWN_DATASETS"; echo "$ECGPOS_KNOWN_SUBSETS"'
    datasets, subsets = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split(
        "\n"
    )[:2]
    assert datasets.split() == sorted(SOURCES) and subsets.split() == sorted(SUBSETS)
