"""Pure signal transforms: float32 (leads, time) in, float32 (leads, time) out.

The order is the paper's: band-limit at the source rate (high-pass, then low-pass), standardise,
resample to the target rate, then cut a window. `preprocess_batch` is what pretraining shards,
probes and `embed` all call (after `ecgpos.ecg.screening.screen_record`); `preprocess_signal`, its
one-record form, is what `ecgpos.models.features` (the API's `encoder.embed`) calls. Both give a
record the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy import signal as sps

from ecgpos.ecg.leads import to_canonical_order
from ecgpos.ecg.rates import MAX_FS_HZ, check_fs
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError, SignalError

_EPS = 1e-6  # below this std a lead is treated as flat and set to zero, never divided by

MAX_WHOLE_SECONDS = 300.0
"""Records up to this long (at their own rate) are preprocessed whole; longer ones (Holter
recordings) on their centre span of this length (`record_span`). Five minutes keeps every record of
the supported corpora whole (10 s PTB-XL / ecg-arrhythmia / CODE-15, CPSC2018 up to 144 s) and the
standard 5-minute short-term HRV recordings too, while bounding the memory of one record: the span
holds 300 s x fs samples per lead whatever the record's length (150,000 at 500 Hz)."""


@lru_cache(maxsize=64)
def bandpass_sos(fs: float, highpass_hz: float, lowpass_hz: float, order: int) -> np.ndarray:
    """Second-order sections of a Butterworth high-pass followed by a low-pass (cached per rate)."""
    high = sps.butter(order, highpass_hz, btype="highpass", fs=fs, output="sos")
    if lowpass_hz >= fs / 2:
        return high  # the source is already band-limited below the cut-off
    low = sps.butter(order, lowpass_hz, btype="lowpass", fs=fs, output="sos")
    return np.vstack([high, low])


def check_filter(spec: PreprocessSpec) -> None:
    """ConfigError when the spec's band-pass cannot be designed and run at its own rate (an order in the
    millions, a high-pass cut-off of 1e-300 Hz) or its rate is above MAX_FS_HZ: otherwise every record
    was skipped, each under a reason that blamed the record (unreadable, too_short, sampling_rate)."""
    if spec.fs > MAX_FS_HZ:
        raise ConfigError(f"preprocess.fs {spec.fs} is above the highest supported rate, {MAX_FS_HZ:g} Hz")
    try:
        sos = bandpass_sos(float(spec.fs), spec.highpass_hz, spec.lowpass_hz, spec.filter_order)
        sps.sosfilt_zi(sos)  # what sosfiltfilt solves first: singular for a degenerate design
    except (ValueError, MemoryError, OverflowError) as err:  # numpy's LinAlgError is a ValueError
        raise ConfigError(
            f"no usable Butterworth band-pass of order {spec.filter_order} for {spec.highpass_hz:g}-"
            f"{spec.lowpass_hz:g} Hz at {spec.fs} Hz ({err})"
        ) from None


def bandpass(
    x: np.ndarray, fs: float, highpass_hz: float = 0.67, lowpass_hz: float = 40.0, order: int = 4
) -> np.ndarray:
    """Zero-phase (forward-backward) Butterworth band-pass along time. x: (..., time) -> float32.

    scipy's sosfiltfilt on the cached per-rate design; raises SignalError('too_short') when the
    record is shorter than the filter's edge padding.
    """
    sos = bandpass_sos(float(fs), float(highpass_hz), float(lowpass_hz), int(order))
    try:
        # float64 from the start, edge extension included, so the result is exactly sosfiltfilt on float64 data
        return sps.sosfiltfilt(sos, np.asarray(x, dtype=np.float64), axis=-1).astype(np.float32)
    except ValueError as err:  # scipy: "The length of the input vector x must be greater than padlen"
        raise SignalError("too_short", f"{x.shape[-1]} samples: too short to filter ({err})") from None


def standardise(x: np.ndarray, mode: str = "lead") -> np.ndarray:
    """Zero mean, unit variance per lead ('lead') or over the whole record ('record').

    A flat lead (std below 1e-6) becomes all zeros instead of NaN/inf.
    """
    return _standardise_inplace(np.array(x, dtype=np.float32), mode)  # a private copy


def _standardise_inplace(y: np.ndarray, mode: str) -> np.ndarray:
    """`standardise` on a float32 array the caller owns; (..., leads, time), one record per (leads, time)."""
    if mode == "record" and y.ndim > 2:  # per record, each exactly as a lone (leads, time) record
        for record in y.reshape(-1, *y.shape[-2:]):
            _standardise_inplace(record, mode)
        return y
    if mode == "lead":
        y -= y.mean(axis=-1, keepdims=True)
        std = np.sqrt(np.einsum("...t,...t->...", y, y) / y.shape[-1])[..., None]
    elif mode == "record":
        y -= y.mean()
        std = np.full((1,) * y.ndim, np.sqrt(np.vdot(y, y) / y.size), dtype=np.float32)
    else:
        raise ValueError(f"unknown standardisation mode {mode!r}")
    flat = std < _EPS
    y *= np.where(flat, 0.0, 1.0 / np.where(flat, 1.0, std)).astype(np.float32)
    return y


def resample_factors(fs_in: float, fs_out: float) -> tuple[int, int]:
    """Exact rational (up, down) with fs_out / fs_in = up / down; raise if the rate is not rational."""
    src = Fraction(fs_in).limit_denominator(1000)
    if abs(float(src) - float(fs_in)) > 1e-9 or src <= 0:
        raise SignalError("sampling_rate", f"cannot resample from {fs_in} Hz exactly")
    ratio = Fraction(fs_out) / src
    if ratio.numerator > 1000 or ratio.denominator > 1000:
        raise SignalError("sampling_rate", f"no small rational factor from {fs_in} Hz to {fs_out} Hz")
    return ratio.numerator, ratio.denominator


@lru_cache(maxsize=32)
def _polyphase_fir(up: int, down: int) -> np.ndarray:
    """The anti-aliasing FIR that resample_poly designs by default (Kaiser beta 5, 10 zero crossings)."""
    max_rate = max(up, down)
    return sps.firwin(2 * 10 * max_rate + 1, 1.0 / max_rate, window=("kaiser", 5.0))


@lru_cache(maxsize=32)
def _polyphase_fir32(up: int, down: int) -> np.ndarray:
    return _polyphase_fir(up, down).astype(np.float32)


def resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """Polyphase resampling along time with exact rational factors (scipy.signal.resample_poly).

    The default FIR is designed once per (up, down) and passed in: equal to resample_poly's own
    default design, without redoing it for every record.
    """
    up, down = resample_factors(fs_in, fs_out)
    x = np.asarray(x, dtype=np.float32)
    if up == down:
        return x
    fir = _polyphase_fir32(up, down) if x.dtype == np.float32 else _polyphase_fir(up, down)
    return sps.resample_poly(x, up, down, axis=-1, window=fir).astype(np.float32, copy=False)


def resampled_length(n: int, fs_in: float, fs_out: float) -> int:
    """Number of samples `resample` returns for n input samples."""
    up, down = resample_factors(fs_in, fs_out)
    return -(-n * up // down)


def window_starts(length: int, window: int, count: int) -> list[int]:
    """Start indices of `count` windows spread evenly over a record (one centred window if count == 1)."""
    if length < window:
        raise SignalError("too_short", f"{length} samples < window {window}")
    if count <= 1 or length == window:
        return [(length - window) // 2]
    return [int(round(s)) for s in np.linspace(0, length - window, count)]


def record_span(length: int, fs: float) -> tuple[int, int]:
    """[start, stop) of the raw samples used of a record of `length` samples at `fs` Hz.

    The whole record when it lasts at most MAX_WHOLE_SECONDS (length <= floor(300 * fs)), else the
    centred span of that many samples, (length - span) // 2 on: the one rule every reader and
    screening apply, so a long record is read, screened, filtered and standardised on this span
    alone. A rate that is not a positive number leaves the record whole (screening refuses it).
    """
    try:
        keep = int(np.floor(MAX_WHOLE_SECONDS * float(fs)))
    except (TypeError, ValueError, OverflowError):
        return 0, length
    if not 0 < keep < length:
        return 0, length
    start = (length - keep) // 2
    return start, start + keep


def seconds_text(samples: int, fs: float) -> str:
    """`samples` at `fs` Hz in seconds as the outputs that list record durations write it (index.csv
    `duration_s`, `ecgpos embed`'s FILE.long.csv): to the microsecond, without trailing zeros."""
    return format(round(samples / float(fs), 6), ".15g")


def pad_to(x: np.ndarray, length: int) -> np.ndarray:
    """Zero-pad at the end along time to `length` samples (no-op if already long enough)."""
    missing = length - x.shape[-1]
    if missing <= 0:
        return x
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, missing)])


def check_finite(x: np.ndarray) -> None:
    """Raise SignalError('non_finite') when any sample is NaN or inf."""
    # A float64 sum of finite float32/float64-range values is finite unless a NaN/inf is present
    # (float32 maxima cannot overflow it): one pass, no boolean temporary.
    if not np.isfinite(np.sum(x, dtype=np.float64)) and not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).sum())
        raise SignalError("non_finite", f"{bad} NaN/inf samples")


DEAD_LEAD_PTP_MV = 0.01
"""A lead whose peak-to-peak amplitude is below 10 uV carries no ECG (lead off, zero-filled)."""

ASSUMED_GAIN = 200.0
"""ADC units per mV that WFDB (and wfdb) assume for a lead whose header gain is 0 or absent
("uncalibrated"): such a lead's mV are made up (`ecgpos.ecg.screening` says how it is judged)."""


def dead_leads(x: np.ndarray, min_ptp_mv: float = DEAD_LEAD_PTP_MV) -> np.ndarray:
    """Boolean (leads,): True where a raw (leads, time) mV lead is flat (all-zero or constant)."""
    return np.ptp(x, axis=-1) < min_ptp_mv


def screen_ptp(x: np.ndarray) -> np.ndarray:
    """`check_finite(x)` and the per-lead peak-to-peak (..., leads) in one max/min pass (time > 0).

    NaN and inf propagate through max/min, so a non-finite sample is always caught; the result is
    `np.ptp(x, axis=-1)` (the same max - min in x's dtype for floats; integers in int64, where an
    int16 lead spanning its full range cannot wrap around to a negative, "dead" amplitude).
    """
    hi, lo = x.max(axis=-1), x.min(axis=-1)
    if x.dtype.kind in "iu":
        return hi.astype(np.int64) - lo.astype(np.int64)
    if not (np.isfinite(hi).all() and np.isfinite(lo).all()):
        check_finite(x)  # raises with the count
    return hi - lo


def screen(x: np.ndarray, min_ptp_mv: float = DEAD_LEAD_PTP_MV) -> np.ndarray:
    """`check_finite(x)` and then `dead_leads(x)` in one max/min pass over a (..., leads, time) array."""
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], dtype=bool)
    return screen_ptp(x) < min_ptp_mv


def preprocess_batch(x: np.ndarray, fs: float, spec: PreprocessSpec, dead: np.ndarray | None = None) -> np.ndarray:
    """k canonical-order raw records of equal length, (k, 12, time) in mV at fs -> float32 (k, 12, T').

    Every step works per lead (filtering, resampling) or per record (standardisation), so record i
    of the batch is bit-for-bit what `preprocess_signal` returns for it alone (tested): batching
    only amortises scipy's per-call overhead. `dead` (k, 12) marks leads to zero (see `screen`);
    the input must already be finite.
    """
    fs = check_fs(fs, spec)  # SignalError('sampling_rate'), never scipy's filter-design ValueError
    resample_factors(fs, spec.fs)  # fail before filtering on an impossible rate
    lowpass = min(spec.lowpass_hz, fs / 2)
    y = bandpass(x, fs, spec.highpass_hz, lowpass, spec.filter_order)  # a fresh float32 array
    y = _standardise_inplace(y, spec.standardise)
    y = resample(y, fs, spec.fs)
    if dead is not None and dead.any():
        y[dead] = 0.0  # a dead lead stays exactly zero (not amplified filter residue)
    return y


def preprocess_signal(x: np.ndarray, fs: float, leads: Sequence[str], spec: PreprocessSpec) -> np.ndarray:
    """Raw (leads, time) in mV at rate fs, any lead order -> float32 (12, T') at spec.fs, canonical order.

    The full record is returned (no windowing): callers pick windows with
    `window_starts`. Dead leads (peak-to-peak < DEAD_LEAD_PTP_MV) come out exactly zero. Raises
    SignalError for unknown/missing/duplicate leads, NaN/inf samples and rates that cannot be
    resampled exactly.
    """
    x = to_canonical_order(np.asarray(x), leads)
    dead = screen(x)  # raises non_finite
    return preprocess_batch(x[None], fs, spec, dead[None])[0]
