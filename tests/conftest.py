"""Shared fixtures: the real sample data (one place), and artefacts built once per session."""

from __future__ import annotations

import os

# The suite runs on the CPU, as CI does, also on a machine with a GPU: its exact comparisons (resume,
# processes, accumulation) rely on CPU determinism and fp32. CUDA is hidden here, before anything
# imports torch; tests/test_train_cuda.py runs its checks in subprocesses that see the real devices.
os.environ.setdefault("ECGPOS_TEST_CUDA_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
os.environ["CUDA_VISIBLE_DEVICES"] = ""

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ecgpos.resources import DATA_ENV_VAR, sample_data_root  # noqa: E402

# Tests never use more threads than the 2-core CI machine has.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Root of the real sample records ($ECGPOS_SAMPLE_DATA, default ../shared/data).

    Absent data skips the real-data tests, except under CI=true where it is a failure.
    """
    root = sample_data_root()
    if not (root / "ecg-arrhythmia").is_dir():
        message = f"real sample data not found at {root} (set {DATA_ENV_VAR})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return root


@pytest.fixture(scope="session")
def arrhythmia_shards(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards of all 200 real ecg-arrhythmia sample records, built once per session."""
    from ecgpos.cli import main

    out = tmp_path_factory.mktemp("arrhythmia-shards")
    rc = main(
        [
            "preprocess",
            "ecg-arrhythmia",
            "--src",
            str(shared_data / "ecg-arrhythmia"),
            "--subset",
            "all",
            "--out",
            str(out),
            "--records-per-shard",
            "64",
        ]
    )
    assert rc == 0
    return out


# Refusal tests (test_refusals*.py): a real record, tiny shards, a tiny run and its export.
@pytest.fixture(scope="module")
def real_record(shared_data) -> Path:
    return shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory) -> Path:
    from shard_fixtures import write_tiny_shards

    return write_tiny_shards(tmp_path_factory.mktemp("refusal-shards") / "shards", n_records=24, records_per_shard=12)


@pytest.fixture(scope="module")
def tiny_run(tiny_shards, tmp_path_factory) -> Path:
    """A 4-step level-0 run with checkpoints at steps 2 and 4."""
    from tiny_runs import pretrain_tiny

    out = tmp_path_factory.mktemp("refusal-run") / "run"
    steps = ["optim.steps=4", "train.batch_size=4", "train.num_workers=0", "train.checkpoint_every=2"]
    return pretrain_tiny(0, tiny_shards, out, *(arg for s in steps for arg in ("--set", s)))


@pytest.fixture(scope="module")
def export(tiny_run, tmp_path_factory) -> Path:
    from ecgpos.cli import main

    out = tmp_path_factory.mktemp("refusal-export") / "enc"
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(out)]) == 0
    return out


# Pretraining tests (test_train_runs.py, test_train_stops.py, test_pretrain_refusals.py): 48 tiny records
# and a 40-step level-0 run.
@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shard_fixtures import write_tiny_shards

    return write_tiny_shards(tmp_path_factory.mktemp("tiny") / "shards", n_records=48, records_per_shard=20)


@pytest.fixture(scope="module")
def run0(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pretrain_helpers import RUN0, pretrain

    run = tmp_path_factory.mktemp("runs") / "level0"
    assert pretrain(0, shards, run, *RUN0) == 0
    return run


# Export and embed tests (test_export.py, test_embed.py): tiny runs of every level on the real
# ecg-arrhythmia samples and their exports, built once per session.
EXPORT_FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]


@pytest.fixture(scope="session")
def level0_run(arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import pretrain_tiny

    return pretrain_tiny(0, arrhythmia_shards, tmp_path_factory.mktemp("export-level0") / "run", *EXPORT_FAST)


@pytest.fixture(scope="session")
def level1_run(level0_run: Path, arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import pretrain_tiny

    run = tmp_path_factory.mktemp("export-level1") / "run"
    return pretrain_tiny(1, arrhythmia_shards, run, *EXPORT_FAST, base=level0_run)


@pytest.fixture(scope="session")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A probe-results folder as `ecgpos probe` writes it (results.csv only: the card must tabulate it)."""
    folder = tmp_path_factory.mktemp("probe-results")
    (folder / "results.csv").write_text("task,fraction,macro_auroc\nptbxl_super,0.01,0.6123\n")
    return folder


@pytest.fixture(scope="session")
def export0(level0_run: Path, probe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import cli

    out = tmp_path_factory.mktemp("exports") / "level0"
    assert cli("export", "--run-dir", level0_run, "--out", out, "--onnx", "--probe-results", probe_dir) == 0
    return out


@pytest.fixture(scope="session")
def export1(level1_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import cli

    out = tmp_path_factory.mktemp("exports") / "level1"
    assert cli("export", "--run-dir", level1_run, "--out", out) == 0
    return out


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running one-node Slurm cluster for one test module (tests/slurm_jobs.py)."""
    from slurm_jobs import running_cluster

    yield from running_cluster()
