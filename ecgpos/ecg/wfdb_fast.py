"""A fast, exact reader for single-file WFDB format-16 records (ecg-arrhythmia `.mat`, PTB-XL `.dat`).

`wfdb.rdrecord` spends ~2.5 ms per record parsing the header through pandas look-ups, more than
the whole signal pipeline. This reader parses the header with wfdb's own grammar (the public
regular expressions in `wfdb.io.header`), reads the samples the way wfdb does for format 16
(little-endian int16, frame-interleaved, from the header's byte offset) and converts them with
wfdb's formula `(digital - baseline) / gain`, with -32768 (the format's invalid-sample code) as NaN.
Tests check it equals `wfdb.rdrecord` on every real sample record. Headers outside this scope
(several signal files, other formats, multi-segment, units other than mV) return None
so the caller falls back to `ecgpos.ecg.wfdb_io.read_wfdb_record`.

It also checks what wfdb does not: the file holds exactly the samples the header promises, the
MATLAB v4 matrix header agrees with the WFDB header, and every lead's checksum and initial value
match, so truncated, corrupt and mismatched files become specific skip reasons.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from wfdb.io.header import rx_record, rx_signal

from ecgpos.ecg.rates import wfdb_header_fs
from ecgpos.ecg.signal import ASSUMED_GAIN, record_span
from ecgpos.ecg.wfdb_io import (
    RawRecord,
    check_checksums,
    check_data_size,
    check_mat_header,
    header_gain,
    read_wfdb_record,
    record_path,
)
from ecgpos.errors import SignalError

_INVALID_FMT16 = -32768  # WFDB's "no sample" value for format 16


@dataclass(frozen=True)
class FastHeader:
    """The parts of a WFDB header the fast path needs."""

    record_name: str
    fs: float
    sig_len: int
    file_name: str
    byte_offset: int
    gains: np.ndarray  # (leads,) float64 adu per mV
    baselines: np.ndarray  # (leads,) float64 adu
    init_values: list[int | None]
    checksums: list[int | None]
    leads: list[str]
    comments: list[str]
    uncalibrated: tuple[str, ...]  # leads whose gain field is 0 or absent (`header_gain`)


def _num(text: str, kind: type = float):
    return kind(text) if text not in ("", None) else None


def parse_header(text: str) -> FastHeader | None:
    """Parse a single-segment, single-file, format-16, mV header; None when outside that scope.

    Raises SignalError('unreadable') when the header does not follow the WFDB grammar.
    """
    lines = [line.strip() for line in text.splitlines()]
    comments = [line.strip(" \t#") for line in lines if line.startswith("#")]  # as wfdb keeps them
    body = [line for line in lines if line and not line.startswith("#")]
    if not body:
        raise SignalError("unreadable", "empty header")
    match = rx_record.match(body[0])
    if match is None:
        raise SignalError("unreadable", f"bad WFDB record line {body[0][:60]!r}")
    name, n_seg, n_sig, fs, _cf, _bc, sig_len, _time, _date = match.groups()
    if n_seg or not n_sig or not fs or not sig_len:
        return None
    n_sig_i, sig_len_i = int(n_sig), int(sig_len)
    signal_lines = body[1:]
    if len(signal_lines) != n_sig_i:
        raise SignalError("header_mismatch", f"header declares {n_sig_i} signals but lists {len(signal_lines)}")
    fields = []
    for line in signal_lines:
        m = rx_signal.match(line)
        if m is None:
            raise SignalError("unreadable", f"bad WFDB signal line {line[:60]!r}")
        fields.append(m.groups())
    files = {f[0] for f in fields}
    offsets = {f[4] for f in fields}
    if (
        len(files) != 1
        or len(offsets) != 1
        or any(f[1] != "16" for f in fields)
        or any(f[2] not in ("", "1") or f[3] not in ("", "0") for f in fields)
        or any(f[7] not in ("", "mV") for f in fields)
    ):
        return None
    # wfdb's read defaults: an uncalibrated lead (gain 0 or absent) at ASSUMED_GAIN, baseline = ADC
    # zero if given, else 0. `uncalibrated` names those leads, for screening to judge (`header_gain`).
    stated = [header_gain(f[5]) for f in fields]
    gains = np.array([ASSUMED_GAIN if gain is None else gain for gain in stated])
    baselines = np.array([float(f[6] if f[6] else f[9] if f[9] else 0) for f in fields])
    return FastHeader(
        record_name=name,
        fs=float(fs),
        sig_len=sig_len_i,
        file_name=fields[0][0],
        byte_offset=int(fields[0][4] or 0),
        gains=gains,
        baselines=baselines,
        init_values=[_num(f[10], int) for f in fields],
        checksums=[_num(f[11], int) for f in fields],
        leads=[f[13] for f in fields],
        comments=comments,
        uncalibrated=tuple(f[13] for f, gain in zip(fields, stated) if gain is None),
    )


def read_fast(base: Path) -> RawRecord | None:
    """Read record `base` (path without extension) in mV, or None when outside the fast path.

    A record longer than 300 s is read on its centre span (`ecgpos.ecg.signal.record_span`): only
    that span is converted, and the checksums over the whole file are summed a block at a time, so
    memory does not grow with the record's length. Raises SignalError: unreadable,
    truncated_signal, corrupt_signal, header_mismatch, sampling_rate.
    """
    try:
        text = base.with_suffix(".hea").read_text(errors="replace")
    except OSError as err:
        raise SignalError("unreadable", f"{base.name}.hea: {err.strerror or err}") from None
    header = parse_header(text)
    fs = wfdb_header_fs(text)  # strict, also for headers outside the fast path
    if header is None:
        return None
    n_sig = len(header.leads)
    data_path = base.parent / header.file_name
    start, stop = record_span(header.sig_len, fs)
    try:
        with data_path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if data_path.suffix == ".mat":
                check_mat_header(handle.read(20), header.file_name, header.byte_offset, n_sig, header.sig_len)
            check_data_size(header.file_name, size, header.byte_offset + 2 * n_sig * header.sig_len)
            if (start, stop) == (0, header.sig_len):
                digital = _frames(handle, header.byte_offset, 0, header.sig_len, n_sig)
                values = _as_float64(digital)
                _check_checksums(values.sum(axis=1).astype(np.int64), digital, header)
            else:
                _check_blocks(handle, header, n_sig)
                values = _as_float64(_frames(handle, header.byte_offset, start, stop, n_sig))
    except OSError as err:
        raise SignalError("unreadable", f"{header.file_name}: {err.strerror or err}") from None
    invalid = values == _INVALID_FMT16 if values.size and values.min() == _INVALID_FMT16 else None
    values -= header.baselines[:, None]
    signal = np.empty(values.shape, dtype=np.float32)
    # wfdb's (digital - baseline) / gain, computed in float64 and rounded once to float32
    np.divide(values, header.gains[:, None], out=signal, casting="same_kind")
    if invalid is not None:
        signal[invalid] = np.nan
    return RawRecord(
        record_id=base.name,
        signal=signal,
        fs=fs,
        leads=header.leads,
        comments=header.comments,
        record_name=header.record_name,
        signal_files=(header.file_name,),
        start=start,
        total=header.sig_len,
        uncalibrated=header.uncalibrated,
    )


def read_wfdb(path: str | Path) -> RawRecord:
    """A WFDB record in mV (a path with or without extension): through `read_fast` when its header is
    within the fast path (the same samples, ~20x faster), else `read_wfdb_record`."""
    base = record_path(path)
    if base.with_suffix(".hea").is_file():  # a missing header: read_wfdb_record's own one-line answer
        try:
            raw = read_fast(base)
        except ValueError:  # a field the fast grammar cannot convert: wfdb's reading names the fault
            raw = None
        if raw is not None:
            return raw
    return read_wfdb_record(base)


def _frames(handle: BinaryIO, byte_offset: int, start: int, stop: int, n_sig: int) -> np.ndarray:
    """Frames [start, stop) of the file as an int16 (leads, time) view of the interleaved samples."""
    handle.seek(byte_offset + 2 * n_sig * start)
    count = n_sig * (stop - start)
    digital = np.frombuffer(handle.read(2 * count), "<i2", count=count)
    return digital.reshape(stop - start, n_sig).T


def _as_float64(digital: np.ndarray) -> np.ndarray:
    # One transposing pass into C order (a plain astype keeps the view's column-major layout, and
    # every later per-lead pass would then stride across the interleaved frames).
    values = np.empty(digital.shape, dtype=np.float64)
    values[...] = digital
    return values


_CHECK_BLOCK = 1 << 18  # frames summed at a time: 6 MB of int16 for 12 leads


def _check_blocks(handle: BinaryIO, header: FastHeader, n_sig: int) -> None:
    """`_check_checksums` over every frame of the file, read a block at a time."""
    if header.sig_len == 0:
        return
    sums = np.zeros(n_sig, dtype=np.int64)
    first = None
    for begin in range(0, header.sig_len, _CHECK_BLOCK):
        block = _frames(handle, header.byte_offset, begin, min(header.sig_len, begin + _CHECK_BLOCK), n_sig)
        sums += block.sum(axis=1, dtype=np.int64)
        first = block if first is None else first
    check_checksums(sums, first[:, 0], header.leads, header.checksums, header.init_values)


def _check_checksums(sums: np.ndarray, digital: np.ndarray, header: FastHeader) -> None:
    """sums: each lead's exact integer sum; digital: the samples as stored (leads, time)."""
    if header.sig_len == 0:
        return
    check_checksums(sums, digital[:, 0], header.leads, header.checksums, header.init_values)
