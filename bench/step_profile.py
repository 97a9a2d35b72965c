"""Where one training step's device time goes: torch.profiler over a few steps, kernels by device time.

Used by `bench/train_step.py --profile N`. Kernels are put in one of four classes by name, so that the
share of time outside the matmuls and attention (what fusion or larger shapes could win back) is one
number: matmul (cuBLAS/CUTLASS GEMMs), attention (flash / memory-efficient SDPA kernels), triton (Inductor's
fused elementwise and reduction kernels), other (copies, memsets, optimizer kernels, everything else).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

CLASSES = (
    ("attention", re.compile(r"flash|fmha|attention|sdpa|cudnn_sdp", re.I)),
    (
        "matmul",
        re.compile(
            r"^aten::(mm|addmm|bmm|baddbmm)$|gemm|cutlass|xmma|nvjet|sm\d+_.*_tn|sm\d+_.*_nt|ampere_|hopper_|cublas",
            re.I,
        ),
    ),
    ("triton", re.compile(r"^triton_", re.I)),
)


def kernel_class(name: str) -> str:
    """attention, matmul, triton or other, by the kernel's name."""
    for label, pattern in CLASSES:
        if pattern.search(name):
            return label
    return "other"


def profile_steps(step: Callable[[int], None], steps: int, first: int, device: torch.device, top: int = 15) -> str:
    """Runs step(first .. first + steps - 1) under the profiler; returns the report: the top kernels by
    device time per step, and each class's share of the device time."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            step(first + i)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    times: dict[str, float] = {}
    counts: dict[str, int] = {}
    for event in prof.events():
        if device.type == "cuda" and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(event, "is_user_annotation", False) or "#" in event.name:
            continue  # a range such as "Optimizer.step#AdamW.step" spans kernels that are counted themselves
        if device.type != "cuda" and not event.name.startswith("aten::"):
            continue
        micros = event.device_time if device.type == "cuda" else event.self_cpu_time_total
        times[event.name] = times.get(event.name, 0.0) + micros
        counts[event.name] = counts.get(event.name, 0) + 1
    total = sum(times.values()) or 1.0
    by_class: dict[str, float] = {}
    for name, micros in times.items():
        by_class[kernel_class(name)] = by_class.get(kernel_class(name), 0.0) + micros
    lines = [f"profile: {steps} steps, {total / steps / 1e3:.2f} ms device time per step, {len(times)} kernels"]
    for name, micros in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(
            f"  {micros / total:6.1%} {micros / steps:8.1f} us/step {counts[name] // steps:4d}x  "
            f"[{kernel_class(name)}] {name[:110]}"
        )
    labels = ("matmul", "attention", "triton", "other")
    shares = " ".join(f"{label}={by_class.get(label, 0.0) / total:.3f}" for label in labels)
    outside = 1 - (by_class.get("matmul", 0.0) + by_class.get("attention", 0.0)) / total
    lines.append(f"profile_shares {shares} outside_matmul_attention={outside:.3f}")
    return "\n".join(lines)
