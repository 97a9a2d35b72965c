"""Writing an export folder from a frozen encoder (`ecgpos export` is the command).

Everything is written into a temporary sibling folder, reloaded from disk and checked against the
training checkpoint's features (and, with --onnx, against onnxruntime) before it is moved to DIR,
so a failed export never leaves a half-written folder that looks valid. An earlier export at DIR
is replaced (re-running a pipeline works); any other non-empty DIR is refused.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos import __version__
from ecgpos.config import read_yaml
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
    state_sha256,
)
from ecgpos.export.load import load_encoder
from ecgpos.export.vectors import ATOL, RTOL, build_vectors, save_vectors
from ecgpos.models.features import window_features

POOLING = "mean over patch tokens (SEP tokens excluded), then the final LayerNorm"
EXACT_TOL = 1e-6  # reloaded export vs training module on CPU: same weights, same code


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}


def _shards_summary(shards: Any) -> dict[str, Any]:
    """Source corpora and record count of the shard folder(s), from their preprocess.json files."""
    folders = [shards] if isinstance(shards, (str, Path)) else list(shards or [])
    sources, records = [], 0
    for folder in folders:
        info = _read_json(Path(str(folder)) / "preprocess.json")
        settings = info.get("settings") if isinstance(info.get("settings"), dict) else {}
        sources.append(str(info.get("source") or settings.get("source") or folder))
        counts = info.get("counts") if isinstance(info.get("counts"), dict) else {}
        records = None if records is None or counts.get("stored") is None else records + int(counts["stored"])
    out: dict[str, Any] = {"data": " + ".join(sources)} if sources else {}
    if sources and records is not None:
        out["records"] = records
    return out


def training_summary(run_dir: Path, info: dict[str, Any], arch: dict[str, Any]) -> dict[str, Any]:
    """Training facts for config.json and the model card, from run_info.json, config.yaml and `info`."""
    run_info = {**_read_json(run_dir / "run_info.json"), **{k: v for k, v in info.items() if _jsonable(v)}}
    config = read_yaml(run_dir / "config.yaml") if (run_dir / "config.yaml").is_file() else {}
    optim, train = config.get("optim", {}) or {}, config.get("train", {}) or {}
    push_pull = config.get("push_pull", {}) or {}
    summary: dict[str, Any] = {
        "name": run_dir.resolve().name,
        "run_dir": str(run_dir.resolve()),
        "stage": run_info.get("stage", config.get("stage", 1 if arch.get("kind") == "nested" else 0)),
        "step": run_info.get("step"),
        "steps": optim.get("steps"),
        "finished": run_info.get("finished"),
        "batch_size": train.get("batch_size"),
        "lr": optim.get("lr"),
        "mask_ratio": config.get("mask_ratio"),
        "push_pull": (f"on (alpha {push_pull.get('alpha')}, lambda {push_pull.get('lambda_pp')}, "
                      f"{push_pull.get('perturbation')})") if push_pull.get("enabled") else
                     ("off" if push_pull else None),
        "records": run_info.get("num_train_records"),
        "stage0": run_info.get("stage0"),
        "checkpoint": run_info.get("checkpoint") or info.get("checkpoint"),
    }
    if summary["stage"] != 1:
        summary.pop("push_pull")  # a Stage-1 objective; meaningless for a Stage-0 run
    shards = _shards_summary(run_info.get("shards") or config.get("shards"))
    summary.update({k: v for k, v in shards.items() if summary.get(k) is None})
    return {k: v for k, v in summary.items() if v is not None}


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def weights_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous, unshared CPU copies of the module's tensors (safetensors refuses shared storage)."""
    return {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in module.state_dict().items()}


@torch.no_grad()
def write_export(module: nn.Module, spec: Any, arch: dict[str, Any], training: dict[str, Any], out: Path,
                 onnx: bool = False, probe_results: Path | None = None) -> dict[str, Any]:
    """Write all export files of a CPU float32 eval `module` into the (empty) folder `out`; return config."""
    from safetensors.torch import save_file

    state = weights_state(module)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": FORMAT})
    vectors = build_vectors(module, spec)
    save_vectors(out / VECTORS_FILE, vectors)
    config: dict[str, Any] = {
        "format": FORMAT, "version": FORMAT_VERSION, "ecgpos_version": __version__,
        "arch": arch, "preprocess": spec.to_dict(), "pooling": POOLING,
        "io": {"input": ["batch", len(spec.leads), spec.window], "input_dtype": "float32",
               "features": int(vectors["features"].shape[1]),
               "tokens": list(module.forward_tokens(torch.from_numpy(vectors["inputs"][:1])).shape[1:])},
        "weights_sha256": state_sha256(state),
        "test_vectors": {"file": VECTORS_FILE, "atol": ATOL, "rtol": RTOL},
        "training": training,
    }
    if onnx:
        from ecgpos.export.onnx_export import export_onnx

        config["onnx"] = export_onnx(module, out / ONNX_FILE, spec.window, len(spec.leads))
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    (out / CARD_FILE).write_text(render_card(config, probe_results))
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


def make_public(folder: Path) -> None:
    """mkdtemp (and safetensors) create owner-only files; an export is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():
        file.chmod(0o666 & ~umask)
