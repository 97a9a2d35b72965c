"""Build encoders from JSON-able architecture dicts and load weights strictly (export, runs, probes).

arch formats:
    {"kind": "level0", "encoder": {EncoderConfig fields}}                  -> STMEMEncoder (one level)
    {"kind": "nested", "levels": [{EncoderConfig}, {EncoderConfig}, ...]}  -> NestedEncoder (>= 2 levels)
The two-level form {"kind": "nested", "stage0": {...}, "stage1": {...}} is read as those two levels,
and kind "stage0" as "level0" (`OTHER_KINDS`). `encoder_arch(module)` is the inverse of `module_from_arch(arch)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ecgpos.config import from_dict
from ecgpos.errors import ConfigError, EcgposError
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.nested import NestedEncoder, legacy_state
from ecgpos.models.nested import cut_encoder as cut_encoder  # the one cut, also read from here
from ecgpos.models.nested import levels_of as levels_of
from ecgpos.models.nested import nested_of as nested_of
from ecgpos.models.st_mem import EncoderConfig, STMEMEncoder

ENCODER_KINDS = ("level0", "latent")
ARCH_KINDS = ("level0", "nested")
# Other spellings of the kinds, read as the kind: level 0's, and a latent level's (any level >= 1)
OTHER_KINDS = {"stage0": "level0", "stage1": "latent"}
TWO_LEVEL_KEYS = ("stage0", "stage1")  # the levels of a two-level nested arch, without a levels list


def encoder_config(cfg: EncoderConfig | Mapping[str, Any]) -> EncoderConfig:
    """EncoderConfig from itself or a dict (ecgpos.config's parser: unknown keys and bad values are ConfigError)."""
    if isinstance(cfg, EncoderConfig):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"encoder config must be a mapping, got {type(cfg).__name__}")
    return from_dict(EncoderConfig, cfg, prefix="encoder.")


def build_encoder(kind: str, cfg: EncoderConfig | Mapping[str, Any]) -> STMEMEncoder | LatentEncoder:
    """Freshly initialised encoder: kind 'level0' -> STMEMEncoder (level 0), 'latent' -> LatentEncoder
    (any level >= 1)."""
    kind = OTHER_KINDS.get(kind, kind)
    if kind == "level0":
        return STMEMEncoder(encoder_config(cfg))
    if kind == "latent":
        return LatentEncoder(encoder_config(cfg))
    raise ConfigError(f"unknown encoder kind {kind!r} (expected one of {', '.join(ENCODER_KINDS)})")


def build_level(level: int, cfg: EncoderConfig | Mapping[str, Any]) -> STMEMEncoder | LatentEncoder:
    """Freshly initialised encoder of one level: an STMEMEncoder at level 0, a LatentEncoder above."""
    return build_encoder("level0" if level == 0 else "latent", cfg)


def build_nested(levels: Sequence[EncoderConfig | Mapping[str, Any]]) -> STMEMEncoder | NestedEncoder:
    """Freshly initialised encoder over the level configs (level 0 first), drawn in level order."""
    return nested_of([build_level(level, cfg) for level, cfg in enumerate(levels)])


def depth_of(module: nn.Module) -> int:
    """Number of levels of an STMEMEncoder (1) or NestedEncoder."""
    return len(levels_of(module))


def encoder_arch(module: nn.Module) -> dict[str, Any]:
    """JSON-able arch dict of an STMEMEncoder or NestedEncoder (inverse of module_from_arch)."""
    if isinstance(module, STMEMEncoder):
        return {"kind": "level0", "encoder": dataclasses.asdict(module.cfg)}
    if isinstance(module, NestedEncoder):
        return {"kind": "nested", "levels": [dataclasses.asdict(m.cfg) for m in module.levels]}
    raise EcgposError(f"no encoder arch for {type(module).__name__} (expected STMEMEncoder or NestedEncoder)")


def arch_levels(arch: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The level configs an arch describes, level 0 first (the two-level form too); EcgposError
    (one line) for a malformed arch."""
    kind = arch.get("kind") if isinstance(arch, Mapping) else None
    kind = OTHER_KINDS.get(kind, kind) if isinstance(kind, str) else kind
    if kind not in ARCH_KINDS:
        raise EcgposError(f"unknown encoder arch kind {kind!r} (expected one of {', '.join(ARCH_KINDS)})")
    if kind == "level0":
        if "encoder" not in arch:
            raise EcgposError("encoder arch of kind 'level0' lacks encoder")
        return [arch["encoder"]]
    if "levels" in arch:
        levels = arch["levels"]
        if not isinstance(levels, list) or len(levels) < 2:
            raise EcgposError("encoder arch of kind 'nested' needs levels: a list of at least two encoder configs")
        return list(levels)
    missing = [k for k in TWO_LEVEL_KEYS if k not in arch]
    if missing:
        raise EcgposError(f"encoder arch of kind 'nested' lacks levels (or {', '.join(missing)})")
    return [arch[k] for k in TWO_LEVEL_KEYS]


def arch_depth(arch: Mapping[str, Any]) -> int:
    """Number of levels an arch describes."""
    return len(arch_levels(arch))


def module_from_arch(arch: Mapping[str, Any]) -> STMEMEncoder | NestedEncoder:
    """Freshly initialised encoder described by `arch`; malformed arch raises EcgposError."""
    return build_nested(arch_levels(arch))


def state_sha256(state: Mapping[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor in sorted key order.

    Hashing tensor contents rather than the file's bytes makes the hash a property of the weights
    themselves, so an in-memory module can be checked as well as a file on disk.
    """
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{str(tensor.dtype)}|{tuple(tensor.shape)}|".encode())
        # uint8 view: bytes of any dtype (bf16 included, which numpy cannot represent)
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def weights_hash(module: torch.nn.Module) -> str:
    """`state_sha256` of a module's weights: the value an export records as `weights_sha256`, so a
    run's encoder and its export can be matched."""
    return state_sha256(module.state_dict())


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

    Any missing/unexpected key or shape difference raises EcgposError with one line. Weights with the
    two-level names ("stage0.*", "stage1.*") load into a two-level NestedEncoder.
    """
    module = module_from_arch(arch)
    state_dict = legacy_state(state_dict) if isinstance(module, NestedEncoder) else dict(state_dict)
    problem = state_mismatch(module.state_dict(), state_dict)
    if problem:
        raise EcgposError(f"weights do not match the {arch['kind']} encoder arch: {problem}")
    try:
        module.load_state_dict(dict(state_dict), strict=True)
    except RuntimeError as exc:  # anything the checks above did not foresee
        raise EcgposError(f"weights do not load into the {arch['kind']} encoder: {str(exc).splitlines()[0]}") from None
    return module.eval()
