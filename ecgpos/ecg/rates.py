"""The one sampling-rate parser every reader uses (WFDB headers, CODE-15, `.npy --fs`).

A rate is accepted only when it is a plain finite positive number, at most MAX_FS_HZ, and (once
the preprocessing spec is known: `ecgpos.ecg.screening`) above twice the spec's low-pass cut-off
(40 Hz by default, so more than 80 Hz: below that the band cannot be represented). Anything else
is a SignalError with reason `sampling_rate`, never a library default (wfdb reads a header rate of
`-500` as 250 Hz and `500e3` as 500 Hz) and never a filter-design error deep inside scipy.
"""

from __future__ import annotations

import math
import re

from ecgpos.ecg.spec import MAX_FS_HZ, PreprocessSpec
from ecgpos.errors import SignalError

"""Highest accepted rate: far above any clinical ECG (500-1000 Hz) and within exact resampling."""

# The WFDB record line's rate field: `fs[/counter_freq[(base_counter)]]`.
_WFDB_RATE = re.compile(r"^(?P<fs>[^/()]*)(?:/(?P<counter>[^()]*)(?:\((?P<base>[^()]*)\))?)?$")


def supported_range(spec: PreprocessSpec | None = None) -> tuple[float, float]:
    """(exclusive minimum, inclusive maximum) rate in Hz for records preprocessed with `spec`
    (without a spec: any positive rate up to MAX_FS_HZ)."""
    return (2.0 * spec.lowpass_hz if spec is not None else 0.0), MAX_FS_HZ


def check_fs(value: float, spec: PreprocessSpec | None = None, what: str = "sampling rate") -> float:
    """`value` as float when finite and inside `supported_range(spec)`; else SignalError('sampling_rate')."""
    try:
        fs = float(value)
    except (TypeError, ValueError):
        raise SignalError("sampling_rate", f"{what} {value!r} is not a number") from None
    low, high = supported_range(spec)
    if not math.isfinite(fs) or fs <= 0:
        raise SignalError("sampling_rate", f"{what} {value!r} is not a positive finite number")
    if not low < fs <= high:
        raise SignalError("sampling_rate", f"{what} {fs:g} Hz is outside the supported range ({low:g} Hz, {high:g} Hz]")
    return fs


def parse_fs(text: str, spec: PreprocessSpec | None = None, what: str = "sampling rate") -> float:
    """A rate written as text (a header field, a CLI flag): a plain decimal number, then `check_fs`.

    Python's float() grammar decides what a number is, so `500.0.0` and `1e1e` are refused;
    `500e3` parses (500 kHz) and is refused by the range.
    """
    token = str(text).strip()
    try:
        fs = float(token)
    except ValueError:
        raise SignalError("sampling_rate", f"{what} {token!r} is not a number") from None
    return check_fs(fs, spec, what)


def wfdb_header_fs(header_text: str, spec: PreprocessSpec | None = None) -> float:
    """The sampling rate of a WFDB header's record line, parsed strictly.

    A header without a rate field is refused rather than given WFDB's default of 250 Hz: an ECG
    whose rate is not stated cannot be filtered or resampled correctly.
    """
    for line in header_text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) > 1 and not fields[1].isdigit():  # the signal count: text here is no WFDB header
            raise SignalError("unreadable", f"bad WFDB record line {line[:60]!r}")
        if len(fields) < 3:
            raise SignalError("sampling_rate", "header states no sampling rate (WFDB would assume 250 Hz)")
        match = _WFDB_RATE.match(fields[2])
        if match is None or not match.group("fs"):
            raise SignalError("sampling_rate", f"header rate field {fields[2]!r} is malformed")
        return parse_fs(match.group("fs"), spec, "header sampling rate")
    raise SignalError("unreadable", "empty header")
