"""GPU checks of the trainer, run by tests/test_train_cuda.py in a subprocess that sees the GPU.

    python tests/cuda_checks.py {bf16-learns,no-sync,compiled-agrees,compiled-accum-agrees,stage0-precision} WORKDIR

Each check raises (exit 1) on failure and prints one line starting with "ok" on success.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shard_fixtures import write_tiny_shards  # noqa: E402
from test_models import check_frozen_stage0_precision  # noqa: E402

from ecgpos.cli.pretrain import build_parser  # noqa: E402
from ecgpos.pretrain.data import train_loader  # noqa: E402
from ecgpos.pretrain.plan import prepare  # noqa: E402
from ecgpos.pretrain.trainer import Trainer  # noqa: E402
from ecgpos.resources import config_path  # noqa: E402

FAST = [
    "--set",
    "train.batch_size=8",
    "--set",
    "train.num_workers=0",
    "--set",
    "train.log_every=1",
    "--set",
    "train.figure_every=1000",
    "--set",
    "train.checkpoint_every=1000",
    "--set",
    "train.compile=false",  # eager unless a check says otherwise ("auto" compiles on CUDA)
]


def trainer(work: Path, name: str, *extra: str) -> Trainer:
    shards = work / "shards"
    if not shards.is_dir():
        write_tiny_shards(shards, n_records=48, records_per_shard=24)
    args = build_parser().parse_args(
        [
            "--stage",
            "0",
            "--config",
            str(config_path("tiny/stage0")),
            "--shards",
            str(shards),
            "--run-dir",
            str(work / name),
            *FAST,
            *extra,
        ]
    )
    return Trainer(prepare(args))


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def bf16_learns(work: Path) -> None:
    assert trainer(work, "bf16", "--set", "optim.steps=40", "--set", "train.mixed_precision=bf16").run() == 0
    info = json.loads((work / "bf16" / "run_info.json").read_text())
    curve = losses(work / "bf16")
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert info["mixed_precision"] == "bf16" and last < 0.85 * first, (first, last)
    print(f"ok bf16 loss {first:.4f} -> {last:.4f}")


def no_sync(work: Path) -> None:
    """Steady-state steps under sync debug mode "error": any host wait inside a step raises."""
    t = trainer(work, "sync", "--set", "optim.steps=100", "--set", "train.mixed_precision=bf16")
    t._setup()
    t._write_run_files()
    batches = iter(train_loader(t.train_set, t.sampler, 0))
    t.model.train()
    for step in range(3):  # warm-up: lazy state (optimizer moments, cuBLAS handles) is created here
        t._train_step(batches, step)
    torch.cuda.synchronize()
    batch = [next(batches) for _ in range(5)]  # the loader's pinning is outside the step
    try:
        torch.cuda.set_sync_debug_mode("error")
        for step in range(3, 8):
            t._train_step(iter(batch), step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert t.guard.check() is None
    print("ok 5 steady-state steps without a host-device sync")


def compiled_agrees(work: Path, grad_accum: int = 1) -> None:
    """Same seed, eager and compiled as "auto" compiles on one GPU (CUDA graphs; with grad_accum 2,
    Inductor without them): the same loss curve within bf16 noise."""
    common = (
        "--set",
        "optim.steps=20",
        "--set",
        "train.mixed_precision=bf16",
        "--set",
        f"train.grad_accum={grad_accum}",
    )
    assert trainer(work, "eager", *common).run() == 0
    assert trainer(work, "compiled", *common, "--set", "train.compile=auto").run() == 0
    eager, compiled = losses(work / "eager"), losses(work / "compiled")
    worst = max(abs(a - b) / abs(a) for a, b in zip(eager, compiled))
    assert len(eager) == len(compiled) == 20 and worst < 0.03, (eager, compiled)
    print(f"ok compiled vs eager, grad_accum {grad_accum}: largest relative loss difference {worst:.4f} over 20 steps")


def stage0_precision(work: Path) -> None:  # noqa: ARG001
    """Stage 1's frozen Stage-0 pass on the GPU: fp32 outside autocast, the caller's bf16 inside."""
    check_frozen_stage0_precision("cuda")
    print("ok frozen Stage-0 pass in the caller's precision on the GPU")


CHECKS = {
    "bf16-learns": bf16_learns,
    "no-sync": no_sync,
    "compiled-agrees": compiled_agrees,
    "compiled-accum-agrees": lambda work: compiled_agrees(work, grad_accum=2),
    "stage0-precision": stage0_precision,
}

if __name__ == "__main__":
    assert torch.cuda.is_available(), "no CUDA device"
    CHECKS[sys.argv[1]](Path(sys.argv[2]))
