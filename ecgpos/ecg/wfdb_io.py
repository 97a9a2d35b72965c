"""Reading one WFDB record (any corpus) into a (leads, time) array in mV."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import wfdb
from wfdb.io.header import parse_header_content, rx_signal

from ecgpos.ecg.rates import wfdb_header_fs
from ecgpos.ecg.signal import record_span
from ecgpos.errors import SignalError


@dataclass
class RawRecord:
    """A raw recording as stored: physical units (mV), source rate, lead names as written."""

    record_id: str
    signal: np.ndarray  # (leads, time) float32, mV
    fs: float
    leads: list[str]
    comments: list[str] = field(default_factory=list)
    record_name: str = ""  # the header's record line names the record ("" when not read from a header)
    signal_files: tuple[str, ...] = ()  # the signal files its header names (none for a multi-segment record)
    start: int = 0  # first sample read: a record longer than 300 s is read on its centre span (`record_span`)
    total: int = -1  # samples in the whole record (-1: as many as `signal` holds)
    uncalibrated: tuple[str, ...] = ()  # leads whose header gives no ADC gain (`uncalibrated_leads`)

    def header_fields(self) -> dict[str, str]:
        """'#Key: value' header comments as a dict (Age, Sex, Dx, ...)."""
        out = {}
        for line in self.comments:
            key, sep, value = line.lstrip("#").partition(":")
            if sep:
                out[key.strip()] = value.strip()
        return out


def header_gain(field: str | None) -> float | None:
    """A WFDB signal line's ADC gain field as a number; None when it is 0 or absent, which the WFDB
    header format defines as "uncalibrated": its samples then read as mV at `ASSUMED_GAIN` (200
    adu/mV), a made-up scale (`ecgpos.ecg.screening` says what that scale may be used for)."""
    gain = float(field) if field else 0.0
    return gain or None


def uncalibrated_leads(header_text: str) -> tuple[str, ...]:
    """Names of the signals a single-segment WFDB header leaves uncalibrated (`header_gain` None),
    split and parsed with wfdb's own grammar (lines it cannot parse are wfdb's to refuse)."""
    body, _comments = parse_header_content(header_text)
    matches = (rx_signal.match(line) for line in body[1:])
    return tuple(m["sig_name"] for m in matches if m is not None and header_gain(m["adc_gain"]) is None)


def record_path(path: str | Path) -> Path:
    """A record path without extension ('.../JS00001' for '.../JS00001.hea')."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in (".hea", ".mat", ".dat") else path


# Bytes per sample of the WFDB storage formats whose file size follows from the header.
_BYTES_PER_SAMPLE = {
    "8": 1.0,
    "16": 2.0,
    "24": 3.0,
    "32": 4.0,
    "61": 2.0,
    "80": 1.0,
    "160": 2.0,
    "212": 1.5,
    "310": 4 / 3,
    "311": 4 / 3,
}


def check_mat_header(prefix: bytes, file_name: str, byte_offset: int, n_sig: int, sig_len: int) -> None:
    """A MATLAB v4 int16 matrix of n_sig rows x sig_len columns must precede the samples.

    prefix: the file's first 20 bytes (its MATLAB v4 matrix header).
    """
    if len(prefix) < 20:
        raise SignalError("truncated_signal", f"{file_name}: {len(prefix)} bytes, no MATLAB header")
    mopt, rows, cols, imag, namlen = (int(v) for v in np.frombuffer(prefix[:20], "<i4"))
    if mopt != 30 or imag != 0 or 20 + namlen != byte_offset:
        raise SignalError("corrupt_signal", f"{file_name}: not a MATLAB v4 int16 matrix at the header's offset")
    if (rows, cols) != (n_sig, sig_len):
        raise SignalError(
            "header_mismatch", f"header says {n_sig} x {sig_len} samples, {file_name} holds {rows} x {cols}"
        )


def check_data_size(file_name: str, size: int, expected: int) -> None:
    """A signal file must hold exactly the bytes its header describes: fewer raises truncated_signal,
    more header_mismatch (wfdb would read the samples the header names and drop the rest silently)."""
    if size < expected:
        raise SignalError("truncated_signal", f"{file_name}: {size} bytes, header needs {expected}")
    if size > expected:
        raise SignalError("header_mismatch", f"{file_name}: {size} bytes, header describes {expected}")


def check_checksums(sums: np.ndarray, firsts: np.ndarray, leads: list[str], checksums: list, init_values: list) -> None:
    """WFDB checksum: 16-bit two's-complement sum of a lead's stored samples (headers write it
    signed or unsigned); initial value: its first sample. A header field left out (None) is not checked.

    sums, firsts: per lead, the exact integer sum and the first of the digital samples.
    Raises SignalError('corrupt_signal').
    """
    for lead, total, first, want_sum, want_first in zip(leads, sums, firsts, checksums or [], init_values or []):
        if want_sum is not None and int(total) & 0xFFFF != int(want_sum) & 0xFFFF:
            raise SignalError("corrupt_signal", f"lead {lead}: checksum {int(total) & 0xFFFF} != header {want_sum}")
        if want_first is not None and int(first) != int(want_first):
            raise SignalError("corrupt_signal", f"lead {lead}: first sample {int(first)} != header {want_first}")


def check_signal_files(base: Path, header: Any) -> None:
    """The size checks the fast reader makes, for any header wfdb reads (wfdb itself makes none:
    it reads what the header says and silently drops the rest of a longer file).

    Each signal file must hold exactly byte offset + the header's samples (truncated_signal when
    shorter, header_mismatch when longer); a `.mat` file's MATLAB header must agree with the WFDB
    header. Files in formats without a fixed sample size, or with several samples per frame, are
    left to wfdb. A multi-segment header is checked segment by segment (each is a record of its
    own; `~` marks a gap).
    """
    if isinstance(header, wfdb.MultiRecord):
        lengths = [int(n) for n in header.seg_len]
        if header.sig_len is not None and sum(lengths) != header.sig_len:
            raise SignalError("header_mismatch", f"segments hold {sum(lengths)} samples, header says {header.sig_len}")
        for name, length in zip(header.seg_name, lengths):
            if name == "~":
                continue
            segment = base.parent / name
            try:
                segment_header = wfdb.rdheader(str(segment))
            except Exception as err:  # wfdb raises many types for missing or malformed headers
                detail = f"segment {name}: {type(err).__name__}: {err}".splitlines()[0]
                raise SignalError("unreadable", detail) from None
            # a layout segment (length 0) only names the signals; wfdb reads the first `length`
            # samples of the others and would silently drop the rest of a longer segment
            if length and segment_header.sig_len != length:
                raise SignalError(
                    "header_mismatch", f"segment {name} holds {segment_header.sig_len} samples, header says {length}"
                )
            check_signal_files(segment, segment_header)
        return
    sig_len = header.sig_len
    if sig_len is None or not header.file_name:
        return  # wfdb infers the length from the file: nothing the header could misstate
    groups: dict[str, list[int]] = {}
    for i, name in enumerate(header.file_name):
        groups.setdefault(name, []).append(i)
    for name, rows in groups.items():
        fmts = {str(header.fmt[i]) for i in rows}
        offsets = {int(header.byte_offset[i] or 0) if header.byte_offset else 0 for i in rows}
        frames = {int(header.samps_per_frame[i] or 1) if header.samps_per_frame else 1 for i in rows}
        if len(fmts) != 1 or len(offsets) != 1 or frames != {1} or next(iter(fmts)) not in _BYTES_PER_SAMPLE:
            continue
        offset = offsets.pop()
        path = base.parent / name
        try:
            size = path.stat().st_size
            prefix = path.open("rb").read(20) if path.suffix == ".mat" else b""
        except OSError as err:
            raise SignalError("unreadable", f"{name}: {err.strerror or err}") from None
        if path.suffix == ".mat":
            check_mat_header(prefix, name, offset, len(rows), sig_len)
        check_data_size(name, size, offset + int(np.ceil(len(rows) * sig_len * _BYTES_PER_SAMPLE[fmts.pop()])))


def _stored_samples(rec: Any) -> np.ndarray | None:
    """`rec.d_signal` (leads as columns) where it is the file's samples as written; None for an empty
    read, or where wfdb averaged frames (several samples per frame) or shifted skewed signals."""
    digital = rec.d_signal
    if digital is None or digital.ndim != 2 or not digital.shape[0]:
        return None
    if any(int(n or 1) != 1 for n in rec.samps_per_frame or []) or any(int(k or 0) for k in rec.skew or []):
        return None
    return digital


def _check_digital(rec: Any, name: str) -> None:
    """Checksums and initial values of a record read as stored (wfdb checks none), where every
    sample of the file is in `d_signal` as written: one sample per frame and no skew."""
    digital = _stored_samples(rec)
    if digital is None:
        return
    try:
        check_checksums(
            digital.sum(axis=0, dtype=np.int64), digital[0], list(rec.sig_name or []), rec.checksum, rec.init_value
        )
    except SignalError as err:
        raise SignalError(err.reason, f"{name}: {err.detail}") from None


def _check_segments(base: Path, header: Any) -> None:
    """`_check_digital` for each segment of a multi-segment record, read as stored: wfdb reads the
    whole record in physical units only, so its own reading cannot be checked."""
    for name, length in zip(header.seg_name, header.seg_len):
        if name == "~" or not int(length):  # a gap, or the layout segment (signal names only)
            continue
        try:
            segment = wfdb.rdrecord(str(base.parent / name), physical=False)
        except Exception as err:  # wfdb raises many types for corrupt/truncated files
            raise SignalError("unreadable", f"segment {name}: {type(err).__name__}: {err}".splitlines()[0]) from None
        _check_digital(segment, f"segment {name}")


def read_wfdb_record(path: str | Path) -> RawRecord:
    """Read a WFDB record (format 16 .dat or MATLAB v4 .mat, or anything else wfdb reads) in mV.

    The rate is parsed strictly from the header (`ecgpos.ecg.rates`), the signal files are
    checked against the header's sizes before wfdb reads them and the samples against its
    checksums and initial values (segment by segment for a multi-segment record). Raises SignalError('unreadable' |
    'truncated_signal' | 'corrupt_signal' | 'header_mismatch' | 'units' | 'sampling_rate') with the
    record name, never a raw wfdb/numpy traceback.

    Only the samples screening uses are read: a record longer than 300 s (`record_span`) is read
    on its centre span (`RawRecord.start` and `.total` say where), so memory does not grow with
    the record's length. A single-segment record's checksums still cover every sample, summed a
    block at a time; a long multi-segment record's segments are not checksummed (their sizes are).
    """
    base = record_path(path)
    header_file = base.with_suffix(".hea")
    if not header_file.is_file():
        raise SignalError("unreadable", f"{base.name}: no header file {header_file}")
    try:
        text = header_file.read_text(errors="replace")
    except OSError as err:
        raise SignalError("unreadable", f"{base.name}.hea: {err.strerror or err}") from None
    try:
        fs = wfdb_header_fs(text)
    except SignalError as err:
        raise SignalError(err.reason, f"{base.name}: {err.detail}") from None
    try:
        header = wfdb.rdheader(str(base))
    except Exception as err:  # wfdb raises many types for malformed headers
        raise SignalError("unreadable", f"{base.name}: {type(err).__name__}: {err}".splitlines()[0]) from None
    try:
        check_signal_files(base, header)
    except SignalError as err:
        raise SignalError(err.reason, f"{base.name}: {err.detail}") from None
    # A single-segment record is read as stored, its checksums checked, then converted as
    # wfdb.rdrecord(physical=True) converts it; a multi-segment one has each segment checked first.
    multi = isinstance(header, wfdb.MultiRecord)
    total = header.sig_len
    start, stop = record_span(int(total), fs) if total else (0, total)
    whole = (start, stop) == (0, total)
    if multi and whole:
        try:
            _check_segments(base, header)
        except SignalError as err:
            raise SignalError(err.reason, f"{base.name}: {err.detail}") from None
    try:
        if not multi and not whole:
            _check_blocks(base, header)
        rec = wfdb.rdrecord(str(base), physical=multi, **({} if whole else {"sampfrom": start, "sampto": stop}))
    except SignalError as err:
        raise SignalError(err.reason, f"{base.name}: {err.detail}") from None
    except Exception as err:  # wfdb raises many types for corrupt/truncated files
        kind = "header_mismatch" if "length" in str(err).lower() or "shape" in str(err).lower() else "unreadable"
        raise SignalError(kind, f"{base.name}: {type(err).__name__}: {err}".splitlines()[0]) from None
    if not multi and rec.d_signal is not None:
        if whole:  # a span's checksums were checked block by block above
            _check_digital(rec, base.name)
        try:  # an uncalibrated lead reads at 200 adu/mV, as in the fast reader (`header_gain`)
            rec.dac(expanded=False, return_res=64, inplace=True)
        except Exception as err:  # wfdb raises many types for fields it cannot convert with
            raise SignalError("unreadable", f"{base.name}: {type(err).__name__}: {err}".splitlines()[0]) from None
    if rec.p_signal is None or rec.p_signal.ndim != 2:
        raise SignalError("unreadable", f"{base.name}: no signal")
    if rec.p_signal.shape != (rec.sig_len, rec.n_sig) or (not whole and rec.sig_len != stop - start):
        raise SignalError(
            "header_mismatch", f"{base.name}: header says {rec.n_sig} x {rec.sig_len}, signal is {rec.p_signal.shape}"
        )
    units = {str(u).strip().lower() for u in (rec.units or [])}
    scale = 1.0
    if units == {"uv"}:
        scale = 1e-3
    elif units and not units <= {"mv"}:
        raise SignalError("units", f"{base.name}: unsupported units {sorted(units)}")
    return RawRecord(
        record_id=base.name,
        signal=np.ascontiguousarray(rec.p_signal.T * scale, dtype=np.float32),
        fs=fs,
        leads=[str(s) for s in rec.sig_name],
        comments=list(rec.comments or []),
        record_name=str(header.record_name or ""),
        signal_files=() if multi else tuple(dict.fromkeys(str(name) for name in header.file_name or [])),
        start=start,
        total=rec.sig_len if whole else int(total),
        uncalibrated=_segment_uncalibrated(base, header) if multi else uncalibrated_leads(text),
    )


def _segment_uncalibrated(base: Path, header: Any) -> tuple[str, ...]:
    """`uncalibrated_leads` of a multi-segment record: the leads any of its segments leaves uncalibrated."""
    names: list[str] = []
    for name, length in zip(header.seg_name, header.seg_len):
        if name == "~" or not int(length):  # a gap, or the layout segment (signal names only)
            continue
        try:
            names += uncalibrated_leads((base.parent / f"{name}.hea").read_text(errors="replace"))
        except OSError as err:
            raise SignalError("unreadable", f"{base.name}: segment {name}: {err.strerror or err}") from None
    return tuple(dict.fromkeys(names))


_CHECK_BLOCK = 1 << 18  # frames summed at a time: a few tens of MB of int64 for 12 leads


def _check_blocks(base: Path, header: Any) -> None:
    """`_check_digital` over every frame of a single-segment record, read as stored a block at a
    time, so checking a long record's checksums needs no more memory than one block. The header's
    checksums are compared (wfdb recomputes a partial read's own)."""
    total = int(header.sig_len)
    sums = firsts = None
    for first in range(0, total, _CHECK_BLOCK):
        block = wfdb.rdrecord(str(base), physical=False, sampfrom=first, sampto=min(total, first + _CHECK_BLOCK))
        digital = _stored_samples(block)
        if digital is None:
            return
        part = digital.sum(axis=0, dtype=np.int64)
        sums, firsts = (part, digital[0].copy()) if sums is None else (sums + part, firsts)
    if sums is not None:
        check_checksums(sums, firsts, list(header.sig_name or []), header.checksum, header.init_value)
