"""The preprint's flag decomposition (appendix on the latent score analysis), over the L levels of an encoder.

Each record has one score per level l, its channel: level 0's reconstruction error (the appendix's
e_rec), level 1's latent error (its e_sub), and so on. For a percentile q, t_l(q) is the q-th
percentile of level l's score over D_fit, held-out nominal records used neither for training nor for
evaluation. A channel fires when its score is strictly greater than its threshold; a record is flagged
when any fires (the OR rule), and its first level is the shallowest that fired. One common percentile
q* is chosen on D_fit so that the OR rule's false-positive rate there is at most the target: the
smallest such q, computed exactly.

Percentiles are numpy's default (linear interpolation between order statistics). The rate on D_fit
only changes where a threshold reaches a D_fit score, and every channel has the same n_fit scores,
so it is constant on each [100 k/(n-1), 100 (k+1)/(n-1)); the smallest q is therefore one of these
points, where t_l is exactly the (k+1)-th smallest D_fit score of channel l.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ecgpos.errors import EcgposError
from ecgpos.models.nested import level_name


@dataclass(frozen=True)
class Calibration:
    """The common percentile q* (in %), one threshold per level, and the realised OR-rule rate on D_fit."""

    q: float
    thresholds: tuple[float, ...]
    n_fit: int
    fit_rate: float
    target: float


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


def _channels(channels: Sequence[Sequence[float] | np.ndarray], what: str) -> np.ndarray:
    """Scores (n, L), one column per level, checked: no NaN, equal lengths, at least two levels."""
    arrays = [_scores(c, f"{what} ({level_name(level)} scores)") for level, c in enumerate(channels)]
    if len(arrays) < 2:
        raise EcgposError(f"{what}: the OR rule needs the scores of at least two levels, got {len(arrays)}")
    if len({a.size for a in arrays}) != 1:
        raise EcgposError(f"{what}: {', '.join(str(a.size) for a in arrays)} scores of levels 0..{len(arrays) - 1}")
    return np.stack(arrays, axis=1)


def calibrate_levels(fit: Sequence[Sequence[float] | np.ndarray], target: float = 0.05) -> Calibration:
    """q* on D_fit over L channels (the scores of levels 0..L-1): the smallest percentile whose OR-rule
    rate on D_fit is at most `target`, every level's threshold at that same percentile.

    EcgposError for a target outside (0, 1), NaN scores, or fewer than `min_fit_records(target)`
    D_fit records (then no false positive at all would fit the target)."""
    check_target(target)
    scores = _channels(fit, "D_fit")
    n = scores.shape[0]
    check_fit_size(n, target)
    ordered = np.sort(scores, axis=0)

    def rate(k: int) -> float:
        return float(np.mean((scores > ordered[k]).any(axis=1)))

    # rate(k) never rises with k and rate(n - 1) = 0: bisect for the first k within the target
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if rate(mid) <= target:
            hi = mid
        else:
            lo = mid + 1
    thresholds = tuple(float(t) for t in ordered[lo])
    return Calibration(q=100.0 * lo / (n - 1), thresholds=thresholds, n_fit=n, fit_rate=rate(lo), target=target)


def level_flags(channels: Sequence[Sequence[float] | np.ndarray], cal: Calibration) -> np.ndarray:
    """(n, L) bool: each level's score strictly greater than its threshold."""
    scores = _channels(channels, "scores")
    return scores > np.asarray(cal.thresholds)[None, :]


def first_fired(flags: np.ndarray) -> np.ndarray:
    """(n,) int: per record the first (shallowest) level whose channel fired, -1 when none did."""
    flags = np.asarray(flags, dtype=bool)
    return np.where(flags.any(axis=1), flags.argmax(axis=1), -1)


@dataclass(frozen=True)
class FirstLevel:
    """Counts of one group over L channels: each level's firings and the first level that fired."""

    n: int
    fired: tuple[int, ...]  # per level: records whose channel fired
    first: tuple[int, ...]  # per level: records whose first firing channel is this level
    neither: int  # records no channel flagged

    def share(self, count: int) -> float | None:
        return count / self.n if self.n else None

    @property
    def deeper(self) -> float | None:
        """The share of flagged records first flagged below level 0: those the level-0 score alone would
        miss (the appendix's r_latent with two levels); None when nothing is flagged."""
        flagged = self.n - self.neither
        return sum(self.first[1:]) / flagged if flagged else None


def decompose_levels(flags: np.ndarray) -> FirstLevel:
    """The counts of one group's (n, L) channel flags."""
    flags = np.asarray(flags, dtype=bool).reshape(-1, np.shape(flags)[-1])
    first = first_fired(flags)
    depth = flags.shape[1]
    return FirstLevel(
        n=int(flags.shape[0]),
        fired=tuple(int(v) for v in flags.sum(axis=0)),
        first=tuple(int((first == level).sum()) for level in range(depth)),
        neither=int((first == -1).sum()),
    )
