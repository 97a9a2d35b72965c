"""Test vectors: deterministic inputs and the features the exported encoder must give for them.

test_vectors.npz holds
- inputs    (n, 12, window) float32: already-preprocessed windows (sines + seeded noise, per-lead
            standardised), fed straight to forward_features -> checks the weights/architecture;
- features  (n, width) float32: their expected features;
- raw_signal (12, T) float32 mV at raw_fs with lead names raw_leads (shuffled order, alias names)
  and raw_features (width,): `embed` of that raw record -> checks preprocessing + lead mapping too.
No neurokit2 or random-state-dependent library is involved, so any installation regenerates
the same inputs from numpy alone.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos.ecg.leads import CANONICAL_LEADS, canonical_lead_name
from ecgpos.ecg.limbs import LIMB_LEADS, derived_limb_leads
from ecgpos.ecg.screening import ScreenPolicy
from ecgpos.ecg.signal import standardise
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.models.features import embed_signal, window_features

NUM_INPUTS = 3
RAW_FS = 500.0
RAW_SECONDS = 10.0
# A non-canonical order with alias spellings (CODE-15 'DI', PTB-XL 'AVR'): the raw vector
# only reproduces when `embed` maps names and order correctly.
RAW_LEADS = ("V6", "DII", "AVR", "V1", "DI", "aVF", "V3", "DIII", "V2", "AVL", "V5", "V4")
# Features must agree to this on any installation (other BLAS/CPU/GPU give ~1e-6 differences).
ATOL = 1e-4
RTOL = 1e-3


def _sines(leads: int, length: int, fs: float, seed: int) -> np.ndarray:
    """(leads, length) float32: per-lead sums of two sines (0.8-2.5 Hz and harmonics) + seeded noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(length) / fs
    base = 0.8 + 1.7 * rng.random((leads, 1))
    phase = 2 * np.pi * rng.random((leads, 2))
    x = np.sin(2 * np.pi * base * t + phase[:, :1]) + 0.4 * np.sin(2 * np.pi * 7.3 * base * t + phase[:, 1:])
    return (x + 0.1 * rng.standard_normal((leads, length))).astype(np.float32)


def make_inputs(spec: PreprocessSpec, count: int = NUM_INPUTS) -> np.ndarray:
    """(count, 12, spec.window) float32 preprocessed-like windows, identical on every machine."""
    return np.stack(
        [
            standardise(_sines(len(CANONICAL_LEADS), spec.window, spec.fs, seed), spec.standardise)
            for seed in range(count)
        ]
    )


def make_raw_record() -> tuple[np.ndarray, float, tuple[str, ...]]:
    """A raw 500 Hz, 10 s record in mV with shuffled, alias-named leads; III, aVR, aVL and aVF derived
    from I and II, so its limb leads pass screening's lead_mismatch check as a recording's do."""
    signal = 0.5 * _sines(len(RAW_LEADS), int(RAW_FS * RAW_SECONDS), RAW_FS, seed=1000)
    row = {canonical_lead_name(name): k for k, name in enumerate(RAW_LEADS)}
    derived = [row[name] for name in LIMB_LEADS[2:]]
    signal[derived] = derived_limb_leads(signal[row["I"]], signal[row["II"]])
    return signal, RAW_FS, RAW_LEADS


def build_vectors(module: nn.Module, spec: PreprocessSpec) -> dict[str, np.ndarray]:
    """Inputs and expected outputs of `module` (eval, CPU float32) as arrays for test_vectors.npz."""
    inputs = make_inputs(spec)
    raw, fs, leads = make_raw_record()
    return {
        "inputs": inputs,
        "features": window_features(module, inputs),
        "raw_signal": raw,
        "raw_fs": np.array(fs),
        "raw_leads": np.array(leads),
        "raw_features": embed_signal(module, raw, fs, leads, spec),
    }


def save_vectors(path: str | Path, vectors: dict[str, np.ndarray]) -> None:
    np.savez(path, **vectors)


def load_vectors(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays of test_vectors.npz (allow_pickle=False: plain numeric/string arrays only)."""
    path = Path(path)
    if not path.is_file():
        raise EcgposError(f"{path} is missing: the export has no test vectors")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:  # EOFError: empty; BadZipFile: cut short
        raise EcgposError(f"{path} is not a readable test-vector file: {err}") from None


def compare(expected: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    """{'ok', 'max_abs', 'max_rel'} for got vs expected under ATOL/RTOL (shapes must agree)."""
    if expected.shape != got.shape:
        return {
            "ok": False,
            "max_abs": float("inf"),
            "max_rel": float("inf"),
            "detail": f"shape {got.shape} != expected {expected.shape}",
        }
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = max_abs / max(float(np.abs(expected).max()) if expected.size else 0.0, 1e-12)
    ok = bool(np.all(diff <= ATOL + RTOL * np.abs(expected)) and np.isfinite(got).all())
    return {"ok": ok, "max_abs": max_abs, "max_rel": max_rel, "detail": ""}


@torch.no_grad()
def run_vectors(encoder: Any, vectors: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """Feed the stored inputs to an ExportedEncoder; comparison per check ('features', 'embed')."""
    missing = [
        k for k in ("inputs", "features", "raw_signal", "raw_fs", "raw_leads", "raw_features") if k not in vectors
    ]
    if missing:
        raise EcgposError(f"test vectors lack {', '.join(missing)}")
    for key in ("inputs", "features", "raw_signal", "raw_fs", "raw_features"):
        if vectors[key].dtype.kind not in "iuf":
            raise EcgposError(f"stored {key} must hold numbers, got dtype {vectors[key].dtype}")
    if vectors["raw_fs"].shape != ():
        raise EcgposError(f"stored raw_fs must be one number, got shape {vectors['raw_fs'].shape}")
    feats = window_features(encoder, vectors["inputs"], device=encoder.device)
    # Exports written before the lead_mismatch check store a raw record of independent sines in every
    # lead: its limb leads are left unchecked, as they were when its features were computed.
    raw_leads = [str(x) for x in vectors["raw_leads"]]
    unchecked = ScreenPolicy(check_limb_leads=False)
    raw = embed_signal(
        encoder,
        vectors["raw_signal"],
        float(vectors["raw_fs"]),
        raw_leads,
        encoder.spec,
        device=encoder.device,
        policy=unchecked,
    )
    return {"features": compare(vectors["features"], feats), "embed": compare(vectors["raw_features"], raw)}


@torch.no_grad()
def run_probabilities(classifier: Any, vectors: dict[str, np.ndarray]) -> dict[str, Any]:
    """A classifier export's probabilities of the stored inputs against its stored `probabilities`."""
    if "probabilities" not in vectors or vectors["probabilities"].dtype.kind != "f":
        raise EcgposError("the classifier's test vectors lack its probabilities")
    inputs = torch.from_numpy(np.ascontiguousarray(vectors["inputs"], dtype=np.float32)).to(classifier.device)
    return compare(vectors["probabilities"], classifier(inputs).float().cpu().numpy())
