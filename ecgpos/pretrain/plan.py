"""Everything `ecgpos pretrain` can check without training, checked before an Accelerator exists.

The config (unknown keys, impossible values), the shards (missing, empty, written with another
preprocessing spec), the base encoder of a latent level (missing, incomplete, another depth than
the level below, other spec, width or token layout) and the run
folder (an existing run needs --resume auto, with the same config). Each problem is an
EcgposError: one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError
from ecgpos.export.format import is_export_dir, weights_hash
from ecgpos.files import make_output_folder
from ecgpos.runs.run_config import RunConfig, config_differences, load_run_config
from ecgpos.workers import max_workers, usable_cpus


@dataclass
class RunPlan:
    """Everything validated before training starts."""

    cfg: RunConfig
    shards: list[Path]
    run_dir: Path
    shards_spec: PreprocessSpec
    resume: bool = False
    base: Any = None  # levels 0..N-1 for level N >= 1 (an STMEMEncoder or a NestedEncoder)
    base_source: str | None = None
    base_info: dict = field(default_factory=dict)


def check_shards(cfg: RunConfig, folders: Sequence[Path]) -> PreprocessSpec:
    """The shards' spec, checked against the config's for every folder (ConfigError naming each difference)."""
    from ecgpos.ecg.shards import read_shard_spec, shard_files

    spec = None
    for folder in folders:
        shard_files(folder)
        spec = read_shard_spec(folder)
        cfg.preprocess.check_compatible(spec, f"the shards in {folder}")
    return spec


def estimated_parameters(cfg: RunConfig) -> float:
    """About how many parameters the trained encoder and decoder have (transformer blocks dominate);
    a float, infinite when the config's sizes overflow one."""
    enc, dec = cfg.encoder, cfg.decoder
    try:
        e_w, e_r, d_w, d_r = float(enc.width), float(enc.mlp_ratio), float(dec.width), float(dec.mlp_ratio)
        blocks = enc.depth * (4 + 2 * e_r) * e_w * e_w + dec.depth * (4 + 2 * d_r) * d_w * d_w
        embeds = e_w * (enc.patch_size + enc.num_leads) + d_w * (e_w + enc.patch_size)
        return blocks + embeds
    except OverflowError:
        return math.inf


def check_resources(cfg: RunConfig) -> None:
    """ConfigError (one line) for a model whose float32 weights alone exceed this machine's memory,
    or more DataLoader workers than max_workers(): both would otherwise fail deep in torch."""
    if cfg.train.num_workers > max_workers():
        raise ConfigError(
            f"train.num_workers {cfg.train.num_workers} is more than this machine's {usable_cpus()} CPUs can "
            f"serve (at most {max_workers()}); lower it, e.g. --set train.num_workers={min(usable_cpus(), 8)}"
        )
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf: torch reports a failed allocation itself
        return
    need = 4 * estimated_parameters(cfg)
    if need > memory:
        size = "an overflowing number of" if math.isinf(need) else f"about {need / 4:.3g}"
        raise ConfigError(
            f"the model of this config has {size} parameters, more than this machine's "
            f"{memory / 2**30:.0f} GiB of memory hold as float32 (encoder width {cfg.encoder.width}, depth "
            f"{cfg.encoder.depth}, mlp_ratio {cfg.encoder.mlp_ratio}; decoder width {cfg.decoder.width}, depth "
            f"{cfg.decoder.depth}, mlp_ratio {cfg.decoder.mlp_ratio})"
        )


def _base_kind(path: Path, cfg: RunConfig, flag: str = "--base") -> str:
    """'run' or 'export' for a --base folder whose depth fits level cfg.level (checked before any
    weights are loaded for a run folder); ConfigError (one line) otherwise."""
    from ecgpos.config import load_config
    from ecgpos.runs.run_folder import RUN_CONFIG, is_run_dir

    if not path.exists():
        raise ConfigError(f"{flag} {path} does not exist")
    if is_run_dir(path):
        run_level = load_config(RunConfig, path / RUN_CONFIG).level
        if run_level != cfg.level - 1:
            raise ConfigError(
                f"{flag} {path} is a level-{run_level} run (levels 0..{run_level}) but level {cfg.level} trains on "
                f"levels 0..{cfg.level - 1}: pass a level-{cfg.level - 1} run or export"
            )
        return "run"
    if not is_export_dir(path):
        raise ConfigError(
            f"{flag} {path} is neither a run folder (config.yaml + checkpoints/) nor an export folder (config.json)"
        )
    return "export"


def base_chain(levels: Sequence[Any], kind: str, source: str, info: dict) -> list[dict]:
    """One record per base level (level, kind, source, encoder config, weights sha256, shards): the
    levels' own provenance where the base records it, else the base folder itself."""
    from ecgpos.runs.levels import encoder_config_dict
    from ecgpos.runs.run_folder import run_chain

    recorded = {entry.get("level"): entry for entry in run_chain(info)}
    chain = []
    for level, module in enumerate(levels):
        own = {"kind": kind, "source": source, "shards": info.get("shards")}
        if level < len(levels) - 1 and isinstance(recorded.get(level), dict):
            own = {k: recorded[level].get(k) for k in ("kind", "source", "shards")}
        chain.append(
            {"level": level, **own, "encoder": encoder_config_dict(module), "weights_sha256": weights_hash(module)}
        )
    return chain


def load_base(path: Path | str, cfg: RunConfig, flag: str = "--base") -> tuple[Any, str, dict]:
    """(base encoder of levels 0..N-1, source, info) for level N = cfg.level, from a finished run
    folder, an export folder or hf://ORG/NAME[@REVISION] (its snapshot in the Hub cache), loaded through
    the one resolver (ecgpos.inference.resolve).
    info: {"kind", "shards", "weights_sha256" (of the whole base), "chain" (one record per level)}."""
    from ecgpos.export.hub import resolve_model_path
    from ecgpos.inference.resolve import resolve_encoder
    from ecgpos.models.factory import levels_of
    from ecgpos.runs.levels import check_base_fits
    from ecgpos.runs.run_folder import read_run_info

    path = resolve_model_path(path)  # hf://ORG/NAME: the snapshot folder in the Hub cache
    kind = _base_kind(path, cfg, flag)
    loaded = resolve_encoder(path)
    if kind == "run":  # an export's info is its run's training summary: run_dir, finished, ... too
        step, steps = loaded.info["step"], loaded.info["steps"]
        if not loaded.info["finished"]:
            raise ConfigError(
                f"{flag} {path} is incomplete (newest checkpoint at step {step} of {steps}): "
                "finish it with --resume auto, or export that checkpoint and pass the export folder"
            )
        recorded = read_run_info(path)
        info = {"kind": "run", "checkpoint": loaded.info["checkpoint"], "shards": recorded.get("shards")}
    else:
        recorded = dict(loaded.info)
        info = {"kind": "export", "shards": loaded.info.get("shards")}
    encoder = loaded.encoder
    cfg.preprocess.check_compatible(loaded.spec, f"the base encoder {path}")
    check_base_fits(encoder, cfg, f"the base encoder {path}")
    encoder.requires_grad_(False)
    encoder.eval()
    source = str(path.resolve())
    info.update(
        weights_sha256=weights_hash(encoder), chain=base_chain(levels_of(encoder), info["kind"], source, recorded)
    )
    return encoder, source, info


def other_pool(plan: RunPlan) -> str | None:
    """Why a level-1 run's shards are not the pool its level 0 was pretrained on (None when they are,
    or when that pool is unknown). The preprint trains every level on one pool; a warning, not a
    refusal, because a deliberate transfer, or the same shards mounted elsewhere, is legitimate."""
    from ecgpos.runs.run_folder import listed_folders

    pool = listed_folders(plan.base_info.get("shards"))
    if not pool:
        return None
    pool, ours = {str(Path(f)) for f in pool}, {str(f.resolve()) for f in plan.shards}
    if pool == ours:
        return None
    return (
        f"level {plan.cfg.level} trains on {', '.join(sorted(ours))}, not on the shards its base was pretrained "
        f"on ({', '.join(sorted(pool))}); the preprint trains every level on one pool"
    )


def check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool, base_info: dict) -> bool:
    """True when an existing run will be resumed; ConfigError when the folder holds another run."""
    from ecgpos.config import load_config, read_yaml
    from ecgpos.ecg.shards import SHARD_GLOB
    from ecgpos.runs.run_folder import (
        METRICS_FILE,
        RUN_CONFIG,
        newest_checkpoint,
        read_run_info,
        set_aside_checkpoints,
    )

    make_output_folder(run_dir, "--run-dir", create=False)  # a file there, or a file above it
    if run_dir.is_dir() and any(run_dir.glob(SHARD_GLOB)):  # e.g. --run-dir given one of the --shards folders
        raise ConfigError(f"--run-dir {run_dir} holds shard files ({SHARD_GLOB}): a run goes in a folder of its own")
    if is_export_dir(run_dir):  # e.g. a latent level given its --base export: the export would turn into a run folder
        raise ConfigError(f"--run-dir {run_dir} is an export folder (config.json): a run goes in a folder of its own")
    has_run = run_dir.is_dir() and (
        (run_dir / METRICS_FILE).exists()
        or newest_checkpoint(run_dir) is not None
        or bool(set_aside_checkpoints(run_dir))
    )
    if not has_run:
        return False
    if not resume:
        raise ConfigError(
            f"--run-dir {run_dir} already holds a run: pass --resume auto to continue it, or choose a new folder"
        )
    saved = run_dir / RUN_CONFIG
    if not saved.is_file() or not read_yaml(saved):  # nothing to compare the command line with
        raise ConfigError(
            f"--run-dir {run_dir} holds a run but its {RUN_CONFIG} is {'empty' if saved.is_file() else 'missing'}: "
            "cannot check that this config is the run's; restore the file or choose a new folder"
        )
    diffs = config_differences(load_config(RunConfig, saved), cfg)
    if diffs:
        raise ConfigError(f"the config differs from the run's config.yaml, cannot resume: {'; '.join(diffs[:4])}")
    saved = read_run_info(run_dir)
    saved_hash = saved.get("base_weights_sha256") or saved.get("stage0_weights_sha256")
    if saved_hash and base_info and saved_hash != base_info.get("weights_sha256"):
        raise ConfigError("--base holds other weights than the base encoder this run was started with")
    if newest_checkpoint(run_dir) is not None or set_aside_checkpoints(run_dir):
        return True
    info = read_run_info(run_dir)
    if info.get("finished"):  # e.g. checkpoints deleted after export: a resume would train it again from step 0
        raise ConfigError(
            f"--run-dir {run_dir} finished at step {info.get('step', '?')} but holds no checkpoint any more: "
            "nothing to resume or check; train again in a new folder"
        )
    return False


def prepare(args: argparse.Namespace) -> RunPlan:
    """Validate every input (EcgposError on the first problem) and return the plan."""
    cfg = load_run_config(args.config, args.overrides, level=args.level)
    check_resources(cfg)
    base_path = base_argument(args, cfg.level)
    spec = check_shards(cfg, args.shards)
    base = source = None
    info: dict = {}
    if cfg.level >= 1:
        flag = "--stage0" if getattr(args, "stage0", None) is not None else "--base"  # the spelling given
        base, source, info = load_base(base_path, cfg, flag)
    resume = check_run_dir(cfg, args.run_dir, args.resume == "auto", info)
    return RunPlan(cfg, list(args.shards), args.run_dir, spec, resume, base, source, info)


def base_argument(args: argparse.Namespace, level: int) -> Path | None:
    """The --base folder (or --stage0, its alias at level 1); ConfigError when it is missing for a
    latent level, given for level 0, or both spellings are given."""
    base, alias = getattr(args, "base", None), getattr(args, "stage0", None)
    if base is not None and alias is not None:
        raise ConfigError("--stage0 is --base for level 1: give --base only")
    if alias is not None and level != 1:
        raise ConfigError(f"--stage0 is --base at --level 1 only; level {level} takes --base RUN_OR_EXPORT_DIR")
    base = base if base is not None else alias
    if level == 0 and base is not None:
        raise ConfigError("--base is only used with --level N >= 1 (level 0 trains on the shards alone)")
    if level >= 1 and base is None:
        raise ConfigError(f"--level {level} needs --base RUN_OR_EXPORT_DIR (the frozen levels 0..{level - 1})")
    return base
