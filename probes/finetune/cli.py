"""`ecgpos finetune`: classifiers trained on the probe tasks, reported in the probe's results format."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ecgpos.config import save_config, to_dict
from ecgpos.errors import EcgposError
from ecgpos.export.format import weights_hash
from ecgpos.export.probe_scores import save_scores
from ecgpos.files import atomic_write_text, make_output_folder, remove_abandoned_temporaries
from ecgpos.inference.resolve import refuse_model_folder, unfinished_note
from ecgpos.models.features import resolve_device
from ecgpos.pretrain.api import resolve_mixed_precision
from ecgpos.probes.finetune.args import build_parser, finetune_config
from ecgpos.probes.finetune.config import FinetuneConfig, Mode, parse_mode
from ecgpos.probes.finetune.model import check_mode_fits
from ecgpos.probes.finetune.out_folder import check_out_folder, earlier_models
from ecgpos.probes.finetune.outputs import model_dir, stored_model, training_key, write_model
from ecgpos.probes.finetune.records import load_task
from ecgpos.probes.finetune.report import finetune_protocol, protocol_markdown
from ecgpos.probes.finetune.train import Split, class_aurocs, train_classifier
from ecgpos.probes.shared.args import check_bootstrap, check_text_flags
from ecgpos.probes.shared.datasets import check_records
from ecgpos.probes.shared.encoder import load_probe_encoder
from ecgpos.probes.shared.guard import cache_folder, leakage_guard
from ecgpos.probes.shared.intervals import add_intervals, collect_scores
from ecgpos.probes.shared.leakage import pretraining_spec, write_overlap
from ecgpos.probes.shared.out_folder import kept_inside
from ecgpos.probes.shared.provenance import INFO_FILE, clear_outputs
from ecgpos.probes.shared.results import records_markdown, write_outputs, write_results
from ecgpos.probes.shared.task_data import fraction_rows, record_column, sort_rows, task_windows
from ecgpos.probes.shared.tasks import read_splits, resolve_tasks, task_names


def _accelerator(cfg: FinetuneConfig):
    """One Accelerator for the whole command, as pretraining sets it up: gloo on hosts without CUDA (so
    `accelerate launch` on CPUs is one job), bf16 autocast on CUDA with bf16 support."""
    from accelerate import Accelerator

    device = resolve_device(cfg.device)
    return Accelerator(mixed_precision=resolve_mixed_precision(cfg.mixed_precision), cpu=device.type == "cpu")


def _check_inputs(args, tasks) -> None:
    needs_data = any(t.dataset != "custom" for t in tasks)
    if needs_data and (args.data_root is None or args.splits is None):
        raise EcgposError("--data-root and --splits are required for the PTB-XL, CPSC2018 and CSN tasks")
    for flag in ("splits", "data_root"):
        folder = getattr(args, flag)
        if folder is not None and not folder.is_dir():
            raise EcgposError(f"--{flag.replace('_', '-')} {folder} is not a folder")
    make_output_folder(args.out, create=False)
    refuse_model_folder(args.out)
    check_out_folder(args.out, kept=kept_inside(args.out, cache_folder(args)))  # a cache inside --out is kept
    for folder in args.pretraining_index or ():
        pretraining_spec(folder)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_text_flags(args)
    check_bootstrap(args.bootstrap)
    mode = parse_mode(args.mode)
    tasks = resolve_tasks(task_names(args.task, args.include_csn))
    _check_inputs(args, tasks)
    cfg = finetune_config(args)
    for task in tasks:  # every split file and its records before the encoder loads
        check_records(
            task, read_splits(task, args.splits, record_column(task, cfg)), args.data_root, args.require_complete
        )
    enc = load_probe_encoder(args.encoder, args.level)
    check_mode_fits(mode, enc.module)
    unfinished = unfinished_note(enc.info)
    if unfinished:
        print(f"ecgpos finetune: warning: {unfinished}", file=sys.stderr)
    try:
        acc = _accelerator(cfg)
        return _finetune(args, cfg, mode, tasks, enc, acc, [unfinished] if unfinished else [])
    finally:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(True)  # a later command in this process (tests, demo) starts afresh


def _finetune(args, cfg: FinetuneConfig, mode: Mode, tasks, enc, acc, notes: list[str]) -> int:
    main_process = acc.is_main_process
    label = args.name or f"{enc.label} ({mode.protocol})"
    cache_dir = make_output_folder(cache_folder(args), "--cache-dir", create=False)
    if main_process:
        make_output_folder(args.out)
        make_output_folder(cache_dir, "--cache-dir")
        for folder in (args.out, cache_dir):
            remove_abandoned_temporaries(folder)
    log = lambda s: (print(s), notes.append(s)) if main_process else None  # noqa: E731
    overlaps, guard_section = leakage_guard(args, enc, tasks, cfg, cache_dir, log)
    exclude = {o.task: o.keys for o in overlaps} if args.exclude_overlap else {}
    copies = {o.task: o.copy_keys for o in overlaps} if args.exclude_overlap else {}
    started = time.time()
    source = {"path": args.encoder, "source": enc.source, "weights_sha256": weights_hash(enc.module)}
    rows, tests, records = [], {}, {label: {}}
    for task in tasks:
        data = load_task(
            task,
            enc.spec,
            args.data_root or Path("."),
            args.splits,
            cfg,
            log,
            exclude.get(task.name, frozenset()),
            copies.get(task.name, frozenset()),
        )
        records[label][task.name] = data.counts
        tests[(label, task.name)] = (data.keys["test"], data.y["test"], data.patients.get("test"))
        windows = task_windows(cfg, task.dataset)
        evals = {s: Split(data.x[s], data.y[s], data.keys[s]) for s in ("val", "test")}
        for fraction in cfg.fractions:
            subset = fraction_rows(data, fraction)
            train = Split(data.x["train"][subset], data.y["train"][subset], [data.keys["train"][i] for i in subset])
            for seed in range(cfg.seeds):
                rows.append(
                    _train_row(args, cfg, mode, enc, acc, label, task, fraction, seed, train, evals, windows, source)
                )
    if not main_process:
        return 0
    ours = [model_dir(args.out, t.name, f, s) for t in tasks for f in cfg.fractions for s in range(cfg.seeds)]
    kept = earlier_models(args.out, ours)
    if kept:
        more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
        log(
            f"kept {len(kept)} model folder(s) of an earlier run that this run's results.csv does not list: "
            f"{', '.join(kept[:3])}{more} (`export --classifier` can still select them)"
        )
    rows = sort_rows(rows, [label], [t.name for t in tasks])
    sets = collect_scores(rows, tests)
    add_intervals(rows, sets, args.bootstrap)
    clear_outputs(args.out)
    save_scores(sets, args.out)
    frame = write_results(rows, args.out)
    if overlaps:
        write_overlap(overlaps, args.out)
    sections = [protocol_markdown(cfg, mode, [t.name for t in tasks], enc.spec), records_markdown(records, frame)]
    sections += [guard_section] if guard_section else []
    text = write_outputs(frame, args.out, [n for n in dict.fromkeys(notes) if not n.startswith("  ")], sections)
    save_config(cfg, args.out / "config.yaml")
    info = {
        "encoder": args.encoder,
        "label": label,
        "mode": mode.protocol,
        "source": enc.source,
        "spec": enc.spec.to_dict(),
        "sources": {label: json.dumps({**source, "protocol": mode.protocol}, sort_keys=True)},
        "kinds": {label: str(enc.arch.get("kind", ""))},
        "data_root": str(args.data_root.resolve()) if args.data_root else None,
        "splits": str(args.splits.resolve()) if args.splits else None,
        "exclude_overlap": args.exclude_overlap,
        "tasks": [t.name for t in tasks],
        "task_folders": {t.name: str(Path(t.files["train"]).parent) for t in tasks if t.dataset == "custom"},
        "config": {**finetune_protocol(cfg, mode), "finetune": to_dict(cfg)},
        "records": records,
        "bootstrap": args.bootstrap,
        "pretraining_overlap": {o.task: {s: len(v) for s, v in o.matches.items()} for o in overlaps},
        **({"split_copies": {o.task: o.copy_counts() for o in overlaps}} if overlaps else {}),
        "processes": acc.num_processes,
        "mixed_precision": acc.mixed_precision,
        "seconds": {"total": round(time.time() - started, 2)},
    }
    atomic_write_text(args.out / INFO_FILE, json.dumps(info, indent=2, default=str), sync=False)
    print(text)
    print(f"wrote {args.out / 'results.csv'}, {args.out / 'summary.md'}, {args.out / 'models'}", file=sys.stderr)
    return 0


def _train_row(args, cfg, mode, enc, acc, label, task, fraction, seed, train, evals, windows, source) -> dict:
    """Train one classifier, write its model folder (main process), and return its results.csv row."""
    base = {
        "encoder": label,
        "protocol": mode.protocol,
        "task": task.name,
        "fraction": fraction,
        "seed": seed,
        "n_train": len(train.keys),
        "n_val": len(evals["val"].keys),
        "n_test": len(evals["test"].keys),
    }
    empty = [name for name, split in (("train", train), *evals.items()) if not len(split.keys)]
    if empty:
        nan = float("nan")
        note = "no " + "/".join(empty) + " rows"
        return dict(base, best_epoch=nan, val_auroc=nan, test_auroc=nan, excluded_val="", excluded_test="",
                    test_auroc_per_class="{}", note=note)  # fmt: skip
    folder = model_dir(args.out, task.name, fraction, seed)
    key = training_key(
        settings={k: v for k, v in to_dict(cfg).items() if k not in ("fractions", "seeds", "device", "compile")},
        mode=mode.protocol,
        encoder=source["weights_sha256"],
        spec=enc.spec.to_dict(),
        records=[(s.keys, np.asarray(s.labels).tolist()) for s in (train, evals["val"], evals["test"])],
        seed=seed,
    )
    stored = stored_model(folder, key)
    if stored is not None:  # an interrupted or repeated run: this seed was trained under the same settings
        print(f"{task.name} {fraction:g} seed {seed}: reusing {folder} (trained under the same settings)")
        meta, val_scores, test_scores = stored
        best_epoch, val_auroc, model = meta["selected_epoch"], meta["val_macro_auroc"], None
    else:
        trained = train_classifier(
            enc.module,
            len(task.classes),
            mode,
            {"train": train, **evals},
            cfg.tune,
            cfg.augment,
            enc.spec.fs,
            enc.spec.window,
            windows,
            seed,
            acc,
            cfg.eval_batch_size,
            f"{task.name} {fraction:g}",
            cfg.compile,
        )
        best_epoch, val_auroc, model = trained.best_epoch, trained.val_auroc, trained.model
        val_scores, test_scores = trained.val_scores, trained.test_scores
    classes = list(task.classes)
    excluded_val, _ = class_aurocs(evals["val"].labels, val_scores, classes)
    excluded_test, per_class = class_aurocs(evals["test"].labels, test_scores, classes)
    test_auroc = float(np.mean(list(per_class.values()))) if per_class else float("nan")
    absent = [c for c, k in zip(classes, train.labels.sum(0)) if k == 0]
    notes = [f"no positive training example: {' '.join(absent)}"] if absent else []
    if len(excluded_val) == len(classes):
        notes.append("no val class has positives and negatives: epoch 1 reported, no selection")
    if acc.is_main_process and model is not None:
        info = {
            "labels": classes,
            "task": task.name,
            "fraction": fraction,
            "seed": seed,
            "protocol": mode.protocol,
            "selected_epoch": best_epoch,
            "val_macro_auroc": val_auroc,
            "test_macro_auroc": test_auroc,
            "windows": windows,
            "encoder_source": source,
            "training_key": key,
            "compile": trained.compiled,
        }
        val, test = evals["val"], evals["test"]
        write_model(
            folder,
            model,
            enc.spec,
            info,
            (val.labels, val_scores, val.keys),
            (test.labels, test_scores, test.keys),
        )
    if torch.cuda.is_available():  # the next seed's fresh copy of the encoder starts from free memory
        torch.cuda.empty_cache()
    return dict(
        base,
        best_epoch=best_epoch,
        val_auroc=val_auroc,
        test_auroc=test_auroc,
        excluded_val=" ".join(excluded_val),
        excluded_test=" ".join(excluded_test),
        test_auroc_per_class=json.dumps(per_class),
        note="; ".join(notes),
        scores=test_scores,
    )
