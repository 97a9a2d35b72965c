"""Benchmark: one pretraining step (forward + backward + AdamW step) for a run config, on this device.

Times the same model, optimizer grouping and precision the trainer uses ('auto': bf16 autocast on
a CUDA device with bf16, fp32 otherwise) on random (B, 12, window) batches, after warm-up steps.
Prints samples/s and peak memory (CUDA: max allocated; CPU: process peak RSS). For a Stage-1
config it also times the frozen Stage-0 forward alone (no_grad, bf16 on CUDA), as the trainer runs
it, and reports its share of a Stage-1 step. Stage 1 uses --stage0 (a run or export folder) or a
random Stage-0 encoder of the config's width (weights do not change the cost). The last line is the figure.

    python bench/train_step.py --config configs/stage0.yaml [--batch 64] [--steps 10] [--warmup 3]
    python bench/train_step.py --config configs/stage1.yaml [--stage0 RUN_OR_EXPORT]
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.models.st_mem import STMEMEncoder, param_count  # noqa: E402
from ecgpos.pretrain.run_config import load_run_config  # noqa: E402
from ecgpos.pretrain.stages import build_model, param_groups  # noqa: E402
from ecgpos.pretrain.trainer import resolve_mixed_precision, step_generator  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def timed(fn, steps: int, warmup: int, device: torch.device) -> float:
    """Seconds per call of fn(i) after `warmup` calls."""
    for i in range(warmup):
        fn(i)
    sync(device)
    start = time.perf_counter()
    for i in range(steps):
        fn(warmup + i)
    sync(device)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--stage0", type=Path, help="Stage 1: Stage-0 run or export folder (default: random)")
    parser.add_argument("--batch", type=int, help="per-device batch (default: the config's global batch)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_run_config(args.config, args.overrides)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve_mixed_precision(cfg.train.mixed_precision)
    batch = args.batch or cfg.train.batch_size
    torch.manual_seed(0)
    stage0 = None
    if cfg.stage == 1:
        if args.stage0 is not None:
            from ecgpos.pretrain.plan import load_stage0

            stage0 = load_stage0(args.stage0, cfg)[0]
        else:
            stage0 = STMEMEncoder(cfg.encoder).requires_grad_(False).eval()
    model = build_model(cfg, stage0).to(device).train()
    optimizer = torch.optim.AdamW(param_groups(model, cfg.optim.weight_decay), lr=cfg.optim.lr,
                                  betas=cfg.optim.betas)
    trainable = [p for p in model.parameters() if p.requires_grad]
    x = torch.randn(batch, 12, cfg.preprocess.window, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step(i: int) -> None:
        with autocast:
            out = model(x, generator=step_generator(0, i, 0))
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = timed(step, args.steps, args.warmup, device)
    memory = peak_memory_mb(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    trainable_n = sum(p.numel() for p in trainable)
    print(f"config {args.config}: stage {cfg.stage}, encoder {cfg.encoder.width}x{cfg.encoder.depth}, decoder "
          f"{cfg.decoder.width}x{cfg.decoder.depth}, {trainable_n / 1e6:.2f}M trainable of "
          f"{param_count(model) / 1e6:.2f}M params, batch {batch}, precision {precision}, device {name}")
    share = ""
    if cfg.stage == 1:
        frozen = model.stage0

        @torch.no_grad()
        def stage0_forward(i: int) -> None:  # noqa: ARG001
            model.latent_tokens(x)

        s0 = timed(stage0_forward, args.steps, args.warmup, device)
        share = f" stage0_forward_ms={s0 * 1e3:.1f} stage0_forward_share={s0 / seconds:.2f}"
        assert not any(p.requires_grad for p in frozen.parameters())
    print(f"train_step stage={cfg.stage} device={device.type} batch={batch} step_ms={seconds * 1e3:.1f} "
          f"samples_per_s={batch / seconds:.1f} peak_mem_mb={memory:.0f}{share}")


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
