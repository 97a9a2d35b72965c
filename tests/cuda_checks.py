"""GPU checks of the trainer, run by tests/test_train_cuda.py in a subprocess that sees the GPU.

    python tests/cuda_checks.py CHECK WORKDIR     (CHECK: a key of CHECKS below)

Each check raises (exit 1) on failure and prints one line starting with "ok" on success.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain_helpers import LEARNS, MEAN_PREDICTOR_LOSS, beats_the_mean_predictor  # noqa: E402
from shard_fixtures import ecg_like, smooth_like, write_tiny_shards  # noqa: E402
from test_models import check_frozen_level0_precision  # noqa: E402

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


def trainer(
    work: Path, name: str, *extra: str, level: int = 0, base: Path | None = None, smooth: bool = False
) -> Trainer:
    """A Trainer of level `level` (on `base` for a latent level) on tiny shards (smooth_like ones with `smooth`)."""
    shards = work / ("smooth-shards" if smooth else "shards")
    if not shards.is_dir():
        write_tiny_shards(shards, n_records=48, records_per_shard=24, signal=smooth_like if smooth else ecg_like)
    config = config_path("tiny/level0" if level == 0 else "tiny/level1")
    args = ["--level", str(level), "--config", str(config), "--shards", str(shards), "--run-dir", str(work / name)]
    args += ["--base", str(base)] if base is not None else []
    return Trainer(prepare(build_parser().parse_args([*args, *FAST, *extra])))


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def bf16_learns(work: Path) -> None:
    """bf16 beats predicting the mean by the CPU check's margin, on the same smooth shards and settings."""
    assert trainer(work, "bf16", *LEARNS, "--set", "train.mixed_precision=bf16", smooth=True).run() == 0
    info = json.loads((work / "bf16" / "run_info.json").read_text())
    beats, last = beats_the_mean_predictor(losses(work / "bf16"))
    assert info["mixed_precision"] == "bf16" and beats, (last, MEAN_PREDICTOR_LOSS)
    print(f"ok bf16 last 10 steps {last:.4f} against the mean predictor's {MEAN_PREDICTOR_LOSS}")


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


def compiled_latent_agrees(work: Path) -> None:
    """Levels 1 and 2, grad_accum 1 and 2, compiled as "auto" compiles on one GPU: the eager curves
    within bf16 noise, and the frozen levels below bit-identical after training."""
    base = ["--set", "optim.steps=6", "--set", "train.mixed_precision=bf16"]
    assert trainer(work, "level0", *base).run() == 0
    assert trainer(work, "level1", *base, level=1, base=work / "level0").run() == 0
    worst = {}
    for level in (1, 2):
        for accum in (1, 2):
            common = ["--set", "optim.steps=10", "--set", "train.mixed_precision=bf16"]
            common += ["--set", f"train.grad_accum={accum}", "--set", f"train.batch_size={8 * accum}"]
            below = work / f"level{level - 1}"
            name = f"l{level}-a{accum}"
            assert trainer(work, f"{name}-eager", *common, level=level, base=below).run() == 0
            compiled = trainer(work, f"{name}-auto", *common, "--set", "train.compile=auto", level=level, base=below)
            assert compiled.run() == 0
            info = json.loads((work / f"{name}-auto" / "run_info.json").read_text())
            assert info["compile"] != "eager" and "compile_fallback" not in info, info
            eager, auto = losses(work / f"{name}-eager"), losses(work / f"{name}-auto")
            worst[name] = max(abs(a - b) / abs(a) for a, b in zip(eager, auto))
            assert len(eager) == len(auto) == 10 and worst[name] < 0.03, (name, eager, auto)
    print(
        "ok compiled latent levels vs eager, largest relative loss difference: "
        + ", ".join(f"{k} {v:.4f}" for k, v in worst.items())
    )


def level1_default_compile(work: Path) -> None:
    """`ecgpos pretrain --level 1` as a user runs it: the default train.compile (auto) compiles and finishes."""
    from ecgpos.cli import main

    shards = work / "shards"
    write_tiny_shards(shards, n_records=48, records_per_shard=24)
    quick = ["--set", "optim.steps=20", "--set", "train.num_workers=0"]
    assert main(["pretrain", "--level", "0", "--config", "tiny/level0", "--shards", str(shards),
                 "--run-dir", str(work / "level0"), *quick]) == 0  # fmt: skip
    assert main(["pretrain", "--level", "1", "--config", "tiny/level1", "--shards", str(shards),
                 "--run-dir", str(work / "level1"), "--base", str(work / "level0"), *quick]) == 0  # fmt: skip
    info = json.loads((work / "level1" / "run_info.json").read_text())
    assert info["finished"] and info["compile"] == "reduce-overhead" and info["mixed_precision"] == "bf16", info
    print(f"ok pretrain --level 1 with the defaults: compile {info['compile']}, precision {info['mixed_precision']}")


def finetune_bf16(work: Path) -> None:  # noqa: ARG001
    """Fine-tuning's defaults on a GPU: bf16 autocast and the compiled forward (auto); finite logits."""
    import numpy as np
    from accelerate import Accelerator

    from ecgpos.models.factory import build_nested
    from ecgpos.pretrain.optim import resolve_mixed_precision
    from ecgpos.probes.finetune.config import AugmentConfig, FinetuneConfig, Mode, OptimConfig
    from ecgpos.probes.finetune.train import Split, train_classifier

    rng = np.random.default_rng(0)

    def split(n: int) -> Split:
        signals = np.empty(n, dtype=object)
        signals[:] = [rng.standard_normal((12, 2500)).astype(np.float32) for _ in range(n)]
        return Split(signals, np.stack([np.arange(n) % 2, (np.arange(n) // 2) % 2], axis=1), [str(i) for i in range(n)])

    defaults = FinetuneConfig()
    acc = Accelerator(mixed_precision=resolve_mixed_precision(defaults.mixed_precision))
    encoder = build_nested([{"width": 64, "depth": 2, "heads": 4, "mlp_ratio": 2.0}])
    trained = train_classifier(
        encoder, 2, Mode("full"), {"train": split(32), "val": split(16), "test": split(16)},
        OptimConfig(epochs=2, warmup_epochs=1, batch_size=16), AugmentConfig(), 250.0, 2250, 1, 0, acc,
        eval_batch=16, compile=defaults.compile,
    )  # fmt: skip
    assert acc.mixed_precision == "bf16" and trained.compiled == "reduce-overhead", (acc.mixed_precision, trained)
    assert np.isfinite(trained.test_scores).all()
    print(f"ok fine-tuning defaults on the GPU: precision {acc.mixed_precision}, compile {trained.compiled}")


def level0_precision(work: Path) -> None:  # noqa: ARG001
    """Level 1's frozen level-0 pass on the GPU: fp32 outside autocast, the caller's bf16 inside."""
    check_frozen_level0_precision("cuda")
    print("ok frozen level-0 pass in the caller's precision on the GPU")


CHECKS = {
    "bf16-learns": bf16_learns,
    "no-sync": no_sync,
    "compiled-agrees": compiled_agrees,
    "compiled-accum-agrees": lambda work: compiled_agrees(work, grad_accum=2),
    "level0-precision": level0_precision,
    "compiled-latent-agrees": compiled_latent_agrees,
    "level1-default-compile": level1_default_compile,
    "finetune-bf16": finetune_bf16,
}

if __name__ == "__main__":
    assert torch.cuda.is_available(), "no CUDA device"
    CHECKS[sys.argv[1]](Path(sys.argv[2]))
