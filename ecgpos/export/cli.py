"""`ecgpos export --run-dir RUN --out DIR [--onnx] [--probe-results DIR]`: a frozen encoder folder.

Everything is written into a temporary sibling folder, reloaded from disk and checked against the
training checkpoint's features (and, with --onnx, against onnxruntime) before it is moved to DIR,
so a failed export never leaves a half-written folder that looks valid. An earlier export at DIR
is replaced (re-running a pipeline works); any other non-empty DIR is refused.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from .. import __version__
from ..config import read_yaml
from ..embedding import window_features
from ..errors import EcgposError
from . import CARD_FILE, CONFIG_FILE, FORMAT, FORMAT_VERSION, ONNX_FILE, VECTORS_FILE, WEIGHTS_FILE
from .card import render_card
from .load import load_encoder, read_export_config, state_sha256
from .vectors import ATOL, RTOL, build_vectors, save_vectors

POOLING = "mean over patch tokens (SEP tokens excluded), then the final LayerNorm"
EXACT_TOL = 1e-6  # reloaded export vs training module on CPU: same weights, same code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ecgpos export", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, type=Path, help="pretraining run folder (Stage 0 or Stage 1)")
    parser.add_argument("--out", required=True, type=Path,
                        help="export folder to create (an earlier export there is replaced)")
    parser.add_argument("--onnx", action="store_true", help="also write encoder.onnx (needs ecgpos[export])")
    parser.add_argument("--probe-results", type=Path, default=None,
                        help="folder written by `ecgpos probe` (summary.md / results.csv) for the model card")
    return parser


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
        from .onnx_export import export_onnx

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


def _public(folder: Path) -> None:
    """mkdtemp (and safetensors) create owner-only files; an export is meant to be shared."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():
        file.chmod(0o666 & ~umask)


def _prepare_out(out: Path) -> bool:
    """True when `out` holds an earlier export (replaced on success); refuse any other non-empty path."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return False
    if out.is_dir() and (out / CONFIG_FILE).is_file():
        try:
            read_export_config(out)
            return True
        except EcgposError:
            pass
    raise EcgposError(f"{out} exists and is not an ecgpos export folder; refusing to overwrite it")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..encoders import load_run_encoder

    if args.probe_results is not None and not args.probe_results.is_dir():
        raise EcgposError(f"--probe-results {args.probe_results} is not a folder")
    replacing = _prepare_out(args.out)
    loaded = load_run_encoder(args.run_dir)
    module = loaded.module.to("cpu").float().eval()
    training = training_summary(args.run_dir, dict(loaded.info or {}), loaded.arch)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{args.out.name}.partial-", dir=args.out.parent))
    try:
        with torch.no_grad():
            config = write_export(module, loaded.spec, loaded.arch, training, staging, args.onnx,
                                  args.probe_results)
            from .vectors import load_vectors

            diff = check_reload(staging, module, load_vectors(staging / VECTORS_FILE)["inputs"])
        _public(staging)
        if args.out.exists():
            shutil.rmtree(args.out)
        staging.rename(args.out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    onnx_note = ""
    if "onnx" in config:
        worst = max(config["onnx"]["max_relative_error"].values())
        onnx_note = f", {ONNX_FILE} ({config['onnx']['exporter']} exporter, max rel err {worst:.1e})"
    verb = "re-exported" if replacing else "exported"
    print(f"{verb} {config['arch'].get('kind')} encoder (step {training.get('step', '?')}, "
          f"{config['io']['features']} features) to {args.out}: {WEIGHTS_FILE}, {CONFIG_FILE}, {CARD_FILE}, "
          f"{VECTORS_FILE}{onnx_note}; reload check max abs diff {diff:.1e}")
    return 0
