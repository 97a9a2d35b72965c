"""A run folder: the name of every file a pretraining run writes, and reading a run back.

RUN/config.yaml        the resolved run config (ecgpos.runs.run_config)
RUN/spec.json          the preprocessing spec of its shards
RUN/run_info.json      provenance: versions, shards, finished/stopped; for a latent level N its base
                       ("base": source, "base_weights_sha256") and "chain": one record per base level
                       (level, kind run/export, source, encoder config, weights_sha256, shards)
RUN/metrics.jsonl      one record per logged step (ecgpos.pretrain.metrics_log)
RUN/tb/                TensorBoard events
RUN/figures/           reconstructions and the training curve (ecgpos.pretrain.figures)
RUN/checkpoints/step-0001000/   model.safetensors, optimizer.bin, random_states_*.pkl,
                                trainer_state.json (ecgpos.pretrain.checkpoint)
RUN/.lock              held by the running trainer (ecgpos.pretrain.run_lock)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from torch import nn

from ecgpos.config import from_dict, load_config, read_yaml
from ecgpos.errors import EcgposError
from ecgpos.files import read_safetensors
from ecgpos.models.nested import recorded_level
from ecgpos.models.st_mem import EncoderConfig
from ecgpos.runs.run_config import RunConfig

RUN_CONFIG = "config.yaml"
SPEC_FILE = "spec.json"
RUN_INFO = "run_info.json"
METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
FIGURES_DIR = "figures"
CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"
_CHECKPOINT_NAME = re.compile(r"^step-(\d{7,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}"


def is_complete(path: Path) -> bool:
    """A finished checkpoint: a step-N folder (never .tmp) with trainer state and weights."""
    return bool(_CHECKPOINT_NAME.match(path.name)) and (path / STATE_FILE).is_file() and (path / WEIGHTS_FILE).is_file()


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    found = [(int(_CHECKPOINT_NAME.match(p.name).group(1)), p) for p in root.iterdir() if p.is_dir() and is_complete(p)]
    return sorted(found)


def incomplete_checkpoints(run_dir: str | Path) -> list[Path]:
    """step-N folders that lack the trainer state or the weights: never written so by a save (which renames
    a finished .tmp folder), so damaged afterwards; no resume can use them."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and _CHECKPOINT_NAME.match(p.name) and not is_complete(p))


def set_aside_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoints that a save of the same step renamed aside (.step-N.old-PID) and a kill kept from
    being deleted or renamed back; the trainer puts them back when it resumes (under the run lock)."""
    root = Path(run_dir) / CHECKPOINT_DIR
    return sorted(p for p in root.glob(".step-*.old-*") if p.is_dir()) if root.is_dir() else []


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def read_trainer_state(checkpoint: str | Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint folder; EcgposError when missing or unreadable."""
    path = Path(checkpoint) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise EcgposError(f"{path} is not a readable trainer state: {str(err).splitlines()[0]}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise EcgposError(f"{path} has no integer 'step'")
    return state


def read_run_info(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RUN_INFO
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EcgposError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(info, dict):
        raise EcgposError(f"{path} is damaged: a JSON {type(info).__name__}, not the run's record (an object)")
    return info


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / RUN_CONFIG).is_file() and ((path / RUN_INFO).is_file() or (path / "checkpoints").is_dir())


def base_source(info: dict[str, Any]) -> str | None:
    """Where a latent level's base came from (a run or export folder), from its run_info.json; runs
    written with the two-level names record it as "stage0"."""
    source = info.get("base", info.get("stage0"))
    return source if isinstance(source, str) else None


def run_chain(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The base levels' records of a run_info.json (level 0 first); a two-level run's level-0 record
    ("stage0", "stage0_encoder", "stage0_weights_sha256") is read as a chain of one level."""
    chain = info.get("chain")
    if isinstance(chain, list):
        return [entry for entry in chain if isinstance(entry, dict)]
    if "stage0_encoder" not in info:
        return []
    source = base_source(info)
    kind = None if source is None else "run" if is_run_dir(source) else "export"
    entry = {"level": 0, "kind": kind, "source": source, "encoder": info["stage0_encoder"]}
    return [{**entry, "weights_sha256": info.get("stage0_weights_sha256")}]


def _base_levels(run_dir: Path, level: int, info: dict[str, Any]) -> list[nn.Module]:
    """Freshly built base levels 0..level-1 of a latent run, from the encoder configs its chain records."""
    from ecgpos.models.factory import build_level

    where = run_dir / RUN_INFO
    chain = run_chain(info)
    if not chain:
        raise EcgposError(
            f"{where} lacks the base chain (chain, or stage0_encoder): cannot rebuild the level-{level} model"
        )
    if [entry.get("level") for entry in chain] != list(range(level)):
        raise EcgposError(f"{where} is damaged: its chain does not list levels 0..{level - 1} in order")
    levels = []
    for entry in chain:
        if not isinstance(entry.get("encoder"), dict):
            raise EcgposError(f"{where} is damaged: chain[{entry['level']}].encoder is not an object")
        try:
            cfg = from_dict(EncoderConfig, entry["encoder"], f"chain[{entry['level']}].encoder.")
        except EcgposError as err:
            raise EcgposError(f"{where} is damaged: {err}") from None
        levels.append(build_level(entry["level"], cfg))
    return levels


def _check_chain_weights(model: nn.Module, run_dir: Path, info: dict[str, Any]) -> None:
    """EcgposError unless every base level's loaded weights have the sha256 its chain records."""
    from ecgpos.models.factory import levels_of, weights_hash

    for entry, level in zip(run_chain(info), levels_of(model.base)):
        recorded = entry.get("weights_sha256")
        if recorded and weights_hash(level) != recorded:
            raise EcgposError(
                f"the checkpoint of {run_dir} holds other level-{entry['level']} weights than its "
                f"{RUN_INFO} records (weights sha256 {weights_hash(level)[:12]}... != {str(recorded)[:12]}...)"
            )


def load_run_model(run_dir: str | Path) -> tuple[nn.Module, RunConfig, Path, dict]:
    """(training model with the newest complete checkpoint's weights, config, checkpoint, run info).
    A latent level's base is rebuilt from its recorded chain and each level's weights hash is checked."""
    from ecgpos.models.factory import nested_of
    from ecgpos.runs.levels import build_model

    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise EcgposError(f"{run_dir} is a file, not a run folder")
    if not run_dir.is_dir():
        raise EcgposError(f"run folder {run_dir} does not exist")
    if not (run_dir / RUN_CONFIG).is_file():
        raise EcgposError(f"{run_dir} is not a training run folder (no {RUN_CONFIG})")
    checkpoint = newest_checkpoint(run_dir)
    if checkpoint is None:
        raise EcgposError(
            f"{run_dir} has no complete checkpoint (checkpoints/step-*/ with {WEIGHTS_FILE}): "
            "the run is incomplete or still before its first checkpoint"
        )
    cfg = load_config(RunConfig, run_dir / RUN_CONFIG)
    info = read_run_info(run_dir)
    base = nested_of(_base_levels(run_dir, cfg.level, info)) if cfg.level >= 1 else None
    model = build_model(cfg, base)
    state = read_safetensors(checkpoint / WEIGHTS_FILE, "checkpoint weights")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        text = " ".join(str(err).split())
        raise EcgposError(f"{checkpoint / WEIGHTS_FILE} does not fit the run's config: {text[:300]}") from None
    if base is not None:
        _check_chain_weights(model, run_dir, info)
    return model, cfg, checkpoint, info


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; {} when it is missing, unreadable or not an object (what is read
    through here is descriptive: the model card and the leakage guard's shard folders)."""
    try:
        found = json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return found if isinstance(found, dict) else {}


def _shards_summary(shards: Any) -> dict[str, Any]:
    """Source corpora and record count of the shard folder(s), from their preprocess.json files."""
    sources, records = [], 0
    for folder in listed_folders(shards):
        info = read_json_object(Path(str(folder)) / "preprocess.json")
        settings = info.get("settings") if isinstance(info.get("settings"), dict) else {}
        sources.append(str(info.get("source") or settings.get("source") or folder))
        counts = info.get("counts") if isinstance(info.get("counts"), dict) else {}
        records = None if records is None or counts.get("stored") is None else records + int(counts["stored"])
    out: dict[str, Any] = {"data": " + ".join(sources)} if sources else {}
    if sources and records is not None:
        out["records"] = records
    return out


def training_summary(run_dir: Path, info: dict[str, Any], arch: dict[str, Any]) -> dict[str, Any]:
    """Training facts for config.json and the model card, from run_info.json, config.yaml and `info`; the level
    trained is the run's own (a cut encoder's `info` names the level it was cut to)."""
    recorded = read_json_object(run_dir / RUN_INFO)
    run_info = {**recorded, **{k: v for k, v in info.items() if _jsonable(v)}}
    config = read_yaml(run_dir / RUN_CONFIG) if (run_dir / RUN_CONFIG).is_file() else {}
    optim, train = config.get("optim", {}) or {}, config.get("train", {}) or {}
    push_pull = config.get("push_pull", {}) or {}
    summary: dict[str, Any] = {
        "name": run_dir.resolve().name,
        "run_dir": str(run_dir.resolve()),
        "level": next(
            (v for v in (recorded_level(recorded), recorded_level(config)) if v is not None), _top_level(arch)
        ),
        "step": run_info.get("step"),
        "steps": optim.get("steps"),
        "finished": run_info.get("finished"),
        "batch_size": train.get("batch_size"),
        "lr": optim.get("lr"),
        "mask_ratio": config.get("mask_ratio"),
        "push_pull": (
            f"on (alpha {push_pull.get('alpha')}, lambda {push_pull.get('lambda_pp')}, {push_pull.get('perturbation')})"
        )
        if push_pull.get("enabled")
        else ("off" if push_pull else None),
        "records": run_info.get("num_train_records"),
        "base": base_source(run_info),
        "chain": run_info.get("chain"),
        "checkpoint": run_info.get("checkpoint") or info.get("checkpoint"),
    }
    shards = _shards_summary(run_info.get("shards") or config.get("shards"))
    summary.update({k: v for k, v in shards.items() if summary.get(k) is None})
    summary["shards"] = _pretraining_folders(run_info) or None  # what the probes' leakage guard compares with
    return {k: v for k, v in summary.items() if v is not None}


def _pretraining_folders(run_info: dict[str, Any]) -> list[str]:
    """Shard folders of the run and, for a latent level, of every level below it (all pretrained it):
    the chain's records, and what the base run or export folder itself lists."""
    folders = listed_folders(run_info.get("shards"))
    for entry in run_chain(run_info):
        folders += listed_folders(entry.get("shards"))
    base = base_source(run_info)
    if base:
        folders += listed_folders(read_json_object(Path(base) / RUN_INFO).get("shards"))
        training = read_json_object(Path(base) / "config.json").get("training")
        folders += listed_folders(training.get("shards") if isinstance(training, dict) else None)
    return list(dict.fromkeys(folders))


def _top_level(arch: dict[str, Any]) -> int:
    """The top level of the encoder an arch describes (0 for a level-0 encoder)."""
    levels = arch.get("levels")
    return len(levels) - 1 if isinstance(levels, list) else (1 if arch.get("kind") == "nested" else 0)


def listed_folders(value: Any) -> list[str]:
    """A recorded `shards` value as folder names: a list, or one folder; anything else (a damaged
    record) names none."""
    if isinstance(value, (str, Path)):
        return [str(value)]
    return [str(f) for f in value if isinstance(f, (str, Path))] if isinstance(value, list) else []


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
