"""Frozen encoders that leave the lab: one folder with weights, config, model card and test vectors.

Layout of an export folder (written by `ecgpos export`, read by `load_encoder` / `ecgpos verify`):

- model.safetensors  encoder weights only (never pickled)
- config.json        {"format": "ecgpos-encoder", "version": 1, "arch", "preprocess", "pooling",
                      "ecgpos_version", "weights_sha256", "training", "io", "test_vectors", "onnx"}
- README.md          model card
- test_vectors.npz   deterministic inputs and their expected features (see vectors.py)
- encoder.onnx       optional (`--onnx`): features of a (batch, 12, window) float32 input
"""
from __future__ import annotations

FORMAT = "ecgpos-encoder"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
CARD_FILE = "README.md"
VECTORS_FILE = "test_vectors.npz"
ONNX_FILE = "encoder.onnx"

__all__ = ["FORMAT", "FORMAT_VERSION", "WEIGHTS_FILE", "CONFIG_FILE", "CARD_FILE", "VECTORS_FILE", "ONNX_FILE",
           "load_encoder"]


def load_encoder(path, device: str = "cpu"):  # noqa: ANN001, ANN201 - thin lazy re-export
    """Load an export folder; see ecgpos.export.load.load_encoder."""
    from .load import load_encoder as _load

    return _load(path, device=device)
