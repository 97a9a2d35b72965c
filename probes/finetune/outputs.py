"""What one trained classifier leaves in OUT/models/<task>/<fraction>/seed<S>/: its weights (safetensors,
LoRA merged), model.json (architecture, preprocessing, labels, selection), and its validation and test
scores (for thresholds chosen on validation, and per-label test intervals). The folder's files and keys are
defined, written and read by ecgpos.export.finetuned_format (which `ecgpos export --classifier` reads them
with). model.json is written last: a rerun reuses every folder that has it and was trained under the same
settings (`training_key`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.export.finetuned_format import (
    FORMAT,
    MODEL_FILE,
    MODEL_INFO,
    MODELS_DIR,
    POOLING,
    model_dir,
    stored_logits,
    write_model_folder,
)
from ecgpos.models.factory import encoder_arch
from ecgpos.probes.finetune.model import Classifier

__all__ = ["FORMAT", "MODELS_DIR", "MODEL_FILE", "MODEL_INFO", "POOLING", "model_dir", "stored_model", "write_model"]


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
    return stored_logits(folder, key)


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
    write_model_folder(folder, classifier_state(model), encoder_arch(model.encoder), spec, info, val, test)
