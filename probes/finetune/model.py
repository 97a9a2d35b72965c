"""The classifier fine-tuned: an encoder, its levels and blocks counted from the input, and a linear head;
which parameters train under each mode, and their learning rates (layer-wise decay)."""

from __future__ import annotations

import torch
from timm.layers import DropPath
from torch import nn

from ecgpos.errors import EcgposError
from ecgpos.export.load import ExportedEncoder
from ecgpos.models.factory import levels_of
from ecgpos.models.st_mem import TokenEncoder
from ecgpos.probes.finetune.config import Mode, OptimConfig
from ecgpos.probes.finetune.lora import add_lora


def bare_encoder(module: nn.Module) -> nn.Module:
    """The STMEMEncoder or NestedEncoder inside a loaded encoder (an export wraps it with its preprocessing)."""
    return module.encoder if isinstance(module, ExportedEncoder) else module


def levels(encoder: nn.Module) -> list[TokenEncoder]:
    """The encoder's levels from the input up (`--level l` has already cut a nested encoder to levels
    0..l); every rule below reads the levels from here."""
    return levels_of(encoder)


def blocks(encoder: nn.Module) -> list[nn.Module]:
    """All transformer blocks of all levels, counted from the input."""
    return [block for level in levels(encoder) for block in level.blocks]


class Classifier(nn.Module):
    """encoder.forward_features -> Linear head: (B, leads, window) -> logits (B, classes)."""

    def __init__(self, encoder: nn.Module, num_classes: int, head_init_std: float = 2e-5) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.width, num_classes)
        if head_init_std > 0:
            nn.init.trunc_normal_(self.head.weight, std=head_init_std, a=-2 * head_init_std, b=2 * head_init_std)
        else:
            nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder.forward_features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def layer_ids(model: Classifier) -> dict[str, int]:
    """Parameter name -> layer id for layer-wise lr decay, as timm's `param_groups_layer_decay` counts:
    0 = the input embedding, block i (from the input, across levels) = i + 1, the top norm and the head
    = total blocks + 1. A higher level's token embedding and the norm below it sit with the block below."""
    total = len(blocks(model.encoder))
    ids, offset = {}, 0
    names = {id(level): name for name, level in model.named_modules() if isinstance(level, TokenEncoder)}
    tops = levels(model.encoder)
    for depth, level in enumerate(tops):
        prefix = names[id(level)]
        for name, _ in level.named_parameters():
            full = f"{prefix}.{name}"
            if name.startswith("blocks."):
                ids[full] = offset + int(name.split(".")[1]) + 1
            elif name.startswith("norm.") and depth == len(tops) - 1:
                ids[full] = total + 1
            elif name.startswith("norm."):
                ids[full] = offset + len(level.blocks)
            else:
                ids[full] = offset
        offset += len(level.blocks)
    ids |= {name: total + 1 for name, _ in model.head.named_parameters(prefix="head")}
    return ids


def _layer_of(name: str, ids: dict[str, int]) -> int:
    """A LoRA parameter (…attn.qkv.lora_a) sits in the layer of the Linear it adapts."""
    if name in ids:
        return ids[name]
    block = name.split(".blocks.")
    prefix, index = block[0], block[1].split(".")[0]
    return ids[next(k for k in ids if k.startswith(f"{prefix}.blocks.{index}."))]


def param_groups(model: Classifier, optim: OptimConfig) -> list[dict]:
    """AdamW groups of the trainable parameters: lr_scale = layer_decay ** (total + 1 - layer id); no weight
    decay on biases, norms and learned tokens/embeddings (as pretraining's groups)."""
    ids = layer_ids(model)
    total = len(blocks(model.encoder))
    groups: dict[tuple[int, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        layer = _layer_of(name, ids)
        no_decay = p.ndim < 2 or name.rsplit(".", 1)[-1].endswith(("_token", "_embed"))
        group = groups.setdefault(
            (layer, no_decay),
            {
                "params": [],
                "weight_decay": 0.0 if no_decay else optim.weight_decay,
                "lr_scale": optim.layer_decay ** (total + 1 - layer),
            },
        )
        group["params"].append(p)
    return list(groups.values())


def set_drop_path(trainable: list[nn.Module], rate: float) -> None:
    """Stochastic depth on the trainable blocks, rising linearly to `rate` at the top one (timm's rule)."""
    for i, block in enumerate(trainable):
        p = rate * i / max(1, len(trainable) - 1)
        block.drop_path1 = DropPath(p) if p > 0 else nn.Identity()
        block.drop_path2 = DropPath(p) if p > 0 else nn.Identity()


def prepare_mode(model: Classifier, mode: Mode, optim: OptimConfig) -> None:
    """Set what trains under `mode`: full and lp-ft's second phase everything; top:K the top K blocks and all
    above them (top:0: the head alone, a linear probe); lora:R rank-R adapters and the head."""
    all_blocks = blocks(model.encoder)
    total = len(all_blocks)
    if mode.kind == "full":
        model.requires_grad_(True)
        set_drop_path(all_blocks, optim.drop_path)
        return
    model.encoder.requires_grad_(False)
    model.head.requires_grad_(True)
    if mode.kind == "lora":
        add_lora(all_blocks, mode.k, optim.lora_alpha)
        set_drop_path(all_blocks, optim.drop_path)
        return
    if mode.kind == "top" and mode.k > 0:
        ids = layer_ids(model)
        for name, p in model.named_parameters():
            if ids.get(name, total + 1) > total - mode.k:
                p.requires_grad_(True)
        set_drop_path(all_blocks[max(0, total - mode.k) :], optim.drop_path)


def frozen_below(model: Classifier) -> bool:
    """True when no encoder parameter trains (the head alone): the encoder runs under no_grad, in eval mode."""
    return not any(p.requires_grad for p in model.encoder.parameters())


def check_mode_fits(mode: Mode, encoder: nn.Module) -> None:
    """One line for top:K with K above the encoder's blocks (counted across levels): it would train what
    `full` trains while its protocol name said otherwise."""
    total = len(blocks(encoder))
    if mode.kind == "top" and mode.k > total:
        raise EcgposError(
            f"--mode {mode.protocol.removeprefix('finetune-')}: the encoder has {total} blocks (counted across "
            f"levels); give K in 0..{total} (top:{total} trains every block, `full` also the input embedding)"
        )
