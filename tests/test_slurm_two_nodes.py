"""`sbatch --nodes=2 slurm/pretrain.sbatch 0` on a real two-node Slurm cluster on this host (two slurmd,
`slurmd -N NAME`, each on a port of its own): the nodes' trainers meet and train as one run."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import ClusterError, SlurmCluster, missing_binaries

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def two_node_cluster():
    if os.geteuid() != 0:
        pytest.skip("the test Slurm cluster needs root")
    if missing_binaries() and not (REPO / "slurm" / "ci" / "install.sh").exists():
        pytest.skip("slurm-wlm/munge missing")
    cluster = SlurmCluster(extra_nodes=1)
    try:
        cluster.start()
    except ClusterError as err:
        pytest.fail(f"could not bring up the two-node Slurm cluster: {err}")
    yield cluster
    cluster.stop()


def test_pretrain_sbatch_on_two_nodes(two_node_cluster: SlurmCluster, shards: Path, tmp_path: Path) -> None:
    cluster = two_node_cluster
    bin_dir = tmp_path / "bin"  # `accelerate` of this interpreter on the nodes' PATH
    bin_dir.mkdir()
    (bin_dir / "accelerate").write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "from accelerate.commands.accelerate_cli import main; '
        f'main()" "$@"\n'
    )
    (bin_dir / "accelerate").chmod(0o755)
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    env = {k: v for k, v in cluster.env.items() if k == "SLURM_CONF" or not k.startswith(("SLURM_", "ECGPOS_"))}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.update(
        ECGPOS_SETUP=f"export PATH={shlex.quote(str(bin_dir))}:{shlex.quote(str(Path(sys.executable).parent))}:$PATH "
        f"PYTHONPATH={shlex.quote(str(REPO))}",
        ECGPOS_REPO=str(REPO),
        ECGPOS_WORK=str(work),
        ECGPOS_LOG_DIR=str(work / "logs"),
        ECGPOS_GPUS_PER_NODE="0",
        ECGPOS_SHARDS=str(shards),
        ECGPOS_LEVEL0_CONFIG=str(REPO / "configs" / "tiny" / "level0.yaml"),
        ECGPOS_PRETRAIN_SET="optim.steps=4 train.checkpoint_every=2 train.batch_size=8 train.num_workers=0",
        OMP_NUM_THREADS="1",
    )
    out = work / "logs" / "pretrain-%j.out"
    sbatch = ["sbatch", "--parsable", "--nodes=2", "--cpus-per-task=1", f"--output={out}"]
    proc = subprocess.run(
        [*sbatch, str(REPO / "slurm" / "pretrain.sbatch"), "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and cluster.run("squeue", "-h", "-j", job, check=False).stdout.strip():
        time.sleep(1)
    log = Path(str(out).replace("%j", job))
    text = log.read_text() if log.is_file() else "(no log)"
    state = cluster.run("scontrol", "-o", "show", "job", job, check=False).stdout
    assert "JobState=COMPLETED" in state and "NodeList=" in state, text[-3000:] + cluster.log_tail()
    assert f"NodeList={cluster.nodes[0]},{cluster.nodes[1]}" in state or "NumNodes=2" in state, state
    info = json.loads((work / "runs" / "level0" / "run_info.json").read_text())
    assert info["finished"] is True and info["num_processes"] == 2, text[-3000:]
    assert "level 0: 2 node(s) x 0 GPU(s)" in text and "level 0 finished" in text
