"""Optional reconstruction decoders in an export folder (`ecgpos export --with-decoders`).

The clinical export is encoder-only. Reconstruction-based anomaly scores (`ecgpos score`) and the
carving criterion need each level's decoder as well, so an export may carry them in
`decoders.safetensors` (keys `level<l>.*` = the per-lead decoder of level l: `level0.*` level 0's,
`level1.*` level 1's, ...) with their settings under `decoders` in config.json:
    {"file", "sha256", "encoder_sha256", "settings_sha256",
     "level0": {"decoder", "mask_ratio", "norm_target"[, "push_pull"]},
     "level<l>": {"decoder", "mask_ratio", "norm_target", "push_pull"}, ...}
Exports whose entries and keys spell the levels `stage<l>` load alike.
A level is present only when its decoder was available at export time. `sha256` binds the decoder
weights, `encoder_sha256` the encoder weights they were trained with (config.json's weights_sha256:
decoders copied from another run's export, entry and all, are refused), `settings_sha256` the rest of
the entry, that binding included (settings change scores as weights do); the encoder is loaded by
`load_encoder`, with its own checks. Exports written before settings_sha256 or encoder_sha256 existed
load with a warning: their settings are checked against the weights' shapes only, their encoder not at all.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ecgpos.errors import EcgposError
from ecgpos.export.format import CONFIG_FILE, json_sha256, state_sha256
from ecgpos.export.load import load_encoder
from ecgpos.files import read_safetensors
from ecgpos.models.decoder import DecoderConfig
from ecgpos.models.factory import cut_encoder, levels_of, state_mismatch
from ecgpos.models.nested import level_names, parse_level_name
from ecgpos.objectives.latent_mae import LatentMaskedAutoencoder
from ecgpos.objectives.level import LevelObjective
from ecgpos.objectives.level0_mae import MaskedECGAutoencoder
from ecgpos.objectives.push_pull import PushPullConfig

DECODERS_FILE = "decoders.safetensors"
_warned_unbound: set[str] = set()


class NoDecoders(EcgposError):
    """An encoder-only export: nothing to reconstruct with (not a damaged one: that is a plain EcgposError)."""


def decoder_settings(model: LevelObjective) -> dict[str, Any]:
    """JSON-able settings that rebuild a level's objective around its encoder."""
    out: dict[str, Any] = {
        "decoder": dataclasses.asdict(model.decoder_cfg),
        "mask_ratio": model.mask_ratio,
        "norm_target": model.norm_target,
    }
    if model.is_latent or model.push_pull.enabled:  # a level-0 entry without
        out["push_pull"] = dataclasses.asdict(model.push_pull)  # push-pull stays as two-level exports wrote it
    return out


def write_decoders(out: Path, models: Mapping[str, LevelObjective], encoder_sha256: str) -> dict[str, Any]:
    """Write the decoders of `models` (level -> objective module) to out/DECODERS_FILE; the config entry,
    bound to the encoder weights they decode (`encoder_sha256`, the export's weights_sha256)."""
    from safetensors.torch import save_file

    state = {
        f"{level}.{k}": v.detach().to("cpu").float().clone().contiguous()
        for level, model in models.items()
        for k, v in model.decoder.state_dict().items()
    }
    save_file(state, str(out / DECODERS_FILE), metadata={"format": "ecgpos-decoders"})
    entry: dict[str, Any] = {"file": DECODERS_FILE, "sha256": state_sha256(state), "encoder_sha256": encoder_sha256}
    entry.update({level: decoder_settings(model) for level, model in models.items()})
    entry["settings_sha256"] = settings_sha256(entry)
    return entry


def settings_sha256(entry: Mapping[str, Any]) -> str:
    """`json_sha256` of a decoders entry without its own settings_sha256."""
    return json_sha256({key: value for key, value in entry.items() if key != "settings_sha256"})


def check_decoder_binding(folder: Path, entry: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Refuse a decoders entry edited after export (settings_sha256) or written for other encoder
    weights (encoder_sha256 vs config.json's weights_sha256: decoders copied from another run would
    give that run's scores); an entry without these hashes (an older export) warns once."""
    if "settings_sha256" in entry and settings_sha256(entry) != entry["settings_sha256"]:
        raise EcgposError(
            f"{folder / CONFIG_FILE} was edited after export: its decoders settings no longer match "
            "settings_sha256; re-export the run instead"
        )
    bound = entry.get("encoder_sha256")
    if bound is not None and bound != config.get("weights_sha256"):
        raise EcgposError(
            f"{folder / DECODERS_FILE} belongs to other encoder weights (decoders encoder_sha256 "
            f"{str(bound)[:12]}... != weights_sha256 {str(config.get('weights_sha256'))[:12]}...): decoders copied "
            "from another run's export? re-export this run with --with-decoders"
        )
    missing = [key for key in ("settings_sha256", "encoder_sha256") if key not in entry]
    if missing and str(folder.resolve()) not in _warned_unbound:
        _warned_unbound.add(str(folder.resolve()))
        print(
            f"ecgpos: warning: {folder / CONFIG_FILE}'s decoders entry has no {' or '.join(missing)} (an older "
            "export, or an edited one): its decoder settings are checked against the weights' shapes only, and "
            "nothing shows they belong to this encoder; re-export to bind them",
            file=sys.stderr,
        )


def _load_decoder(model: nn.Module, state: Mapping[str, torch.Tensor], level: str, what: str) -> nn.Module:
    own = {k[len(level) + 1 :]: v for k, v in state.items() if k.startswith(f"{level}.")}
    problem = state_mismatch(model.decoder.state_dict(), own)
    if problem:
        raise EcgposError(f"{what}: the {level} decoder does not fit its settings in config.json: {problem}")
    model.decoder.load_state_dict(own, strict=True)
    model.requires_grad_(False)
    return model.eval()


def load_decoders(folder: str | Path, config: Mapping[str, Any]) -> dict[str, nn.Module]:
    """The reconstruction models of an export with decoders: "level<l>" -> MaskedECGAutoencoder (level 0)
    / LatentMaskedAutoencoder on levels 0..l-1 (level l >= 1), frozen, float32, CPU, for the levels
    whose decoder the export holds. EcgposError when the export has none."""
    folder = Path(folder)
    entry = config.get("decoders")
    if not isinstance(entry, Mapping):
        raise NoDecoders(
            f"{folder} is an encoder-only export: re-export the run with "
            "`ecgpos export --with-decoders` to score reconstructions"
        )
    state = read_safetensors(folder / str(entry.get("file", DECODERS_FILE)), "decoder weights")
    if state_sha256(state) != entry.get("sha256"):
        raise EcgposError(f"{folder / DECODERS_FILE} does not match config.json (decoders sha256 differs)")
    check_decoder_binding(folder, entry, config)
    # the encoder as `embed` loads it: weights hash, edited arch/preprocess and strict load all refused
    encoder = load_encoder(folder).encoder
    levels = levels_of(encoder)
    what = str(folder / DECODERS_FILE)
    named = {k: parse_level_name(k) for k in entry if parse_level_name(k) is not None}
    unknown = [k for k, level in named.items() if level >= len(levels)]
    if unknown:
        raise EcgposError(f"{what}: decoders of {', '.join(unknown)} in an export of levels 0..{len(levels) - 1}")
    models: dict[str, LevelObjective] = {}
    try:
        for level, name in enumerate(level_names(len(levels))):
            spelt = [k for k, at in named.items() if at == level]  # level<l>, or stage<l> in an older export
            if not spelt:
                continue
            if len(spelt) > 1:
                raise EcgposError(f"config.json: the decoders entry names level {level} twice ({', '.join(spelt)})")
            s = entry[spelt[0]]
            push_pull = PushPullConfig(**s.get("push_pull", {}))
            decoder = DecoderConfig(**s["decoder"])
            if level == 0:
                model = MaskedECGAutoencoder(levels[0], decoder, s["mask_ratio"], s["norm_target"], push_pull)
            else:
                base = cut_encoder(encoder, level - 1)
                model = LatentMaskedAutoencoder(
                    base, levels[level], decoder, s["mask_ratio"], s["norm_target"], push_pull
                )
            models[name] = _load_decoder(model, state, spelt[0], what)
    except (TypeError, KeyError) as err:
        raise EcgposError(f"config.json: malformed decoders entry ({type(err).__name__}: {err})") from None
    return models
