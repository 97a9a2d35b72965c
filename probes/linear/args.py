"""`ecgpos probe`'s command line: its flags and help, and the probe settings they resolve to."""

from __future__ import annotations

import argparse
import json

from ecgpos.config import add_set_option, load_config
from ecgpos.files import user_path
from ecgpos.probes.linear.run import ProbeConfig, check_probe_config
from ecgpos.probes.shared.args import add_bootstrap_option, fractions_from_percent

DESCRIPTION = "`ecgpos probe`: frozen-encoder linear probes (MERL splits and protocol) and `--compare`."
EPILOG = """\
--encoder is a level-0/level-1 run folder, an exported encoder folder, or random:<config.yaml>.
--data-root holds ptbxl/ and cpsc2018/ as published (CPSC2018 in any of its three forms);
--splits holds MERL's split folders (ptbxl/{super_class,sub_class,form,rhythm}/, icbeb/; chapman/ for csn).
--task custom:<dir>: a folder with train.csv, val.csv, test.csv, each with a `record` column
(WFDB record path relative to <dir>, or absolute) followed by one 0/1 column per class, optionally
preceded by a `patient_id` column (then no patient may be in two splits, and the bootstrap resamples
patients).
Features are cached in --cache-dir (default $ECGPOS_CACHE/probe-features, else
~/.cache/ecgpos/probe-features), keyed by the encoder's weights hash and architecture, dataset,
preprocessing spec and window count: a second run on the same encoder extracts nothing, except
records whose files changed since (size or mtime of their .hea/.dat/.mat differs). Windows per record
(averaged): --set windows_cpsc2018=4 (default 4), windows_ptbxl=1, windows_csn=1, windows_custom=1.
Writes OUT/results.csv (one row per encoder, task, fraction, seed; best_epoch counts from 1;
per-class test AUROC as JSON; 95 % stratified bootstrap intervals of the seed's test AUROC and of the
seed mean, resampling patients where the split files name them), OUT/summary.md (mean +- std over
seeds [interval of the mean], one table per fraction; the protocol as run; every split row counted as
not found, refused, pretraining overlap, copy across splits or probed),
OUT/summary.png (error bars: the interval of the mean), OUT/test_scores.npz (test logits, for
--compare), OUT/overlap.csv and OUT/split_copies.csv (with a pretraining index) and OUT/probe.json
(settings, counts, timings), last: an earlier run's files in OUT are deleted first, so a folder
without probe.json was interrupted while written.
Leakage guard: --pretraining-index SHARDS... (default: the shard folders the run or export records)
compares probe records with the pretraining records by content fingerprint and reports the overlap
per task; it also reports val and test records whose fingerprint matches a record of an earlier split
of the task (train; for test also val): one recording under two file names. --exclude-overlap drops
records that match pretraining records from every split, and such copies from their val or test
split. --task csn (MERL's Chapman-Shaoxing-Ningbo split, records under DATA/ecg-arrhythmia/) always
runs with the guard; --task all adds it only with --include-csn.
`ecgpos probe --compare DIR1 DIR2 ... [--out DIR]` merges result folders into one table and chart:
one encoder label probed on different tasks in different folders (e.g. one folder per task from an
array job) stays one row; a label whose (task, fraction) an earlier folder already has gets the
folder name added, e.g. `level1 [run2]`. It adds, for every pair of encoders with stored test
scores, the paired bootstrap difference of their seed means with its interval (differences.csv).
As a probe run, it deletes an earlier compare's files in --out first and writes probe.json last;
into one of its input folders it writes only differences.csv and the summary. A --out (probe or
compare) holding another command's results, or files it does not write, is refused in one line.
--reference paper adds the preprint's published full-label rows, marked (published), and our
difference to them."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos probe",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--encoder", help="run folder, export folder or random:<config.yaml>")
    p.add_argument(
        "--level",
        type=int,
        default=None,
        help="probe levels 0..LEVEL of a nested encoder (default: the top level)",
    )
    p.add_argument(
        "--task",
        default="all",
        help="ptbxl-super, ptbxl-sub, ptbxl-form, ptbxl-rhythm, cpsc2018, csn, all (default: the five without csn), "
        "custom:<dir>, or a comma-separated list",
    )
    p.add_argument("--data-root", type=user_path, help="folder holding ptbxl/ and cpsc2018/")
    p.add_argument("--splits", type=user_path, help="folder holding MERL's split folders")
    p.add_argument(
        "--fractions",
        help="label fractions in percent, e.g. 1,10,100 (default: 1,10,100): MERL's training subsets "
        "(train_test_split, random_state=42), the same for every seed",
    )
    p.add_argument("--seeds", type=int, help="seeds per probe, 0..N-1: initialisation and batch order (default 5)")
    p.add_argument("--epochs", type=int, help="epochs per probe (default 100)")
    p.add_argument(
        "--out", type=user_path, help="output folder (required to probe; --compare without it prints the table)"
    )
    p.add_argument(
        "--cache-dir",
        type=user_path,
        help="feature cache folder (default $ECGPOS_CACHE/probe-features, else ~/.cache/ecgpos/probe-features)",
    )
    p.add_argument(
        "--random-baseline", action="store_true", help="also probe a random-init encoder of the same architecture"
    )
    p.add_argument(
        "--raw-baseline",
        action="store_true",
        help="also probe raw-signal features (preprocessed, downsampled, flattened)",
    )
    p.add_argument(
        "--require-complete", action="store_true", help="error if any split record is not found under --data-root"
    )
    p.add_argument("--records100", action="store_true", help="PTB-XL at 100 Hz (records100/) instead of records500/")
    p.add_argument("--workers", type=int, help="probe training processes (default 2)")
    p.add_argument("--name", help="row label of the encoder in the tables")
    p.add_argument("--device", help="feature extraction device (default auto: cuda when available)")
    p.add_argument("--config", type=user_path, help="YAML with ProbeConfig keys")
    add_set_option(p, "a ProbeConfig key", "windows_cpsc2018=6 or --set protocol.epochs=10")
    p.add_argument("--compare", nargs="+", type=user_path, metavar="DIR", help="merge result folders, not probe")
    add_bootstrap_option(p)
    p.add_argument("--reference", metavar="NAME", help="published rows beside ours: 'paper' (or a CSV of that form)")
    p.add_argument("--include-csn", action="store_true", help="--task all also runs csn (Chapman-Shaoxing-Ningbo)")
    p.add_argument(
        "--pretraining-index",
        nargs="+",
        type=user_path,
        metavar="SHARDS",
        help="shard folders the encoder was pretrained on (default: those its run or export records)",
    )
    p.add_argument(
        "--exclude-overlap",
        action="store_true",
        help="drop probe records that match pretraining records from every split, and val or test records "
        "that copy a record of an earlier split from theirs",
    )
    return p


def probe_config(args: argparse.Namespace) -> ProbeConfig:
    overrides = list(args.overrides)
    if args.fractions is not None:
        overrides.append(f"fractions=[{','.join(fractions_from_percent(args.fractions))}]")
    for flag, key in ((args.seeds, "seeds"), (args.epochs, "protocol.epochs"), (args.workers, "workers")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    if args.device is not None:
        overrides.append(f"device={json.dumps(args.device)}")  # a YAML string as given: `,` is no syntax error
    if args.records100:
        overrides.append("ptbxl_records=records100")
    cfg = load_config(ProbeConfig, args.config, overrides)
    check_probe_config(cfg)
    return cfg
