"""Everything `ecgpos pretrain` can check without training, checked before an Accelerator exists.

The config (unknown keys, impossible values), the shards (missing, empty, written with another
preprocessing spec), the Stage-0 encoder (missing, incomplete, other spec or width) and the run
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
    stage0: Any = None  # STMEMEncoder for Stage 1
    stage0_source: str | None = None
    stage0_info: dict = field(default_factory=dict)


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


def load_stage0(path: Path | str, cfg: RunConfig) -> tuple[Any, str, dict]:
    """(STMEMEncoder, source, info) from a finished Stage-0 run folder or a Stage-0 export folder,
    loaded through the one resolver (ecgpos.inference.resolve)."""
    from ecgpos.config import load_config
    from ecgpos.export.hub import resolve_model_path
    from ecgpos.inference.resolve import resolve_encoder
    from ecgpos.runs.run_folder import RUN_CONFIG, is_run_dir, read_run_info
    from ecgpos.runs.stages import check_stage0_fits, stage0_config_dict

    path = resolve_model_path(path)  # hf://ORG/NAME: the snapshot folder in the Hub cache
    if not path.exists():
        raise ConfigError(f"--stage0 {path} does not exist")
    if is_run_dir(path):
        run_stage = load_config(RunConfig, path / RUN_CONFIG).stage  # before loading any weights
        if run_stage != 0:
            raise ConfigError(f"--stage0 {path} is a Stage-{run_stage} run, not a Stage-0 run")
    elif not is_export_dir(path):
        raise ConfigError(
            f"--stage0 {path} is neither a Stage-0 run folder (config.yaml + checkpoints/) "
            "nor an export folder (config.json)"
        )
    loaded = resolve_encoder(path)
    if loaded.arch.get("kind") != "stage0":
        raise ConfigError(
            f"--stage0 {path} is an export of a {loaded.arch.get('kind')!r} encoder, not of a Stage-0 encoder"
        )
    if is_run_dir(path):  # an export's info is its run's training summary: run_dir, finished, ... too
        step, steps = loaded.info["step"], loaded.info["steps"]
        if not loaded.info["finished"]:
            raise ConfigError(
                f"--stage0 {path} is incomplete (newest checkpoint at step {step} of {steps}): "
                "finish it with --resume auto, or export that checkpoint and pass the export folder"
            )
        info = {"kind": "run", "checkpoint": loaded.info["checkpoint"], "shards": read_run_info(path).get("shards")}
    else:
        info = {"kind": "export", "shards": loaded.info.get("shards")}
    encoder = getattr(loaded.module, "encoder", loaded.module)  # an export wraps its STMEMEncoder
    cfg.preprocess.check_compatible(loaded.spec, f"the Stage-0 encoder {path}")
    check_stage0_fits(encoder, cfg, f"the Stage-0 encoder {path}")
    encoder.requires_grad_(False)
    encoder.eval()
    info.update(encoder=stage0_config_dict(encoder), weights_sha256=weights_hash(encoder))
    return encoder, str(path.resolve()), info


def other_pool(plan: RunPlan) -> str | None:
    """Why a Stage-1 run's shards are not the pool its Stage 0 was pretrained on (None when they are,
    or when that pool is unknown). The preprint trains both stages on one pool; a warning, not a
    refusal, because a deliberate transfer, or the same shards mounted elsewhere, is legitimate."""
    from ecgpos.runs.run_folder import listed_folders

    pool = listed_folders(plan.stage0_info.get("shards"))
    if not pool:
        return None
    pool, ours = {str(Path(f)) for f in pool}, {str(f.resolve()) for f in plan.shards}
    if pool == ours:
        return None
    return (
        f"Stage 1 trains on {', '.join(sorted(ours))}, not on the shards its Stage 0 was pretrained on "
        f"({', '.join(sorted(pool))}); the preprint trains both stages on one pool"
    )


def check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool, stage0_info: dict) -> bool:
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
    if is_export_dir(run_dir):  # e.g. Stage 1 given its --stage0 export: the export would turn into a run folder
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
    saved_hash = read_run_info(run_dir).get("stage0_weights_sha256")
    if saved_hash and stage0_info and saved_hash != stage0_info.get("weights_sha256"):
        raise ConfigError("--stage0 holds other weights than the Stage-0 encoder this run was started with")
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
    cfg = load_run_config(args.config, args.overrides, stage=args.stage)
    check_resources(cfg)
    if cfg.stage == 0 and args.stage0 is not None:
        raise ConfigError("--stage0 is only used with --stage 1")
    if cfg.stage == 1 and args.stage0 is None:
        raise ConfigError("--stage 1 needs --stage0 RUN_OR_EXPORT_DIR (the frozen Stage-0 encoder)")
    spec = check_shards(cfg, args.shards)
    stage0 = source = None
    info: dict = {}
    if cfg.stage == 1:
        stage0, source, info = load_stage0(args.stage0, cfg)
    resume = check_run_dir(cfg, args.run_dir, args.resume == "auto", info)
    return RunPlan(cfg, list(args.shards), args.run_dir, spec, resume, stage0, source, info)
