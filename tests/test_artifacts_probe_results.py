"""What `probe --compare` and `export --probe-results` read of a probe folder (results.csv, test_scores.npz)
and a `--reference` CSV: checked before anything is written, one line otherwise."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from refusal_helpers import one_line_error, run
from tiny_runs import cli

from ecgpos.export.probe_scores import PROBE_SCORES_FILE, ScoreSet, load_scores, save_scores


@pytest.fixture(scope="module")
def probed(shared_data, tmp_path_factory) -> Path:
    """A real ptbxl-super probe folder (tiny random encoder, 2 seeds, 1 epoch)."""
    root = tmp_path_factory.mktemp("probed")
    args = ["probe", "--encoder", "random:tiny/level0", "--task", "ptbxl-super", "--data-root", shared_data]
    args += ["--splits", shared_data / "merl_splits", "--fractions", "100", "--seeds", "2", "--epochs", "1"]
    args += ["--workers", "1", "--bootstrap", "20"]
    assert cli(*args, "--cache-dir", root / "cache", "--out", root / "probe") == 0
    return root / "probe"


def _copy(probed: Path, folder: Path, scores: bool = True) -> Path:
    shutil.copytree(probed, folder)
    if not scores:
        (folder / PROBE_SCORES_FILE).unlink()
    return folder


def test_a_real_probe_folder_compares(probed, tmp_path, capsys):
    rc, out, err = run(capsys, "probe", "--compare", probed, "--reference", "paper", "--out", tmp_path / "cmp")
    assert rc == 0, err


def test_a_truncated_results_csv_is_one_line_and_writes_nothing(probed, tmp_path, capsys):
    bad = _copy(probed, tmp_path / "bad")
    text = (bad / "results.csv").read_text()
    (bad / "results.csv").write_text(text[: len(text) - 40])  # cut inside the last row
    rc, _, err = run(capsys, "probe", "--compare", probed, bad, "--out", tmp_path / "cmp")
    one_line_error(rc, err, "probe", "fields where the header has")
    assert not (tmp_path / "cmp").exists()


@pytest.mark.parametrize("value", ["nan", "1.7", "-3.0", "inf", ""])
def test_an_auroc_out_of_range_is_refused_without_test_scores(probed, tmp_path, capsys, value):
    bad = _copy(probed, tmp_path / "bad", scores=False)
    frame = pd.read_csv(bad / "results.csv", keep_default_na=False)
    frame["test_auroc"] = frame["test_auroc"].astype(object)
    frame.loc[0, "test_auroc"] = value
    frame.to_csv(bad / "results.csv", index=False)
    rc, _, err = run(capsys, "probe", "--compare", bad, "--out", tmp_path / "cmp")
    one_line_error(rc, err, "probe", "test_auroc")
    assert "line 2" in err and not (tmp_path / "cmp").exists()


def test_a_reference_csv_with_an_auroc_above_one_is_refused(probed, tmp_path, capsys):
    ref = tmp_path / "ref.csv"
    ref.write_text("model,ptbxl-super\nMine,1.7\n")
    rc, _, err = run(capsys, "probe", "--compare", probed, "--reference", ref, "--out", tmp_path / "cmp")
    one_line_error(rc, err, "probe", "Mine ptbxl-super 1.7 is not an AUROC")
    assert not (tmp_path / "cmp").exists()


def test_damaged_test_scores_are_refused(probed, tmp_path, capsys):
    sets = load_scores(probed)
    assert sets and all(np.isfinite(s.scores).all() for s in sets)
    first = sets[0]
    cases = {
        "non-finite logits": ScoreSet(**{**vars(first), "scores": np.where(first.scores > 0, np.nan, first.scores)}),
        "seeds": ScoreSet(**{**vars(first), "seeds": [*first.seeds, 99]}),
        "labels other than 0 and 1": ScoreSet(**{**vars(first), "labels": first.labels * 2}),
    }
    needles = {"non-finite logits": "NaN or inf", "seeds": "for the 3 seeds", "labels other than 0 and 1": "labels"}
    for name, damaged in cases.items():
        bad = _copy(probed, tmp_path / name.replace(" ", "-"))
        save_scores([damaged, *sets[1:]], bad)
        rc, _, err = run(capsys, "probe", "--compare", bad, "--out", tmp_path / f"cmp-{name}")
        one_line_error(rc, err, "probe", needles[name])


def test_a_seed_its_probe_json_does_not_name_is_refused(probed, tmp_path, capsys):
    bad = _copy(probed, tmp_path / "bad", scores=False)
    frame = pd.read_csv(bad / "results.csv", keep_default_na=False)
    frame.loc[1, "seed"] = 7  # the probe ran seeds 0 and 1
    frame.to_csv(bad / "results.csv", index=False)
    rc, _, err = run(capsys, "probe", "--compare", bad, "--out", tmp_path / "cmp")
    one_line_error(rc, err, "probe", "line 3: seed 7 is not one of the 2 seeds")
