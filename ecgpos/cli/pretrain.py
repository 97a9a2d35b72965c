"""`ecgpos pretrain`: level 0 (masked ECG transformer) or level N >= 1 (latent MAE on the frozen
levels 0..N-1) with Accelerate.

    ecgpos pretrain --level N --config FILE --shards DIR --run-dir DIR
                    [--base RUN_OR_EXPORT_DIR] [--set key=value ...] [--resume auto]
    ecgpos pretrain --level N --config FILE [--set key=value ...] --check-config
    (hidden aliases: --stage N is --level N; --stage0 DIR is --base DIR for --level 1)
    python -m ecgpos.pretrain ...            (one process)
    accelerate launch [--num_processes N] -m ecgpos.pretrain ...   (any number of processes / nodes)

Every input is validated first (ecgpos.pretrain.plan); each problem is one line on stderr and
exit code 2. `--check-config` only resolves the config with its overrides (the same checks a run
makes first: unknown keys, wrong types, impossible values), prints it as YAML and exits, without
shards or a run folder: slurm/pipeline.sh uses it to refuse a misspelt override before submitting.

Exit codes: 0 finished, or stopped cleanly by SIGUSR1/SIGTERM after writing a checkpoint
(run_info.json then says finished: false; rerun with --resume auto to continue); 130 stopped the
same way by Ctrl-C (a second Ctrl-C stops at once, keeping the checkpoints already written); 1 training
stopped on a non-finite loss (the last good checkpoint is kept); 2 bad input; 143 a SIGTERM before
training started (one `terminated:` line; nothing to resume, run the same command again).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ecgpos.config import add_set_option
from ecgpos.errors import Interrupted
from ecgpos.export.hub import model_ref
from ecgpos.files import user_path
from ecgpos.pretrain.plan import prepare
from ecgpos.runs.run_folder import newest_checkpoint


def build_parser(check_only: bool = False) -> argparse.ArgumentParser:
    """The options; with `check_only` (--check-config given) --shards and --run-dir are not required."""
    parser = argparse.ArgumentParser(
        prog="ecgpos pretrain",
        description="Pretrain level 0 (ST-MEM-style masked ECG autoencoder) or level N >= 1 (masked latent "
        "autoencoder on the frozen tokens of levels 0..N-1, the --base). Launch with `accelerate launch -m "
        "ecgpos.pretrain` for several processes.",
        epilog="signals: SIGUSR1, SIGTERM or Ctrl-C makes every process write a checkpoint at the next step "
        "boundary and exit (run_info.json: finished false, stopped ...); rerun the same command with --resume "
        "auto to continue (e.g. after a Slurm requeue); a second Ctrl-C stops at once. exit codes: 0 finished "
        "or stopped cleanly by SIGUSR1/SIGTERM; 130 stopped by Ctrl-C; "
        "1 non-finite loss (stopped before the bad update; the last good checkpoint is kept); 2 bad input.",
    )
    levels = parser.add_mutually_exclusive_group(required=True)
    levels.add_argument(
        "--level",
        type=level_number,
        metavar="N",
        help="level to train: 0 on the shards; N >= 1 on the frozen --base encoder of levels 0..N-1",
    )
    levels.add_argument("--stage", dest="level", type=level_number, help=argparse.SUPPRESS)  # --level's alias
    parser.add_argument(
        "--config",
        required=True,
        help="run config YAML, or a shipped config by name: level0, level1, stmem12, tiny/level0, "
        "tiny/level1 (see configs/README.md); a latent config (level1) serves every level N >= 1",
    )
    parser.add_argument(
        "--shards",
        type=user_path,
        nargs="+",
        required=not check_only,
        metavar="DIR",
        help="shard folder(s) written by `ecgpos preprocess`; several folders are pooled (e.g. Ningbo + CODE-15) "
        "and must not share record ids",
    )
    parser.add_argument(
        "--run-dir", type=user_path, required=not check_only, help="run folder (created; not a shard or export folder)"
    )
    parser.add_argument(
        "--base",
        type=model_ref,
        help="level N >= 1: the frozen levels 0..N-1, a finished level-(N-1) run folder, an export of N levels "
        "or hf://ORG/NAME",
    )
    parser.add_argument("--stage0", type=model_ref, help=argparse.SUPPRESS)  # --base's alias at --level 1
    add_set_option(parser, "a config key", "optim.steps=200")
    parser.add_argument(
        "--resume",
        choices=("auto",),
        help="auto: continue from the newest complete checkpoint of --run-dir, on the same training records "
        "in the same order (start fresh if there is none)",
    )
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="only resolve --config with --level and the --set overrides, print it as YAML and exit "
        "(exit 2 naming an unknown key or a bad value); --shards and --run-dir are not needed",
    )
    return parser


def level_number(text: str) -> int:
    """argparse type of --level: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid level {text!r}: an integer >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid level {value}: an integer >= 0")
    return value


def _check_only(argv: Sequence[str] | None) -> bool:
    """Whether --check-config (or an unambiguous abbreviation of it) is among the arguments."""
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--check-config", action="store_true")
    return first.parse_known_args(argv)[0].check_config


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code (EcgposError propagates to ecgpos.cli: exit 2)."""
    args = build_parser(_check_only(argv)).parse_args(argv)
    if args.check_config:
        import yaml

        from ecgpos.config import to_dict
        from ecgpos.runs.run_config import load_run_config

        cfg = load_run_config(args.config, args.overrides, level=args.level)
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    plan = prepare(args)
    from ecgpos.pretrain.trainer import Trainer

    try:
        return Trainer(plan).run()
    except KeyboardInterrupt:  # Ctrl-C twice (once stops at the next step with a checkpoint)
        last = newest_checkpoint(plan.run_dir)
        kept = f"newest checkpoint {last}" if last else "no checkpoint yet"
        raise Interrupted(f"{kept}; continue with the same command and --resume auto") from None
