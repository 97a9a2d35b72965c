"""The preprocessing spec: the one object that says how a signal becomes model input.

It is written with every shard set (HDF5 attributes and preprocess.json), saved in every
run folder and export, and read back by pretraining, probes and `embed`, so no later
step repeats these constants.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecgpos.config import apply_overrides, from_dict, read_yaml
from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.errors import ConfigError

MAX_FS_HZ = 10_000.0  # the highest sampling rate of a spec or a record (ecgpos.ecg.rates parses rates)

STANDARDISE_MODES = ("lead", "record")
MAX_FILTER_ORDER = 100  # far above the default 4; a Butterworth design of this order still takes milliseconds


@dataclass(frozen=True)
class PreprocessSpec:
    """Defaults: the paper's 0.67 Hz and 40 Hz cut-offs, 250 Hz and 2250-sample window; the zero-phase
    Butterworth of order 4 and the per-lead z-score are the readings configs/README.md states."""

    fs: int = 250
    leads: tuple[str, ...] = CANONICAL_LEADS
    units: str = "mV"
    highpass_hz: float = 0.67
    lowpass_hz: float = 40.0
    filter_order: int = 4
    standardise: str = "lead"
    window: int = 2250
    dtype: str = "float16"  # storage dtype of shard signals; models always see float32

    def __post_init__(self) -> None:
        object.__setattr__(self, "leads", tuple(self.leads))
        if self.standardise not in STANDARDISE_MODES:
            raise ConfigError(f"preprocess.standardise must be one of {STANDARDISE_MODES}, got {self.standardise!r}")
        if self.dtype not in ("float16", "float32"):
            raise ConfigError(f"preprocess.dtype must be float16 or float32, got {self.dtype!r}")
        if not 0 < self.highpass_hz < self.lowpass_hz < self.fs / 2:
            raise ConfigError(
                f"need 0 < highpass_hz < lowpass_hz < fs/2, got {self.highpass_hz}, {self.lowpass_hz}, fs={self.fs}"
            )
        if self.window <= 0 or self.filter_order <= 0:
            raise ConfigError("preprocess.window and preprocess.filter_order must be positive")
        if self.fs > MAX_FS_HZ:  # before the window check, which would otherwise name this rate's second
            raise ConfigError(f"preprocess.fs {self.fs} is above the highest supported rate, {MAX_FS_HZ:g} Hz")
        if self.window < self.fs:  # a shorter window holds no heartbeat (nor a 1-sample z-score a signal)
            raise ConfigError(
                f"preprocess.window must hold at least one second ({self.fs} samples at fs={self.fs}), "
                f"got {self.window}"
            )
        if self.filter_order > MAX_FILTER_ORDER:  # scipy designs an order in the millions for hours
            raise ConfigError(f"preprocess.filter_order must be at most {MAX_FILTER_ORDER}, got {self.filter_order}")
        if self.units != "mV":  # every reader converts to mV; another value would only mislabel the data
            raise ConfigError(
                f"preprocess.units must be 'mV' (every reader converts records to mV), got {self.units!r}"
            )
        if self.leads != CANONICAL_LEADS:
            raise ConfigError(f"preprocess.leads must be the canonical order {list(CANONICAL_LEADS)}")

    # The fields that change what a model sees; `dtype` only changes storage precision.
    SIGNAL_FIELDS = ("fs", "leads", "units", "highpass_hz", "lowpass_hz", "filter_order", "standardise", "window")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["leads"] = list(self.leads)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreprocessSpec:
        """ecgpos.config's parser: unknown keys and wrong types are ConfigError."""
        return from_dict(cls, data, prefix="preprocess.")

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Sequence[str] = ()) -> PreprocessSpec:
        """The spec from a YAML file (+ `key=value` overrides), the defaults filling what it omits.

        The file holds spec keys (fs, highpass_hz, lowpass_hz, filter_order, standardise, window,
        dtype, ...), or is a run config whose `preprocess:` section is used, so shards can be made
        with exactly the spec a run expects. Overrides may be written `lowpass_hz=45` or
        `preprocess.lowpass_hz=45`; unknown keys and impossible values are ConfigError.
        """
        data = read_yaml(path) if path is not None else {}
        if "preprocess" in data:
            data = data["preprocess"] or {}
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: preprocess must be a mapping")
        plain = [o.removeprefix("preprocess.") for o in overrides]
        return cls.from_dict(apply_overrides(dict(data), plain))

    def describe(self) -> str:
        """One line for help texts and logs, e.g. '0.67-40 Hz, lead z-score, 250 Hz, 2250-sample windows'."""
        return (
            f"{self.highpass_hz:g}-{self.lowpass_hz:g} Hz, {self.standardise} z-score, {self.fs} Hz, "
            f"{self.window}-sample windows"
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PreprocessSpec:
        return cls.from_dict(json.loads(text))

    def to_h5_attrs(self) -> dict[str, Any]:
        """Attributes for an HDF5 file: `fs`, `leads` and the whole spec as JSON under `spec`."""
        return {"fs": self.fs, "leads": list(self.leads), "spec": self.to_json()}

    @classmethod
    def from_h5_attrs(cls, attrs: Mapping[str, Any]) -> PreprocessSpec:
        if "spec" not in attrs:
            raise ConfigError("HDF5 file has no 'spec' attribute: not written by ecgpos preprocess")
        raw = attrs["spec"]
        return cls.from_json(raw.decode() if isinstance(raw, bytes) else str(raw))

    def signal_differences(self, other: PreprocessSpec) -> list[str]:
        """Names and values of the signal-defining fields that differ (empty when compatible)."""
        return [
            f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}"
            for name in self.SIGNAL_FIELDS
            if getattr(self, name) != getattr(other, name)
        ]

    def check_compatible(self, other: PreprocessSpec, what: str) -> None:
        """Raise ConfigError naming every difference between self (expected) and `other` ({what})."""
        diffs = self.signal_differences(other)
        if diffs:
            raise ConfigError(f"preprocessing spec of {what} does not match the expected one ({'; '.join(diffs)})")


DEFAULT_SPEC = PreprocessSpec()
