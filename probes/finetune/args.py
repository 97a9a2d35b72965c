"""`ecgpos finetune`'s command line: its flags and help, and the settings they resolve to."""

from __future__ import annotations

import argparse
import json

from ecgpos.config import add_set_option, load_config
from ecgpos.files import user_path
from ecgpos.probes.finetune.config import FinetuneConfig, check_finetune_config
from ecgpos.probes.shared.args import add_bootstrap_option, fractions_from_percent
from ecgpos.resources import config_path

DESCRIPTION = "`ecgpos finetune`: the encoder trained on the probe tasks (full, top blocks, LoRA or LP-FT)."
EPILOG = """\
--encoder, --task, --data-root, --splits, --fractions, --seeds, the leakage guard flags and --bootstrap
mean what they mean for `ecgpos probe`: the same tasks, MERL splits and label subsets, records, seeds
and 95 % bootstrap intervals. --mode:
  full     everything trains: AdamW, layer-wise lr decay over all blocks of all levels, drop path,
           warm-up then cosine (configs/finetune.yaml; configs/README.md gives each value's source)
  top:K    the top K blocks (counted across levels from the output) and all above them, and the head;
           top:0 is a linear probe trained with crops and augmentations
  lora:R   rank-R adapters on every block's attention and MLP projections, and the head; merged into
           the weights afterwards
  lp-ft    the head alone first (tune.lp_epochs), then everything from that head (Kumar et al. 2022)
Each step trains on a random window of every record plus augmentations (augment.*); validation and
test average each record's windows as the probes do. Each seed keeps its epoch of best validation
macro-AUROC; the test split is scored once, with that epoch's weights.
Writes OUT/results.csv (the probe's columns; `encoder` is the label plus the protocol, e.g.
`level1 (finetune-full)`, `protocol` the protocol), OUT/summary.md, OUT/summary.png,
OUT/test_scores.npz, OUT/config.yaml (the resolved settings), OUT/probe.json (last), and per
classifier OUT/models/TASK/FRACTION/seedS/ (model.safetensors, model.json, val_scores.npz,
test_scores.npz). OUT holds nothing else: a folder with other files or another command's results is
refused; model folders of an earlier run that this run does not list are kept and named. `ecgpos export
--classifier OUT --fraction P` takes a model by the percentage --fractions gave (100, not 1).
`ecgpos probe --compare PROBE_OUT OUT` puts the rows beside the linear probe's, with paired bootstrap
differences.
Several GPUs or nodes: `accelerate launch -m ecgpos finetune ...` (slurm/finetune.sbatch)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos finetune",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--encoder", required=True, help="run folder, export folder, hf://ORG/NAME or random:<config.yaml>")
    p.add_argument(
        "--level",
        type=int,
        default=None,
        help="fine-tune levels 0..LEVEL of a nested encoder, as the probes read them (default: every level)",
    )
    p.add_argument("--task", default="all", help="as `ecgpos probe --task` (default: the five without csn)")
    p.add_argument("--data-root", type=user_path, help="folder holding ptbxl/ and cpsc2018/")
    p.add_argument("--splits", type=user_path, help="folder holding MERL's split folders")
    p.add_argument("--mode", default="full", help="full (default), top:K, lora:R or lp-ft")
    p.add_argument(
        "--config", default="finetune", help="YAML with FinetuneConfig keys, or a shipped name (default finetune)"
    )
    add_set_option(p, "a FinetuneConfig key", "tune.epochs=5 or --set augment.p_noise=0")
    p.add_argument("--fractions", help="label fractions in percent, e.g. 1,10,100 (default: 1,10,100)")
    p.add_argument("--seeds", type=int, help="seeds per classifier, 0..N-1 (default 5)")
    p.add_argument("--epochs", type=int, help="epochs of fine-tuning (default 10)")
    p.add_argument("--out", type=user_path, required=True, help="output folder")
    p.add_argument("--name", help="row label in the tables (default: the encoder's label and the protocol)")
    p.add_argument("--device", help="device of a single-process run (default auto: cuda when available)")
    p.add_argument("--cache-dir", type=user_path, help="the leakage guard's fingerprint cache (as `ecgpos probe`)")
    p.add_argument(
        "--require-complete", action="store_true", help="error if any split record is not found under --data-root"
    )
    p.add_argument("--records100", action="store_true", help="PTB-XL at 100 Hz (records100/) instead of records500/")
    add_bootstrap_option(p)
    p.add_argument("--include-csn", action="store_true", help="--task all also runs csn")
    p.add_argument("--pretraining-index", nargs="+", type=user_path, metavar="SHARDS", help="as `ecgpos probe`")
    p.add_argument("--exclude-overlap", action="store_true", help="as `ecgpos probe`")
    return p


def finetune_config(args: argparse.Namespace) -> FinetuneConfig:
    overrides = list(args.overrides)
    if args.fractions is not None:
        overrides.append(f"fractions=[{','.join(fractions_from_percent(args.fractions))}]")
    for flag, key in ((args.seeds, "seeds"), (args.epochs, "tune.epochs")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    if args.device is not None:
        overrides.append(f"device={json.dumps(args.device)}")
    if args.records100:
        overrides.append("ptbxl_records=records100")
    cfg = load_config(FinetuneConfig, config_path(args.config), overrides)
    check_finetune_config(cfg)
    return cfg
