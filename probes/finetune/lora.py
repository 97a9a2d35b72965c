"""Low-rank adapters (Hu et al., ICLR 2022) on the attention and MLP projections of timm Blocks, merged
into the plain Linear weights after training.

A module of our own rather than `peft`: the four projections of a timm Block are plain nn.Linear
attributes (`attn.qkv`, `attn.proj`, `mlp.fc1`, `mlp.fc2`), so an adapter is 30 lines, and merging
gives back exactly the encoder's own modules and state-dict keys, which the strict loaders of runs,
exports and classifiers expect; peft would be a further dependency for the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

TARGETS = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")


class LoRALinear(nn.Module):
    """base(x) + scale * x A^T B^T, with the base frozen; B starts at zero, so training starts at the base."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # nn.Linear's own init, as LoRA's reference code

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale

    @torch.no_grad()
    def merged(self) -> nn.Linear:
        """The base Linear with the adapter folded into its weight."""
        self.base.weight += (self.lora_b @ self.lora_a) * self.scale
        return self.base


def _swap(block: nn.Module, path: str, make) -> None:
    parent_name, name = path.split(".")
    parent = getattr(block, parent_name)
    setattr(parent, name, make(getattr(parent, name)))


def add_lora(blocks: Iterable[nn.Module], rank: int, alpha: float = 0.0) -> None:
    """Wrap each block's projections in LoRALinear (alpha 0: alpha = rank, scale 1)."""
    for block in blocks:
        for path in TARGETS:
            _swap(block, path, lambda linear: LoRALinear(linear, rank, alpha or float(rank)))


def merge_lora(blocks: Iterable[nn.Module]) -> None:
    """Fold every adapter into its Linear: the blocks are plain timm Blocks again."""
    for block in blocks:
        for path in TARGETS:
            _swap(block, path, lambda m: m.merged() if isinstance(m, LoRALinear) else m)
