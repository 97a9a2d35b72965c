"""What one trained classifier leaves in OUT/models/<task>/<fraction>/seed<S>/: its weights (safetensors,
LoRA merged), model.json (architecture, preprocessing, labels, selection), and its validation and test
scores (for thresholds chosen on validation, and per-label test intervals). model.json is written last: a
rerun reuses every folder that has it and was trained under the same settings (`training_key`)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.files import atomic_path, atomic_write_text
from ecgpos.models.factory import encoder_arch
from ecgpos.probes.finetune.model import Classifier

MODELS_DIR = "models"
MODEL_FILE = "model.safetensors"
MODEL_INFO = "model.json"
FORMAT = "ecgpos-classifier"
POOLING = "mean of patch tokens then final norm; mean over a record's windows"


def model_dir(out: Path, task: str, fraction: float, seed: int) -> Path:
    return Path(out) / MODELS_DIR / task / f"{fraction:g}" / f"seed{seed}"


def classifier_state(model: Classifier) -> dict[str, torch.Tensor]:
    """`encoder.<encoder keys>` + `head.weight`/`head.bias`, fp32, contiguous, on the CPU."""
    return {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}


def training_key(**parts: object) -> str:
    """A digest of everything that decides a trained model (settings, mode, encoder weights, records, labels):
    a model folder trained under the same key is reused by a rerun instead of trained again."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def stored_model(folder: Path, key: str) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """(model.json, val logits, test logits) of a finished model folder trained under `key`, else None
    (absent, interrupted before model.json, trained under other settings, or unreadable)."""
    try:
        meta = json.loads((folder / MODEL_INFO).read_text())
        if meta.get("training_key") != key or not (folder / MODEL_FILE).is_file():
            return None
        with np.load(folder / "val_scores.npz") as val, np.load(folder / "test_scores.npz") as test:
            return meta, val["logits"], test["logits"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None


def _scores(path: Path, labels: np.ndarray, logits: np.ndarray, keys: Sequence[str], classes: Sequence[str]) -> None:
    with atomic_path(path, suffix=".npz") as tmp:
        np.savez_compressed(
            tmp,
            y_true=np.asarray(labels, dtype=np.uint8),
            y_score=(1 / (1 + np.exp(-np.asarray(logits, np.float64)))).astype(np.float32),
            logits=np.asarray(logits, np.float32),
            records=np.array(list(keys), dtype=str),
            labels=np.array(list(classes), dtype=str),
        )


def write_model(
    folder: Path,
    model: Classifier,
    spec: PreprocessSpec,
    info: dict,
    val: tuple[np.ndarray, np.ndarray, Sequence[str]],
    test: tuple[np.ndarray, np.ndarray, Sequence[str]],
) -> None:
    """The model folder; model.json last, so a folder without it was interrupted while written.
    `info` holds labels, task, fraction, seed, protocol, selection, windows and encoder_source;
    val/test: (labels, logits, record keys)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MODEL_INFO).unlink(missing_ok=True)
    with atomic_path(folder / MODEL_FILE, suffix=".safetensors") as tmp:
        save_file(classifier_state(model), str(tmp), metadata={"format": FORMAT})
    _scores(folder / "val_scores.npz", *val, info["labels"])
    _scores(folder / "test_scores.npz", *test, info["labels"])
    meta = {
        "format": FORMAT,
        "version": 1,
        "encoder_arch": encoder_arch(model.encoder),
        "preprocess": spec.to_dict(),
        "pooling": POOLING,
        "output": "logits; sigmoid for probabilities",
        **info,
    }
    atomic_write_text(folder / MODEL_INFO, json.dumps(meta, indent=2, default=str) + "\n", sync=False)
