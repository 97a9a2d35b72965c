"""`ecgpos carve`: the depth loop. Train level 0, then level 1 on it, and so on, until the carving
criterion says stop.

    ecgpos carve --config level0 --latent-config level1 --shards DIR [DIR ...] --run-dir RUNS
                 [--max-levels 4] [--stop-below 0.05] [--min-drop 0.01] [--val-fraction 0.1]
                 [--criterion-map trained|masked|unmasked]
                 [--set key=value ...] [--latent-set key=value ...]
                 [--probe-task TASK --data-root DIR [--splits DIR] [--probe-args "..."]]
                 [--geometry-task TASK --nominal A,B --anomalous C [--geometry-args "..."]]
    accelerate launch -m ecgpos carve ...        (each level trains on every process)

Level l trains into RUNS/level<l> (`ecgpos pretrain --level N` with N = l, on the frozen RUNS/level<l-1> for l >= 1)
with train.val_fraction set to --val-fraction at every level, so all levels hold out the same records.
After each level the calibrated criterion (ecgpos.objectives.calibrated: a structured perturbation at twice
the level's own clean reconstruction error, read through the map the level trained as; with pass-through and
the literal push-margin reading beside it) is measured on those held-out records (label-free) and
ecgpos.pretrain.carve_plan decides: stop below --stop-below, stop when it fell by less
than --min-drop since the level before, stop at --max-levels, else carve the next level.
RUNS/carve.json, carve.md and carve.png are rewritten after each level. Run the same command again to
resume: finished levels are kept (their measurement too), an interrupted level continues from its
newest checkpoint (`--resume auto`). Before level 0 starts, every level's config is resolved and each level
run already in RUNS is checked as `pretrain --resume auto` checks a run (ecgpos.pretrain.carve_checks): the
same config, --val-fraction and shards, and level l's base is RUNS/level<l-1>; anything else, and a RUNS
that is an export, run or shard folder or holds files carve did not write, is one line (exit 2). A
damaged carve.json is measured again. With --probe-task each level is also linear-probed (`ecgpos probe`
into RUNS/probes/level<l>); with --geometry-task, --nominal and --anomalous each level l >= 1 gets
`ecgpos geometry --level L` with L = l (into RUNS/geometry/level<l>), whose Delta % per metric carve.md tabulates.

`--decide LEVEL` trains nothing: levels 0..LEVEL are finished runs trained elsewhere (slurm/pipeline.sh
--depth auto, whose runs are RUNS/level<l>; `--level-prefix stage` reads runs named RUNS/stage<l>); it
measures them (reusing carve.json's measurements of the same runs), decides after each as above and
rewrites carve.*. The last level in carve.json and its decision say whether to carve level LEVEL + 1
(slurm/decide.sbatch reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ecgpos.config import add_set_option
from ecgpos.errors import EcgposError
from ecgpos.files import user_path
from ecgpos.pretrain.carve_checks import (
    check_carve,
    earlier_measurements,
    level_config_name,
    level_overrides,
    level_record,
)
from ecgpos.pretrain.carve_plan import LevelRecord, decide, write_carve


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos carve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="level0", help="level-0 run config (default level0; tiny/level0 for tests)")
    p.add_argument("--latent-config", default="level1", help="config of every level >= 1 (default level1)")
    p.add_argument("--shards", type=user_path, nargs="+", required=True, metavar="DIR", help="the pretraining pool")
    p.add_argument("--run-dir", type=user_path, required=True, help="folder of the level runs and carve.*")
    p.add_argument("--max-levels", type=int, default=4, help="at most this many levels (default 4)")
    p.add_argument("--stop-below", type=float, default=0.05, help="stop when the criterion is below (default 0.05)")
    p.add_argument("--min-drop", type=float, default=0.01, help="stop when it fell by less (default 0.01)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held-out share of the pool (default 0.1)")
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward of the criterion (default 32)")
    p.add_argument(
        "--criterion-map",
        choices=("trained", "masked", "unmasked"),
        default="trained",
        help="the map each level is read through: the one it trained (default; unmasked with push-pull on, "
        "masked without), or the masked / unmasked map at every level",
    )
    add_set_option(p, "a config key of every level", "optim.steps=200")
    p.add_argument(
        "--latent-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key of the levels >= 1 only, after --set (repeatable), e.g. optim.steps=100",
    )
    p.add_argument("--probe-task", help="also linear-probe each level on this task (e.g. ptbxl-rhythm)")
    p.add_argument("--data-root", type=user_path, help="with --probe-task: folder holding ptbxl/ and cpsc2018/")
    p.add_argument("--splits", type=user_path, help="with --probe-task: folder holding MERL's split folders")
    p.add_argument("--probe-args", default="", help="with --probe-task: extra `ecgpos probe` flags, one string")
    p.add_argument("--geometry-task", help="also measure geometry between levels l-1 and l on this task (l >= 1)")
    p.add_argument("--nominal", help="with --geometry-task: comma-separated nominal classes")
    p.add_argument("--anomalous", help="with --geometry-task: comma-separated anomalous classes")
    p.add_argument("--geometry-args", default="", help="with --geometry-task: extra `ecgpos geometry` flags")
    p.add_argument(
        "--decide",
        type=int,
        metavar="LEVEL",
        help="train nothing: measure and decide after LEVEL on the finished runs of levels 0..LEVEL "
        "(slurm/decide.sbatch; the runs must hold out --val-fraction)",
    )
    p.add_argument(
        "--level-prefix",
        choices=("level", "stage"),
        default="level",
        help="with --decide: the runs are RUN_DIR/<prefix><l>, level (default) or stage (run folders named stage<l>)",
    )
    return p


def is_main_process() -> bool:
    """Whether this is the process that writes (rank 0 under `accelerate launch`, or the only one)."""
    return int(os.environ.get("RANK", "0")) == 0


def _check(args: argparse.Namespace) -> None:
    if args.max_levels < 1:
        raise EcgposError(f"--max-levels must be at least 1, got {args.max_levels}")
    if not 0 < args.val_fraction < 1:
        raise EcgposError(f"--val-fraction must be in (0, 1), got {args.val_fraction}")
    if not 0 <= args.stop_below <= 1:
        raise EcgposError(f"--stop-below is a fraction in [0, 1], got {args.stop_below}")
    if args.batch_size < 1:
        raise EcgposError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.probe_task and args.data_root is None and not args.probe_task.startswith("custom:"):
        raise EcgposError("--probe-task needs --data-root")
    if args.geometry_task and not (args.nominal and args.anomalous):
        raise EcgposError("--geometry-task needs --nominal and --anomalous")
    if args.decide is not None and not 0 <= args.decide < args.max_levels:
        raise EcgposError(
            f"--decide {args.decide}: a level in 0..{args.max_levels - 1} (--max-levels {args.max_levels})"
        )
    if args.run_dir.exists() and not args.run_dir.is_dir():
        raise EcgposError(f"--run-dir {args.run_dir} is a file, not a folder")


def _level_run(args: argparse.Namespace, level: int) -> Path:
    """The run folder of level `level`: RUN_DIR/level<l> (RUN_DIR/stage<l> with --level-prefix stage)."""
    return args.run_dir / f"{args.level_prefix}{level}"


def _pretrain_argv(args: argparse.Namespace, level: int) -> list[str]:
    """`ecgpos pretrain`'s options for level `level`. Command-line words are the honest interface here:
    pretrain's main builds the run config from --config and the user's --set overrides and owns the
    Accelerate set-up (one call per level, under `accelerate launch` on several processes); its results
    are its run folder, which carve reads as a resumed carve or a Slurm decide job does."""
    run = _level_run(args, level)
    argv = ["--level", str(level), "--config", level_config_name(args, level)]
    argv += ["--shards", *map(str, args.shards), "--run-dir", str(run), "--resume", "auto"]
    if level >= 1:
        argv += ["--base", str(_level_run(args, level - 1))]
    for override in level_overrides(args, level):
        argv += ["--set", override]
    return argv


def _finished(run: Path) -> bool:
    info = run / "run_info.json"
    return info.is_file() and bool(json.loads(info.read_text()).get("finished"))


def _train(args: argparse.Namespace, level: int) -> int:
    """Train (or finish) level `level`; 0 when its run folder is finished."""
    run = _level_run(args, level)
    if _finished(run):
        return 0
    from ecgpos.cli.pretrain import main as pretrain

    code = pretrain(_pretrain_argv(args, level))
    if code == 0 and not _finished(run):  # stopped cleanly by a signal: exit 0 as pretrain does, for a requeue
        print(f"ecgpos carve: level {level} stopped before its last step; rerun to resume", file=sys.stderr)
        return -1
    return code


def _run_facts(run: Path) -> tuple[int, float | None]:
    """(steps trained, last validation loss) of a finished run folder."""
    info = json.loads((run / "run_info.json").read_text())
    lines = []
    metrics = run / "metrics.jsonl"
    for line in metrics.read_text(errors="replace").splitlines() if metrics.is_file() else []:
        try:  # a line cut by a kill, or damaged, says nothing
            lines.append(json.loads(line))
        except ValueError:
            continue
    val = [r["val_loss"] for r in lines if isinstance(r, dict) and isinstance(r.get("val_loss"), (int, float))]
    return int(info.get("step", info.get("steps", 0)) or 0), (val[-1] if val else None)


def measure(args: argparse.Namespace, level: int) -> tuple[dict, tuple[int, float | None]]:
    """The calibrated reading (every family) and the literal per-record violation of level `level` on the
    pool's validation records, as carve.json's fields, and the run's (steps, last validation loss)."""
    import torch

    from ecgpos.pretrain.carving import shard_reading, shard_violations, validation_index
    from ecgpos.pretrain.data import ShardDataset
    from ecgpos.runs.run_folder import load_run_model

    run = _level_run(args, level)
    model, cfg, _, _ = load_run_model(run)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).float().eval()
    index = validation_index(args.shards, args.val_fraction)
    if index is None:
        raise EcgposError(f"--val-fraction {args.val_fraction} holds out no record of the pool: nothing to measure on")
    dataset = ShardDataset(index, cfg.preprocess.window, train=False)
    literal = shard_violations(model, dataset, args.batch_size, device)
    reading = shard_reading(model, dataset, args.batch_size, device, args.criterion_map)
    return reading_fields(reading, literal), _run_facts(run)


def reading_fields(reading: object, literal: dict[str, float]) -> dict:
    """carve.json's measurement fields of a level from its calibrated reading and literal violations."""
    from ecgpos.objectives.criterion import bootstrap_interval, criterion

    families = {
        name: {
            "criterion": criterion(f.violation),
            "pass_through": criterion(f.pass_through),
            "perturbation_over_error": f.size_over_error,
        }
        for name, f in reading.families.items()
    }
    decides = reading.families[reading.deciding]
    return {
        "clean_error": reading.clean_error,
        "perturbation_over_error": decides.size_over_error,
        "criterion": criterion(decides.violation),
        "criterion_ci": bootstrap_interval(decides.violation),
        "criterion_literal": criterion(literal),
        "pass_through": criterion(decides.pass_through),
        "pass_through_ci": bootstrap_interval(decides.pass_through),
        "perturbation": reading.deciding,
        "records": len(literal),
        "map": reading.map,
        "families": families,
    }


def _probe(args: argparse.Namespace, level: int) -> tuple[float | None, tuple[float, float] | None]:
    """Macro AUROC (test, mean over seeds) of a linear probe on level `level`, with its 95 % interval."""
    from ecgpos.probes.linear.cli import probe

    out = args.run_dir / "probes" / f"level{level}"
    argv = ["--encoder", str(_level_run(args, level)), "--task", args.probe_task, "--out", str(out)]
    argv += ["--name", f"level{level}"]
    argv += ["--data-root", str(args.data_root)] if args.data_root else []
    argv += ["--splits", str(args.splits)] if args.splits else []
    argv += args.probe_args.split()
    try:
        done = probe(argv)
    except EcgposError as err:
        raise EcgposError(f"probing level {level} failed: {err}; its run is kept, rerun carve to continue") from err
    return done.mean_test_auroc(), done.mean_interval()


def _geometry(args: argparse.Namespace, level: int) -> dict[str, float]:
    """Delta % of each geometry metric between levels level-1 and level (`ecgpos geometry --level`)."""
    from ecgpos.probes.geometry.cli import measure

    out = args.run_dir / "geometry" / f"level{level}"
    argv = ["--encoder", str(_level_run(args, level)), "--level", str(level), "--task", args.geometry_task]
    argv += ["--nominal", args.nominal, "--anomalous", args.anomalous, "--out", str(out)]
    argv += ["--data-root", str(args.data_root)] if args.data_root else []
    argv += ["--splits", str(args.splits)] if args.splits else []
    argv += args.geometry_args.split()
    try:
        done = measure(argv)
    except EcgposError as err:
        raise EcgposError(f"geometry of level {level} failed: {err}; its run is kept, rerun carve to continue") from err
    return done.deltas(level)


def _map_of(run: Path, choice: str) -> str:
    """The map `--criterion-map choice` reads the finished run `run` through (ecgpos.objectives.calibrated)."""
    import yaml

    if choice != "trained":
        return choice
    cfg = yaml.safe_load((run / "config.yaml").read_text()) or {}
    return "unmasked" if (cfg.get("push_pull") or {}).get("enabled") else "masked"


def _level_record(args: argparse.Namespace, level: int, known: dict[int, dict]) -> LevelRecord:
    """Measure level `level` (or reuse carve.json's measurement of the same finished run, when it holds the
    calibrated reading through the same map)."""
    run = _level_run(args, level)
    # None: not measured, measured before the calibrated criterion, or an entry that does not read as a LevelRecord
    old = level_record(known.get(level))
    if old is not None and old.run_dir == str(run) and old.steps == _run_facts(run)[0]:
        probed = args.probe_task is None or old.probe_auroc is not None
        measured = args.geometry_task is None or level == 0 or old.geometry
        if probed and measured and old.map == _map_of(run, args.criterion_map):
            return old
    fields, (steps, val_loss) = measure(args, level)
    record = LevelRecord(level=level, run_dir=str(run), steps=steps, val_loss=val_loss, decision={}, **fields)
    if args.probe_task and is_main_process():  # the other processes go on to the next level's training
        record.probe_auroc, record.probe_interval = _probe(args, level)
    if args.geometry_task and level >= 1 and is_main_process():
        record.geometry = _geometry(args, level)
    return record


def _carve_level(
    args: argparse.Namespace, level: int, known: dict[int, dict], done: list[LevelRecord], settings: dict
) -> bool:
    """Measure level `level` on top of `done`, decide, append it to `done` and rewrite carve.*; True: stop."""
    record = _level_record(args, level, known)
    decision = decide([r.criterion for r in done] + [record.criterion], args.max_levels, args.stop_below, args.min_drop)
    record.decision = {"stop": decision.stop, "rule": decision.rule, "reason": decision.reason}
    done.append(record)
    if is_main_process():
        # the measurements of levels above this one stay in carve.json while the carving goes on, so a
        # decide job of a resumed Slurm chain reuses them; a stop drops them with the levels they belong to
        above = [] if decision.stop else [known[k] for k in sorted(known) if k > level]
        write_carve(args.run_dir, settings, done, above)
        lo, hi = record.criterion_ci
        print(
            f"ecgpos carve: level {level}: criterion {record.criterion:.4f} [{lo:.4f}, {hi:.4f}] "
            f"({record.perturbation}, {record.map} map), pass-through {record.pass_through:.4f}, "
            f"literal {record.criterion_literal:.4f}; {decision.reason}"
        )
    return decision.stop


def _check_trained(args: argparse.Namespace) -> None:
    """--decide: levels 0..LEVEL are finished runs that held out the records the criterion is measured on."""
    import yaml

    for level in range(args.decide + 1):
        run = _level_run(args, level)
        if not _finished(run):
            raise EcgposError(f"--decide {args.decide}: {run} is not a finished run (level {level}): train it first")
        held = yaml.safe_load((run / "config.yaml").read_text())["train"]["val_fraction"]
        if held != args.val_fraction:
            raise EcgposError(
                f"--decide {args.decide}: {run} trained with train.val_fraction={held}, not --val-fraction "
                f"{args.val_fraction}: the criterion is measured on the records every level held out"
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check(args)
    kept = check_carve(args, lambda level: _level_run(args, level))  # one line before anything is trained
    if kept and args.decide is None and is_main_process():
        last = f"levels 0..{kept[-1]}" if len(kept) > 1 else "level 0"
        print(f"ecgpos carve: keeping the finished {last} in {args.run_dir} (same config, shards and base)")
    args.run_dir.mkdir(parents=True, exist_ok=True)
    settings = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if k in ("config", "latent_config", "max_levels", "stop_below", "min_drop", "val_fraction", "probe_task")
    }
    settings["shards"] = [str(s) for s in args.shards]
    before, known = earlier_measurements(args.run_dir)
    # earlier measurements hold only for the same validation records
    if not all(before.get(k) == settings[k] for k in ("shards", "val_fraction")):
        known = {}
    done: list[LevelRecord] = []
    if args.decide is not None:  # the levels are trained elsewhere (a Slurm chain): decide after the given one
        _check_trained(args)
        for level in range(args.decide + 1):
            if _carve_level(args, level, known, done, settings):
                break
        return 0
    for level in range(args.max_levels):
        code = _train(args, level)
        if code != 0:
            return max(code, 0)
        if _carve_level(args, level, known, done, settings):
            break
    if is_main_process():
        print(f"wrote {args.run_dir / 'carve.json'}, {args.run_dir / 'carve.md'}, {args.run_dir / 'carve.png'}")
    return 0
