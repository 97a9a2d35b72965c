"""`ecgpos probe`: frozen-encoder linear probes (MERL splits and protocol) and `--compare`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ecgpos.config import load_config, to_dict
from ecgpos.errors import EcgposError, Interrupted
from ecgpos.export.probe_scores import PROBE_SCORES_FILE, load_scores, save_scores
from ecgpos.files import (
    atomic_path,
    atomic_write_text,
    make_output_folder,
    remove_abandoned_temporaries,
    user_path,
)
from ecgpos.inference.resolve import unfinished_note
from probes.bootstrap import DEFAULT_RESAMPLES
from probes.datasets import check_records, task_locator
from probes.encoder import load_probe_encoder, random_twin
from probes.features import FeatureSource, encoder_source, raw_source
from probes.intervals import add_intervals, collect_scores, differences_markdown, paired_differences
from probes.leakage import load_pretraining, overlap_markdown, recorded_pretraining, task_overlap, write_overlap
from probes.provenance import (
    INFO_FILE,
    common_protocol,
    merged_records,
    protocol,
    protocol_section,
    read_info,
    shared_protocol,
    sources,
)
from probes.published import read_reference, reference_markdown
from probes.report import (
    merge_results,
    protocol_markdown,
    records_markdown,
    summary_markdown,
    write_outputs,
    write_results,
)
from probes.run import (
    ProbeConfig,
    check_probe_config,
    dataset_key,
    extraction_device,
    make_jobs,
    prepare_task,
    record_column,
    run_jobs,
    sort_rows,
)
from probes.tasks import GUARDED_TASKS, read_splits, resolve_tasks, task_names

EPILOG = """\
PATH is a Stage-0/Stage-1 run folder, an exported encoder folder, or random:<config.yaml>.
--data-root holds ptbxl/ and cpsc2018/ as published (CPSC2018 in any of its three forms);
--splits holds MERL's split folders (ptbxl/{super_class,sub_class,form,rhythm}/, icbeb/).
--task custom:<dir>: a folder with train.csv, val.csv, test.csv, each with a `record` column
(WFDB record path relative to <dir>) followed by one 0/1 column per class.
Features are cached in --cache-dir (default $ECGPOS_CACHE/probe-features, else
~/.cache/ecgpos/probe-features), keyed by the encoder's weights hash and architecture, dataset,
preprocessing spec and window count: a second run on the same encoder extracts nothing, except
records whose files changed since (size or mtime of their .hea/.dat/.mat differs). Windows per record
(averaged): --set windows_cpsc2018=4 (default 4), windows_ptbxl=1, windows_custom=1.
Writes OUT/results.csv (one row per encoder, task, fraction, seed; best_epoch counts from 1;
per-class test AUROC as JSON; 95 % stratified bootstrap intervals of the seed's test AUROC and of the
seed mean), OUT/summary.md (mean +- std over seeds [interval of the mean], one table per fraction; the protocol
as run; every split row counted as not found, refused, pretraining overlap or probed),
OUT/summary.png (error bars: the interval of the mean), OUT/test_scores.npz (test logits, for
--compare), OUT/overlap.csv (with a pretraining index) and OUT/probe.json (settings, counts, timings).
Leakage guard: --pretraining-index SHARDS... (default: the shard folders the run or export records)
compares probe records with the pretraining records by content fingerprint and reports the overlap
per task; --exclude-overlap drops overlapping records. --task csn (MERL's Chapman-Shaoxing-Ningbo
split, records under DATA/ecg-arrhythmia/) always runs with the guard; --task all adds it only with
--include-csn.
`ecgpos probe --compare DIR1 DIR2 ... [--out DIR]` merges result folders into one table and chart:
one encoder label probed on different tasks in different folders (e.g. one folder per task from an
array job) stays one row; a label whose (task, fraction) an earlier folder already has gets the
folder name added, e.g. `stage1 [run2]`. It adds, for every pair of encoders with stored test
scores, the paired bootstrap difference of their seed means with its interval (differences.csv).
--reference paper adds the seed paper's published full-label rows, marked (published), and our
difference to them."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos probe", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--encoder", help="run folder, export folder or random:<config.yaml>")
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
    p.add_argument("--cache-dir", type=user_path, help="feature cache folder")
    p.add_argument(
        "--random-baseline", action="store_true", help="also probe a random-init encoder of the same architecture"
    )
    p.add_argument(
        "--raw-baseline",
        action="store_true",
        help="also probe raw-signal features (preprocessed, downsampled, flattened)",
    )
    p.add_argument("--require-complete", action="store_true", help="error if any split record is missing")
    p.add_argument("--records100", action="store_true", help="PTB-XL at 100 Hz (records100/) instead of records500/")
    p.add_argument("--workers", type=int, help="probe training processes (default 2)")
    p.add_argument("--name", help="row label of the encoder in the tables")
    p.add_argument("--device", help="feature extraction device (default auto: cuda when available)")
    p.add_argument("--config", type=user_path, help="YAML with ProbeConfig keys")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a ProbeConfig key, e.g. windows_cpsc2018=6 or protocol.epochs=10",
    )
    p.add_argument("--compare", nargs="+", type=user_path, metavar="DIR", help="merge result folders, not probe")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_RESAMPLES,
        metavar="N",
        help=f"stratified bootstrap resamples of the 95 %% intervals (default {DEFAULT_RESAMPLES}; 0: off)",
    )
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
        help="drop probe records that match pretraining records from every split",
    )
    return p


def _fractions(text: str) -> list[str]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise EcgposError(f"--fractions expects percentages like 1,10,100, got {text!r}") from None
    if not values or any(not 0 < v <= 100 for v in values):
        raise EcgposError(f"--fractions must be percentages in (0, 100], got {text!r}")
    return [f"{v / 100:g}" for v in values]


def _config(args: argparse.Namespace) -> ProbeConfig:
    overrides = list(args.overrides)
    if args.fractions:
        overrides.append(f"fractions=[{','.join(_fractions(args.fractions))}]")
    for flag, key in ((args.seeds, "seeds"), (args.epochs, "protocol.epochs"), (args.workers, "workers")):
        if flag is not None:
            overrides.append(f"{key}={flag}")
    if args.device:
        overrides.append(f"device={args.device}")
    if args.records100:
        overrides.append("ptbxl_records=records100")
    cfg = load_config(ProbeConfig, args.config, overrides)
    check_probe_config(cfg)
    return cfg


def _reference_section(args: argparse.Namespace, frame) -> list[str]:
    if not args.reference:
        return []
    table, source = read_reference(args.reference)
    return [reference_markdown(frame, table, source)]


def _compare(args: argparse.Namespace) -> int:
    if args.bootstrap < 0:
        raise EcgposError("--bootstrap must be 0 (off) or a number of resamples")
    notes: list[str] = []
    renamed: dict[Path, dict[str, str]] = {}
    infos = {folder: read_info(folder) for folder in dict.fromkeys(Path(f).resolve() for f in args.compare)}
    frame = merge_results(list(infos), notes, renamed, {f: sources(i) for f, i in infos.items()})
    sets = []
    for folder, names in renamed.items():
        found = load_scores(folder, names)
        if not found:  # its encoders would silently be missing from the paired differences
            notes.append(f"{folder}: no {PROBE_SCORES_FILE}, so its rows are in no paired difference")
        sets += found
    diffs = paired_differences(sets, list(dict.fromkeys(frame["encoder"])), args.bootstrap)
    records = merged_records(infos, renamed)
    sections = [s for s in [protocol_section(infos), shared_protocol(infos)] if s]
    sections += [records_markdown(records, frame)] if records else []
    sections += [differences_markdown(diffs)] if len(set(frame["encoder"])) > 1 else []
    sections += _reference_section(args, frame)
    if args.out is None:
        print(summary_markdown(frame, notes, sections))
        return 0
    make_output_folder(args.out)
    remove_abandoned_temporaries(args.out)  # what a killed run on this host left
    if args.out.resolve() not in {d.resolve() for d in args.compare}:  # never overwrite an input's rows
        write_results(frame.to_dict("records"), args.out)
        if sets:
            save_scores(sets, args.out)
    with atomic_path(args.out / "differences.csv") as tmp:
        diffs.to_csv(tmp, index=False)
    if args.out.resolve() not in infos:  # what the inputs had in common, for a later --compare
        labels = {renamed[f].get(enc, enc): key for f, i in infos.items() for enc, key in sources(i).items()}
        info = {
            "compared": [str(f) for f in infos],
            "protocol": common_protocol({f: protocol(i) for f, i in infos.items() if i is not None}),
            "sources": labels,
            "records": records,
        }
        atomic_write_text(args.out / INFO_FILE, json.dumps(info, indent=2), sync=False)
    print(write_outputs(frame, args.out, notes, sections))
    return 0


def _guard(args: argparse.Namespace, enc, tasks, cfg: ProbeConfig, cache_dir: Path, log) -> tuple[list, str]:
    """The leakage guard: (overlaps per task, summary section); nothing when there is no pretraining index."""
    folders = args.pretraining_index or recorded_pretraining(enc.source, enc.info)
    guarded = [t.name for t in tasks if t.name in GUARDED_TASKS]
    if not folders:
        if guarded and not args.encoder.startswith("random:"):
            raise EcgposError(
                f"--task {guarded[0]} draws its records from ecg-arrhythmia, which the encoder may "
                "have been pretrained on: give --pretraining-index SHARDS (the encoder records no "
                "pretraining shards)"
            )
        if args.exclude_overlap:
            raise EcgposError("--exclude-overlap needs --pretraining-index (the encoder records no pretraining shards)")
        return [], ""
    index = load_pretraining(folders, log)
    overlaps = []
    for task in tasks:
        column = record_column(task, cfg)
        splits = {s: t.records for s, t in read_splits(task, args.splits, column).items()}
        overlap = task_overlap(
            task.name,
            splits,
            task_locator(task, args.data_root or Path(".")),
            index,
            cache_dir,
            dataset_key(task, args.data_root or Path("."), cfg),
        )
        overlaps.append(overlap)
        print(f"leakage guard: {overlap.line(args.exclude_overlap)}")
    return overlaps, overlap_markdown(index, overlaps, args.exclude_overlap)


def _cache_dir(args: argparse.Namespace) -> Path:
    default = Path(os.environ.get("ECGPOS_CACHE", Path.home() / ".cache" / "ecgpos")) / "probe-features"
    return args.cache_dir or default


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.compare:
        return _compare(args)
    try:
        return _probe(args)
    except KeyboardInterrupt:
        raise Interrupted(
            f"the features extracted so far are cached in {_cache_dir(args)}; the same command reuses them"
        ) from None


def _probe(args: argparse.Namespace) -> int:
    for flag in ("encoder", "out"):
        if getattr(args, flag) is None:
            raise EcgposError(f"--{flag} is required (or use --compare DIR ...)")
    if args.bootstrap < 0:
        raise EcgposError("--bootstrap must be 0 (off) or a number of resamples")
    tasks = resolve_tasks(task_names(args.task, args.include_csn))
    if args.reference:  # a wrong name is one line now, not after every probe has trained
        read_reference(args.reference)
    needs_data = any(t.dataset != "custom" for t in tasks)
    if needs_data and (args.data_root is None or args.splits is None):
        raise EcgposError("--data-root and --splits are required for the PTB-XL, CPSC2018 and CSN tasks")
    if args.splits is not None and not args.splits.is_dir():
        raise EcgposError(f"--splits {args.splits} is not a folder")
    if args.data_root is not None and not args.data_root.is_dir():
        raise EcgposError(f"--data-root {args.data_root} is not a folder")
    make_output_folder(args.out, create=False)  # a file as --out: one line before any work
    cfg = _config(args)
    cache_dir = make_output_folder(_cache_dir(args), "--cache-dir", create=False)  # not after the extraction
    # check every split file and its records before loading the encoder
    for task in tasks:
        check_records(
            task, read_splits(task, args.splits, record_column(task, cfg)), args.data_root, args.require_complete
        )

    enc = load_probe_encoder(args.encoder)
    unfinished = unfinished_note(enc.info)
    if unfinished:
        print(f"ecgpos probe: warning: {unfinished}", file=sys.stderr)
    label = args.name or enc.label
    device = extraction_device(cfg)
    sources: list[FeatureSource] = [
        encoder_source(enc.module, enc.spec, label, cfg.extract_batch_size, device, enc.arch)
    ]
    if args.random_baseline and args.encoder.startswith("random:"):
        print("--random-baseline: the encoder is already random-init; no second row")
    elif args.random_baseline:
        twin = random_twin(enc)
        sources.append(encoder_source(twin.module, twin.spec, twin.label, cfg.extract_batch_size, device, twin.arch))
    if args.raw_baseline:
        sources.append(raw_source(enc.spec, cfg.raw_fs))
    labels = [src.name for src in sources]
    if len(set(labels)) < len(labels):  # one label: two sources' rows would be merged and averaged
        raise EcgposError(f"the encoder's row label {label!r} is also a baseline's: give --name another")
    make_output_folder(args.out)
    make_output_folder(cache_dir, "--cache-dir")
    for folder in (args.out, cache_dir):  # what a killed run on this host left
        remove_abandoned_temporaries(folder)
    started = time.time()
    jobs, notes, extraction, tests = [], [unfinished] if unfinished else [], {}, {}
    records: dict[str, dict[str, dict[str, dict[str, int]]]] = {}  # source -> task -> split -> counts
    log = lambda s: (print(s), notes.append(s))  # noqa: E731
    overlaps, guard_section = _guard(args, enc, tasks, cfg, cache_dir, log)
    exclude = {o.task: o.keys for o in overlaps} if args.exclude_overlap else {}
    for source in sources:
        print(f"features: {source.name}")
        for task in tasks:
            data, stats = prepare_task(
                task,
                source,
                args.data_root or Path("."),
                args.splits,
                cache_dir,
                cfg,
                args.require_complete,
                log=log,
                exclude=exclude.get(task.name, frozenset()),
            )
            extraction[f"{source.name} / {task.name}"] = {
                "extracted": stats.extracted,
                "cached": stats.cached,
                "changed": stats.changed,
                "failed": stats.failed,
            }
            tests[(source.name, task.name)] = (data.keys.get("test", []), data.y["test"])
            records.setdefault(source.name, {})[task.name] = data.counts
            jobs += make_jobs(source.name, data, cfg)
    print(f"training {len(jobs)} probes x {cfg.seeds} seeds x {cfg.protocol.epochs} epochs ...")
    t_train = time.time()
    rows = sort_rows(run_jobs(jobs, cfg.workers), [src.name for src in sources], [t.name for t in tasks])
    t_boot = time.time()
    sets = collect_scores(rows, tests)
    add_intervals(rows, sets, args.bootstrap)
    save_scores(sets, args.out)
    boot_seconds = time.time() - t_boot
    frame = write_results(rows, args.out)
    if overlaps:
        write_overlap(overlaps, args.out)
    sections = [
        protocol_markdown(cfg, [t.name for t in tasks], enc.spec.window, enc.spec.fs),
        records_markdown(records, frame),
    ]
    sections += [guard_section] if guard_section else []
    sections += _reference_section(args, frame)
    text = write_outputs(
        frame, args.out, notes=[n for n in dict.fromkeys(notes) if not n.startswith("  ")], sections=sections
    )
    info = {
        "encoder": args.encoder,
        "label": label,
        "source": enc.source,
        "spec": enc.spec.to_dict(),
        "sources": {src.name: json.dumps(src.key, sort_keys=True) for src in sources},
        "data_root": str(args.data_root.resolve()) if args.data_root else None,
        "splits": str(args.splits.resolve()) if args.splits else None,
        "exclude_overlap": args.exclude_overlap,
        "tasks": [t.name for t in tasks],
        "task_folders": {t.name: str(Path(t.files["train"]).parent) for t in tasks if t.dataset == "custom"},
        "config": to_dict(cfg),
        "cache_dir": str(cache_dir),
        "extraction": extraction,
        "records": records,
        "bootstrap": args.bootstrap,
        "pretraining_overlap": {o.task: {s: len(v) for s, v in o.matches.items()} for o in overlaps},
        "seconds": {
            "total": round(time.time() - started, 2),
            "training": round(t_boot - t_train, 2),
            "bootstrap": round(boot_seconds, 2),
        },
    }
    atomic_write_text(args.out / INFO_FILE, json.dumps(info, indent=2, default=str), sync=False)
    print(text)
    print(f"wrote {args.out / 'results.csv'}, {args.out / 'summary.md'}, {args.out / 'summary.png'}", file=sys.stderr)
    return 0
