"""Writing an export folder from a frozen encoder (`ecgpos export` is the command).

Everything is written into a temporary sibling folder, reloaded from disk and checked against the
training checkpoint's features (and, with --onnx, against onnxruntime) before it is moved to DIR,
so a failed export never leaves a half-written folder that looks valid. An earlier export at DIR
is replaced (re-running a pipeline works); any other non-empty DIR is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos import __version__
from ecgpos.errors import EcgposError
from ecgpos.export.card import render_card
from ecgpos.export.format import (
    CARD_FILE,
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    ONNX_FILE,
    VECTORS_FILE,
    WEIGHTS_FILE,
    config_sha256,
    state_sha256,
)
from ecgpos.export.hub_card import DEFAULT_LICENSE
from ecgpos.export.load import load_encoder
from ecgpos.export.vectors import ATOL, RTOL, build_vectors, save_vectors
from ecgpos.models.features import window_features

POOLING = "mean over patch tokens (SEP tokens excluded), then the final LayerNorm"
EXACT_TOL = 1e-6  # reloaded export vs training module on CPU: same weights, same code


def weights_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous, unshared CPU copies of the module's tensors (safetensors refuses shared storage)."""
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in module.state_dict().items()}


@torch.no_grad()
def write_export(
    module: nn.Module,
    spec: Any,
    arch: dict[str, Any],
    training: dict[str, Any],
    out: Path,
    onnx: bool = False,
    probe_results: Path | None = None,
    decoders: dict[str, nn.Module] | None = None,
    license_id: str = DEFAULT_LICENSE,
) -> dict[str, Any]:
    """Write all export files of a CPU float32 eval `module` into the (empty) folder `out`; return config.
    `decoders` (level -> objective module) adds decoders.safetensors for reconstruction scoring."""
    from safetensors.torch import save_file

    state = weights_state(module)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    vectors = build_vectors(module, spec)
    save_vectors(out / VECTORS_FILE, vectors)
    config: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "ecgpos_version": __version__,
        "arch": arch,
        "preprocess": spec.to_dict(),
        "pooling": POOLING,
        "io": {
            "input": ["batch", len(spec.leads), spec.window],
            "input_dtype": "float32",
            "features": int(vectors["features"].shape[1]),
            "tokens": list(module.forward_tokens(torch.from_numpy(vectors["inputs"][:1])).shape[1:]),
        },
        "weights_sha256": state_sha256(state),
        "test_vectors": {"file": VECTORS_FILE, "atol": ATOL, "rtol": RTOL},
        "training": training,
    }
    if decoders:
        from ecgpos.export.decoders import write_decoders

        config["decoders"] = write_decoders(out, decoders, config["weights_sha256"])
    config["config_sha256"] = config_sha256(config)
    if onnx:
        from ecgpos.export.onnx_export import export_onnx

        config["onnx"] = export_onnx(module, out / ONNX_FILE, spec.window, len(spec.leads))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (out / CARD_FILE).write_text(render_card(config, probe_results, license_id))
    return config


def check_reload(out: Path, module: nn.Module, inputs: np.ndarray) -> float:
    """Reload the written folder and compare its features with `module`'s; raise if they differ."""
    reloaded = load_encoder(out)
    want = window_features(module, inputs)
    got = window_features(reloaded, inputs)
    diff = float(np.abs(want - got).max())
    if not diff <= EXACT_TOL:
        raise EcgposError(f"reloaded export differs from the training encoder (max abs diff {diff:.2e})")
    return diff
