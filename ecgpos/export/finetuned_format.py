"""The fine-tuned model folder: the one definition of its files, their keys, and their writing and reading.

`ecgpos finetune` (ecgpos.probes.finetune.outputs) writes one folder per trained model,
OUT/models/<task>/<fraction>/seed<S>/, and `ecgpos export --classifier` (ecgpos.export.classifier_writer)
reads it:
- model.safetensors: `encoder.<encoder keys>` + `head.weight` / `head.bias`, float32 (LoRA merged),
  metadata format CLASSIFIER_FORMAT;
- val_scores.npz, test_scores.npz: y_true (N, C) uint8, y_score (N, C) float32 probabilities (the
  sigmoid of the logits), logits (N, C) float32, records (N,) record keys, labels (C,) label names;
- model.json, written last (a folder without it was interrupted): format, version, encoder_arch,
  preprocess, pooling, output, then the trainer's own fields (labels, task, fraction, seed, protocol,
  selection, windows, encoder_source, training_key, ...).
<fraction> is the share of training labels (0.01 for `finetune --fractions 1`).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.export.format import CLASSIFIER_FORMAT, WEIGHTS_FILE
from ecgpos.files import atomic_path, atomic_write_text

MODELS_DIR = "models"
MODEL_FILE = WEIGHTS_FILE
MODEL_INFO = "model.json"
VAL_SCORES = "val_scores.npz"
TEST_SCORES = "test_scores.npz"
FORMAT = CLASSIFIER_FORMAT
VERSION = 1
POOLING = "mean of patch tokens then final norm; mean over a record's windows"
OUTPUT = "logits; sigmoid for probabilities"


def model_dir(out: Path, task: str, fraction: float, seed: int) -> Path:
    """OUT/models/<task>/<fraction>/seed<S>: the folder of one trained model."""
    return Path(out) / MODELS_DIR / task / f"{fraction:g}" / f"seed{seed}"


def model_folders(out: Path) -> list[Path]:
    """Every OUT/models/<task>/<fraction>/seed<S> folder holding a model.json."""
    return sorted(p.parent for p in (Path(out) / MODELS_DIR).glob(f"*/*/seed*/{MODEL_INFO}"))


def write_scores(
    path: Path, labels: np.ndarray, logits: np.ndarray, keys: Sequence[str], classes: Sequence[str]
) -> None:
    """A val/test score file: `labels` (N, C) 0/1, `logits` (N, C), the record `keys`, the label names."""
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez_compressed(
            tmp,
            y_true=np.asarray(labels, dtype=np.uint8),
            y_score=(1 / (1 + np.exp(-np.asarray(logits, np.float64)))).astype(np.float32),
            logits=np.asarray(logits, np.float32),
            records=np.array(list(keys), dtype=str),
            labels=np.array(list(classes), dtype=str),
        )


def write_model_folder(
    folder: Path,
    state: Mapping[str, torch.Tensor],
    encoder_arch: Mapping[str, Any],
    spec: PreprocessSpec,
    info: Mapping[str, Any],
    val: tuple[np.ndarray, np.ndarray, Sequence[str]],
    test: tuple[np.ndarray, np.ndarray, Sequence[str]],
) -> None:
    """The model folder of `state` (`encoder.*` + `head.*`, float32 CPU tensors); model.json last.
    `info` holds labels and the trainer's fields; val/test: (labels, logits, record keys)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / MODEL_INFO).unlink(missing_ok=True)
    with atomic_path(folder / MODEL_FILE, suffix=".safetensors") as tmp:
        save_file(dict(state), str(tmp), metadata={"format": FORMAT})
    write_scores(folder / VAL_SCORES, *val, info["labels"])
    write_scores(folder / TEST_SCORES, *test, info["labels"])
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "encoder_arch": dict(encoder_arch),
        "preprocess": spec.to_dict(),
        "pooling": POOLING,
        "output": OUTPUT,
        **info,
    }
    atomic_write_text(folder / MODEL_INFO, json.dumps(meta, indent=2, default=str) + "\n", sync=False)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file (model.json); EcgposError (one line) when unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise EcgposError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise EcgposError(f"{path} is not a JSON object")
    return data


def stored_logits(folder: Path, key: str) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """(model.json, val logits, test logits) of a finished model folder whose model.json has
    training_key `key`, else None (absent, interrupted before model.json, another key, or unreadable)."""
    try:
        meta = json.loads((folder / MODEL_INFO).read_text())
        if meta.get("training_key") != key or not (folder / MODEL_FILE).is_file():
            return None
        with np.load(folder / VAL_SCORES) as val, np.load(folder / TEST_SCORES) as test:
            return meta, val["logits"], test["logits"]
    except (OSError, ValueError, KeyError, AttributeError, zipfile.BadZipFile):
        return None


def read_scores(path: Path, labels: list[str]) -> dict[str, np.ndarray]:
    """y_true (N, C) 0/1, y_score (N, C) probabilities and `ranked` (N, C), the scores AUROC ranks (the logits
    where the file holds them, else the probabilities) of a val/test score file, checked against `labels`."""
    try:
        with np.load(path, allow_pickle=False) as data:
            scores = {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise EcgposError(f"{path} is not a readable score file: {err}") from None
    if "y_true" not in scores or "y_score" not in scores:
        raise EcgposError(f"{path} lacks y_true or y_score")
    y_true, y_score = np.asarray(scores["y_true"]), np.asarray(scores["y_score"], dtype=np.float64)
    if y_true.shape != y_score.shape or y_true.ndim != 2 or y_true.shape[1] != len(labels):
        raise EcgposError(f"{path}: y_true {y_true.shape} and y_score {y_score.shape} must be (N, {len(labels)})")
    if "labels" in scores and [str(x) for x in scores["labels"]] != labels:
        raise EcgposError(f"{path}: its labels differ from model.json's")
    if not np.isfinite(y_score).all() or y_score.min() < 0 or y_score.max() > 1:
        raise EcgposError(f"{path}: y_score must hold probabilities in [0, 1]")
    ranked = y_score
    if "logits" in scores:
        ranked = np.asarray(scores["logits"], dtype=np.float64)
        if ranked.shape != y_score.shape or not np.isfinite(ranked).all():
            raise EcgposError(f"{path}: logits must be finite and shaped as y_score {y_score.shape}")
    return {"y_true": (y_true > 0).astype(np.uint8), "y_score": y_score, "ranked": ranked}
