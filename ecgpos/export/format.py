"""The export format: what an export folder holds, and the weights hash that binds it.

Layout of an export folder (written by `ecgpos export`, read by `load_encoder` / `ecgpos verify`):

- model.safetensors  encoder weights only (never pickled)
- config.json        {"format": "ecgpos-encoder", "version": 1, "arch", "preprocess", "pooling",
                      "ecgpos_version", "weights_sha256", "config_sha256", "training", "io",
                      "test_vectors", "onnx", "decoders"}; config_sha256 binds every field that changes
                      features (CONFIG_HASH_FIELDS) to the weights hash
- README.md          model card
- test_vectors.npz   deterministic inputs and their expected features (see vectors.py)
- encoder.onnx       optional (`--onnx`): features of a (batch, 12, window) float32 input
- decoders.safetensors  optional (`--with-decoders`): reconstruction decoders for `ecgpos score`
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# the weights hash lives with the other state-dict comparisons; an export records it as weights_sha256
from ecgpos.models.factory import state_sha256, weights_hash  # noqa: F401

FORMAT = "ecgpos-encoder"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
VECTORS_FILE = "test_vectors.npz"
ONNX_FILE = "encoder.onnx"


CONFIG_HASH_FIELDS = ("arch", "preprocess", "pooling", "weights_sha256")
"""The config.json fields that decide what features an export computes (plus the weights hash,
which binds them to model.safetensors). `training`, `io` and the card are descriptive only."""

CLASSIFIER_FORMAT = "ecgpos-classifier"
CLASSIFIER_HASH_FIELDS = (*CONFIG_HASH_FIELDS, "head", "labels", "thresholds", "windows")
"""A classifier export (ecgpos.export.classifier) binds also what turns features into flags, and the windows
per record `ecgpos predict` averages by default."""


def hash_fields(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The config.json fields config_sha256 binds for this export's format."""
    return CLASSIFIER_HASH_FIELDS if config.get("format") == CLASSIFIER_FORMAT else CONFIG_HASH_FIELDS


def json_sha256(value: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no spaces) of `value`: equal before and after a
    round trip through config.json."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def config_sha256(config: Mapping[str, Any]) -> str:
    """`json_sha256` of config's CONFIG_HASH_FIELDS (CLASSIFIER_HASH_FIELDS for a classifier export)."""
    return json_sha256({key: config.get(key) for key in hash_fields(config)})


def is_export_dir(path: str | Path) -> bool:
    """Whether `path` looks like an export folder (it holds config.json); load_encoder checks the rest."""
    return (Path(path) / CONFIG_FILE).is_file()
