"""Nested encoder: level 0 (STMEMEncoder over raw ECG), then levels 1..L-1 (LatentEncoder), no masking.

Level l reads the tokens of level l-1, so every level shares the width and token layout. Same
interface as STMEMEncoder, so probes and export treat both alike, plus `level=` to read any level:
    forward_tokens(x (B, 12, 2250), level=None)   -> (B, 12 * 32, W)  tokens of `level` (default: the
                                                                       top) after its final norm
    forward_features(x (B, 12, 2250), level=None) -> (B, W)           that level's block outputs averaged
                                                                       over the patch tokens, then its norm
State-dict keys: "levels.<l>.*". Weights written with the two-level names "stage0.*" / "stage1.*"
load as levels 0 and 1 (`legacy_state`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from ecgpos.errors import ConfigError, EcgposError
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.st_mem import EncoderConfig, STMEMEncoder

# What level l must share with level l-1: it reads those tokens, so the same width and token layout.
SHARED_LAYOUT = ("width", "num_leads", "seq_len", "patch_size")
LEGACY_PREFIXES = {"stage0.": "levels.0.", "stage1.": "levels.1."}


# A level's name is "level<l>"; "stage<l>" is its other spelling in runs, exports and score tables written with it.
LEVEL_NAME = re.compile(r"(?:level|stage)([0-9]+)")


def level_name(level: int) -> str:
    """The name of a level in score columns, decoder keys and reports: 'level0', 'level1', ..."""
    return f"level{int(level)}"


def parse_level_name(name: str) -> int | None:
    """The level a name such as 'level2' (or its other spelling 'stage2') names; None for any other text."""
    match = LEVEL_NAME.fullmatch(name)
    return int(match[1]) if match else None


def recorded_level(record: Mapping[str, object]) -> object:
    """The "level" of a run_info.json, training summary or checkpoint state (its other spelling "stage" too)."""
    return record.get("level", record.get("stage"))


def level_names(depth: int) -> list[str]:
    """Names of the levels 0..depth-1 of an encoder with `depth` levels."""
    return [level_name(level) for level in range(int(depth))]


def check_levels_fit(below: EncoderConfig, above: EncoderConfig, what: str = "the level-0 encoder") -> None:
    """ConfigError (one line) unless a latent encoder config `above` can read the tokens of `below`."""
    for name in SHARED_LAYOUT:
        if getattr(below, name) != getattr(above, name):
            raise ConfigError(
                f"{what} has {name} {getattr(below, name)} but the latent encoder's {name} is "
                f"{getattr(above, name)} (a latent level runs at the width and token layout of the level below)"
            )


def legacy_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A nested state dict with two-level names ("stage0.*", "stage1.*") renamed to "levels.<l>.*";
    any other state is returned as it is."""
    out = {}
    for key, value in state.items():
        prefix = next((p for p in LEGACY_PREFIXES if key.startswith(p)), None)
        out[LEGACY_PREFIXES[prefix] + key[len(prefix) :] if prefix else key] = value
    return out


class NestedEncoder(nn.Module):
    """levels[L-1](... levels[1](levels[0](x))); `.width` is the common width, `.cfg` the top level's."""

    def __init__(self, levels: Sequence[nn.Module]) -> None:
        super().__init__()
        levels = list(levels)
        if len(levels) < 2:
            raise ConfigError(f"a nested encoder has at least two levels, got {len(levels)}")
        if not isinstance(levels[0], STMEMEncoder) or not all(isinstance(m, LatentEncoder) for m in levels[1:]):
            raise ConfigError("a nested encoder is an STMEMEncoder followed by LatentEncoders")
        for level in range(1, len(levels)):
            check_levels_fit(levels[level - 1].cfg, levels[level].cfg, f"level {level - 1}")
        self.levels = nn.ModuleList(levels)
        top = levels[-1]
        self.cfg = top.cfg
        self.width = top.width
        self.num_leads = top.num_leads
        self.num_patches = top.num_patches
        self.tokens_per_lead = top.tokens_per_lead
        self._register_load_state_dict_pre_hook(_rename_legacy_keys, with_module=True)

    @property
    def depth(self) -> int:
        return len(self.levels)

    def check_level(self, level: int | None) -> int:
        """`level` as an index 0..depth-1 (None: the top); EcgposError (one line) otherwise."""
        if level is None:
            return self.depth - 1
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < self.depth:
            raise EcgposError(f"level {level!r} does not exist: this encoder has levels 0..{self.depth - 1}")
        return level

    def cut(self, level: int | None) -> STMEMEncoder | NestedEncoder:
        """Levels 0..level (sharing these modules): `cut_encoder(self, level)`."""
        return cut_encoder(self, level)

    def forward_tokens(self, x: torch.Tensor, level: int | None = None) -> torch.Tensor:
        """x (B, L, T) -> tokens of `level` (B, L * (N + 2), W)."""
        level = self.check_level(level)
        tokens = self.levels[0].forward_tokens(x)
        for module in self.levels[1 : level + 1]:
            tokens = module.forward_tokens(tokens)
        return tokens

    def forward_features(self, x: torch.Tensor, level: int | None = None) -> torch.Tensor:
        """x (B, L, T) -> (B, W) features of `level`, pooled as the level-0 encoder pools."""
        level = self.check_level(level)
        if level == 0:
            return self.levels[0].forward_features(x)
        return self.levels[level].forward_features(self.forward_tokens(x, level - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Same as `forward_features` (B, W) of the top level."""
        return self.forward_features(x)


def levels_of(module: nn.Module) -> list[nn.Module]:
    """The levels of an STMEMEncoder (itself) or NestedEncoder, level 0 first."""
    if isinstance(module, NestedEncoder):
        return list(module.levels)
    if isinstance(module, STMEMEncoder):
        return [module]
    raise EcgposError(f"{type(module).__name__} is not an encoder with levels (STMEMEncoder or NestedEncoder)")


def nested_of(levels: Sequence[nn.Module]) -> STMEMEncoder | NestedEncoder:
    """The encoder made of `levels` (sharing them): one level is that STMEMEncoder itself."""
    levels = list(levels)
    return levels[0] if len(levels) == 1 else NestedEncoder(levels)


def cut_encoder(module: nn.Module, level: int | None) -> STMEMEncoder | NestedEncoder:
    """Levels 0..level of an STMEMEncoder or NestedEncoder, sharing its modules: an STMEMEncoder for
    level 0, else a NestedEncoder; None or the top level: the encoder itself. The one cut of an encoder
    to its lower levels (exports, loaded encoders and probes cut through it). A level the encoder does
    not have is an EcgposError (one line)."""
    levels = levels_of(module)
    if level is None:
        return module
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < len(levels):
        raise EcgposError(f"level {level!r} does not exist: the encoder has levels 0..{len(levels) - 1}")
    return module if level == len(levels) - 1 else nested_of(levels[: level + 1])


def _rename_legacy_keys(module: nn.Module, state: dict, prefix: str, *args: object) -> None:
    """load_state_dict pre-hook: two-level names under `prefix` become level names, in place."""
    for old, new in LEGACY_PREFIXES.items():
        for key in [k for k in state if k.startswith(prefix + old)]:
            state[prefix + new + key[len(prefix + old) :]] = state.pop(key)
