"""The trainer on a GPU (skipped without one): bf16 learns, steady-state steps never wait for the
device, the compiled model follows the eager one (also when gradients accumulate over two
micro-batches, compiled without CUDA graphs), compiled latent levels 1 and 2 follow theirs, `pretrain
--level 1` and fine-tuning run with their defaults (compiled, bf16), and level 1's frozen level-0 pass
runs in the caller's precision. The suite itself hides CUDA (conftest.py), so each check runs in a subprocess that sees
the machine's devices (tests/cuda_checks.py)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = Path(__file__).resolve().parent / "cuda_checks.py"
CHECK_NAMES = (
    "bf16-learns",
    "no-sync",
    "compiled-agrees",
    "compiled-accum-agrees",
    "level0-precision",
    "compiled-latent-agrees",
    "level1-default-compile",
    "finetune-bf16",
)
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def cuda_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "OMP_NUM_THREADS": "4"}
    devices = os.environ.get("ECGPOS_TEST_CUDA_DEVICES", "all")
    if devices == "all":
        env.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return env


@functools.cache
def has_cuda() -> bool:
    code = "import torch; print(torch.cuda.is_available())"
    done = subprocess.run([sys.executable, "-c", code], env=cuda_env(), capture_output=True, text=True, timeout=120)
    return done.stdout.strip() == "True"


@pytest.mark.parametrize("check", list(CHECK_NAMES))
def test_on_the_gpu(check: str, tmp_path: Path) -> None:
    if not has_cuda():
        pytest.skip("no CUDA device")
    done = subprocess.run(
        [sys.executable, str(CHECKS), check, str(tmp_path)], env=cuda_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("ok"), done.stdout[-2000:]
    print(verdict)  # the check's figure (e.g. the compiled run's largest loss difference), shown by pytest -rP


def test_every_gpu_check_runs_here() -> None:
    """A check added to tests/cuda_checks.py and forgotten here would never run."""
    sys.path.insert(0, str(CHECKS.parent))
    from cuda_checks import CHECKS as DEFINED

    assert set(DEFINED) == set(CHECK_NAMES)
