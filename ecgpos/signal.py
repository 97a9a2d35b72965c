"""Pure signal transforms: float32 (leads, time) in, float32 (leads, time) out.

The order is the paper's: band-limit at the source rate (high-pass, then low-pass), standardise,
resample to the target rate, then cut a window. `preprocess_signal` is the single entry point
that pretraining shards, probes and `embed` all call.
"""
from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Sequence

import numpy as np
from scipy import signal as sps

from .errors import SignalError
from .leads import to_canonical_order
from .spec import PreprocessSpec

_EPS = 1e-6  # below this std a lead is treated as flat and set to zero, never divided by


@lru_cache(maxsize=64)
def bandpass_sos(fs: float, highpass_hz: float, lowpass_hz: float, order: int) -> np.ndarray:
    """Second-order sections of a Butterworth high-pass followed by a low-pass (cached per rate)."""
    high = sps.butter(order, highpass_hz, btype="highpass", fs=fs, output="sos")
    if lowpass_hz >= fs / 2:
        return high  # the source is already band-limited below the cut-off
    low = sps.butter(order, lowpass_hz, btype="lowpass", fs=fs, output="sos")
    return np.vstack([high, low])


def bandpass(x: np.ndarray, fs: float, highpass_hz: float = 0.67, lowpass_hz: float = 40.0,
             order: int = 4) -> np.ndarray:
    """Zero-phase (forward-backward) Butterworth band-pass along time. x: (leads, time)."""
    sos = bandpass_sos(float(fs), float(highpass_hz), float(lowpass_hz), int(order))
    return sps.sosfiltfilt(sos, x, axis=-1).astype(np.float32, copy=False)


def standardise(x: np.ndarray, mode: str = "lead") -> np.ndarray:
    """Zero mean, unit variance per lead ('lead') or over the whole record ('record').

    A flat lead (std below 1e-6) becomes all zeros instead of NaN/inf.
    """
    x = x.astype(np.float32, copy=False)
    if mode == "lead":
        mean = x.mean(axis=-1, keepdims=True)
        std = x.std(axis=-1, keepdims=True)
    elif mode == "record":
        mean = x.mean(keepdims=True).reshape(1, 1)
        std = x.std(keepdims=True).reshape(1, 1)
    else:
        raise ValueError(f"unknown standardisation mode {mode!r}")
    flat = std < _EPS
    out = (x - mean) / np.where(flat, 1.0, std)
    return np.where(flat, 0.0, out).astype(np.float32, copy=False)


def resample_factors(fs_in: float, fs_out: float) -> tuple[int, int]:
    """Exact rational (up, down) with fs_out / fs_in = up / down; raise if the rate is not rational."""
    src = Fraction(fs_in).limit_denominator(1000)
    if abs(float(src) - float(fs_in)) > 1e-9 or src <= 0:
        raise SignalError("sampling_rate", f"cannot resample from {fs_in} Hz exactly")
    ratio = Fraction(fs_out) / src
    if ratio.numerator > 1000 or ratio.denominator > 1000:
        raise SignalError("sampling_rate", f"no small rational factor from {fs_in} Hz to {fs_out} Hz")
    return ratio.numerator, ratio.denominator


def resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """Polyphase resampling along time with exact rational factors (scipy.signal.resample_poly)."""
    up, down = resample_factors(fs_in, fs_out)
    if up == down:
        return x.astype(np.float32, copy=False)
    return sps.resample_poly(x, up, down, axis=-1).astype(np.float32, copy=False)


def resampled_length(n: int, fs_in: float, fs_out: float) -> int:
    """Number of samples `resample` returns for n input samples."""
    up, down = resample_factors(fs_in, fs_out)
    return -(-n * up // down)


def centre_window(x: np.ndarray, window: int) -> np.ndarray:
    """The centred `window` samples of x (leads, time); x must be at least that long."""
    start = (x.shape[-1] - window) // 2
    return x[..., start:start + window]


def window_starts(length: int, window: int, count: int) -> list[int]:
    """Start indices of `count` windows spread evenly over a record (one centred window if count == 1)."""
    if length < window:
        raise SignalError("too_short", f"{length} samples < window {window}")
    if count <= 1 or length == window:
        return [(length - window) // 2]
    return [int(round(s)) for s in np.linspace(0, length - window, count)]


def pad_to(x: np.ndarray, length: int) -> np.ndarray:
    """Zero-pad at the end along time to `length` samples (no-op if already long enough)."""
    missing = length - x.shape[-1]
    if missing <= 0:
        return x
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, missing)])


def check_finite(x: np.ndarray) -> None:
    """Raise SignalError('non_finite') when any sample is NaN or inf."""
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).sum())
        raise SignalError("non_finite", f"{bad} NaN/inf samples")


def preprocess_signal(x: np.ndarray, fs: float, leads: Sequence[str], spec: PreprocessSpec) -> np.ndarray:
    """Raw (leads, time) in mV at rate fs, any lead order -> float32 (12, T') at spec.fs, canonical order.

    The full record is returned (no windowing): callers pick windows with `centre_window` /
    `window_starts`. Raises SignalError for unknown/missing/duplicate leads, NaN/inf samples and
    rates that cannot be resampled exactly.
    """
    x = np.asarray(x)
    x = to_canonical_order(x, leads)
    check_finite(x)
    resample_factors(fs, spec.fs)  # fail before filtering on an impossible rate
    lowpass = min(spec.lowpass_hz, fs / 2)
    y = bandpass(x.astype(np.float64, copy=False), fs, spec.highpass_hz, lowpass, spec.filter_order)
    y = standardise(y, spec.standardise)
    return resample(y, fs, spec.fs)
