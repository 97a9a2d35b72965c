"""`ecgpos probe`: frozen-encoder linear probes (MERL splits and protocol) and `--compare`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Collection
from pathlib import Path

from ecgpos.config import to_dict
from ecgpos.errors import EcgposError, Interrupted
from ecgpos.export.probe_scores import PROBE_SCORES_FILE, load_scores, save_scores
from ecgpos.files import (
    atomic_path,
    atomic_write_text,
    make_output_folder,
    remove_abandoned_temporaries,
)
from ecgpos.inference.resolve import refuse_model_folder, unfinished_note
from probes.datasets import check_records, task_locator
from probes.encoder import load_probe_encoder, random_twin
from probes.features import FeatureSource, cached_note, encoder_source, raw_source
from probes.intervals import add_intervals, collect_scores, differences_markdown, paired_differences
from probes.leakage import (
    SPLIT_COPIES,
    load_pretraining,
    overlap_markdown,
    pretraining_spec,
    recorded_pretraining,
    task_overlap,
    write_overlap,
)
from probes.probe_args import build_parser, check_bootstrap, check_text_flags, probe_config
from probes.provenance import (
    INFO_FILE,
    common_protocol,
    guard_markdown,
    merged_guard,
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
    dataset_key,
    extraction_device,
    make_jobs,
    prepare_task,
    record_column,
    run_jobs,
    sort_rows,
)
from probes.tasks import GUARDED_TASKS, read_splits, resolve_tasks, task_names


def _reference_section(args: argparse.Namespace, frame, kinds: dict[str, str]) -> list[str]:
    if not args.reference:
        return []
    table, source = read_reference(args.reference)
    return [reference_markdown(frame, table, source, kinds)]


def _compare(args: argparse.Namespace) -> int:
    check_bootstrap(args.bootstrap)
    notes: list[str] = []
    renamed: dict[Path, dict[str, str]] = {}
    infos = {folder: read_info(folder) for folder in dict.fromkeys(Path(f).resolve() for f in args.compare)}
    frame = merge_results(list(infos), notes, renamed, {f: sources(i) for f, i in infos.items()})
    kinds = {
        renamed.get(f, {}).get(enc, enc): kind
        for f, i in infos.items()
        for enc, kind in (i or {}).get("kinds", {}).items()
    }
    sets = []
    for folder, names in renamed.items():
        found = load_scores(folder, names)
        if not found:  # its encoders would silently be missing from the paired differences
            notes.append(f"{folder}: no {PROBE_SCORES_FILE}, so its rows are in no paired difference")
        sets += found
    diffs = paired_differences(sets, list(dict.fromkeys(frame["encoder"])), args.bootstrap)
    records = merged_records(infos, renamed)
    guard = merged_guard(infos)
    sections = [s for s in [protocol_section(infos), shared_protocol(infos)] if s]
    sections += [records_markdown(records, frame)] if records else []
    sections += [guard_markdown(guard)] if guard else []
    sections += [differences_markdown(diffs, args.bootstrap)] if len(set(frame["encoder"])) > 1 else []
    sections += _reference_section(args, frame, kinds)
    if args.out is None:
        print(summary_markdown(frame, notes, sections))
        return 0
    refuse_model_folder(args.out)
    make_output_folder(args.out)
    remove_abandoned_temporaries(args.out)  # what a killed run on this host left
    into_input = args.out.resolve() in infos
    _clear_outputs(args.out, keep=INPUT_FILES if into_input else ())
    if not into_input:  # never overwrite an input's rows
        write_results(frame.to_dict("records"), args.out)
        if sets:
            save_scores(sets, args.out)
    with atomic_path(args.out / DIFFERENCES_FILE) as tmp:
        diffs.to_csv(tmp, index=False)
    text = write_outputs(frame, args.out, notes, sections)
    if not into_input:  # what the inputs had in common, for a later --compare; last, as a probe's
        labels = {renamed[f].get(enc, enc): key for f, i in infos.items() for enc, key in sources(i).items()}
        info = {
            "compared": [str(f) for f in infos],
            "protocol": common_protocol({f: protocol(i) for f, i in infos.items() if i is not None}),
            "sources": labels,
            "kinds": kinds,
            "records": records,
            "guard": guard,
        }
        atomic_write_text(args.out / INFO_FILE, json.dumps(info, indent=2), sync=False)
    print(text)
    return 0


GUARD_NOT_RUN = (
    "the encoder records no pretraining shards and no --pretraining-index was given, so neither overlap with "
    "pretraining records nor one recording in two splits under two file names was checked"
)


def _guard(args: argparse.Namespace, enc, tasks, cfg: ProbeConfig, cache_dir: Path, log) -> tuple[list, str]:
    """The leakage guard: (overlaps per task, summary section); no overlaps, and a section saying so, when
    there is no pretraining index."""
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
        print(f"leakage guard: not run ({GUARD_NOT_RUN})")
        return [], f"## Pretraining overlap (leakage guard)\n\nNot run: {GUARD_NOT_RUN}."
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
        print(f"leakage guard: {overlap.copy_line(args.exclude_overlap)}")
    return overlaps, overlap_markdown(index, overlaps, args.exclude_overlap)


DIFFERENCES_FILE = "differences.csv"
RUN_FILES = (
    INFO_FILE,
    "summary.md",
    "summary.png",
    "results.csv",
    PROBE_SCORES_FILE,
    "overlap.csv",
    SPLIT_COPIES,
    DIFFERENCES_FILE,
)
"""What a probe run or a --compare writes into --out (a probe no differences.csv, a compare no
overlap.csv or split_copies.csv); probe.json, written last, marks a whole folder."""
INPUT_FILES = frozenset(RUN_FILES) - {"summary.md", "summary.png", DIFFERENCES_FILE}
"""The files of a --compare input folder that a --compare into that folder keeps (it writes only the rest)."""


def _clear_outputs(out: Path, keep: Collection[str] = ()) -> None:
    """Delete an earlier run's files in `out` (all of RUN_FILES but `keep`), probe.json first, before this
    run writes its own: an interrupted write then leaves some of this run's files, never beside an earlier
    run's summary, results or probe.json that readers (`--compare`, `export --probe-results`) would take
    for this run's."""
    for name in RUN_FILES:
        if name not in keep:
            (out / name).unlink(missing_ok=True)


def _cache_dir(args: argparse.Namespace) -> Path:
    default = Path(os.environ.get("ECGPOS_CACHE", Path.home() / ".cache" / "ecgpos")) / "probe-features"
    return args.cache_dir or default


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_text_flags(args)
    if args.compare:
        return _compare(args)
    cached: list[Path] = []  # the cache folder, once it holds features of this run's records
    try:
        return _probe(args, cached)
    except Interrupted:
        raise  # an extraction saying what it saved
    except KeyboardInterrupt:
        if cached:
            raise Interrupted(cached_note(cached[0])) from None
        raise  # nothing kept: the default line says so


def _probe(args: argparse.Namespace, cached: list[Path]) -> int:
    for flag in ("encoder", "out"):
        if getattr(args, flag) is None:
            raise EcgposError(f"--{flag} is required (or use --compare DIR ...)")
    check_bootstrap(args.bootstrap)
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
    refuse_model_folder(args.out)
    for folder in args.pretraining_index or ():  # not after the output folders are made
        pretraining_spec(folder)
    cfg = probe_config(args)
    cache_dir = make_output_folder(_cache_dir(args), "--cache-dir", create=False)  # not after the extraction
    # check every split file and its records before loading the encoder
    for task in tasks:
        check_records(
            task, read_splits(task, args.splits, record_column(task, cfg)), args.data_root, args.require_complete
        )

    enc = load_probe_encoder(args.encoder, getattr(args, "level", None))
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
    copies = {o.task: o.copy_keys for o in overlaps} if args.exclude_overlap else {}
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
                copies=copies.get(task.name, frozenset()),
            )
            if stats.extracted or stats.cached:
                cached[:] = [cache_dir]
            extraction[f"{source.name} / {task.name}"] = {
                "extracted": stats.extracted,
                "cached": stats.cached,
                "changed": stats.changed,
                "failed": stats.failed,
            }
            tests[(source.name, task.name)] = (data.keys.get("test", []), data.y["test"], data.patients.get("test"))
            records.setdefault(source.name, {})[task.name] = data.counts
            jobs += make_jobs(source.name, data, cfg)
    print(f"training {len(jobs)} probes x {cfg.seeds} seeds x {cfg.protocol.epochs} epochs ...")
    t_train = time.time()
    rows = sort_rows(run_jobs(jobs, cfg.workers), [src.name for src in sources], [t.name for t in tasks])
    t_boot = time.time()
    sets = collect_scores(rows, tests)
    add_intervals(rows, sets, args.bootstrap)
    _clear_outputs(args.out)
    save_scores(sets, args.out)
    boot_seconds = time.time() - t_boot
    frame = write_results(rows, args.out)
    if overlaps:
        write_overlap(overlaps, args.out)
    sections = [
        protocol_markdown(cfg, [t.name for t in tasks], enc.spec.window, enc.spec.fs, args.raw_baseline),
        records_markdown(records, frame),
    ]
    sections += [guard_section] if guard_section else []
    # each row's architecture picks its published row when its label names none (a Stage-0 run in runs/mine)
    kinds = {src.name: str(src.arch["kind"]) for src in sources if src.arch and "kind" in src.arch}
    sections += _reference_section(args, frame, kinds)
    text = write_outputs(
        frame, args.out, notes=[n for n in dict.fromkeys(notes) if not n.startswith("  ")], sections=sections
    )
    info = {
        "encoder": args.encoder,
        "label": label,
        "source": enc.source,
        "spec": enc.spec.to_dict(),
        "sources": {src.name: json.dumps(src.key, sort_keys=True) for src in sources},
        "kinds": kinds,
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
        # val or test records whose recording an earlier split holds, per split pair (only where the guard ran)
        **({"split_copies": {o.task: o.copy_counts() for o in overlaps}} if overlaps else {}),
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
