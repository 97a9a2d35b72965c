"""Bootstrap intervals: the vectorised statistic against a plain loop, stratification, coverage, pairing."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from ecgpos.export.probe_scores import ScoreSet
from ecgpos.probes.shared.bootstrap import (
    MIN_STRATUM,
    macro_auroc_reference,
    macro_auroc_resamples,
    paired_difference,
    patient_clusters,
    resample_weights,
    seed_intervals,
    stratified_indices,
)
from ecgpos.probes.shared.intervals import add_intervals, paired_differences


def _predictions(rng: np.random.Generator, n: int = 120, classes: int = 4, seeds: int = 3):
    labels = (rng.random((n, classes)) < [0.4, 0.2, 0.1, 0.05][:classes]).astype(np.uint8)
    labels[:2, -1] = 1  # at least one positive in every column
    scores = rng.normal(0, 1, (seeds, n, classes)) + labels
    scores[:, :30, 0] = np.round(scores[:, :30, 0])  # ties between positives and negatives
    return scores, labels


def _plain_intervals(scores: np.ndarray, labels: np.ndarray, indices: np.ndarray):
    """The textbook procedure, one resample and one seed at a time with scikit-learn."""
    per_seed = np.zeros((len(scores), len(indices)))
    for s, seed_scores in enumerate(scores):
        for b, rows in enumerate(indices):
            y, x = labels[rows], seed_scores[rows]
            per_seed[s, b] = np.mean(
                [roc_auc_score(y[:, c], x[:, c]) for c in range(y.shape[1]) if 0 < y[:, c].sum() < len(y)]
            )
    seeds = [tuple(np.percentile(r, [2.5, 97.5])) for r in per_seed]
    return seeds, tuple(np.percentile(per_seed.mean(axis=0), [2.5, 97.5]))


def test_vectorised_bootstrap_equals_plain_reference():
    scores, labels = _predictions(np.random.default_rng(0))
    indices = stratified_indices(labels, 200, seed=7)
    fast = macro_auroc_resamples(scores, labels, indices)
    for s in range(len(scores)):
        np.testing.assert_allclose(fast[s], macro_auroc_reference(scores[s], labels, indices), rtol=0, atol=1e-12)
    intervals = seed_intervals(scores, labels, 200, seed=7)
    seeds, mean = _plain_intervals(scores, labels, indices)
    np.testing.assert_allclose(intervals.seeds, seeds, atol=1e-12)
    np.testing.assert_allclose(intervals.mean, mean, atol=1e-12)
    # the identity resample is the plain test macro-AUROC
    whole = macro_auroc_resamples(scores[0], labels, np.arange(len(labels))[None])[0]
    assert whole == pytest.approx(np.mean([roc_auc_score(labels[:, c], scores[0][:, c]) for c in range(4)]), abs=1e-12)


def test_seeded_bootstrap_is_reproducible_and_stratified():
    scores, labels = _predictions(np.random.default_rng(1))
    a, b = seed_intervals(scores, labels, 300, seed=3), seed_intervals(scores, labels, 300, seed=3)
    assert a.seeds == b.seeds and a.mean == b.mean
    assert seed_intervals(scores, labels, 300, seed=4).mean != a.mean
    indices = stratified_indices(labels, 50, seed=3)
    patterns, counts = np.unique(labels, axis=0, return_counts=True)
    common = patterns[counts >= MIN_STRATUM]
    assert len(common) and len(common) < len(patterns)  # both kinds of stratum occur
    rare_rows = ~(labels[:, None] == common[None]).all(axis=2).any(axis=1)
    for rows in indices:  # every common pattern keeps its count; the pooled rare ones keep theirs together
        for p in common:
            assert (labels[rows] == p).all(axis=1).sum() == (labels == p).all(axis=1).sum()
        assert rare_rows[rows].sum() == rare_rows.sum()
        assert (labels[rows].sum(axis=0) > 0).all()  # every class keeps a positive
    assert all(low < high for low, high in [*a.seeds, a.mean])


def test_records_of_unique_label_patterns_vary_between_resamples():
    # many classes: most label patterns are held by one record; those records must still be resampled
    rng = np.random.default_rng(5)
    labels = (rng.random((200, 20)) < 0.15).astype(np.uint8)
    labels[:3] = 1
    _, counts = np.unique(labels, axis=0, return_counts=True)
    assert (counts == 1).sum() > 100
    drawn = np.stack([np.bincount(rows, minlength=len(labels)) for rows in stratified_indices(labels, 200, seed=1)])
    assert drawn.std(axis=0).min() > 0.5  # each record's multiplicity varies (about Poisson(1), std 1)
    positives = np.stack([labels[rows].sum(axis=0) for rows in stratified_indices(labels, 200, seed=1)])
    assert (positives > 0).all() and (positives < len(labels)).all()


def test_interval_covers_the_true_auroc_at_about_the_nominal_rate():
    # binormal scores: positives N(d, 1), negatives N(0, 1) -> AUROC = Phi(d / sqrt 2), known exactly
    rng = np.random.default_rng(11)
    shift = np.array([1.0, 0.5])
    truth = norm.cdf(shift / np.sqrt(2)).mean()
    trials, hits = 400, 0
    for trial in range(trials):
        labels = (rng.random((200, 2)) < [0.3, 0.2]).astype(np.uint8)
        scores = rng.normal(0, 1, (200, 2)) + labels * shift
        low, high = seed_intervals(scores[None], labels, 400, seed=trial).mean
        hits += low <= truth <= high
    assert 0.90 <= hits / trials <= 0.985, hits / trials


def test_paired_difference_uses_the_same_resamples():
    rng = np.random.default_rng(5)
    labels = (rng.random((300, 3)) < 0.3).astype(np.uint8)
    weak = rng.normal(0, 1, (2, 300, 3)) + 0.3 * labels
    strong = weak + 1.0 * labels  # the same noise plus more signal: better on every resample
    assert paired_difference(weak, weak, labels, 300) == (0.0, 0.0, 0.0, 300)
    diff, low, high, _ = paired_difference(strong, weak, labels, 300)
    assert 0 < low <= diff <= high
    a = macro_auroc_resamples(strong, labels, np.arange(300)[None]).mean()
    b = macro_auroc_resamples(weak, labels, np.arange(300)[None]).mean()
    assert diff == pytest.approx(a - b, abs=1e-12)
    # unpaired intervals of the two would overlap far more than the paired difference suggests
    assert seed_intervals(strong, labels, 300).mean[0] - seed_intervals(weak, labels, 300).mean[1] < low


def _single_positive_classes(classes: int = 6, n: int = 30) -> np.ndarray:
    """Each class positive in one record of its own: every such record is a label pattern of one, so all
    of them share the pooled stratum, and a resample keeps every class only when it draws all of them."""
    labels = np.zeros((n, classes), np.uint8)
    labels[np.arange(classes), np.arange(classes)] = 1
    return labels


def test_resamples_still_short_of_a_class_are_dropped_and_counted():
    # 6! / 6^6 = 1.5 %: a resample keeps all six classes once in 65 draws, so about a fifth stay short
    # after 100 redraws; they scored NaN and the interval silently rested on the others
    labels = _single_positive_classes()
    indices = stratified_indices(labels, 200, seed=2)
    assert 100 < len(indices) < 200
    assert (labels[indices].sum(axis=1) > 0).all()  # every kept resample scores every class
    scores = np.random.default_rng(0).normal(size=(2, *labels.shape)) + labels
    intervals = seed_intervals(scores, labels, 200, seed=2)
    assert intervals.resamples.shape == (2, len(indices)) and np.isfinite(intervals.resamples).all()
    diff, low, high, kept = paired_difference(scores, scores[::-1], labels, 200, seed=2)
    assert kept == len(indices) and np.isfinite([diff, low, high]).all()


def test_results_rows_say_how_many_resamples_an_interval_rests_on():
    labels = _single_positive_classes()
    scores = np.random.default_rng(0).normal(size=(2, *labels.shape)).astype(np.float32) + labels
    keys = [f"r{i}" for i in range(len(labels))]
    sets = [ScoreSet("enc", "t", 1.0, [0, 1], keys, labels, scores)]
    rows = [{"encoder": "enc", "task": "t", "fraction": 1.0, "seed": s, "note": ""} for s in (0, 1)]
    add_intervals(rows, sets, 200)
    kept = len(stratified_indices(labels, 200))
    assert kept < 200 and all(r["bootstrap"] == kept for r in rows)
    assert all(r["note"].startswith(f"bootstrap: {kept} of 200 resamples kept") for r in rows)
    assert "without a positive or a negative" in rows[0]["note"]
    # a test split every resample can score: all resamples, no note
    full = (np.arange(60)[:, None] % [2, 3] == 0).astype(np.uint8)
    sets = [ScoreSet("enc", "t", 1.0, [0], [str(i) for i in range(60)], full, np.zeros((1, 60, 2), np.float32))]
    rows = [{"encoder": "enc", "task": "t", "fraction": 1.0, "seed": 0, "note": ""}]
    add_intervals(rows, sets, 200)
    assert rows[0]["bootstrap"] == 200 and rows[0]["note"] == ""


def _patients(rng: np.random.Generator, patients: int = 80, per_patient: int = 4):
    """Test records of `patients` patients with `per_patient` recordings each, whose scores share a
    strong per-patient effect (as recordings of one heart do): labels (N, 2), scores (1, N, 2), ids."""
    ids = np.repeat([f"p{i}" for i in range(patients)], per_patient)
    labels = np.repeat(rng.random((patients, 2)) < [0.4, 0.25], per_patient, axis=0).astype(np.uint8)
    labels[::7, 1] ^= 1  # some patients' recordings differ in a label
    effect = np.repeat(rng.normal(0, 1.5, (patients, 2)), per_patient, axis=0)
    scores = effect + labels + rng.normal(0, 0.2, labels.shape)
    return labels, scores[None].astype(np.float32), list(ids)


def test_patient_clusters_only_where_a_patient_has_several_records():
    assert patient_clusters(None) is None
    assert patient_clusters(["a", "b", "c"]) is None  # one record each: the record is the unit
    assert patient_clusters(["", "nan", "a"]) is None  # blank patients are never pooled together
    cluster = patient_clusters(["b", "a", "b", "", ""])
    assert cluster[0] == cluster[2] and len(set(cluster[[0, 1, 3, 4]])) == 4


def test_patient_bootstrap_draws_whole_patients_within_strata():
    labels, _, ids = _patients(np.random.default_rng(0))
    weights = resample_weights(labels, 300, seed=1, groups=ids)
    assert weights.shape == (len(labels), 300)
    per_patient = weights.reshape(80, 4, 300)
    assert (per_patient == per_patient[:, :1]).all()  # a patient's records are drawn together
    assert (weights.sum(axis=0) == len(labels)).all()  # as many patients as the test split has
    drawn = labels.T.astype(int) @ weights
    assert (drawn > 0).all() and (drawn < weights.sum(axis=0)).all()  # every resample scores every class
    # patients whose label unions are common are resampled within their stratum: its size is kept
    union = labels.reshape(80, 4, 2).max(axis=1)
    stratum = (union == [1, 0]).all(axis=1)
    assert stratum.sum() >= MIN_STRATUM
    assert (per_patient[stratum, 0].sum(axis=0) == stratum.sum()).all()
    # one record per patient: exactly the record-level bootstrap
    unique = [f"q{i}" for i in range(len(labels))]
    np.testing.assert_array_equal(resample_weights(labels, 50, 3, unique), resample_weights(labels, 50, 3))


def test_patient_bootstrap_widens_the_interval_of_correlated_recordings():
    """Four recordings of one patient carry less information than four patients: resampling records
    one by one would understate the interval, by about half here."""
    labels, scores, ids = _patients(np.random.default_rng(2))
    by_record = seed_intervals(scores, labels, 1000).mean
    by_patient = seed_intervals(scores, labels, 1000, groups=ids).mean
    width = lambda interval: interval[1] - interval[0]  # noqa: E731
    assert width(by_patient) > 1.5 * width(by_record), (by_patient, by_record)
    assert by_patient[0] < by_record[0] and by_patient[1] > by_record[1]


def test_rows_and_paired_differences_name_the_unit_resampled():
    labels, scores, ids = _patients(np.random.default_rng(3))
    keys = [f"r{i}" for i in range(len(labels))]
    sets = [
        ScoreSet("a", "t", 1.0, [0], keys, labels, scores, ids),
        ScoreSet("b", "t", 1.0, [0], keys, labels, scores[:, ::-1].copy(), None),  # an older folder
    ]
    rows = [{"encoder": e, "task": "t", "fraction": 1.0, "seed": 0, "note": ""} for e in ("a", "b")]
    add_intervals(rows, sets, 200)
    assert [r["bootstrap_unit"] for r in rows] == ["patient", "record"]
    diffs = paired_differences(sets, ["a", "b"], 200)  # b - a: the patients a stored are used
    point, low, high, _ = paired_difference(scores, scores[:, ::-1], labels, 200, groups=ids)
    assert diffs.iloc[0]["bootstrap_unit"] == "patient"
    assert (diffs.iloc[0]["difference"], diffs.iloc[0]["low"]) == (pytest.approx(-point), pytest.approx(-high))
