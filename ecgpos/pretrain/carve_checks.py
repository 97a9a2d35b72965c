"""What `ecgpos carve` checks before level 0 starts: its arguments, its --run-dir, every level's config,
and each level run it finds already there, as `ecgpos pretrain --resume auto` checks a run.

A level run found in --run-dir is kept only when it is what this command would train: the same resolved
config (train.val_fraction = --val-fraction included, so every level held out the records the criterion
is measured on), the same shards, and for level l >= 1 the base level l-1 of the same folder. Anything
else is one line (EcgposError, exit 2) before anything is trained or measured. An earlier carve.json
that cannot be read is said in one line and measured again; its records are reused only when they hold
every field of a LevelRecord with a value of the declared type.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ecgpos.errors import ConfigError, EcgposError
from ecgpos.pretrain.carve_plan import LevelRecord, read_carve

CARVE_FILES = ("carve.json", "carve.md", "carve.png")


def level_overrides(args: argparse.Namespace, level: int) -> list[str]:
    """The --set overrides of level `level`'s run: the held-out fraction, --set, then --latent-set (l >= 1)."""
    return [f"train.val_fraction={args.val_fraction}", *args.overrides, *(args.latent_set if level >= 1 else [])]


def level_config_name(args: argparse.Namespace, level: int) -> str:
    return args.config if level == 0 else args.latent_config


def check_arguments(args: argparse.Namespace) -> None:
    """Numbers that would switch a stop rule off, and options that only mean something beside another."""
    if args.level_prefix != "level" and args.decide is None:
        raise EcgposError(f"--level-prefix {args.level_prefix} reads finished runs: give it with --decide LEVEL")
    for flag, value in (("--stop-below", args.stop_below), ("--min-drop", args.min_drop)):
        if not math.isfinite(value):
            raise EcgposError(f"{flag} must be a finite number, got {value}: {value} would switch its stop rule off")
    geometry = [f for f, v in (("--nominal", args.nominal), ("--anomalous", args.anomalous)) if v]
    geometry += ["--geometry-args"] if args.geometry_args else []
    if geometry and not args.geometry_task:
        verb = "take" if len(geometry) > 1 else "takes"
        raise EcgposError(f"{', '.join(geometry)} only {verb} effect with --geometry-task")
    if args.probe_args and not args.probe_task:
        raise EcgposError("--probe-args only takes effect with --probe-task")
    if args.data_root is not None and not (args.probe_task or args.geometry_task):
        raise EcgposError("--data-root only takes effect with --probe-task or --geometry-task")
    if args.latent_set and args.max_levels < 2 and args.decide is None:
        raise EcgposError("--latent-set sets levels >= 1, but --max-levels 1 trains level 0 only")


def check_run_dir(run_dir: Path, prefix: str) -> None:
    """Refuse a --run-dir that is (or lies inside) an export, run or shard folder, or that holds files
    carve did not write (neither carve.json nor a level folder)."""
    from ecgpos.export.format import is_export_dir
    from ecgpos.inference.resolve import artifact_above

    if is_export_dir(run_dir):
        raise EcgposError(f"--run-dir {run_dir} is an export folder (config.json): carve into a folder of its own")
    inside = artifact_above(run_dir)
    if inside is not None:
        where = "is" if inside[0] == run_dir.absolute() else "lies inside"
        raise EcgposError(f"--run-dir {run_dir} {where} {inside[1]} {inside[0]}: carve into a folder of its own")
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return
    if (run_dir / "carve.json").is_file() or (run_dir / f"{prefix}0").is_dir():
        return
    found = sorted(p.name for p in run_dir.iterdir())
    raise EcgposError(
        f"--run-dir {run_dir} holds files carve did not write ({', '.join(found[:3])}{' ...' if len(found) > 3 else ''}"
        f"; no carve.json and no {prefix}0/): carve into a new or empty folder"
    )


def level_configs(args: argparse.Namespace, levels: int) -> list[Any]:
    """Every level's resolved RunConfig, so that a config that cannot train a level is refused before level 0."""
    from ecgpos.runs.run_config import load_run_config

    configs = []
    for level in range(levels):
        flag = "--config" if level == 0 else "--latent-config"
        try:
            configs.append(load_run_config(level_config_name(args, level), level_overrides(args, level), level=level))
        except ConfigError as err:
            raise ConfigError(f"{flag} {level_config_name(args, level)} cannot train level {level}: {err}") from None
    return configs


def _same_folders(recorded: Any, given: list[Path]) -> bool:
    if not isinstance(recorded, list):
        return False
    return [str(Path(p)) for p in recorded] == [str(p.resolve()) for p in given]


def check_level_run(args: argparse.Namespace, level: int, run: Path, cfg: Any, base: Path | None) -> bool:
    """Whether level `level`'s run folder `run` is finished; EcgposError when it holds a run this command would
    not have trained (`cfg` None: its config is not compared, e.g. runs trained by slurm/pipeline.sh)."""
    from ecgpos.config import load_config
    from ecgpos.runs.run_config import RunConfig, config_differences
    from ecgpos.runs.run_folder import RUN_CONFIG, base_source, read_run_info

    saved_path = run / RUN_CONFIG
    if not saved_path.is_file():  # nothing trained yet, or a damaged run `ecgpos pretrain --resume auto` refuses
        return False
    what = f"level {level} ({run})"
    saved = load_config(RunConfig, saved_path)
    held = saved.train.val_fraction
    if held != args.val_fraction:
        raise EcgposError(
            f"{what} trained with train.val_fraction={held}, not --val-fraction {args.val_fraction}: the criterion "
            "is measured on the records every level held out; carve into a new --run-dir"
        )
    if cfg is not None:
        diffs = config_differences(saved, cfg)
        if diffs:
            raise EcgposError(
                f"{what} was trained with other settings than this command gives it: {'; '.join(diffs[:4])}; "
                "run the command it was carved with, or carve into a new --run-dir"
            )
    info = read_run_info(run)
    step, finished = info.get("step", 0), info.get("finished", False)
    if isinstance(step, bool) or not isinstance(step, int) or not isinstance(finished, bool):
        raise EcgposError(
            f"{run / 'run_info.json'} is damaged (step {step!r:.20}, finished {finished!r:.20}): rerun "
            f"`ecgpos pretrain --resume auto` on {run}, or carve into a new --run-dir"
        )
    if info and not _same_folders(info.get("shards"), args.shards):
        raise EcgposError(
            f"{what} was trained on the shards {', '.join(map(str, info.get('shards') or []))}, not on --shards "
            f"{' '.join(str(p.resolve()) for p in args.shards)}: pass the same --shards or carve into a new --run-dir"
        )
    if base is not None and info:
        source = base_source(info)
        if source is None or Path(source) != base.resolve():
            raise EcgposError(
                f"{what} was trained on the base {source}, not on level {level - 1} of this folder ({base}): "
                "carve into a new --run-dir"
            )
    return finished


def check_carve(args: argparse.Namespace, level_run: Callable[[int], Path]) -> list[int]:
    """Everything carve checks before level 0 starts (see the module docstring); the finished levels kept."""
    check_arguments(args)
    check_run_dir(args.run_dir, args.level_prefix)
    levels = args.max_levels if args.decide is None else args.decide + 1
    configs = level_configs(args, levels) if args.decide is None else [None] * levels
    kept = []
    for level in range(levels):
        run = level_run(level)
        base = level_run(level - 1) if level >= 1 else None
        if check_level_run(args, level, run, configs[level], base) and len(kept) == level:
            kept.append(level)
    return kept


def _fits(value: Any, kind: Any) -> bool:
    """Whether a JSON value fits a LevelRecord field's declared type (float, int, str, dict, tuple, | None)."""
    origin, parts = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, part) for part in parts)
    if kind is type(None):
        return value is None
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind is bool:
        return isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and len(value) == len(parts) and all(map(_fits, value, parts))
    if origin is dict or kind is dict:
        return isinstance(value, dict) and (not parts or all(_fits(v, parts[1]) for v in value.values()))
    if origin is list:
        return isinstance(value, list) and all(_fits(v, parts[0]) for v in value)
    return True  # a type this check does not know: taken as written


def level_record(entry: Any) -> LevelRecord | None:
    """An earlier carve.json entry as a LevelRecord, or None when a field is missing, unknown or mistyped."""
    if not isinstance(entry, dict):
        return None
    hints = typing.get_type_hints(LevelRecord)
    fields = {f.name: f for f in dataclasses.fields(LevelRecord)}
    required = {
        n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    if set(entry) - set(fields) or required - set(entry):
        return None
    if not all(_fits(value, hints[name]) for name, value in entry.items()):
        return None
    return LevelRecord(**{k: _as_declared(v, hints[k]) for k, v in entry.items()})


def _as_declared(value: Any, kind: Any) -> Any:
    """A JSON list as the tuple a field declares (an interval)."""
    kinds = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else (kind,)
    return tuple(value) if isinstance(value, list) and any(typing.get_origin(k) is tuple for k in kinds) else value


def earlier_measurements(run_dir: Path) -> tuple[dict, dict[int, dict]]:
    """(settings, {level: entry}) of an earlier carve.json, its entries that read as LevelRecords only;
    a damaged file is said in one line on stderr and every level is measured again."""
    try:
        settings, levels = read_carve(run_dir)
    except (ValueError, UnicodeDecodeError, AttributeError, TypeError, OSError) as err:
        print(
            f"ecgpos carve: {run_dir / 'carve.json'} is damaged ({type(err).__name__}); every level is measured "
            "again and the file rewritten",
            file=sys.stderr,
        )
        return {}, {}
    known = {}
    for entry in levels if isinstance(levels, list) else []:
        if level_record(entry) is not None:
            known.setdefault(entry["level"], entry)
    return (settings if isinstance(settings, dict) else {}), known
