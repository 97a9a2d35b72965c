"""`ecgpos probe`: frozen-encoder linear probes (MERL splits and protocol) and `--compare`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
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
from ecgpos.probes.linear.args import build_parser, probe_config
from ecgpos.probes.linear.features import FeatureSource, cached_note, encoder_source, raw_source
from ecgpos.probes.linear.outcome import ProbeRun, probe_run
from ecgpos.probes.linear.report import protocol_markdown, shared_protocol
from ecgpos.probes.linear.run import extraction_device, make_jobs, prepare_task, run_jobs
from ecgpos.probes.shared.args import check_bootstrap, check_text_flags
from ecgpos.probes.shared.datasets import check_records
from ecgpos.probes.shared.encoder import load_probe_encoder, random_twin
from ecgpos.probes.shared.guard import cache_folder, leakage_guard
from ecgpos.probes.shared.intervals import add_intervals, collect_scores, differences_markdown, paired_differences
from ecgpos.probes.shared.leakage import pretraining_spec, write_overlap
from ecgpos.probes.shared.out_folder import check_out_folder, kept_inside
from ecgpos.probes.shared.provenance import (
    DIFFERENCES_FILE,
    INFO_FILE,
    INPUT_FILES,
    RUN_FILES,
    clear_outputs,
    common_protocol,
    guard_markdown,
    merged_guard,
    merged_records,
    protocol,
    protocol_section,
    read_info,
    sources,
)
from ecgpos.probes.shared.published import read_reference, reference_markdown
from ecgpos.probes.shared.results import merge_results, records_markdown, summary_markdown, write_outputs, write_results
from ecgpos.probes.shared.task_data import record_column, sort_rows
from ecgpos.probes.shared.tasks import read_splits, resolve_tasks, task_names


def _reference_section(args: argparse.Namespace, frame, kinds: dict[str, str]) -> list[str]:
    if not args.reference:
        return []
    table, source = read_reference(args.reference)
    return [reference_markdown(frame, table, source, kinds)]


def _compare(args: argparse.Namespace) -> int:
    check_bootstrap(args.bootstrap)
    inputs = list(dict.fromkeys(Path(f).resolve() for f in args.compare))
    into_input = args.out is not None and args.out.resolve() in inputs
    if args.out is not None:
        make_output_folder(args.out, create=False)
        refuse_model_folder(args.out)
        if not into_input:  # into an input it replaces only the summary and differences.csv, as documented
            check_out_folder(args.out, "probe --compare", RUN_FILES)
    notes: list[str] = []
    renamed: dict[Path, dict[str, str]] = {}
    infos = {folder: read_info(folder) for folder in inputs}
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
    make_output_folder(args.out)
    remove_abandoned_temporaries(args.out)  # what a killed run on this host left
    clear_outputs(args.out, keep=INPUT_FILES if into_input else ())
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


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_text_flags(args)
    if args.compare:
        return _compare(args)
    _probing(args)
    return 0


def probe(argv: Sequence[str]) -> ProbeRun:
    """`ecgpos probe ARGV` (not --compare) called from Python: the same checks, outputs and errors
    (EcgposError), and the run's scores returned. The options stay command-line words: carve and the
    demo pass a user's own probe options (`carve --probe-args`) through unchanged."""
    args = build_parser().parse_args(list(argv))
    check_text_flags(args)
    if args.compare:
        raise EcgposError("probe() trains probes; merging folders is `ecgpos probe --compare`")
    return _probing(args)


def _probing(args: argparse.Namespace) -> ProbeRun:
    cached: list[Path] = []  # the cache folder, once it holds features of this run's records
    try:
        return _probe(args, cached)
    except Interrupted:
        raise  # an extraction saying what it saved
    except KeyboardInterrupt:
        if cached:
            raise Interrupted(cached_note(cached[0])) from None
        raise  # nothing kept: the default line says so


def _probe(args: argparse.Namespace, cached: list[Path]) -> ProbeRun:
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
    # an earlier probe's files are replaced (clear_outputs); a cache folder inside --out is kept
    check_out_folder(args.out, "probe", RUN_FILES, kept=kept_inside(args.out, cache_folder(args)))
    for folder in args.pretraining_index or ():  # not after the output folders are made
        pretraining_spec(folder)
    cfg = probe_config(args)
    cache_dir = make_output_folder(cache_folder(args), "--cache-dir", create=False)  # not after the extraction
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
    overlaps, guard_section = leakage_guard(args, enc, tasks, cfg, cache_dir, log)
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
    clear_outputs(args.out)
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
    # each row's architecture picks its published row when its label names none (a level-0 run in runs/mine)
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
    return probe_run(args.out, frame.to_dict("records"))
