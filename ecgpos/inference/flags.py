"""The preprint's two-channel flag decomposition (appendix on the latent score analysis).

Each record has two scores: e_rec, the Stage-0 reconstruction error, and e_sub, the Stage-1 latent
error. For a percentile q, t_c(q) is the q-th percentile of score c over D_fit, held-out nominal
records used neither for training nor for evaluation. A record's channels fire when its score is
strictly greater than the threshold: A = [e_rec > t_rec(q)], B = [e_sub > t_sub(q)]; it is flagged
when either fires (the OR rule). One common percentile q* is chosen on D_fit so that the OR rule's
false-positive rate there is at most the target: the smallest such q, computed exactly.

Percentiles are numpy's default (linear interpolation between order statistics). The rate on D_fit
only changes where a threshold reaches a D_fit score, and both channels have the same n_fit scores,
so it is constant on each [100 k/(n-1), 100 (k+1)/(n-1)); the smallest q is therefore one of these
points, where t_c is exactly the (k+1)-th smallest D_fit score of channel c.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ecgpos.errors import EcgposError


@dataclass(frozen=True)
class Calibration:
    """The common percentile q* (in %), its two thresholds, and the realised OR-rule rate on D_fit."""

    q: float
    t_rec: float
    t_sub: float
    n_fit: int
    fit_rate: float
    target: float


@dataclass(frozen=True)
class Decomposition:
    """Counts of one group of records: each channel's firings and the disjoint outcomes."""

    n: int
    a: int
    b: int
    a_only: int
    b_only: int
    neither: int

    def share(self, count: int) -> float | None:
        """count / n; None for an empty group."""
        return count / self.n if self.n else None

    @property
    def flagged(self) -> int:
        return self.n - self.neither

    @property
    def r_latent(self) -> float | None:
        """Pr(not A and B) / Pr(A or B): the share of detections the Stage-0 score alone would miss;
        None when nothing is flagged."""
        return self.b_only / self.flagged if self.flagged else None


def min_fit_records(target: float) -> int:
    """The fewest D_fit records for which one false positive still fits the target rate: ceil(1/target)."""
    # the small tolerance keeps 1/0.05 = 20.000000000000004-style rounding from asking for one more
    return math.ceil(1.0 / target - 1e-9)


def check_target(target: float) -> None:
    """EcgposError unless 0 < target < 1 (NaN included)."""
    if not 0.0 < target < 1.0:
        raise EcgposError(f"--fpr {target}: the target false-positive rate must lie strictly between 0 and 1")


def check_fit_size(n: int, target: float, what: str = "D_fit") -> None:
    """EcgposError when `n` D_fit records are too few for `target` (`what` names them for the user)."""
    if n < min_fit_records(target):
        raise EcgposError(
            f"{what} has {n} records; a false-positive rate of {target:g} needs at least "
            f"{min_fit_records(target)} (ceil(1/fpr)), so that one false positive can fit it"
        )


def _scores(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise EcgposError(f"{what}: expected one score per record, got shape {array.shape}")
    bad = int(np.isnan(array).sum())
    if bad:
        raise EcgposError(f"{what}: {bad} of {array.size} scores are NaN; no threshold can be calibrated on them")
    return array


def _pair(
    rec: Sequence[float] | np.ndarray, sub: Sequence[float] | np.ndarray, what: str
) -> tuple[np.ndarray, np.ndarray]:
    e_rec, e_sub = _scores(rec, f"{what} (Stage-0 scores)"), _scores(sub, f"{what} (Stage-1 scores)")
    if e_rec.shape != e_sub.shape:
        raise EcgposError(f"{what}: {e_rec.size} Stage-0 but {e_sub.size} Stage-1 scores")
    return e_rec, e_sub


def or_rate(rec: np.ndarray, sub: np.ndarray, t_rec: float, t_sub: float) -> float:
    """The fraction of records the OR rule flags at these thresholds (strictly greater fires)."""
    return float(np.mean((rec > t_rec) | (sub > t_sub))) if rec.size else 0.0


def calibrate(
    fit_rec: Sequence[float] | np.ndarray, fit_sub: Sequence[float] | np.ndarray, target: float = 0.05
) -> Calibration:
    """q* on D_fit: the smallest percentile whose OR-rule rate on D_fit is at most `target`.

    EcgposError for a target outside (0, 1), NaN scores, or fewer than `min_fit_records(target)`
    D_fit records (then no false positive at all would fit the target)."""
    check_target(target)
    rec, sub = _pair(fit_rec, fit_sub, "D_fit")
    n = rec.size
    check_fit_size(n, target)
    rec_sorted, sub_sorted = np.sort(rec), np.sort(sub)

    def rate(k: int) -> float:
        return or_rate(rec, sub, rec_sorted[k], sub_sorted[k])

    # rate(k) never rises with k and rate(n - 1) = 0: bisect for the first k within the target
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if rate(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    return Calibration(
        q=100.0 * lo / (n - 1),
        t_rec=float(rec_sorted[lo]),
        t_sub=float(sub_sorted[lo]),
        n_fit=n,
        fit_rate=rate(lo),
        target=target,
    )


def channel_flags(
    rec: Sequence[float] | np.ndarray, sub: Sequence[float] | np.ndarray, cal: Calibration
) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) per record: boolean arrays, each score strictly greater than its threshold."""
    e_rec, e_sub = _pair(rec, sub, "scores")
    return e_rec > cal.t_rec, e_sub > cal.t_sub


def decompose(a: np.ndarray, b: np.ndarray) -> Decomposition:
    """The counts of one group's channel flags (A, B boolean arrays of equal length)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    return Decomposition(
        n=int(a.size),
        a=int(a.sum()),
        b=int(b.sum()),
        a_only=int((a & ~b).sum()),
        b_only=int((~a & b).sum()),
        neither=int((~a & ~b).sum()),
    )
