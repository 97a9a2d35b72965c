"""The OR-rule flags over every level of `ecgpos score --calibration`: the maths against brute force on
hand-made scores, and the command on a tiny real two-level run."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import one_line_error, run

from ecgpos.errors import EcgposError
from ecgpos.inference.flags import calibrate_levels, decompose_levels, first_fired, level_flags, min_fit_records
from ecgpos.inference.scoring import flags_by_label

PTBXL = "ptbxl/records500/00000"


def _brute_rate(rec: np.ndarray, sub: np.ndarray, t_rec: float, t_sub: float) -> float:
    return sum(1 for r, s in zip(rec, sub) if r > t_rec or s > t_sub) / len(rec)


def _fine_grid_q(rec: np.ndarray, sub: np.ndarray, target: float, step: float = 1e-3) -> float:
    """The smallest q on a grid of `step` whose OR rule, at numpy's q-th percentiles, is within target."""
    qs = np.arange(0.0, 100.0 + step / 2, step)
    t_rec, t_sub = np.percentile(rec, qs), np.percentile(sub, qs)
    rates = ((rec[None, :] > t_rec[:, None]) | (sub[None, :] > t_sub[:, None])).mean(axis=1)
    return float(qs[np.flatnonzero(rates <= target)[0]])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("n", "target"), [(20, 0.05), (37, 0.05), (60, 0.1), (25, 0.2)])
def test_q_star_is_the_smallest_percentile_within_the_target(seed: int, n: int, target: float) -> None:
    rng = np.random.default_rng(seed)
    rec = rng.gamma(2.0, size=n)
    sub = 0.5 * rec + rng.gamma(2.0, size=n)
    if seed % 2:  # scores on a coarse grid: ties within and across records
        rec, sub = rec.round(1), sub.round(1)
    cal = calibrate_levels([rec, sub], target)
    t_rec, t_sub = cal.thresholds
    assert np.isclose(t_rec, np.percentile(rec, cal.q)) and np.isclose(t_sub, np.percentile(sub, cal.q))
    assert cal.fit_rate == _brute_rate(rec, sub, t_rec, t_sub) <= target
    grid = _fine_grid_q(rec, sub, target)
    assert cal.q - 1e-9 <= grid <= cal.q + 1e-3 + 1e-9
    if cal.q > 0:  # any smaller percentile exceeds the target
        below = cal.q - 1e-6
        assert _brute_rate(rec, sub, np.percentile(rec, below), np.percentile(sub, below)) > target
    assert cal.n_fit == n and cal.target == target


def test_hand_computed_calibration_and_strict_thresholds() -> None:
    """n = 5, target 0.4: the thresholds (k-th order statistics) give rates 1, 1, 0.8, 0.4, 0."""
    rec, sub = np.array([1.0, 2, 3, 4, 5]), np.array([5.0, 4, 3, 2, 1])
    cal = calibrate_levels([rec, sub], 0.4)
    assert (cal.q, cal.thresholds, cal.fit_rate) == (75.0, (4.0, 4.0), 0.4)
    strict = calibrate_levels([rec, sub], 0.39)
    assert strict.q == 100.0 and strict.fit_rate == 0.0
    # a score equal to its threshold does not fire; only strictly greater does
    a, b = level_flags([[4.0, 4.000001, 0.0, 9.0], [4.0, 0.0, 4.000001, 9.0]], cal).T
    assert a.tolist() == [False, True, False, True] and b.tolist() == [False, False, True, True]


def test_ties_at_the_threshold_are_not_flagged() -> None:
    """Three D_fit records tie at the top of level 0's scores: a threshold at their value flags none of
    them (rate 0); with >= it would flag all three (0.15, above the target)."""
    rec = np.array([0.0] * 17 + [1.0] * 3)
    sub = np.zeros(20)
    cal = calibrate_levels([rec, sub], 0.05)
    assert cal.q == pytest.approx(100 * 17 / 19) and cal.thresholds == (1.0, 0.0)
    assert cal.fit_rate == 0.0 == _brute_rate(rec, sub, *cal.thresholds)
    assert np.mean((rec >= cal.thresholds[0]) | (sub >= cal.thresholds[1])) > 0.05


def test_first_level_counts_and_the_share_below_level_0() -> None:
    """With two levels the share first flagged below level 0 is the appendix's r_latent."""
    rng = np.random.default_rng(3)
    a, b = rng.random(50) < 0.4, rng.random(50) < 0.3
    d = decompose_levels(np.stack([a, b], axis=1))
    assert (d.n, d.fired) == (50, (a.sum(), b.sum()))
    assert d.first == ((a).sum(), (~a & b).sum()) and d.neither == (~a & ~b).sum()
    assert d.deeper == pytest.approx((~a & b).sum() / (a | b).sum())
    assert d.share(d.fired[1]) == pytest.approx(b.mean())
    # nothing flagged, and an empty group: the share below level 0 (and the shares) are undefined
    none = decompose_levels(np.zeros((4, 2), bool))
    assert none.deeper is None and none.share(none.neither) == 1.0
    empty = decompose_levels(np.zeros((0, 2), bool))
    assert empty.deeper is None and empty.share(empty.neither) is None
    assert decompose_levels(np.array([[True, False]])).deeper == 0.0


def test_calibration_refusals() -> None:
    assert [min_fit_records(t) for t in (0.05, 0.1, 0.07, 0.5)] == [20, 10, math.ceil(1 / 0.07), 2]
    good = np.arange(20.0)
    with pytest.raises(EcgposError, match="needs at least 20"):
        calibrate_levels([good[:19], good[:19]], 0.05)
    for target in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(EcgposError, match="strictly between 0 and 1"):
            calibrate_levels([good, good], target)
    with pytest.raises(EcgposError, match="1 of 20 scores are NaN"):
        calibrate_levels([np.where(good == 3, np.nan, good), good], 0.05)
    cal = calibrate_levels([good, good], 0.05)
    with pytest.raises(EcgposError, match="NaN"):
        level_flags([[1.0], [np.nan]], cal)
    with pytest.raises(EcgposError, match="at least two levels"):
        calibrate_levels([good], 0.05)
    ids = [f"r{i}" for i in range(24)]
    labels = {f"r{i}": "C" if i < 20 else "N" if i < 22 else "A" for i in range(24)}
    scores = {"level0": list(np.arange(24.0)), "level1": [0.0] * 23 + [np.nan]}
    with pytest.raises(EcgposError, match="NaN level1 score for 1 of 24 records \\(the first: 'r23'\\)"):
        flags_by_label(ids, scores, labels, ["C"], ["N"], ["A"], 0.05)


def test_flags_by_label_groups_the_records() -> None:
    """D_fit calibrates, every scored record gets flags, and each label's counts are its records'."""
    rng = np.random.default_rng(7)
    ids = [f"r{i}" for i in range(40)]
    labels = {rid: ("C" if i < 20 else "N" if i < 28 else "A" if i < 36 else "B") for i, rid in enumerate(ids)}
    labels["r39"] = "other"
    rec, sub = rng.random(40) + np.r_[np.zeros(28), np.ones(12)], rng.random(40)
    report = flags_by_label(ids, {"level0": rec, "level1": sub}, labels, ["C"], ["N"], ["A", "B"], 0.1)
    assert report.calibration == calibrate_levels([rec[:20], sub[:20]], 0.1)
    assert report.flags[:, 0].tolist() == (rec > report.calibration.thresholds[0]).tolist()
    assert report.flags[:, 1].tolist() == (sub > report.calibration.thresholds[1]).tolist()
    assert list(report.first) == ["N", "A", "B"]
    assert report.first["A"] == decompose_levels(report.flags[28:36])
    assert report.first["B"].n == 3 and report.nominal_first == report.first["N"]
    with pytest.raises(EcgposError, match="at least levels level0, level1"):
        flags_by_label(ids, {"level0": rec}, labels, ["C"], ["N"], ["A"], 0.1)
    with pytest.raises(EcgposError, match="scored set of --calibration C has 20 records; .* at least 25"):
        flags_by_label(ids, {"level0": rec, "level1": sub}, labels, ["C"], ["N"], ["A"], 0.04)


@pytest.fixture(scope="module")
def records(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve real PTB-XL records: 1-4 D_fit (C), 5-8 nominal (N), 9-12 anomalous (A) in `labels.csv`."""
    folder = tmp_path_factory.mktemp("flag-records")
    for n in range(1, 13):
        for ext in ("hea", "dat"):
            (folder / f"{n:05d}_hr.{ext}").write_bytes((shared_data / PTBXL / f"{n:05d}_hr.{ext}").read_bytes())
    return folder


def _labels(path: Path, extra: str = "") -> Path:
    path.write_text(
        "record_id,label\n"
        + "".join(f"{n:05d}_hr,{'C' if n <= 4 else 'N' if n <= 8 else 'A'}\n" for n in range(1, 13))
        + extra
    )
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_score_writes_the_flag_decomposition(level1_run: Path, records: Path, tmp_path: Path, capsys) -> None:
    labels = _labels(tmp_path / "labels.csv")
    out = tmp_path / "o" / "scores.csv"
    base = ["score", "--run", level1_run, "--input", records, "--out", out, "--no-progress", "--masks", "1"]
    labelled = ["--labels", labels, "--nominal", "N", "--anomalous", "A"]
    rc, printed, err = run(capsys, *base, *labelled, "--calibration", "C", "--fpr", "0.25")
    assert rc == 0, err
    scores = {r["record_id"]: (float(r["level0_score"]), float(r["level1_score"])) for r in _rows(out)}
    ids = [f"{n:05d}_hr" for n in range(1, 13)]
    rec, sub = np.array([scores[i][0] for i in ids]), np.array([scores[i][1] for i in ids])
    cal = calibrate_levels([rec[:4], sub[:4]], 0.25)  # D_fit: records 1-4, from the written scores
    a, b = rec > cal.thresholds[0], sub > cal.thresholds[1]
    flags = _rows(out.with_name("scores.flags.csv"))
    assert [(r["record_id"], r["label"]) for r in flags] == [
        (i, "C" if n < 4 else "N" if n < 8 else "A") for n, i in enumerate(ids)
    ]
    assert [(int(r["level0"]), int(r["level1"]), int(r["flag"])) for r in flags] == [
        (int(x), int(y), int(x or y)) for x, y in zip(a, b)
    ]
    text = (out.with_name("scores.summary.md")).read_text()
    assert f"q* = {cal.q:.2f}, t_level0 = {cal.thresholds[0]:.6g}, t_level1 = {cal.thresholds[1]:.6g}" in text
    assert f"realised false-positive rate on D_fit {cal.fit_rate:.3f} (target 0.25)" in text
    nominal_rate = np.mean(a[4:8] | b[4:8])
    assert f"over the 4 nominal evaluation records: {nominal_rate:.3f}." in text
    for label, rows in (("N", slice(4, 8)), ("A", slice(8, 12))):
        x, y = a[rows], b[rows]
        cells = [np.mean(x), np.mean(y), np.mean(x), np.mean(~x & y), np.mean(~x & ~y)]
        latent = "—" if label == "N" or not (x | y).any() else f"{np.sum(~x & y) / np.sum(x | y):.3f}"
        role = "nominal" if label == "N" else "anomalous"
        assert f"| {label} | {role} | 4 | {' | '.join(f'{c:.3f}' for c in cells)} | {latent} |" in text
    assert "| level0 |" in text and "## 2-channel flags (OR rule)" in printed
    # a run that scores nothing deletes the earlier flags with the rest; one without --calibration deletes them
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "00001_hr.hea").write_bytes((records / "00001_hr.hea").read_bytes())
    (broken / "00001_hr.dat").write_bytes((records / "00001_hr.dat").read_bytes()[:1000])
    rc, _, err = run(capsys, *base[:4], broken, *base[5:], *labelled, "--calibration", "C", "--fpr", "0.25")
    assert rc == 2 and "error: none of the 1 WFDB records could be scored" in err
    assert sorted(p.name for p in out.parent.iterdir()) == ["scores.skipped.csv"]
    assert run(capsys, *base, *labelled, "--calibration", "C", "--fpr", "0.25")[0] == 0
    assert out.with_name("scores.flags.csv").is_file()
    rc, _, err = run(capsys, *base, *labelled)
    assert rc == 0, err
    assert sorted(p.name for p in out.parent.iterdir()) == ["scores.csv", "scores.skipped.csv", "scores.summary.md"]
    assert "2-channel" not in out.with_name("scores.summary.md").read_text()


def test_score_flag_refusals(level0_run: Path, level1_run: Path, records: Path, tmp_path: Path, capsys) -> None:
    labels = _labels(tmp_path / "labels.csv")
    out = tmp_path / "o" / "s.csv"
    base = ["score", "--run", level1_run, "--input", records, "--out", out, "--no-progress", "--masks", "1"]
    labelled = ["--labels", labels, "--nominal", "N", "--anomalous", "A"]
    cases = [
        (["--calibration", "C"], "--calibration needs --labels CSV"),
        ([*labelled, "--fpr", "0.25"], "--fpr needs --calibration"),
        ([*labelled, "--calibration", "C", "--fpr", "1"], "strictly between 0 and 1"),
        ([*labelled, "--calibration", "C", "--fpr", "nan"], "strictly between 0 and 1"),
        ([*labelled, "--calibration", "C,N", "--fpr", "0.25"], "--calibration label N is also a --nominal label"),
        ([*labelled, "--calibration", "A", "--fpr", "0.25"], "is also a --anomalous label"),
        ([*labelled, "--calibration", "C"], "has 4 records; a false-positive rate of 0.05 needs at least 20"),
        ([*labelled, "--calibration", "Q"], "has 0 records"),
    ]
    for extra, needle in cases:
        one_line_error(*run(capsys, *base, *extra)[::2], "score", needle)
    level0 = ["score", "--run", level0_run, "--input", records, "--out", out, "--no-progress"]
    rc, _, err = run(capsys, *level0, *labelled, "--calibration", "C", "--fpr", "0.25")
    one_line_error(rc, err, "score", "--calibration needs the scores of every level")
    assert not out.parent.exists() or not any(out.parent.iterdir())
    # a D_fit record that is not among the scored ones: the scores are written, the flags refused
    short = _labels(tmp_path / "short.csv", "elsewhere/00013_hr,C\n")
    rc, _, err = run(capsys, *base, *labelled[:1], short, *labelled[2:], "--calibration", "C", "--fpr", "0.2")
    assert "match no record of the input and are in no AUROC: elsewhere/00013_hr" in err  # named, not ignored
    err = "\n".join(line for line in err.splitlines() if ": note: " not in line)
    one_line_error(rc, err, "score", "the scored set of --calibration C has 4 records; a false-positive rate")
    assert sorted(p.name for p in out.parent.iterdir()) == ["s.csv", "s.skipped.csv"]


def test_the_or_rule_over_three_levels() -> None:
    """Three channels share one percentile; the OR's rate on D_fit meets the target, and each record
    counts under the first level that fired."""
    rng = np.random.default_rng(3)
    fit = [rng.random(40) for _ in range(3)]
    cal = calibrate_levels(fit, 0.1)
    k = round(cal.q / 100 * 39)
    assert cal.thresholds == tuple(float(np.sort(c)[k]) for c in fit)
    assert cal.fit_rate == np.mean(np.any([c > t for c, t in zip(fit, cal.thresholds)], axis=0)) <= 0.1
    flags = np.array([[0, 0, 0], [0, 1, 1], [1, 1, 0], [0, 0, 1], [0, 0, 1]], dtype=bool)
    assert first_fired(flags).tolist() == [-1, 1, 0, 2, 2]
    d = decompose_levels(flags)
    assert (d.n, d.fired, d.first, d.neither) == (5, (1, 2, 3), (1, 1, 2), 1)
    assert d.deeper == pytest.approx(3 / 4)
    ids = [f"r{i}" for i in range(46)]
    labels = {rid: "C" if i < 40 else "N" if i < 43 else "A" for i, rid in enumerate(ids)}
    scores = {
        f"level{level}": np.r_[fit[level], np.zeros(3), np.full(3, 2.0 if level == 2 else 0.0)] for level in range(3)
    }
    report = flags_by_label(ids, scores, labels, ["C"], ["N"], ["A"], 0.1)
    assert report.calibration == cal and report.levels == ["level0", "level1", "level2"]
    assert report.first["A"].first == (0, 0, 3) and report.first["N"].neither == 3
