"""A classifier export: a fine-tuned encoder, its linear head, the label names and decision thresholds.

The folder follows the encoder export (ecgpos.export.format) with these differences:
- model.safetensors  the encoder's tensors under `encoder.` and the head's `head.weight` (labels, width)
                     and `head.bias` (labels,)
- config.json        format "ecgpos-classifier"; besides an encoder export's fields: `labels` (head order),
                     `head` ({"in_features", "out_features", "activation": "sigmoid"}), `thresholds`
                     ({"rule", "values": {label: t}}: a label is flagged when its probability >= t) and
                     `test` (per-label test AUROC with its interval); config_sha256 also binds labels, head,
                     thresholds and windows (CLASSIFIER_HASH_FIELDS)
- test_vectors.npz   the encoder's vectors plus `probabilities` of the stored inputs
- classifier.onnx    probabilities of a (batch, 12, window) float32 input
`load_classifier` checks all of it as `load_encoder` checks an encoder export, and refuses with one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.export.format import CLASSIFIER_FORMAT, CONFIG_FILE, WEIGHTS_FILE
from ecgpos.export.load import (
    ExportedEncoder,
    build_from_state,
    check_config_binding,
    checked_weights,
    export_folder,
    export_spec,
)
from ecgpos.export.load import read_export_config as _read_config
from ecgpos.models.features import DEFAULT_NUM_WINDOWS, resolve_device

CLASSIFIER_ONNX_FILE = "classifier.onnx"
ENCODER_PREFIX = "encoder."
HEAD_KEYS = ("head.weight", "head.bias")


class ExportedClassifier(nn.Module):
    """A frozen, eval-mode classifier: forward(x) gives each label's probability.

    forward(x) = probabilities (B, labels) of (B, 12, window) preprocessed float32 windows;
    forward_features(x) the encoder's pooled features; predict_proba(raw, fs, leads) one record's
    probabilities (the head applied to the features averaged over its windows, as evaluation does);
    flags(probabilities) compares them with the validation-chosen thresholds.
    """

    def __init__(
        self, encoder: ExportedEncoder, head: nn.Linear, labels: Sequence[str], thresholds: np.ndarray, config: dict
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.labels = list(labels)
        self.thresholds = np.asarray(thresholds, dtype=np.float64)
        self.config = config
        self.spec: PreprocessSpec = encoder.spec
        self.source = encoder.source
        self.requires_grad_(False)
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.encoder.device

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.forward_logits(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder.forward_features(x)

    def forward_logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder.forward_features(x))

    @torch.no_grad()
    def probabilities_of_features(self, features: np.ndarray) -> np.ndarray:
        """(N, width) features (a record's averaged over its windows) -> (N, labels) float32 probabilities."""
        x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)).to(self.device)
        return torch.sigmoid(self.head(x)).cpu().numpy()

    def predict_proba(
        self, signal: np.ndarray, fs: float, leads: Sequence[str], num_windows: int = DEFAULT_NUM_WINDOWS
    ) -> np.ndarray:
        """Raw (leads, time) mV record -> (labels,) probabilities; screening and preprocessing as `embed`."""
        return self.probabilities_of_features(self.encoder.embed(signal, fs, leads, num_windows)[None])[0]

    def flags(self, probabilities: np.ndarray) -> np.ndarray:
        """Boolean flags (same shape): probability >= the label's threshold."""
        return np.asarray(probabilities) >= self.thresholds


def _check_fields(config: dict[str, Any], where: Path) -> tuple[list[str], np.ndarray]:
    """(labels, thresholds in label order) of a classifier config.json; EcgposError when malformed."""
    labels, head, thresholds = config.get("labels"), config.get("head"), config.get("thresholds")
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
        raise EcgposError(f"{where}: labels must be a non-empty list of label names")
    if len(set(labels)) != len(labels):
        raise EcgposError(f"{where}: labels repeat a name")
    if not isinstance(head, dict) or head.get("out_features") != len(labels):
        raise EcgposError(f"{where}: head must state out_features equal to the {len(labels)} labels")
    values = thresholds.get("values") if isinstance(thresholds, dict) else None
    if not isinstance(values, dict) or set(values) != set(labels):
        raise EcgposError(f"{where}: thresholds must give one value per label ({{'rule': ..., 'values': {{...}}}})")
    if not all(isinstance(values[x], (int, float)) and np.isfinite(values[x]) for x in labels):
        raise EcgposError(f"{where}: every threshold must be a finite number")
    if "config_sha256" not in config:
        raise EcgposError(f"{where} has no config_sha256: re-export the classifier")
    return labels, np.array([float(values[x]) for x in labels])


def split_state(
    state: Mapping[str, torch.Tensor], what: str
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(encoder tensors without their `encoder.` prefix, head tensors) of a classifier's weights."""
    missing = [key for key in HEAD_KEYS if key not in state]
    stray = [key for key in state if key not in HEAD_KEYS and not key.startswith(ENCODER_PREFIX)]
    if missing or stray:
        found = [f"missing {', '.join(missing)}"] if missing else []
        found += [f"unexpected {', '.join(stray[:3])}{' ...' if len(stray) > 3 else ''}"] if stray else []
        raise EcgposError(f"{what} is not a classifier's weights: {'; '.join(found)}")
    encoder = {key[len(ENCODER_PREFIX) :]: value for key, value in state.items() if key.startswith(ENCODER_PREFIX)}
    return encoder, {key.split(".", 1)[1]: state[key] for key in HEAD_KEYS}


def load_classifier(path: str | Path, device: str | torch.device = "cpu") -> ExportedClassifier:
    """Load a classifier export folder (or `hf://ORG/NAME[@REVISION]`) as an eval-mode ExportedClassifier.

    Raises EcgposError with one line when the folder is not a classifier export, the weights hash
    differs from config.json, a field that decides the outputs was edited, or the weights do not fit.
    """
    folder = export_folder(path)
    device = resolve_device(device)
    config = _read_config(folder, (CLASSIFIER_FORMAT,))
    where = folder / CONFIG_FILE
    labels, thresholds = _check_fields(config, where)
    spec = export_spec(folder, config)
    weights_path = folder / WEIGHTS_FILE
    state = checked_weights(folder, config, "weights in the classifier export")
    encoder_state, head_state = split_state(state, str(weights_path))
    module = build_from_state(config["arch"], encoder_state, str(weights_path))
    check_config_binding(folder, config)
    head = head_module(head_state, len(labels), int(module.width), str(weights_path))
    encoder = ExportedEncoder(module.float(), spec, config["arch"], config, source=str(folder.resolve()))
    return ExportedClassifier(encoder, head, labels, thresholds, config).to(device)


def head_module(head_state: Mapping[str, torch.Tensor], num_labels: int, width: int, what: str) -> nn.Linear:
    """nn.Linear(width, num_labels) holding exactly `head_state` (weight, bias); EcgposError when it does not fit."""
    weight, bias = head_state["weight"], head_state["bias"]
    if tuple(weight.shape) != (num_labels, width) or tuple(bias.shape) != (num_labels,):
        raise EcgposError(
            f"{what}: head.weight {tuple(weight.shape)} / head.bias {tuple(bias.shape)} do not fit "
            f"{num_labels} labels on {width} features"
        )
    head = nn.Linear(width, num_labels)
    head.load_state_dict({"weight": weight.float(), "bias": bias.float()}, strict=True)
    return head.eval()
