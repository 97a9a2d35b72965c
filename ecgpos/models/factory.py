"""Build encoders from JSON-able architecture dicts and load weights strictly (export, runs, probes).

arch formats:
    {"kind": "stage0", "encoder": {EncoderConfig fields}}                       -> STMEMEncoder
    {"kind": "nested", "stage0": {EncoderConfig}, "stage1": {EncoderConfig}}     -> NestedEncoder
`encoder_arch(module)` is the inverse of `module_from_arch(arch)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ecgpos.config import from_dict
from ecgpos.errors import ConfigError, EcgposError
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.nested import NestedEncoder
from ecgpos.models.st_mem import EncoderConfig, STMEMEncoder

ENCODER_KINDS = ("stage0", "stage1")
ARCH_KINDS = ("stage0", "nested")


def encoder_config(cfg: EncoderConfig | Mapping[str, Any]) -> EncoderConfig:
    """EncoderConfig from itself or a dict (ecgpos.config's parser: unknown keys and bad values are ConfigError)."""
    if isinstance(cfg, EncoderConfig):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"encoder config must be a mapping, got {type(cfg).__name__}")
    return from_dict(EncoderConfig, cfg, prefix="encoder.")


def build_encoder(kind: str, cfg: EncoderConfig | Mapping[str, Any]) -> STMEMEncoder | LatentEncoder:
    """Freshly initialised encoder: kind 'stage0' -> STMEMEncoder, 'stage1' -> LatentEncoder."""
    if kind == "stage0":
        return STMEMEncoder(encoder_config(cfg))
    if kind == "stage1":
        return LatentEncoder(encoder_config(cfg))
    raise ConfigError(f"unknown encoder kind {kind!r} (expected one of {', '.join(ENCODER_KINDS)})")


def build_nested(stage0: EncoderConfig | Mapping[str, Any], stage1: EncoderConfig | Mapping[str, Any]) -> NestedEncoder:
    """Freshly initialised NestedEncoder(STMEMEncoder(stage0), LatentEncoder(stage1))."""
    return NestedEncoder(build_encoder("stage0", stage0), build_encoder("stage1", stage1))


def encoder_arch(module: nn.Module) -> dict[str, Any]:
    """JSON-able arch dict of an STMEMEncoder or NestedEncoder (inverse of module_from_arch)."""
    if isinstance(module, STMEMEncoder):
        return {"kind": "stage0", "encoder": dataclasses.asdict(module.cfg)}
    if isinstance(module, NestedEncoder):
        return {
            "kind": "nested",
            "stage0": dataclasses.asdict(module.stage0.cfg),
            "stage1": dataclasses.asdict(module.stage1.cfg),
        }
    raise EcgposError(f"no encoder arch for {type(module).__name__} (expected STMEMEncoder or NestedEncoder)")


def module_from_arch(arch: Mapping[str, Any]) -> STMEMEncoder | NestedEncoder:
    """Freshly initialised encoder described by `arch`; malformed arch raises EcgposError."""
    if not isinstance(arch, Mapping) or arch.get("kind") not in ARCH_KINDS:
        kind = arch.get("kind") if isinstance(arch, Mapping) else None
        raise EcgposError(f"unknown encoder arch kind {kind!r} (expected one of {', '.join(ARCH_KINDS)})")
    needed = ("encoder",) if arch["kind"] == "stage0" else ("stage0", "stage1")
    missing = [k for k in needed if k not in arch]
    if missing:
        raise EcgposError(f"encoder arch of kind {arch['kind']!r} lacks {', '.join(missing)}")
    if arch["kind"] == "stage0":
        return build_encoder("stage0", arch["encoder"])
    return build_nested(arch["stage0"], arch["stage1"])


def state_mismatch(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor]) -> str:
    """One line saying how `found` differs from `expected` (missing/unexpected keys, shapes, dtypes);
    empty when every tensor fits. The one state-dict comparison for runs, exports and probes."""
    missing = [k for k in expected if k not in found]
    unexpected = [k for k in found if k not in expected]
    shapes = [
        f"{k} {tuple(found[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in found and tuple(found[k].shape) != tuple(v.shape)
    ]
    dtypes = [
        f"{k} {found[k].dtype} vs {v.dtype}"
        for k, v in expected.items()
        if k in found and tuple(found[k].shape) == tuple(v.shape) and found[k].dtype != v.dtype
    ]
    parts = []
    for label, items in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("shape mismatch", shapes),
        ("dtype mismatch", dtypes),
    ):
        if items:
            more = f" (+{len(items) - 3} more)" if len(items) > 3 else ""
            parts.append(f"{label}: {', '.join(items[:3])}{more}")
    return "; ".join(parts)


def random_init(arch: Mapping[str, Any], seed: int = 0) -> STMEMEncoder | NestedEncoder:
    """The random-init baseline of `arch`: the model's own initialisation drawn from `seed`, frozen,
    in eval mode; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = module_from_arch(arch)
    module.requires_grad_(False)
    return module.eval()


def encoder_from_state(arch: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> nn.Module:
    """Encoder described by `arch` with `state_dict` loaded strictly, in eval mode.

    Any missing/unexpected key or shape difference raises EcgposError with one line.
    """
    module = module_from_arch(arch)
    problem = state_mismatch(module.state_dict(), state_dict)
    if problem:
        raise EcgposError(f"weights do not match the {arch['kind']} encoder arch: {problem}")
    try:
        module.load_state_dict(dict(state_dict), strict=True)
    except RuntimeError as exc:  # anything the checks above did not foresee
        raise EcgposError(f"weights do not load into the {arch['kind']} encoder: {str(exc).splitlines()[0]}") from None
    return module.eval()
