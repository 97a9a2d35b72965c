"""Benchmark: one fine-tuning step beside one level-0 pretraining step, same encoder, batch and window.

The fine-tuning step is `ecgpos finetune --mode full`'s (ECG augmentations on the batch, the encoder and a
linear head, binary cross-entropy, AdamW over the layer-decay groups, clipping); the pretraining step is
the trainer's (masked encoder, decoder, fused AdamW, clipping) as bench/train_step.py times it. Both run
on a random (B, 12, window) batch after warm-up steps, precision 'auto' (bf16 autocast on CUDA, fp32 on
the CPU). A pretraining step encodes only the visible quarter of the patches, a fine-tuning step all of
them, so the FLOPs per sample differ: the bench prints both (FlopCounterMode) and the ratio of samples/s
and of FLOP/s (how well each step uses the device). Both steps compile as their commands compile them
(`--compile`, default auto: `train.compile` and fine-tuning's `compile` resolve alike, CUDA graphs on one
GPU, eager on the CPU), so compiled is compared with compiled; the warm-up steps take the compiles.
The last line is the figure.

    python bench/finetune.py [--config configs/level0.yaml] [--batch 64] [--steps 10] [--warmup 3] [--compile auto]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from train_step import sync, timed  # noqa: E402  (bench/ is this script's folder)

from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.pretrain.optim import (  # noqa: E402
    build_optimizer,
    compile_model,
    compile_name,
    resolve_compile,
    resolve_mixed_precision,
)
from ecgpos.pretrain.schedule import step_generator  # noqa: E402
from ecgpos.probes.finetune.augment import augment  # noqa: E402
from ecgpos.probes.finetune.config import AugmentConfig, Mode, OptimConfig  # noqa: E402
from ecgpos.probes.finetune.model import Classifier, param_groups, prepare_mode  # noqa: E402
from ecgpos.runs.levels import build_model  # noqa: E402
from ecgpos.runs.run_config import load_run_config  # noqa: E402

CLASSES = 5  # PTB-XL's super-classes


def _flops(fn) -> float:
    with FlopCounterMode(display=False) as counter:
        fn(0)
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("configs/level0.yaml"), help="a level-0 run config")
    parser.add_argument("--batch", type=int, default=0, help="batch size (default: the config's)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--compile", default="auto", help="both steps' compile setting: auto (default), false, true or a mode"
    )
    args = parser.parse_args()
    requested = {"false": False, "true": True}.get(args.compile.lower(), args.compile)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_run_config(args.config)
    if cfg.level != 0:
        raise EcgposError(f"--config {args.config} is a level-{cfg.level} config; the bench compares level 0")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve_mixed_precision(cfg.train.mixed_precision)
    autocast = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")  # noqa: E731
    batch = args.batch or cfg.train.batch_size
    x = torch.randn(batch, 12, cfg.preprocess.window, device=device)
    target = (torch.rand(batch, CLASSES, device=device) < 0.3).float()

    torch.manual_seed(0)
    pretrain = build_model(cfg).to(device).train()
    pre_opt = build_optimizer(pretrain, cfg)
    pre_params = [p for p in pretrain.parameters() if p.requires_grad]

    def pretrain_step(i: int) -> None:
        noise = pretrain.draw_noise(batch, step_generator(0, i, 0, device=device), device)
        with autocast():  # the noise drawn outside the forward, as the trainer does: one graph
            loss = pretrain(x, noise=noise)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(pre_params, cfg.optim.grad_clip)
        pre_opt.step()
        pre_opt.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    optim = OptimConfig(batch_size=batch)
    model = Classifier(build_model(cfg).encoder, CLASSES)
    prepare_mode(model, Mode("full"), optim)
    model.to(device).train()
    ft_opt = torch.optim.AdamW(param_groups(model, optim), lr=optim.lr, betas=optim.betas)
    ft_params = [p for p in model.parameters() if p.requires_grad]
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator(device=device).manual_seed(0)

    def finetune_step(i: int) -> None:  # noqa: ARG001
        batch_in = augment(x, AugmentConfig(), float(cfg.preprocess.fs), generator)
        with autocast():
            loss = loss_fn(model(batch_in).float(), target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ft_params, optim.grad_clip)
        ft_opt.step()
        ft_opt.zero_grad(set_to_none=True)

    flops = {"pretrain": _flops(pretrain_step) / batch, "finetune": _flops(finetune_step) / batch}
    mode = resolve_compile(requested, device)
    compile_model(pretrain, mode)  # after counting: FlopCounterMode counts the eager modules
    compile_model(model, mode)
    sync(device)
    seconds = {
        "pretrain": timed(pretrain_step, args.steps, args.warmup, device),
        "finetune": timed(finetune_step, args.steps, args.warmup, device),
    }
    rate = {k: batch / s for k, s in seconds.items()}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(
        f"config {args.config}: encoder {cfg.encoder.width}x{cfg.encoder.depth}, decoder "
        f"{cfg.decoder.width}x{cfg.decoder.depth}, mask ratio {cfg.mask_ratio:g}, batch {batch}, "
        f"precision {precision}, compile {compile_name(mode)}, device {name}"
    )
    for k in ("pretrain", "finetune"):
        print(
            f"{k}: step {seconds[k] * 1e3:.1f} ms, {rate[k]:.1f} samples/s, {flops[k] / 1e9:.2f} GFLOP per sample, "
            f"{rate[k] * flops[k] / 1e9:.1f} GFLOP/s"
        )
    per_flop = rate["finetune"] * flops["finetune"] / (rate["pretrain"] * flops["pretrain"])
    print(
        f"finetune/pretrain samples/s: {rate['finetune'] / rate['pretrain']:.2f}x "
        f"(FLOP/s: {per_flop:.2f}x; {flops['finetune'] / flops['pretrain']:.2f}x the FLOPs per sample)"
    )


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
