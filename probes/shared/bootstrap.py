"""Stratified bootstrap intervals of the test macro-AUROC, vectorised over all resamples.

The unit resampled is the patient where the split files name one (PTB-XL: `patient_id`) and some
patient has more than one test record: a patient's recordings are not independent, and resampling
them one by one would make the interval too narrow. A drawn patient brings all of their test records;
patients are stratified by the union of their records' labels. Otherwise the unit is the record.

Resampling is stratified by label pattern: the test records are grouped by their full 0/1 label row
and every group is resampled with replacement to its own size. Patterns held by fewer than
MIN_STRATUM records (most of them, with 20-40 classes) are pooled into one stratum: a pattern of one
record resampled on its own would be drawn exactly once every time and add no variance, which would
make the interval too narrow. A resample in which a class that the test set can score has no
positive or no negative is drawn again, so every resample scores the same classes as the test set; one
still short after `max_redraws` tries is dropped (an interval then rests on fewer resamples than asked
for, and the callers report how many it kept).

Speed: a resample is a vector of multiplicities (how often each record was drawn), so the AUROC of
every resample is a weighted Mann-Whitney statistic over the records sorted once by score: for each
distinct score, the drawn negatives below it (a cumulative sum) plus half the tied ones. One sort
per class and a few (B, N) array passes give all B resamples at once; `macro_auroc_reference` is
the plain per-resample scikit-learn loop that tests compare against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import roc_auc_score

from ecgpos.export.probe_scores import macro_aurocs

DEFAULT_RESAMPLES = 1000
MAX_RESAMPLES = 100_000  # (resamples, test records) int64 indices are held at once
LEVEL = 0.95
SEED = 20240101  # fixed: the same test labels always give the same resamples
MIN_STRATUM = 5  # label patterns held by fewer test records are pooled into one stratum
BLANK_PATIENTS = ("", "nan", "None")  # a split file's empty patient cell, as read
MAX_REDRAWS = 100  # tries of a resample that leaves a scorable class without a positive or a negative


def strata(labels: np.ndarray, min_stratum: int = MIN_STRATUM) -> list[np.ndarray]:
    """Row indices of each stratum: one per label pattern held by >= min_stratum records, and one
    pooling the rows of all rarer patterns."""
    labels = np.asarray(labels)
    _, group, counts = np.unique(labels.reshape(len(labels), -1), axis=0, return_inverse=True, return_counts=True)
    group = np.asarray(group).reshape(-1)
    out = [np.flatnonzero(group == g) for g in np.flatnonzero(counts >= min_stratum)]
    rare = np.flatnonzero(counts[group] < min_stratum)
    return out + ([rare] if len(rare) else [])


def _draw(groups: list[np.ndarray], n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    out = np.empty((count, n), dtype=np.int64)
    for rows in groups:
        out[:, rows] = rows[rng.integers(0, len(rows), size=(count, len(rows)))]
    return out


def stratified_indices(
    labels: np.ndarray, n_boot: int, seed: int = SEED, min_stratum: int = MIN_STRATUM, max_redraws: int = MAX_REDRAWS
) -> np.ndarray:
    """(B, N) row indices, stratified by label pattern (rare patterns pooled); a resample that leaves a
    scorable class without positives or negatives is drawn again, and dropped when it still does after
    `max_redraws` tries, so B <= n_boot (its macro-AUROC would be NaN and the interval would silently
    rest on the other resamples)."""
    labels = np.asarray(labels).reshape(len(labels), -1)
    rng = np.random.default_rng(seed)
    groups = strata(labels, min_stratum)
    out = _draw(groups, len(labels), n_boot, rng)
    for _ in range(max_redraws):
        bad = np.flatnonzero(_short(labels, multiplicities(out, len(labels))))
        if not len(bad):
            return out
        out[bad] = _draw(groups, len(labels), len(bad), rng)
    return out[~_short(labels, multiplicities(out, len(labels)))]


def patient_clusters(groups: Sequence[str] | None) -> np.ndarray | None:
    """(N,) cluster number of each record from its patient (a blank patient is a cluster of its own), or
    None when no patient has two records: then the record is the unit and nothing changes."""
    if groups is None:
        return None
    named = [g if g not in BLANK_PATIENTS else f"\0{i}" for i, g in enumerate(map(str, groups))]
    _, cluster = np.unique(np.asarray(named), return_inverse=True)
    cluster = np.asarray(cluster).reshape(-1)
    return cluster if len(cluster) and cluster.max() + 1 < len(cluster) else None


def _short(labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(B,) True where a resample (weights (N, B)) leaves a class that labels can score without a
    drawn positive or a drawn negative."""
    positives = labels.sum(axis=0)
    scorable = labels[:, (positives > 0) & (positives < len(labels))].astype(np.int64)
    drawn = scorable.T @ weights  # (scorable classes, B)
    return ((drawn == 0) | (drawn == weights.sum(axis=0))).any(axis=0)


def bootstrap_unit(groups: Sequence[str] | None) -> str:
    """What `resample_weights` resamples for these patients: "patient" or "record"."""
    return "record" if patient_clusters(groups) is None else "patient"


def patient_weights(
    labels: np.ndarray,
    cluster: np.ndarray,
    n_boot: int,
    seed: int = SEED,
    min_stratum: int = MIN_STRATUM,
    max_redraws: int = MAX_REDRAWS,
) -> np.ndarray:
    """(N, B) multiplicities of a patient-level bootstrap: each resample draws as many patients as
    there are, with replacement, within strata of the patients' label unions (rare unions pooled), and
    every record of a drawn patient counts once per draw. Redraws and drops as `stratified_indices`."""
    labels = np.asarray(labels).reshape(len(labels), -1)
    k = int(cluster.max()) + 1
    union = np.zeros((k, labels.shape[1]), dtype=bool)
    np.logical_or.at(union, cluster, labels.astype(bool))
    groups = strata(union, min_stratum)
    rng = np.random.default_rng(seed)

    def draw(count: int) -> np.ndarray:
        return multiplicities(_draw(groups, k, count, rng), k)[cluster]

    out = draw(n_boot)
    for _ in range(max_redraws):
        bad = np.flatnonzero(_short(labels, out))
        if not len(bad):
            return out
        out[:, bad] = draw(len(bad))
    return np.ascontiguousarray(out[:, ~_short(labels, out)])


def resample_weights(
    labels: np.ndarray, n_boot: int, seed: int = SEED, groups: Sequence[str] | None = None
) -> np.ndarray:
    """(N, B) multiplicities of B <= n_boot stratified resamples of the test records: by patient when
    `groups` (the patient of each record) has a patient with several records, else by record."""
    cluster = patient_clusters(groups)
    if cluster is not None:
        return patient_weights(labels, cluster, n_boot, seed)
    return multiplicities(stratified_indices(labels, n_boot, seed), len(labels))


def multiplicities(indices: np.ndarray, n: int) -> np.ndarray:
    """(N, B) int32: how often each record is drawn in each resample (records on rows: gathering the
    records of one class is then a copy of whole contiguous rows)."""
    b = len(indices)
    flat = (indices + n * np.arange(b)[:, None]).reshape(-1)
    return np.ascontiguousarray(np.bincount(flat, minlength=b * n).reshape(b, n).T.astype(np.int32))


def _auroc_weighted(score: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(B,) AUROC of one class for every resample: score, positive (N,), weights (N, B) multiplicities."""
    order = np.argsort(score, kind="stable")
    s, pos_sorted = score[order], positive[order]
    tied = s[1:] == s[:-1]
    if tied.any() and (pos_sorted[1:] != pos_sorted[:-1])[tied].any():
        return _auroc_weighted_ties(s, pos_sorted, weights[order])
    # no positive ties a negative: U = sum over positives of (weight x drawn negatives below it)
    pos_at = np.flatnonzero(pos_sorted)
    neg_w = weights[order[~pos_sorted]]  # (Q, B), ascending score
    rank = pos_at - np.arange(len(pos_at))  # negatives ranked below each positive
    # drawn negatives below each positive: segment sums between consecutive positives, then a running
    # sum over the positives (row by row: numpy's cumsum along axis 0 is several times slower)
    edges, first = np.unique(rank, return_index=True)
    inner = edges[(edges > 0) & (edges < len(neg_w))]
    segments = np.add.reduceat(neg_w, np.r_[0, inner], axis=0) if len(neg_w) else np.zeros((1, weights.shape[1]))
    running = np.zeros((len(edges), weights.shape[1]), dtype=np.int64)
    total = np.zeros(weights.shape[1], dtype=np.int64)
    k = 0
    for g, edge in enumerate(edges):
        while k < len(inner) + 1 and (0 if k == 0 else inner[k - 1]) < edge:
            total += segments[k]
            k += 1
        running[g] = total
    below = running[np.searchsorted(edges, rank)]  # (P, B)
    pos_w = weights[order[pos_at]]  # (P, B)
    u = (pos_w * below).sum(axis=0)
    negatives = neg_w.sum(axis=0, dtype=np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return u / (pos_w.sum(axis=0, dtype=np.int64) * negatives.astype(np.float64))


def _auroc_weighted_ties(s: np.ndarray, pos_sorted: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The general case (ties between positives and negatives count one half), inputs sorted by score."""
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])  # first position of each distinct score
    w = w.astype(np.float64)
    pos = np.add.reduceat(w * pos_sorted[:, None], starts, axis=0)  # (G, B) drawn positives per score
    neg = np.add.reduceat(w * ~pos_sorted[:, None], starts, axis=0)  # (G, B) drawn negatives per score
    below = np.cumsum(neg, axis=0) - neg
    u = (pos * (below + 0.5 * neg)).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return u / (pos.sum(axis=0) * neg.sum(axis=0))


def macro_auroc_resamples(scores: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Macro-AUROC of every resample given as (B, N) row indices: `macro_auroc_weighted` of their
    multiplicities."""
    return macro_auroc_weighted(scores, labels, multiplicities(indices, len(labels)))


def macro_auroc_weighted(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Macro-AUROC of every resample: scores (S, N, C) or (N, C), labels (N, C), weights (N, B) how often
    each record is drawn -> (S, B) or (B,).

    The macro runs over the classes with a positive and a negative in `labels` (the same classes
    in every stratified resample); NaN when there is none.
    """
    scores = np.asarray(scores, dtype=np.float64)
    single = scores.ndim == 2
    scores = scores[None] if single else scores
    labels = np.asarray(labels).astype(bool)
    n = len(labels)
    count = labels.sum(axis=0)
    valid = np.flatnonzero((count > 0) & (count < n))
    out = np.full((len(scores), weights.shape[1]), np.nan)
    if len(valid):
        for i, seed_scores in enumerate(scores):
            out[i] = np.mean([_auroc_weighted(seed_scores[:, c], labels[:, c], weights) for c in valid], axis=0)
    return out[0] if single else out


def macro_auroc_reference(scores: np.ndarray, labels: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """The plain implementation: (B,) scikit-learn macro-AUROC of each resample, one at a time."""
    labels = np.asarray(labels)
    out = []
    for rows in indices:
        y, s = labels[rows], scores[rows]
        vals = [roc_auc_score(y[:, c], s[:, c]) for c in range(y.shape[1]) if 0 < y[:, c].sum() < len(y)]
        out.append(np.mean(vals) if vals else np.nan)
    return np.array(out)


def percentile_interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """(low, high) percentile interval of bootstrap values (NaN resamples ignored)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if not len(values):
        return float("nan"), float("nan")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


@dataclass
class Intervals:
    """One (encoder, task, fraction): per-seed intervals and the seed-mean interval."""

    seeds: list[tuple[float, float]]
    mean: tuple[float, float]
    resamples: np.ndarray  # (S, B) macro-AUROC of every seed and kept resample (B <= the count asked for)


def seed_intervals(
    scores: np.ndarray,
    labels: np.ndarray,
    n_boot: int,
    seed: int = SEED,
    level: float = LEVEL,
    groups: Sequence[str] | None = None,
) -> Intervals:
    """Intervals of scores (S, N, C) against labels (N, C): per seed, and of each resample's seed mean;
    groups: the patient of each record, or None (`resample_weights`)."""
    resamples = macro_auroc_weighted(scores, labels, resample_weights(labels, n_boot, seed, groups))
    return Intervals(
        [percentile_interval(r, level) for r in resamples],
        percentile_interval(resamples.mean(axis=0), level),
        resamples,
    )


def paired_difference(
    scores_a: np.ndarray,
    scores_b: np.ndarray,
    labels: np.ndarray,
    n_boot: int,
    seed: int = SEED,
    level: float = LEVEL,
    groups: Sequence[str] | None = None,
) -> tuple[float, float, float, int]:
    """(difference, low, high, resamples kept) of seed-mean macro-AUROC, A minus B, on the same resamples
    for both.

    scores_a (Sa, N, C), scores_b (Sb, N, C) on the same test records in the same order; groups: the
    patient of each record, or None.
    """
    weights = resample_weights(labels, n_boot, seed, groups)
    a = macro_auroc_weighted(scores_a, labels, weights).mean(axis=0)
    b = macro_auroc_weighted(scores_b, labels, weights).mean(axis=0)
    point = float(macro_aurocs(labels, np.asarray(scores_a)).mean() - macro_aurocs(labels, np.asarray(scores_b)).mean())
    return (point, *percentile_interval(a - b, level), weights.shape[1])
