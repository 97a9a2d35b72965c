"""The classifier path gives one answer per question: `predict` refuses --level and writes the probability its
flag compares, config.json binds `windows`, `export --fraction` is in percent as `finetune --fractions`, and
the export's test AUROC ranks the logits as results.csv does. Messages name the thing that is wrong."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import ecgpos
from ecgpos.cli import main

SEED0 = Path("models") / "arrhythmia-rhythm" / "1" / "seed0"


def cli(*args: object) -> int:
    return main([str(a) for a in args])


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def finetuned(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from classifier_fixtures import write_finetune_out

    return write_finetune_out(shared_data, tmp_path_factory.mktemp("finetune") / "out")


@pytest.fixture(scope="module")
def classifier(finetuned: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("classifier") / "clf"
    assert cli("export", "--classifier", finetuned["out"], "--out", out) == 0
    return out


def test_predict_refuses_level_in_one_line(
    classifier: Path, real_record: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for level in ("0", "1", "-1"):
        assert (
            cli("predict", "--model", classifier, "--input", real_record, "--out", tmp_path / "p.csv", "--level", level)
            == 2
        )
        assert f"--level {level}: a classifier is applied whole" in _one_line(capsys)
    assert not (tmp_path / "p.csv").exists()


def test_edited_windows_fail_verify_and_loading(
    classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(classifier, edited)
    config = json.loads((edited / "config.json").read_text())
    config["windows"] = 4
    (edited / "config.json").write_text(json.dumps(config))
    assert cli("verify", edited) == 1
    with pytest.raises(ecgpos.errors.EcgposError, match=r"config_sha256 binds \(.*windows\)"):
        ecgpos.load_classifier(edited)


def test_printed_probabilities_sit_on_their_flags_side_of_the_threshold(classifier: Path, tmp_path: Path) -> None:
    """Probabilities one float32 step either side of each threshold (and on it): the file's number, read back,
    compares with config.json's threshold as its flag says."""
    from ecgpos.cli.predict import write_predictions

    model = ecgpos.load_classifier(classifier)
    t = model.thresholds.astype(np.float32)
    rows = [np.nextafter(t, np.float32(0)), t, np.nextafter(t, np.float32(1))]
    probabilities = np.stack(rows).astype(np.float32)
    out = tmp_path / "p.csv"
    write_predictions(out, ["below", "at", "above"], probabilities, model, [])
    thresholds = json.loads((classifier / "config.json").read_text())["thresholds"]["values"]
    got = list(csv.DictReader(out.open()))
    for row, probs in zip(got, probabilities):
        for label, p in zip(model.labels, probs):
            written = float(row[f"{label}_probability"])
            assert written == float(p)
            assert int(row[f"{label}_flag"]) == int(written >= thresholds[label])


def test_export_fraction_is_in_percent_as_finetune_fractions(
    finetuned: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The fixture's models are at fraction 1 (folder `1`): `finetune --fractions 100`."""
    assert cli("export", "--classifier", finetuned["out"], "--fraction", "1", "--out", tmp_path / "one") == 2
    assert "no model for these flags; it holds arrhythmia-rhythm 100 %" in _one_line(capsys)
    assert not (tmp_path / "one").exists()
    assert cli("export", "--classifier", finetuned["out"], "--fraction", "100", "--out", tmp_path / "all") == 0
    card = (tmp_path / "all" / "README.md").read_text()
    assert "(100 % of its training labels" in card and "fraction of training labels: 100 %" in card
    for bad in ("0", "101", "half"):
        assert cli("export", "--classifier", finetuned["out"], "--fraction", bad, "--out", tmp_path / "x") == 2
        assert "--fraction is a percentage in (0, 100]" in _one_line(capsys)


def test_export_test_auroc_ranks_the_logits_as_results_csv_does(finetuned: dict, tmp_path: Path) -> None:
    """A confident model: its float32 probabilities saturate at 1 and tie, its logits do not. The export's
    per-label and macro test AUROC are finetune's (ecgpos.probes.finetune.train.class_aurocs on the logits)."""
    from ecgpos.export.finetuned_format import write_scores
    from ecgpos.probes.finetune.train import class_aurocs

    out = tmp_path / "finetune"
    shutil.copytree(finetuned["out"], out)
    labels = ["SB", "AFIB", "SR"]
    rng = np.random.default_rng(0)
    for split in ("val", "test"):
        path = out / SEED0 / f"{split}_scores.npz"
        with np.load(path) as data:
            y_true, records = data["y_true"], [str(r) for r in data["records"]]
        # logits of a confident model: most lie beyond +-17, where float32 sigmoid rounds to 1
        logits = rng.normal(0, 30, y_true.shape) + 20 * (2 * y_true - 1)
        write_scores(path, y_true, logits, records, labels)  # as `ecgpos finetune` writes them
    with np.load(out / SEED0 / "test_scores.npz") as data:
        y_true, logits, y_score = data["y_true"], data["logits"], data["y_score"]
    assert (y_score == 1).sum() > 1  # the probabilities tie
    _, per_class = class_aurocs(y_true, logits, labels)
    assert cli("export", "--classifier", out, "--out", tmp_path / "clf") == 0
    test = json.loads((tmp_path / "clf" / "config.json").read_text())["test"]
    for label, value in per_class.items():
        assert test["per_label"][label]["auroc"] == pytest.approx(value, abs=1e-6)
    assert test["macro_auroc"] == pytest.approx(np.mean(list(per_class.values())), abs=1e-6)


def test_messages_name_the_right_thing(
    classifier: Path, finetuned: dict, real_record: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # an edited threshold: the message names the bound fields, thresholds among them
    edited = tmp_path / "edited"
    shutil.copytree(classifier, edited)
    config = json.loads((edited / "config.json").read_text())
    config["thresholds"]["values"]["SB"] = 0.01
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ecgpos.errors.EcgposError, match="thresholds"):
        ecgpos.load_classifier(edited)
    # an output inside a classifier export
    assert cli("predict", "--model", classifier, "--input", real_record, "--out", classifier / "p.csv") == 2
    assert "inside the classifier export" in _one_line(capsys)
    # an encoder export given to predict
    assert (
        cli("predict", "--model", finetuned["encoder_export"], "--input", real_record, "--out", tmp_path / "p.csv") == 2
    )
    line = _one_line(capsys)
    assert "is an encoder export, not a classifier export" in line and "ecgpos embed" in line


def test_a_classifier_exported_before_windows_was_bound_is_told_to_re_export(classifier: Path, tmp_path: Path) -> None:
    from ecgpos.export.format import CONFIG_HASH_FIELDS, json_sha256

    older = tmp_path / "older"
    shutil.copytree(classifier, older)
    config = json.loads((older / "config.json").read_text())
    fields = (*CONFIG_HASH_FIELDS, "head", "labels", "thresholds")  # what config_sha256 bound before
    config["config_sha256"] = json_sha256({key: config.get(key) for key in fields})
    (older / "config.json").write_text(json.dumps(config))
    with pytest.raises(ecgpos.errors.EcgposError, match="written before config_sha256 bound `windows`.*re-export"):
        ecgpos.load_classifier(older)
    assert cli("verify", older) == 1
