"""ONNX export of forward_features, checked against PyTorch with onnxruntime before it counts.

The graph maps `ecg` (batch, 12, window) float32 preprocessed windows to `features` (batch, width);
batch is dynamic. torch 2.14's default exporter (dynamo=True, torch.export + onnxscript) is used;
when it cannot trace a model, the TorchScript-based exporter (dynamo=False) is tried. Either way
the file only stays if onnxruntime reproduces PyTorch at batch 1 and 7.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos.errors import EcgposError

OPSET = 18
CHECK_BATCHES = (1, 7)
RTOL = 1e-4  # max |onnx - torch| / max |torch|
INPUT_NAME = "ecg"
OUTPUT_NAME = "features"


def require_onnx() -> tuple[Any, Any]:
    """(onnx, onnxruntime) modules, or an EcgposError saying which optional extra to install."""
    missing = []
    modules = []
    for name in ("onnx", "onnxruntime"):
        try:
            modules.append(__import__(name))
        except ImportError:
            missing.append(name)
    if missing:
        raise EcgposError(f"ONNX support needs {' and '.join(missing)}: pip install 'ecgpos[export]'")
    return modules[0], modules[1]


class _Features(nn.Module):
    """forward = encoder.<method> (forward_features: the pooled-feature path only; a classifier's forward:
    its probabilities)."""

    def __init__(self, encoder: nn.Module, method: str = "forward_features") -> None:
        super().__init__()
        self.encoder = encoder
        self.method = method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.encoder, self.method)(x)


def _export(model: nn.Module, example: torch.Tensor, path: Path, dynamo: bool, output: str = OUTPUT_NAME) -> None:
    kwargs: dict[str, Any] = dict(opset_version=OPSET, input_names=[INPUT_NAME], output_names=[output], dynamo=dynamo)
    if dynamo:
        kwargs.update(
            dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=4096)}}, external_data=False, verbose=False
        )
    else:
        kwargs["dynamic_axes"] = {INPUT_NAME: {0: "batch"}, output: {0: "batch"}}
    # The exporters narrate their steps and warn about deprecations on stdout/stderr; the CLI
    # reports the outcome itself.
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(path), **kwargs)


def onnx_features(path: str | Path, x: np.ndarray) -> np.ndarray:
    """Run encoder.onnx on (B, 12, window) float32 with onnxruntime (CPU) -> (B, width)."""
    _, ort = require_onnx()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: np.ascontiguousarray(x, dtype=np.float32)})[0]


@torch.no_grad()
def check_onnx(
    path: str | Path, module: nn.Module, window: int, num_leads: int = 12, method: str = "forward_features"
) -> dict[str, float]:
    """Max relative error of onnxruntime vs PyTorch at each batch in CHECK_BATCHES; raise if > RTOL."""
    rng = np.random.default_rng(7)
    errors = {}
    for batch in CHECK_BATCHES:
        x = rng.standard_normal((batch, num_leads, window)).astype(np.float32)
        want = getattr(module, method)(torch.from_numpy(x)).float().numpy()
        got = onnx_features(path, x)
        if got.shape != want.shape:
            raise EcgposError(f"ONNX output shape {got.shape} != PyTorch {want.shape} at batch {batch}")
        rel = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-12))
        errors[f"batch_{batch}"] = rel
        if not rel <= RTOL:
            raise EcgposError(
                f"ONNX export disagrees with PyTorch at batch {batch}: max relative error {rel:.2e} > {RTOL:.0e}"
            )
    return errors


def export_onnx(
    module: nn.Module,
    path: str | Path,
    window: int,
    num_leads: int = 12,
    method: str = "forward_features",
    output: str = OUTPUT_NAME,
) -> dict[str, Any]:
    """Write `path` (ONNX, opset OPSET, dynamic batch) of CPU float32 `module`'s `method`, its output named
    `output`; return a summary dict.

    Raises EcgposError when the extra is missing, both exporters fail, or the check fails.
    """
    onnx, _ = require_onnx()
    path = Path(path)
    model = _Features(module, method).eval()
    example = torch.zeros(2, num_leads, window)  # batch 2: torch.export would specialise a batch of 1
    failures = []
    for dynamo in (True, False):
        try:
            _export(model, example, path, dynamo, output)
            onnx.checker.check_model(str(path))
            errors = check_onnx(path, module, window, num_leads, method)
            return {
                "file": path.name,
                "opset": OPSET,
                "exporter": "dynamo" if dynamo else "torchscript",
                "input": INPUT_NAME,
                "output": output,
                "dynamic_axes": {"batch": 0},
                "max_relative_error": errors,
            }
        except Exception as err:  # exporter internals raise many types; try the other, report both
            text = str(err).strip().splitlines()[0] if str(err).strip() else ""
            name = "" if isinstance(err, EcgposError) else f"{type(err).__name__}: "
            failures.append(f"{'dynamo' if dynamo else 'torchscript'} exporter: {name}{text}")
            path.unlink(missing_ok=True)
    raise EcgposError(f"ONNX export failed ({'; '.join(failures)})")
