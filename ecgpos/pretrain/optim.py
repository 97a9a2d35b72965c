"""The optimiser of every level (AdamW groups as in MAE, fused), and the device-dependent training
settings: mixed precision and the optional whole-model compile."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
from torch import nn

from ecgpos.errors import ConfigError
from ecgpos.pretrain.schedule import lr_at
from ecgpos.runs.run_config import RunConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups over trainable parameters: no weight decay for biases, norms (ndim < 2) and the
    learned tokens/embeddings held directly as parameters (names ending in _token or _embed), as in
    MAE; Linear weights (including the patch embedding's) decay."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        leaf = name.rsplit(".", 1)[-1]
        (no_decay if p.ndim < 2 or leaf.endswith(("_token", "_embed")) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: RunConfig) -> torch.optim.AdamW:
    """The fused AdamW of every level (one kernel per step on CUDA and CPU). Being fused, it also
    honours a `found_inf` flag on the device: the trainer skips a non-finite step without a sync."""
    return torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay),
        lr=lr_at(0, cfg.optim),
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        fused=True,
    )


def resolve_mixed_precision(mode: str) -> str:
    """'auto' -> 'bf16' on a CUDA device that supports it, else 'no' (bf16 on CPU is slow)."""
    if mode != "auto":
        return mode
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def uses_cuda_graphs(mode: bool | str, device: torch.device) -> bool:
    """Whether a resolved `train.compile` runs the model as CUDA graphs on this device (Inductor's
    "reduce-overhead" and "max-autotune" do on CUDA)."""
    return device.type == "cuda" and mode in ("reduce-overhead", "max-autotune")


def resolve_compile(mode: bool | str, device: torch.device, num_processes: int = 1, grad_accum: int = 1) -> bool | str:
    """`train.compile` for this run: "auto" is "reduce-overhead" (Inductor + CUDA graphs) on a single
    CUDA process, where it measured 1.9x (level 0) and 1.5x (level 1) the eager step on an H200, and
    eager elsewhere (the CPU, and several processes, where CUDA graphs around DDP are unmeasured).

    CUDA graphs with several micro-batches per step (grad_accum > 1) stop at the second micro-batch's
    backward ("accessing tensor output of CUDAGraphs that has been overwritten", torch 2.11 on an H200,
    also with cudagraph_mark_step_begin before each forward), so "auto" compiles them without CUDA graphs
    (Inductor's default mode) and an explicit CUDA-graph mode is refused before the run starts."""
    if mode == "auto":
        if device.type != "cuda" or num_processes != 1:
            return False
        return "reduce-overhead" if grad_accum == 1 else True
    if grad_accum > 1 and uses_cuda_graphs(mode, device):
        raise ConfigError(
            f"train.compile={mode} runs CUDA graphs, which fail with train.grad_accum {grad_accum}: use "
            f"train.compile=auto or default (Inductor without CUDA graphs), or train.grad_accum=1"
        )
    return mode


def compile_model(model: nn.Module, mode: bool | str) -> nn.Module:
    """Compile the whole model in place (a resolved `train.compile`: false, true = "default", or a
    torch.compile mode); false leaves it eager. In place keeps the state-dict keys, so checkpoints of
    compiled and eager runs are interchangeable. Shapes are static (every lead keeps the same number
    of patches), so dynamic shapes are off."""
    if mode is False:
        return model
    model.compile(mode=None if mode in (True, "default") else mode, dynamic=False)
    return model


def uncompile_model(model: nn.Module) -> nn.Module:
    """Undo `compile_model` in place: the module's calls run its eager forward again."""
    model._compiled_call_impl = None  # what nn.Module.compile sets; None is its uncompiled state
    return model


def compile_failure(error: BaseException) -> str:
    """One line naming what stopped a compile: the innermost cause (Inductor wraps the error that
    decided it in BackendCompilerFailed), its type and the first line of its message."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[0] if lines else 'no message'}"


@contextlib.contextmanager
def quiet_compile_logs() -> Iterator[None]:
    """Inductor and Dynamo log a failing compile at length (the generated kernel, the graph) before
    raising; the caller names the cause in one line instead. With TORCH_LOGS set (someone debugging
    the compile) nothing is silenced."""
    if os.environ.get("TORCH_LOGS"):
        yield
        return
    loggers = [logging.getLogger(name) for name in ("torch._inductor", "torch._dynamo")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def compile_name(mode: bool | str) -> str:
    """A resolved `train.compile` as run_info.json records it: "eager", "default" or the mode."""
    return "eager" if mode is False else "default" if mode is True else str(mode)


def compile_notice(mode: bool | str) -> str:
    """What the start line says of a resolved `train.compile`: a compiled run's first step waits for
    the compile (minutes for a paper config with no cached kernels), which would otherwise read as a hang."""
    if mode is False:
        return ""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or "Inductor's default cache folder"
    return (
        f", compile {compile_name(mode)}: the first step waits for it (minutes without cached kernels; cache: {cache})"
    )


def eager_pass() -> contextlib.AbstractContextManager:
    """Runs compiled modules eagerly inside: validation and figures (a few batches every few thousand
    steps) would otherwise compile graphs of their own (eval mode, other batch sizes) and add those
    compiles to a run's cold start."""
    return torch.compiler.set_stance("force_eager")
