"""Which raw records may be turned into model input: the one screening step of every reader.

Preprocessing (shards), `embed` and probes all call `screen_record` before `preprocess_batch`,
so a recording that preprocessing skips is never embedded or probed with a made-up feature
vector: each refusal is a SignalError whose reason is the skip reason of docs/data.md ("Skip reasons").

A record longer than `ecgpos.ecg.signal.MAX_WHOLE_SECONDS` (300 s) at its own rate is cut to its
centre span (`record_span`) before any check: the checks, the dead leads and the standardisation
that follows all cover that span, never the rest of the record. `Screened.total` keeps the whole
record's length, so every output can say which records were used on their span (`Screened.cut`).

Checks, in order: real-number samples (dtype: not complex, text, booleans or objects), lead
names (missing_lead / duplicate_lead / unknown_lead), the rate (sampling_rate outside the spec's
supported range; unexpected_fs when a corpus fixes another), no samples at all (empty), shorter
than one window after resampling (too_short, unless pad_short; before the amplitude checks, which
a handful of samples can fail by chance), NaN/inf (non_finite), every sample zero (all_zero), every
lead flat (flat), a median lead amplitude no ECG in mV has, or any one lead's (units: uV or ADC
counts, damaged samples), more dead
leads than allowed (dead_leads), limb leads that break Einthoven's or Goldberger's relations
(lead_mismatch: swapped, inverted or misnamed leads; `ecgpos.ecg.limbs`; not checked when a limb
lead is dead, nor with `ScreenPolicy(check_limb_leads=False)`).

Uncalibrated leads (a WFDB header gain of 0 or none: `ecgpos.ecg.wfdb_io.header_gain`) are read in
made-up mV, at 200 ADC units per mV. Their true scale is unknown, so no check judges them in mV:
they are dead when they span at most one ADC step (what 10 uV is at 200 units/mV, but gain-free),
the units median covers the calibrated leads only, and the limb relations are checked only when
the six limb leads are all calibrated or all uncalibrated (a scale they share cancels). Per-lead
z-scoring removes a lead's unknown scale; one z-score over the whole record (`standardise: record`)
does not, so there a record mixing uncalibrated and calibrated leads is refused as `units`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ecgpos.ecg.leads import CANONICAL_LEADS, lead_permutation, to_canonical_order
from ecgpos.ecg.limbs import LEAD_MISMATCH_MAX, LIMB_LEADS, limb_residuals
from ecgpos.ecg.rates import check_fs
from ecgpos.ecg.signal import (
    ASSUMED_GAIN,
    DEAD_LEAD_PTP_MV,
    MAX_WHOLE_SECONDS,
    record_span,
    resampled_length,
    screen_ptp,
    seconds_text,
)
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError, SignalError

DEFAULT_MAX_DEAD_LEADS = 2
"""Records with up to this many dead (flat) leads are kept, the dead leads used as exact zeros."""
MAX_MEDIAN_PTP_MV = 100.0
"""Above this median lead peak-to-peak a record is not in mV (an ECG lead spans about 0.5-5 mV; even
heavy baseline wander leaves the median lead far below 100 mV): it is uV or ADC counts. Features
would hardly change (leads are z-scored), but the 10 uV dead-lead threshold would be 1000x off."""
MAX_LEAD_PTP_MV = 1000.0
"""Above this peak-to-peak a single lead is not an ECG in mV, whatever the other leads hold: no 16-bit
recorder at a usual gain spans more than a few hundred mV. The median check alone would let one lead
of counts (or of 1e300, which z-scoring turns into NaN) through beside eleven good ones."""


@dataclass(frozen=True)
class ScreenPolicy:
    """What to do with records that are short or have dead leads.

    expected_fs: a corpus's one rate (None: any supported rate). pad_short: keep records shorter
    than one window (the caller zero-pads them) instead of refusing them as too_short.
    check_limb_leads: refuse records whose limb leads break Einthoven's or Goldberger's relations
    (lead_mismatch); False keeps them (`--keep-lead-mismatch`), e.g. for a corpus known to store
    its limb leads with per-lead calibration errors, which per-lead z-scoring removes anyway.
    """

    expected_fs: float | None = None
    pad_short: bool = False
    max_dead_leads: int = DEFAULT_MAX_DEAD_LEADS
    check_limb_leads: bool = True

    def __post_init__(self) -> None:
        n = len(CANONICAL_LEADS)
        if (
            isinstance(self.max_dead_leads, bool)
            or not isinstance(self.max_dead_leads, int)
            or not 0 <= self.max_dead_leads < n
        ):
            raise ConfigError(f"max dead leads must be an integer in 0..{n - 1}, got {self.max_dead_leads!r}")


DEFAULT_POLICY = ScreenPolicy()
"""`embed`'s and the API's policy: any supported rate, short records refused, up to 2 dead leads."""


@dataclass
class Screened:
    """A record that passed every check: canonical-order raw (12, time) mV, its rate and dead leads,
    and the samples of the whole record (`signal` holds its `record_span`)."""

    signal: np.ndarray
    fs: float
    dead: np.ndarray  # (12,) bool
    total: int = -1  # samples of the whole record at fs (-1: as many as `signal` holds)

    @property
    def dead_names(self) -> list[str]:
        return [CANONICAL_LEADS[i] for i in np.flatnonzero(self.dead)]

    @property
    def cut(self) -> bool:
        """Whether the record is longer than 300 s, so `signal` is its centre span only."""
        return self.total > self.signal.shape[-1]

    def span_seconds(self) -> tuple[str, str, str]:
        """(the whole record's duration, start and end of the span used) in seconds, as the outputs write them."""
        whole = max(self.total, self.signal.shape[-1])
        start, stop = record_span(whole, self.fs)
        return seconds_text(whole, self.fs), seconds_text(start, self.fs), seconds_text(stop, self.fs)


def long_records_note(count: int, verb: str, where: str) -> str:
    """`; N records longer than 300 s <verb> their centre 300 s (<where>)` for a command's closing line
    ('' when every record was used whole), e.g. verb 'used on', where 'listed in feats.long.csv'."""
    if not count:
        return ""
    span, many = f"{MAX_WHOLE_SECONDS:g} s", count > 1
    records, their = ("records", "their") if many else ("record", "its")
    return f"; {count} {records} longer than {span} {verb} {their} centre {span} ({where})"


def as_samples(signal: Any) -> np.ndarray:
    """`signal` (an array, a list of leads, a CPU tensor) as an array; SignalError('shape') for
    leads of unequal lengths, which numpy cannot stack, and SignalError('dtype') for what numpy
    cannot read at all (a GPU tensor, a bfloat16 tensor)."""
    try:
        return np.asarray(signal)
    except ValueError:  # numpy: "inhomogeneous shape", rows of different lengths
        raise SignalError("shape", "leads of unequal lengths cannot form a (leads, time) array") from None
    except TypeError as err:  # torch: "can't convert cuda:0 device type tensor to numpy", "unsupported ScalarType"
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SignalError(
            "dtype", f"samples cannot be read as a numpy array ({detail}); pass a CPU float array"
        ) from None


def screen_record(
    signal: np.ndarray,
    fs: float,
    leads: Sequence[str],
    spec: PreprocessSpec,
    policy: ScreenPolicy = DEFAULT_POLICY,
    total: int = -1,
    uncalibrated: Sequence[str] = (),
) -> Screened:
    """Every refusal check on one raw (leads, time) mV record; raises SignalError(reason).

    `uncalibrated`: the names (in `leads`) of leads whose mV are made up (`RawRecord.uncalibrated`).

    The returned signal is the record's `record_span`: the whole record up to 300 s, else its
    centre 300 s (a record already read on its span is returned whole: the span of a span is itself;
    `total`, the whole record's samples as the readers give them in `RawRecord.total`, then says
    how long the record was).
    """
    x = as_samples(signal)
    if x.dtype.kind not in "iuf":  # complex would lose its imaginary part, text and booleans are no mV
        raise SignalError("dtype", f"samples must be real numbers in mV, got dtype {x.dtype}")
    if x.ndim != 2:
        raise SignalError("shape", f"expected a (leads, time) array, got shape {x.shape}")
    if x.shape[0] != len(leads):
        # (time, leads), e.g. a DataFrame's values or a CSV read row by row: say so, never guess
        hint = "; it looks like (time, leads): pass its transpose, signal.T" if x.shape[1] == len(leads) else ""
        raise SignalError("shape", f"{x.shape[0]} signal rows but {len(leads)} lead names{hint}")
    # a record longer than MAX_WHOLE_SECONDS is screened and preprocessed on its centre span alone:
    # cropped first (a view), so lead reordering and every check below touch the span only
    total = max(int(total), x.shape[-1])
    start, stop = record_span(x.shape[-1], fs)
    x = to_canonical_order(x[:, start:stop], leads)  # raises missing/duplicate/unknown lead
    uncal = _canonical_mask(leads, uncalibrated)
    fs = check_fs(fs, spec)  # unsupported rates first: unexpected_fs is a supported rate of another corpus
    if policy.expected_fs is not None and abs(fs - policy.expected_fs) > 1e-6:
        raise SignalError("unexpected_fs", f"{fs:g} Hz, this corpus is {policy.expected_fs:g} Hz")
    if x.shape[-1] == 0:
        raise SignalError("empty", "the record holds no samples")
    # before the amplitude checks: a few samples are flat or all zero by chance, and too short is what is wrong
    length = resampled_length(x.shape[-1], fs, spec.fs)
    if length < spec.window and not policy.pad_short:
        raise SignalError(
            "too_short",
            f"{x.shape[-1] / fs:.2f} s at {fs:g} Hz = {length} samples at {spec.fs} Hz < window {spec.window}",
        )
    ptp = screen_ptp(x)  # raises non_finite; the peak-to-peak of each lead in the same max/min pass
    dead = ptp < DEAD_LEAD_PTP_MV
    if uncal is not None:  # in ADC steps: samples taking at most two adjacent values are no ECG at any gain
        dead[uncal] = ptp[uncal] * ASSUMED_GAIN < 1.5
    if dead.all():  # an all-zero trace is also flat: tell the two apart only here, off the common path
        if not np.any(x):
            raise SignalError("all_zero", "every sample is zero")
        # leads that move, only by less than 10 uV each, are most often a record in volts
        hint = "; if the samples are in V, multiply by 1000 (mV expected)" if (ptp > 0).all() else ""
        steps = "; uncalibrated leads: at most one ADC step" if uncal is not None else ""
        raise SignalError(
            "flat", f"every lead is flat (peak-to-peak below {DEAD_LEAD_PTP_MV * 1000:g} uV{steps}){hint}"
        )
    if uncal is not None and not uncal.all() and spec.standardise == "record":
        raise SignalError(
            "units",
            f"leads {' '.join(_names(uncal))} are uncalibrated (header gain 0 or none) beside calibrated leads: "
            "one z-score over the record (standardise: record) would weigh them by a made-up gain",
        )
    calibrated = ptp if uncal is None else ptp[~uncal]
    median = float(np.median(calibrated)) if calibrated.size else 0.0  # no mV to judge when none is calibrated
    if median > MAX_MEDIAN_PTP_MV:
        raise SignalError(
            "units",
            f"median lead peak-to-peak {median:.4g} is not an ECG in mV (about 0.5-5 mV): samples in uV "
            "or ADC counts? convert to mV (uV / 1000, counts / gain)",
        )
    wild = ptp > MAX_LEAD_PTP_MV
    if uncal is not None:
        wild &= ~uncal
    if wild.any():
        worst = int(np.argmax(np.where(wild, ptp, -np.inf)))
        raise SignalError(
            "units",
            f"lead {CANONICAL_LEADS[worst]} spans {ptp[worst]:.4g} peak-to-peak, no ECG lead in mV (at most "
            f"{MAX_LEAD_PTP_MV:g}): a lead in uV or ADC counts, or damaged samples",
        )
    count = int(dead.sum())
    if count > policy.max_dead_leads:
        raise SignalError("dead_leads", f"{count} dead leads ({' '.join(_names(dead))}) > {policy.max_dead_leads}")
    limbs = slice(0, len(LIMB_LEADS))
    # a dead limb lead leaves nothing to check; calibrated and uncalibrated limb leads, no common scale
    one_scale = uncal is None or len(set(uncal[limbs])) == 1
    if policy.check_limb_leads and not dead[limbs].any() and one_scale:
        screen_limb_leads(x)
    return Screened(signal=x, fs=fs, dead=dead, total=total)


def _canonical_mask(leads: Sequence[str], names: Sequence[str]) -> np.ndarray | None:
    """(12,) bool in canonical order: which leads `names` names; None when it names none of the 12."""
    named = {str(name) for name in names}
    mask = np.array([str(leads[row]) in named for row in lead_permutation(leads)]) if named else None
    return mask if mask is not None and mask.any() else None


def _names(mask: np.ndarray) -> list[str]:
    return [CANONICAL_LEADS[i] for i in np.flatnonzero(mask)]


def screen_limb_leads(x: np.ndarray) -> None:
    """SignalError('lead_mismatch') naming the worst relation when a canonical-order raw record's limb
    leads break Einthoven's or Goldberger's relations by more than LEAD_MISMATCH_MAX."""
    residuals = limb_residuals(x)
    relation = max(residuals, key=residuals.__getitem__)
    if residuals[relation] > LEAD_MISMATCH_MAX:
        raise SignalError(
            "lead_mismatch",
            f"limb leads break {relation}: residual {residuals[relation]:.3g} of the I/II/III RMS "
            f"(at most {LEAD_MISMATCH_MAX:g}); leads swapped, inverted or misnamed, or a limb lead clipped",
        )
