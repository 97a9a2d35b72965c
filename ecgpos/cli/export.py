"""`ecgpos export --run-dir RUN --out DIR [--level L] [--onnx] [--with-decoders] [--probe-results DIR]`: a frozen
encoder folder.
`ecgpos export --classifier FINETUNE_OUT [--task T] [--fraction F] [--seed S] --out DIR [--onnx]`: a classifier.

A classifier export takes one model of an `ecgpos finetune` output folder (without --seed, the seed
with the best validation macro-AUROC), chooses each label's decision threshold on its validation scores
(max F1), and states its test AUROC per label with a bootstrap interval; `ecgpos predict` applies it.

DIR holds model.safetensors, config.json, the model card README.md (with the probe summary of
--probe-results), test_vectors.npz, and encoder.onnx or decoders.safetensors when asked for. A run
that has not finished is exported from its newest checkpoint, with a warning. `--level L` cuts the
nest: the export holds levels 0..L only (with their decoders), verified like any other.
Everything is written into a temporary sibling folder, reloaded from disk and checked against the
training checkpoint's features (and, with --onnx, against onnxruntime) before it is moved to DIR,
so a failed export never leaves a half-written folder that looks valid. An earlier export at DIR
is replaced (re-running a pipeline works): renamed aside, then deleted, so a kill at any moment
leaves at DIR the old export, the new one or nothing. The hidden sibling folders a killed export
leaves (.DIR.partial-*, .DIR.old-*) are removed by the next export to DIR; any other non-empty DIR
is refused.
"""

from __future__ import annotations

import argparse
import glob
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from ecgpos.errors import EcgposError
from ecgpos.export.card import check_probed_encoder, probe_section
from ecgpos.export.classifier import CLASSIFIER_ONNX_FILE
from ecgpos.export.decoders import DECODERS_FILE
from ecgpos.export.format import (
    CARD_FILE,
    CLASSIFIER_FORMAT,
    CONFIG_FILE,
    FORMAT,
    ONNX_FILE,
    VECTORS_FILE,
    WEIGHTS_FILE,
    weights_hash,
)
from ecgpos.export.hub_card import DEFAULT_LICENSE
from ecgpos.export.load import read_export_config
from ecgpos.export.writer import check_reload, write_export
from ecgpos.files import make_output_folder, make_public, recover_replaced, replace_folder, user_path
from ecgpos.inference.resolve import artifact_above, load_run_encoder, unfinished_note
from ecgpos.inference.scoring import load_recon_models
from ecgpos.models.factory import depth_of
from ecgpos.models.nested import level_names, parse_level_name, recorded_level
from ecgpos.runs.run_folder import is_run_dir, read_run_info, run_chain, training_summary

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecgpos export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run-dir", type=user_path, help="pretraining run folder (any level)")
    source.add_argument("--classifier", type=user_path, help="`ecgpos finetune` output folder: export a classifier")
    parser.add_argument(
        "--level", type=int, default=None, help="--run-dir: export levels 0..LEVEL only (default: every level)"
    )
    parser.add_argument("--task", default=None, help="--classifier: the task, when the folder holds several")
    parser.add_argument(
        "--fraction",
        default=None,
        help="--classifier: the label fraction in percent, as `finetune --fractions` gives it (1, 10, 100), "
        "when the folder holds several",
    )
    parser.add_argument("--seed", type=int, default=None, help="--classifier: the seed (default: best on validation)")
    parser.add_argument(
        "--license",
        default=DEFAULT_LICENSE,
        help="licence id for the model card's Hub metadata, e.g. cc-by-4.0 (default other: the terms of the "
        "training data decide)",
    )
    parser.add_argument(
        "--out", required=True, type=user_path, help="export folder to create (an earlier export there is replaced)"
    )
    parser.add_argument("--onnx", action="store_true", help="also write encoder.onnx (needs ecgpos[export])")
    parser.add_argument(
        "--with-decoders",
        action="store_true",
        help="also write the reconstruction decoders (decoders.safetensors) for `ecgpos score`; "
        "off by default: the clinical export is encoder-only",
    )
    parser.add_argument(
        "--probe-results",
        type=user_path,
        default=None,
        help="folder written by `ecgpos probe` (summary.md / results.csv) for the model card; its rows "
        "must include this encoder's",
    )
    return parser


EXPORT_FILES = {
    CONFIG_FILE,
    WEIGHTS_FILE,
    CARD_FILE,
    VECTORS_FILE,
    ONNX_FILE,
    f"{ONNX_FILE}.data",
    DECODERS_FILE,
    CLASSIFIER_ONNX_FILE,
    f"{CLASSIFIER_ONNX_FILE}.data",
}
"""What an export folder holds; re-exporting replaces the whole folder, so it refuses one holding anything else."""


def _prepare_out(out: Path) -> bool:
    """True when `out` holds an earlier export (replaced on success); refuse any other non-empty path."""
    inside = artifact_above(out.parent)
    if inside is not None:  # an export inside another export, a run or a shard folder would be read as part of it
        raise EcgposError(f"--out {out} is inside {inside[1]} {inside[0]}: give the export a folder of its own")
    if not out.exists():
        make_output_folder(out, create=False)  # a file above it: one line before the export is built
        return False
    if out.is_dir() and not any(out.iterdir()):
        return False
    if out.is_dir() and (out / CONFIG_FILE).is_file():
        try:
            read_export_config(out, (FORMAT, CLASSIFIER_FORMAT))
        except EcgposError:
            pass
        else:
            foreign = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES)
            if foreign:  # replacing the folder would delete them without a word
                raise EcgposError(
                    f"{out} holds files an export does not own ({', '.join(foreign[:5])}"
                    f"{', ...' if len(foreign) > 5 else ''}); move them out before re-exporting into it"
                )
            return True
    raise EcgposError(f"{out} exists and is not an ecgpos export folder; refusing to overwrite it")


def _remove_leftovers(out: Path) -> None:
    """The staging folders that a killed export to `out` left beside it."""
    for leftover in out.parent.glob(f".{glob.escape(out.name)}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _staged(out: Path, write: Callable[[Path], T]) -> T:
    """`write` into a hidden sibling of `out`, then the folder moved to `out` (an earlier export replaced)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        result = write(staging)
        make_public(staging)
        replace_folder(staging, out)  # an earlier export: renamed aside, deleted last
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return result


def cut_summary(run_dir: Path, top: dict, level: int) -> dict:
    """The training facts of levels 0..level of `run_dir`'s nest (`top`: the run's own): below the run's level,
    those of level `level`'s own run as the run's chain records it (its steps, checkpoint and data), or the
    chain's record of it when that run is not at hand; never the top level's steps and checkpoint."""
    top_level = recorded_level(top)
    if not isinstance(top_level, int) or level >= top_level:
        return {**top, "exported_levels": f"0..{level}"}
    entry = next((e for e in run_chain(read_run_info(run_dir)) if e.get("level") == level), {})
    source = entry.get("source")
    if entry.get("kind") == "run" and isinstance(source, str) and is_run_dir(source):
        summary = training_summary(Path(source), {}, {})
    else:  # an export, or a run folder no longer there: what the chain says of the level
        summary = {"level": level, **({"source": source} if isinstance(source, str) else {})}
        summary["shards"] = top.get("shards")
    return {**summary, "exported_levels": f"0..{level}", "cut_from": str(run_dir.resolve())}


def export_classifier(args: argparse.Namespace) -> int:
    """`--classifier`: one fine-tuned model as a classifier export folder."""
    from ecgpos.export.classifier_writer import check_classifier_reload, read_finetuned, select_model
    from ecgpos.export.classifier_writer import write_classifier_export as write

    if not args.classifier.is_dir():
        raise EcgposError(f"--classifier {args.classifier} is not a folder")
    if args.with_decoders or args.probe_results is not None or args.level is not None:
        raise EcgposError("--level, --with-decoders and --probe-results belong to encoder exports (--run-dir)")
    folder = select_model(args.classifier, args.task, args.fraction, args.seed)
    if args.out.parent.is_dir():
        recover_replaced(args.out.parent, args.out.name)
    replacing = _prepare_out(args.out)
    model = read_finetuned(folder)

    def build(staging: Path) -> tuple[dict, float]:
        with torch.no_grad():
            config = write(model, staging, args.onnx, args.license)
        from ecgpos.export.vectors import load_vectors

        return config, check_classifier_reload(
            staging, model.classifier, load_vectors(staging / VECTORS_FILE)["inputs"]
        )

    config, diff = _staged(args.out, build)
    test = config["test"]
    print(
        f"{'re-exported' if replacing else 'exported'} {config['training'].get('task')} classifier "
        f"({folder.relative_to(args.classifier)}, {len(config['labels'])} labels, test macro AUROC "
        f"{test['macro_auroc'] if test['macro_auroc'] is not None else 'n/a'}) to {args.out}; thresholds "
        f"{config['thresholds']['rule']}; reload check max abs diff {diff:.1e}"
        + (f"; {config['onnx']['file']} ({config['onnx']['exporter']} exporter)" if "onnx" in config else "")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.classifier is not None:
        return export_classifier(args)
    if args.task or args.fraction or args.seed is not None:
        raise EcgposError("--task, --fraction and --seed select a model of --classifier")
    if args.probe_results is not None and not args.probe_results.is_dir():
        raise EcgposError(f"--probe-results {args.probe_results} is not a folder")
    if args.probe_results is not None:
        probe_section(args.probe_results)  # refused here, before any work, when unreadable or inconsistent
    if args.out.parent.is_dir():  # an earlier export a killed re-export left aside is put back first
        recover_replaced(args.out.parent, args.out.name)
    replacing = _prepare_out(args.out)
    loaded = load_run_encoder(args.run_dir)
    if args.level is not None:
        loaded = loaded.cut(args.level)
    module = loaded.module.to("cpu").float().eval()
    if args.probe_results is not None:
        checkpoint = loaded.info.get("checkpoint") if isinstance(loaded.info, dict) else None
        what = f"the checkpoint exported ({checkpoint or args.run_dir})"
        warning = check_probed_encoder(args.probe_results, weights_hash(module), what)
        if warning:
            print(f"ecgpos export: warning: {warning}", file=sys.stderr)
    training = training_summary(args.run_dir, dict(loaded.info or {}), loaded.arch)
    if args.level is not None:
        training = cut_summary(args.run_dir, training, args.level)
    unfinished = unfinished_note(training)
    if unfinished:
        print(f"ecgpos export: warning: {unfinished}", file=sys.stderr)
    decoders = None
    if args.with_decoders:
        recon = load_recon_models(args.run_dir)
        kept = level_names(depth_of(module))
        decoders = {name: model for name, model in recon.levels.items() if name in kept}
        for note in recon.notes:
            print(f"note: {note}")

    def build(staging: Path) -> tuple[dict, float]:
        with torch.no_grad():
            config = write_export(
                module,
                loaded.spec,
                loaded.arch,
                training,
                staging,
                args.onnx,
                args.probe_results,
                decoders,
                args.license,
            )
            from ecgpos.export.vectors import load_vectors

            return config, check_reload(staging, module, load_vectors(staging / VECTORS_FILE)["inputs"])

    config, diff = _staged(args.out, build)
    onnx_note = ""
    if "onnx" in config:
        worst = max(config["onnx"]["max_relative_error"].values())
        onnx_note = f", {ONNX_FILE} ({config['onnx']['exporter']} exporter, max rel err {worst:.1e})"
    decoder_note = ""
    if "decoders" in config:
        levels = ", ".join(k for k in config["decoders"] if parse_level_name(k) is not None)
        decoder_note = f", {config['decoders']['file']} ({levels})"
    verb = "re-exported" if replacing else "exported"
    print(
        f"{verb} {config['arch'].get('kind')} encoder (step {training.get('step', '?')}, "
        f"{config['io']['features']} features) to {args.out}: {WEIGHTS_FILE}, {CONFIG_FILE}, {CARD_FILE}, "
        f"{VECTORS_FILE}{onnx_note}{decoder_note}; reload check max abs diff {diff:.1e}"
    )
    return 0
