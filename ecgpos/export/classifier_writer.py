"""Writing a classifier export from one model of an `ecgpos finetune` output folder.

FINETUNE_OUT/models/<task>/<fraction>/seed<S>/ holds model.safetensors (`encoder.*` + `head.*`),
model.json, val_scores.npz and test_scores.npz, as ecgpos.export.finetuned_format defines them;
<fraction> is the share of training labels (0.01 for `finetune --fractions 1`), --fraction selects it in
percent, as --fractions gives it. Per-label thresholds are chosen on the validation probabilities only
(THRESHOLD_RULE); the test logits give the card's per-label AUROC and its bootstrap interval (the logits, as
`ecgpos finetune` scores results.csv: float32 probabilities tie where the logits do not), and are never
used to choose anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos import __version__
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.export.classifier import (
    CLASSIFIER_ONNX_FILE,
    ExportedClassifier,
    head_module,
    load_classifier,
    split_state,
)
from ecgpos.export.classifier_card import render_classifier_card
from ecgpos.export.finetuned_format import (
    MODEL_FILE,
    MODEL_INFO,
    TEST_SCORES,
    VAL_SCORES,
    model_folders,
    read_json,
    read_scores,
)
from ecgpos.export.format import (
    CARD_FILE,
    CLASSIFIER_FORMAT,
    CONFIG_FILE,
    FORMAT_VERSION,
    VECTORS_FILE,
    WEIGHTS_FILE,
    config_sha256,
    state_sha256,
)
from ecgpos.export.load import ExportedEncoder, build_from_state
from ecgpos.export.vectors import ATOL, RTOL, build_vectors, save_vectors
from ecgpos.export.writer import EXACT_TOL
from ecgpos.files import read_safetensors
from ecgpos.metrics import auroc_columns

THRESHOLD_RULE = "max F1 on the validation split (flag when probability >= threshold)"
BOOTSTRAP = 1000
BOOTSTRAP_SEED = 20240101
LEVEL = 0.95


@dataclass
class FinetunedModel:
    """One trained model of a fine-tune output folder, read and checked."""

    folder: Path
    info: dict[str, Any]
    classifier: ExportedClassifier
    state: dict[str, torch.Tensor]
    val: dict[str, np.ndarray]
    test: dict[str, np.ndarray]


def fraction_percent(name: str) -> str:
    """A fraction folder's name (0.01) as the percentage `finetune --fractions` and --fraction give (1)."""
    try:
        return f"{float(name) * 100:g}"
    except ValueError:
        return name


def select_model(out: Path, task: str | None, fraction: str | None, seed: int | None) -> Path:
    """The model folder the flags name (`fraction` in percent); without --seed the seed with the best validation
    macro-AUROC. One line listing the choices when the flags leave several tasks or fractions."""
    if fraction is not None:
        try:
            percent = float(fraction)
        except ValueError:
            percent = float("nan")
        if not 0 < percent <= 100:
            raise EcgposError(
                f"--fraction is a percentage in (0, 100] as `finetune --fractions` gives it, got {fraction}"
            )
    found = model_folders(out)
    if not found:
        raise EcgposError(
            f"--classifier {out}: no models/<task>/<fraction>/seed<S>/model.json (an `ecgpos finetune` --out?)"
        )
    keep = [
        p
        for p in found
        if (task is None or p.parent.parent.name == task)
        and (fraction is None or _same_fraction(p.parent.name, float(fraction) / 100))
        and (seed is None or p.name == f"seed{seed}")
    ]
    choices = ", ".join(sorted({f"{p.parent.parent.name} {fraction_percent(p.parent.name)} %" for p in found}))
    if not keep:
        raise EcgposError(
            f"--classifier {out}: no model for these flags; it holds {choices} (--task, --fraction in percent; "
            "seeds as seed<S>)"
        )
    groups = {(p.parent.parent.name, p.parent.name) for p in keep}
    if len(groups) > 1:
        raise EcgposError(f"--classifier {out} holds several models ({choices}): choose with --task and --fraction")
    return max(keep, key=lambda p: (_val_auroc(p), -int(p.name[4:]) if p.name[4:].isdigit() else 0))


def _same_fraction(name: str, wanted: float) -> bool:
    try:
        return abs(float(name) - wanted) < 1e-12
    except ValueError:
        return False


def _val_auroc(folder: Path) -> float:
    value = read_json(folder / MODEL_INFO).get("val_macro_auroc")
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else float("-inf")


def read_finetuned(folder: Path) -> FinetunedModel:
    """The model of one seed folder, rebuilt strictly (the encoder by its arch, the head by the labels)."""
    info = read_json(folder / MODEL_INFO)
    labels = info.get("labels")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
        raise EcgposError(f"{folder / MODEL_INFO}: labels must be a list of label names")
    for key in ("encoder_arch", "preprocess"):
        if not isinstance(info.get(key), dict):
            raise EcgposError(f"{folder / MODEL_INFO} lacks {key}")
    windows = info.get("windows", 1)
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise EcgposError(f"{folder / MODEL_INFO}: windows must be a whole number >= 1, got {windows!r:.40}")
    try:
        spec = PreprocessSpec.from_dict(info["preprocess"])
    except (EcgposError, TypeError) as err:
        raise EcgposError(f"{folder / MODEL_INFO}: invalid preprocess spec: {err}") from None
    what = str(folder / MODEL_FILE)
    state = read_safetensors(folder / MODEL_FILE, "fine-tuned weights")
    encoder_state, head_state = split_state(state, what)
    module = build_from_state(info["encoder_arch"], encoder_state, what).float().eval()
    head = head_module(head_state, len(labels), int(module.width), what)
    encoder = ExportedEncoder(module, spec, info["encoder_arch"], {"training": {}}, source=str(folder))
    thresholds = np.full(len(labels), 0.5)  # replaced by the validation choice before anything is written
    classifier = ExportedClassifier(encoder, head, labels, thresholds, {})
    val = read_scores(folder / VAL_SCORES, labels)
    test = read_scores(folder / TEST_SCORES, labels)
    state = {key: value.float().contiguous() for key, value in state.items()}
    return FinetunedModel(folder, info, classifier, state, val, test)


def max_f1_thresholds(y_true: np.ndarray, y_score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per label, the threshold t among its validation scores maximising F1 of (score >= t), and that F1.
    A label without a positive or a negative in validation keeps 0.5 (F1 NaN): no choice can be made."""
    thresholds, f1s = np.full(y_true.shape[1], 0.5), np.full(y_true.shape[1], np.nan)
    for c in range(y_true.shape[1]):
        y, s = y_true[:, c].astype(bool), y_score[:, c]
        if not 0 < y.sum() < len(y):
            continue
        order = np.argsort(-s, kind="stable")
        s_sorted, y_sorted = s[order], y[order]
        tp = np.cumsum(y_sorted)
        flagged = np.arange(1, len(s) + 1)
        last = np.r_[s_sorted[1:] != s_sorted[:-1], True]  # flagging down to a score flags all its ties
        f1 = 2 * tp / (flagged + y.sum())
        f1 = np.where(last, f1, -1.0)
        best = int(np.argmax(f1))  # the highest threshold of the best F1: the fewest flags
        thresholds[c], f1s[c] = float(s_sorted[best]), float(f1[best])
    return thresholds, f1s


def test_aurocs(y_true: np.ndarray, y_score: np.ndarray, labels: list[str]) -> dict[str, Any]:
    """Per-label test AUROC and its 95 % percentile bootstrap interval (records resampled with
    replacement; a resample without a positive or a negative of a label does not count for that label)."""
    auroc = auroc_columns(y_score, y_true)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    draws = np.stack(
        [auroc_columns(y_score[idx], y_true[idx]) for idx in rng.integers(0, len(y_true), (BOOTSTRAP, len(y_true)))]
    )
    tail = (1 - LEVEL) / 2 * 100
    per_label = {}
    for c, label in enumerate(labels):
        values = draws[:, c][np.isfinite(draws[:, c])]
        low, high = np.percentile(values, [tail, 100 - tail]) if len(values) else (np.nan, np.nan)
        per_label[label] = {
            "auroc": _num(auroc[c]),
            "low": _num(low),
            "high": _num(high),
            "positives": int(y_true[:, c].sum()),
            "resamples": int(len(values)),
        }
    finite = auroc[np.isfinite(auroc)]
    return {
        "n_test": int(len(y_true)),
        "macro_auroc": _num(finite.mean()) if len(finite) else None,
        "level": LEVEL,
        "bootstrap": BOOTSTRAP,
        "bootstrap_unit": "record",
        "per_label": per_label,
    }


def _num(value: float) -> float | None:
    return round(float(value), 6) if np.isfinite(value) else None


def export_state(model: FinetunedModel) -> dict[str, torch.Tensor]:
    """The classifier's tensors as the export stores them (`encoder.*`, `head.*`), contiguous CPU copies."""
    return {key: value.detach().cpu().clone().contiguous() for key, value in model.state.items()}


@torch.no_grad()
def write_classifier_export(
    model: FinetunedModel, out: Path, onnx: bool = False, license_id: str = "other"
) -> dict[str, Any]:
    """Write every file of the classifier export of `model` into the empty folder `out`; return config."""
    from safetensors.torch import save_file

    classifier = model.classifier
    labels = classifier.labels
    thresholds, f1s = max_f1_thresholds(model.val["y_true"], model.val["y_score"])
    classifier.thresholds = thresholds
    state = export_state(model)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": CLASSIFIER_FORMAT})
    spec = classifier.spec
    vectors = build_vectors(classifier, spec)
    vectors["probabilities"] = classifier(torch.from_numpy(vectors["inputs"])).numpy()
    save_vectors(out / VECTORS_FILE, vectors)
    info = model.info
    training = {
        key: info[key] for key in info if key not in ("encoder_arch", "preprocess", "labels", "format", "version")
    }
    config: dict[str, Any] = {
        "format": CLASSIFIER_FORMAT,
        "version": FORMAT_VERSION,
        "ecgpos_version": __version__,
        "arch": info["encoder_arch"],
        "preprocess": spec.to_dict(),
        "pooling": info.get("pooling", "mean over patch tokens, then the final LayerNorm"),
        "head": {"in_features": int(classifier.head.in_features), "out_features": len(labels), "activation": "sigmoid"},
        "labels": labels,
        "thresholds": {
            "rule": THRESHOLD_RULE,
            "values": {label: float(t) for label, t in zip(labels, thresholds)},
            "validation_f1": {label: _num(f) for label, f in zip(labels, f1s)},
            "n_validation": int(len(model.val["y_true"])),
        },
        "windows": int(info.get("windows", 1) or 1),
        "io": {
            "input": ["batch", len(spec.leads), spec.window],
            "input_dtype": "float32",
            "features": int(classifier.head.in_features),
            "outputs": len(labels),
        },
        "weights_sha256": state_sha256(state),
        "test_vectors": {"file": VECTORS_FILE, "atol": ATOL, "rtol": RTOL},
        "training": training,
        "test": test_aurocs(model.test["y_true"], model.test["ranked"], labels),
    }
    config["config_sha256"] = config_sha256(config)
    if onnx:
        from ecgpos.export.onnx_export import export_onnx

        config["onnx"] = export_onnx(
            classifier,
            out / CLASSIFIER_ONNX_FILE,
            spec.window,
            len(spec.leads),
            method="forward",
            output="probabilities",
        )
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (out / CARD_FILE).write_text(render_classifier_card(config, license_id))
    return config


def check_classifier_reload(out: Path, module: nn.Module, inputs: np.ndarray) -> float:
    """Reload the written folder and compare its probabilities with `module`'s; raise if they differ."""
    reloaded = load_classifier(out)
    with torch.no_grad():
        want = module(torch.from_numpy(inputs)).numpy()
        got = reloaded(torch.from_numpy(inputs)).numpy()
    diff = float(np.abs(want - got).max())
    if not diff <= EXACT_TOL:
        raise EcgposError(f"reloaded classifier export differs from the fine-tuned model (max abs diff {diff:.2e})")
    return diff
