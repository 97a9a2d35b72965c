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
