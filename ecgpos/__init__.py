"""ecgpos: ECG self-supervised pretraining with nested manifold carving."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "load_classifier", "load_encoder"]


def load_encoder(path: Any, device: str = "cpu") -> Any:
    """Load an exported encoder folder (safetensors + config.json) or hf://ORG/NAME[@REVISION]; see ecgpos.export."""
    from ecgpos.export.load import load_encoder as _load

    return _load(path, device=device)


def load_classifier(path: Any, device: str = "cpu") -> Any:
    """Load a classifier export folder (`ecgpos export --classifier`) or hf://ORG/NAME[@REVISION]."""
    from ecgpos.export.classifier import load_classifier as _load

    return _load(path, device=device)
