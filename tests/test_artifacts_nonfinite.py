"""No NaN or inf is ever written as a result: an extreme sample in any input format is a listed skip,
and every feature, score and AUROC written is finite."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import read_rows, run

from ecgpos.ecg.screening import screen_record
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.inference.inputs import finite_outputs


@pytest.fixture(scope="module")
def batch(real_record, tmp_path_factory) -> tuple[Path, str]:
    """A float64 .npy of four copies of a real record: row 1 with one sample at 1e300, row 2 with one
    lead at +-1e6 mV; and its lead names."""
    raw = read_wfdb_record(real_record)
    rows = np.stack([raw.signal.astype(np.float64)] * 4)
    rows[1, 3, 500] = 1e300
    rows[2, 7, ::2] += 1e6
    path = tmp_path_factory.mktemp("extreme") / "batch.npy"
    np.save(path, rows)
    return path, ",".join(raw.leads)


def test_one_lead_far_beyond_any_ecg_is_refused_as_units(real_record):
    raw = read_wfdb_record(real_record)
    x = raw.signal.astype(np.float64)
    x[7, ::2] += 1e6  # one lead of twelve: the median lead is still an ECG
    with pytest.raises(SignalError, match="lead V2 spans") as err:
        screen_record(x, raw.fs, raw.leads, DEFAULT_SPEC)
    assert err.value.reason == "units"
    x[7] = raw.signal[7]
    x[3, 500] = 1e300  # one sample: z-scoring its lead would give NaN features
    with pytest.raises(SignalError, match="lead aVR spans 1e\\+300") as err:
        screen_record(x, raw.fs, raw.leads, DEFAULT_SPEC)
    assert err.value.reason == "units"


def test_embed_skips_extreme_npy_records_and_writes_finite_features(export, batch, tmp_path, capsys):
    path, leads = batch
    out = tmp_path / "f.csv"
    rc, _, err = run(capsys, "embed", "--encoder", export, "--input", path, "--out", out, "--fs", 500,
                     "--leads", leads, "--no-progress")  # fmt: skip
    assert rc == 0, err
    rows = read_rows(out)
    assert [r["record_id"] for r in rows] == ["0", "3"]
    assert np.isfinite(np.array([[float(v) for k, v in r.items() if k != "record_id"] for r in rows])).all()
    skipped = {r["record_id"]: r["reason"] for r in read_rows(tmp_path / "f.skipped.csv")}
    assert skipped == {"1": "units", "2": "units"}


def test_score_skips_extreme_npy_records_and_writes_finite_scores(tiny_run, batch, tmp_path, capsys):
    path, leads = batch
    out = tmp_path / "s.csv"
    rc, stdout, err = run(capsys, "score", "--run", tiny_run, "--input", path, "--out", out, "--fs", 500,
                          "--leads", leads, "--masks", 1, "--no-progress")  # fmt: skip
    assert rc == 0, err
    assert "scored 2 of 4" in stdout
    with open(out, newline="") as handle:
        scores = [float(v) for row in csv.DictReader(handle) for k, v in row.items() if k != "record_id"]
    assert len(scores) == 2 and np.isfinite(scores).all()


def test_a_non_finite_output_becomes_a_listed_skip(capsys):
    skipped: list = []
    assert finite_outputs("a", {"level0": np.array([1.0])}, skipped, "ecgpos score", "scores")
    assert not finite_outputs("b", {"level0": np.array([np.nan]), "level1": [2.0]}, skipped, "ecgpos score", "scores")
    assert skipped == [("b", "non_finite", skipped[0][2])] and "(level0)" in skipped[0][2]
    assert "ecgpos score: skipped b: non_finite" in capsys.readouterr().err
