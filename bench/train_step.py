"""Benchmark: one pretraining step (forward + backward + AdamW step) for a run config, on this device.

Times the trainer's own step (model, fused AdamW and parameter groups, clipping, the on-device
non-finite guard, device-side stats, precision 'auto': bf16 autocast on a CUDA device with bf16,
fp32 otherwise) on a random (B, 12, window) batch, after warm-up steps; prints samples/s, peak
memory (CUDA: max allocated; CPU: process peak RSS) and MFU: FLOPs per sample counted by
torch.utils.flop_counter.FlopCounterMode on the model itself (forward + backward), against the
card's peak measured in the same run by a short bf16 matmul (CPU: an fp32 matmul). For a latent
config it also times the frozen forward of the levels below and reports its share of the step; the
base is --base (a run or export folder) or random levels (level 0 from the `level0.yaml`
beside the config, the latent levels from the config). --level N trains level N of a latent config
(default: its own level) and, for N >= 2, also times a level-1 step of the same config on the same
level 0, alternating with level N's, and prints both with their ratio (the cost of depth: the frozen levels run under
torch.no_grad and compile with the trained level, in one graph).
--compile times the whole model compiled (train.compile); the first line gives the number of graphs
and the first step's time (the compile). --e2e SHARDS runs the real trainer (loader, logging, figure
and checkpoint at the end) for --e2e-steps steps on those shards and prints its samples/s (from
metrics.jsonl, first record excluded) and the ratio to the bare step. --profile N adds where N steps' device
time goes (bench/step_profile.py: top kernels, the share outside matmuls and attention).
The last line is the figure.

    python bench/train_step.py --config configs/level0.yaml [--batch 64] [--steps 10] [--warmup 3]
    python bench/train_step.py --config configs/level1.yaml [--base RUN_OR_EXPORT] [--compile]
    python bench/train_step.py --config configs/level1.yaml --level 2 [--base RUN_OR_EXPORT] [--steps 3]
    python bench/train_step.py --config configs/level0.yaml --e2e SHARDS [--e2e-steps 300]
    python bench/train_step.py --config configs/level0.yaml --compile reduce-overhead --profile 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/step_profile.py

from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.models.factory import build_nested, cut_encoder  # noqa: E402
from ecgpos.models.st_mem import param_count  # noqa: E402
from ecgpos.pretrain.guard import NonFiniteGuard  # noqa: E402
from ecgpos.pretrain.optim import (  # noqa: E402
    build_optimizer,
    compile_model,
    resolve_compile,
    resolve_mixed_precision,
)
from ecgpos.pretrain.schedule import step_generator  # noqa: E402
from ecgpos.runs.levels import build_model  # noqa: E402
from ecgpos.runs.run_config import load_run_config  # noqa: E402


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


def matmul_peak(device: torch.device) -> tuple[float, str]:
    """Measured dense matmul FLOP/s of this device: bf16 8192^3 on CUDA, fp32 1024^3 on CPU."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    seconds = timed(lambda i: a @ b, 10, 3, device)
    return 2 * n**3 / seconds, f"{str(dtype).removeprefix('torch.')} matmul {n}^3"


def attention_report(model: torch.nn.Module, x: torch.Tensor, generator, autocast) -> str:
    """How many attention modules call F.scaled_dot_product_attention, and (CUDA) whether the flash
    kernel accepts the model's attention: a forward restricted to it raises otherwise."""
    attn = [m for m in model.modules() if hasattr(m, "fused_attn")]
    report = f"sdpa={sum(bool(m.fused_attn) for m in attn)}/{len(attn)}"
    if x.device.type != "cuda":
        return report
    from torch.nn.attention import SDPBackend, sdpa_kernel

    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), autocast, torch.no_grad():
            model(x, generator=generator)
        return report + " flash=yes"
    except RuntimeError as err:
        return report + f" flash=no ({str(err).splitlines()[0][:80]})"


def e2e(args: argparse.Namespace, cfg_overrides: list[str], base: torch.nn.Module | None, batch: int) -> float:
    """Samples/s of the real trainer on --e2e shards (records after the first: start-up excluded)."""
    from ecgpos.pretrain.plan import RunPlan, check_shards
    from ecgpos.pretrain.trainer import Trainer

    every = max(args.e2e_steps // 10, 1)
    overrides = [
        *cfg_overrides,
        f"optim.steps={args.e2e_steps}",
        f"train.batch_size={batch}",
        f"train.log_every={every}",
        f"train.checkpoint_every={args.e2e_steps}",
        f"train.figure_every={args.e2e_steps}",
        "train.grad_accum=1",
    ]
    cfg = load_run_config(args.config, overrides, level=args.level)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        plan = RunPlan(
            cfg,
            list(args.e2e),
            run,
            check_shards(cfg, args.e2e),
            False,
            base,
            "random" if base is not None else None,
        )
        started = time.perf_counter()
        if Trainer(plan).run() != 0:
            raise EcgposError("the end-to-end run failed")
        wall = time.perf_counter() - started
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "samples_per_s" in r][1:]
    if not records:
        raise EcgposError("--e2e-steps too small: no record after the first")
    steps = [r["step"] - p["step"] for p, r in zip([{"step": 0}, *records], records)][1:] or [every]
    seconds = sum(s * batch / r["samples_per_s"] for s, r in zip(steps, records[-len(steps) :]))
    print(f"e2e: {args.e2e_steps} steps, {wall:.1f} s wall with start-up, loss {records[-1]['loss']:.4f}")
    return sum(steps) * batch / seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--base", dest="base", type=Path, help="levels below: run or export (default: random)")
    parser.add_argument("--level", type=int, help="level to train with a latent config (default: the config's level)")
    parser.add_argument("--batch", type=int, help="per-device batch (default: the config's global batch)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument(
        "--compile",
        nargs="?",
        const="true",
        default=None,
        help="compile the whole model (train.compile; optional mode, e.g. reduce-overhead)",
    )
    parser.add_argument("--e2e", type=Path, nargs="+", metavar="SHARDS", help="also run the real trainer on these")
    parser.add_argument("--e2e-steps", type=int, default=300)
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="also profile N steps: top kernels, time outside matmuls"
    )
    return parser


def random_base(args: argparse.Namespace, cfg) -> torch.nn.Module:
    """Random frozen levels 0..N-1 for level N: level 0 as the random-init baseline builds it."""
    from ecgpos.inference.resolve import level0_config

    levels = [level0_config(args.config, cfg), *[cfg.encoder] * (cfg.level - 1)]
    return build_nested(levels).requires_grad_(False).eval()


def make_step(model, cfg, x: torch.Tensor, autocast, device: torch.device):
    """What Trainer._train_step does per step, less the loader: step(i) and the running loss sum."""
    optimizer = build_optimizer(model, cfg)
    trainable = [p for p in model.parameters() if p.requires_grad]
    guard = NonFiniteGuard(device, 1)
    sums = [torch.zeros(1, dtype=torch.float64, device=device)]
    batch = x.shape[0]

    def step(i: int) -> None:
        noise = model.draw_noise(batch, step_generator(0, i, 0, device=device), device)
        with autocast:
            out = model(x, noise=noise)
        out["loss"].backward()
        stats = torch.stack([out["loss"].detach().float(), *(v.detach().float() for v in out["log"].values())])
        norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip)
        optimizer.found_inf = guard.update(i, stats, norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sums[0] = sums[0] + stats[:1].double()

    return step, optimizer, trainable


def level1_step(cfg, base: torch.nn.Module, x, autocast, device, mode):
    """A level-1 training step of the same latent config on level 0 of `base` (step(i), as make_step)."""
    import dataclasses

    cfg1 = dataclasses.replace(cfg, level=1)
    torch.manual_seed(0)
    model = build_model(cfg1, cut_encoder(base, 0)).to(device).train()
    compile_model(model, mode)
    step = make_step(model, cfg1, x, autocast, device)[0]
    step(0)  # with --compile: its compile
    return step


def paired(step_a, step_b, steps: int, warmup: int, device: torch.device) -> tuple[float, float]:
    """Seconds per call of each of two steps, timed alternately, so that a machine whose load changes
    during the measurement weighs on both alike."""
    for i in range(warmup):
        step_a(i), step_b(i)
    took = [0.0, 0.0]
    for i in range(steps):
        for k, fn in enumerate((step_a, step_b)):
            sync(device)
            start = time.perf_counter()
            fn(warmup + i)
            sync(device)
            took[k] += time.perf_counter() - start
    return took[0] / steps, took[1] / steps


def main() -> None:
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = [*args.overrides, *([f"train.compile={args.compile}"] if args.compile else [])]
    cfg = load_run_config(args.config, overrides, level=args.level)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = resolve_mixed_precision(cfg.train.mixed_precision)
    batch = args.batch or cfg.train.batch_size
    torch.manual_seed(0)
    base = None
    if cfg.level >= 1:
        if args.base is not None:
            from ecgpos.pretrain.plan import load_base

            base = load_base(args.base, cfg)[0]
        else:
            base = random_base(args, cfg)
    model = build_model(cfg, base).to(device).train()
    x = torch.randn(batch, 12, cfg.preprocess.window, device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    attention = attention_report(model, x, step_generator(0, 0, 0, device=device), autocast)
    with FlopCounterMode(display=False) as counter:  # before compiling: the counter sees every aten op
        with autocast:
            loss = model(x, generator=step_generator(0, 0, 0, device=device))["loss"]
        loss.backward()
    model.zero_grad(set_to_none=True)
    flops_per_sample = counter.get_total_flops() / batch
    compile_mode = resolve_compile(cfg.train.compile, device, grad_accum=cfg.train.grad_accum)
    compile_model(model, compile_mode)  # in place; the frozen levels compile into the same graph
    step, _, trainable = make_step(model, cfg, x, autocast, device)

    peak, peak_what = matmul_peak(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    counters.clear()
    started = time.perf_counter()
    step(0)  # with --compile: the compile, cold or from TORCHINDUCTOR_CACHE_DIR
    sync(device)
    first_step = time.perf_counter() - started
    compiled = counters["stats"]["unique_graphs"]
    graphs = f" ({compiled} graph{'s' * (compiled != 1)})" if compile_mode else ""
    seconds = timed(step, args.steps, args.warmup, device)
    memory = peak_memory_mb(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(
        f"config {args.config}: level {cfg.level}, encoder {cfg.encoder.width}x{cfg.encoder.depth}, decoder "
        f"{cfg.decoder.width}x{cfg.decoder.depth}, {sum(p.numel() for p in trainable) / 1e6:.2f}M trainable of "
        f"{param_count(model) / 1e6:.2f}M params, batch {batch}, precision {precision}, "
        f"compile {compile_mode}{graphs}, first step {first_step:.1f} s, device {name}, {attention}"
    )
    print(
        f"flops: {flops_per_sample / 1e9:.2f} GFLOP per sample (forward + backward, FlopCounterMode); "
        f"peak {peak / 1e12:.3g} TFLOP/s ({peak_what}, measured)"
    )
    share = ""
    if cfg.level >= 1:

        def base_forward(i: int) -> None:  # noqa: ARG001
            with autocast if device.type == "cuda" else contextlib.nullcontext():
                model.latent_tokens(x)

        s0 = timed(base_forward, args.steps, args.warmup, device)
        name = "level0" if cfg.level == 1 else "base"  # the frozen levels below the trained one
        share = f" {name}_forward_ms={s0 * 1e3:.1f} {name}_forward_share={s0 / seconds:.2f}"
        assert not any(p.requires_grad for p in model.base.parameters())
    if cfg.level >= 2:  # both levels again, alternately: the ratio is the figure
        one_step = level1_step(cfg, base, x, autocast, device, compile_mode)
        mine, one = paired(step, one_step, args.steps, args.warmup, device)
        share += f" paired_step_ms={mine * 1e3:.1f} level1_step_ms={one * 1e3:.1f}"
        share += f" level{cfg.level}_over_level1={mine / one:.2f}"
    rate = batch / seconds
    if args.profile:
        from step_profile import profile_steps

        print(profile_steps(step, args.profile, args.warmup + args.steps, device))
    end_to_end = ""
    if args.e2e:
        e2e_rate = e2e(args, overrides, base, batch)
        end_to_end = f" e2e_samples_per_s={e2e_rate:.1f} e2e_ratio={e2e_rate / rate:.2f}"
    print(
        f"train_step level={cfg.level} device={device.type} batch={batch} compile={compile_mode} "
        f"step_ms={seconds * 1e3:.1f} samples_per_s={rate:.1f} peak_mem_mb={memory:.0f} "
        f"graphs={compiled if compile_mode else 0} first_step_s={first_step:.1f} "
        f"gflop_per_sample={flops_per_sample / 1e9:.2f} mfu={rate * flops_per_sample / peak:.4f}{share}{end_to_end}"
    )


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:  # bad input: one line, no traceback
        sys.exit(str(err))
