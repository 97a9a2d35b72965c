"""Reading one WFDB record (any corpus) into a (leads, time) array in mV."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import wfdb

from ecgpos.errors import SignalError


@dataclass
class RawRecord:
    """A raw recording as stored: physical units (mV), source rate, lead names as written."""

    record_id: str
    signal: np.ndarray  # (leads, time) float32, mV
    fs: float
    leads: list[str]
    comments: list[str] = field(default_factory=list)

    def header_fields(self) -> dict[str, str]:
        """'#Key: value' header comments as a dict (Age, Sex, Dx, ...)."""
        out = {}
        for line in self.comments:
            key, sep, value = line.lstrip("#").partition(":")
            if sep:
                out[key.strip()] = value.strip()
        return out


def record_path(path: str | Path) -> Path:
    """A record path without extension ('.../JS00001' for '.../JS00001.hea')."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in (".hea", ".mat", ".dat") else path


def read_wfdb_record(path: str | Path) -> RawRecord:
    """Read a WFDB record (format 16 .dat or MATLAB v4 .mat) in mV.

    Raises SignalError('unreadable' | 'header_mismatch' | 'units') with the record name, never
    a raw wfdb/numpy traceback.
    """
    base = record_path(path)
    if not base.with_suffix(".hea").is_file():
        raise SignalError("unreadable", f"{base.name}: no header file {base.with_suffix('.hea')}")
    try:
        rec = wfdb.rdrecord(str(base), physical=True)
    except Exception as err:  # wfdb raises many types for corrupt/truncated files
        kind = "header_mismatch" if "length" in str(err).lower() or "shape" in str(err).lower() else "unreadable"
        raise SignalError(kind, f"{base.name}: {type(err).__name__}: {err}".splitlines()[0]) from None
    if rec.p_signal is None or rec.p_signal.ndim != 2:
        raise SignalError("unreadable", f"{base.name}: no signal")
    if rec.p_signal.shape != (rec.sig_len, rec.n_sig):
        raise SignalError("header_mismatch",
                          f"{base.name}: header says {rec.n_sig} x {rec.sig_len}, signal is {rec.p_signal.shape}")
    units = {str(u).strip().lower() for u in (rec.units or [])}
    scale = 1.0
    if units == {"uv"}:
        scale = 1e-3
    elif units and not units <= {"mv"}:
        raise SignalError("units", f"{base.name}: unsupported units {sorted(units)}")
    return RawRecord(record_id=base.name, signal=np.ascontiguousarray(rec.p_signal.T * scale, dtype=np.float32),
                     fs=float(rec.fs), leads=[str(s) for s in rec.sig_name], comments=list(rec.comments or []))
