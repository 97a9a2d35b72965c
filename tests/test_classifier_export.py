"""Classifier exports (`ecgpos export --classifier`), `ecgpos predict`, `ecgpos.load_classifier`, and
exports read from the Hugging Face Hub cache (`hf://ORG/NAME[@REVISION]`), offline."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import ecgpos
from ecgpos.cli import main

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: object) -> int:
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def finetuned(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from classifier_fixtures import write_finetune_out

    return write_finetune_out(shared_data, tmp_path_factory.mktemp("finetune") / "out")


@pytest.fixture(scope="module")
def classifier(finetuned: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("classifier") / "clf"
    assert cli("export", "--classifier", finetuned["out"], "--out", out, "--onnx", "--license", "cc-by-4.0") == 0
    return out


@pytest.fixture(scope="module")
def cpsc_records(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPSC2018 WFDB records of both Challenge releases, plus one whose signal file is cut short."""
    folder = tmp_path_factory.mktemp("cpsc") / "records"
    shutil.copytree(shared_data / "cpsc2018" / "cinc2020_wfdb_feb2020", folder / "feb2020")
    shutil.copytree(shared_data / "cpsc2018" / "cinc2021_wfdb_snomed", folder / "snomed")
    damaged = folder / "feb2020" / "A0003.mat"
    damaged.write_bytes(damaged.read_bytes()[:2000])
    return folder


def test_classifier_export_holds_thresholds_test_aurocs_and_verifies(classifier: Path, finetuned: dict) -> None:
    config = json.loads((classifier / "config.json").read_text())
    assert config["format"] == "ecgpos-classifier" and config["labels"] == ["SB", "AFIB", "SR"]
    assert "max F1 on the validation split" in config["thresholds"]["rule"]
    assert config["training"]["seed"] == 0  # the better seed on validation, without --seed
    assert {"classifier.onnx", "model.safetensors", "test_vectors.npz", "README.md"} <= {
        p.name for p in classifier.iterdir()
    }
    cell = config["test"]["per_label"]["SB"]
    assert cell["low"] <= cell["auroc"] <= cell["high"]
    # the test AUROC is the one of the stored test scores
    scores = np.load(finetuned["out"] / "models" / "arrhythmia-rhythm" / "1" / "seed0" / "test_scores.npz")
    from ecgpos.metrics import auroc_columns

    assert auroc_columns(scores["y_score"], scores["y_true"])[0] == pytest.approx(cell["auroc"], abs=1e-6)
    # the card opens with the Hub's metadata and states the rule and each label's interval
    card = (classifier / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "ecgpos" and meta["license"] == "cc-by-4.0"
    metrics = [m for r in meta["model-index"][0]["results"] for m in r["metrics"]]
    assert {"type": "roc_auc", "value": round(cell["auroc"], 4), "name": "AUROC SB"} in metrics
    assert config["thresholds"]["rule"] in card and f"{cell['low']:.3f}-{cell['high']:.3f}" in card
    assert cli("verify", classifier) == 0


def test_load_classifier_gives_the_fine_tuned_models_probabilities(classifier: Path, finetuned: dict) -> None:
    model = ecgpos.load_classifier(classifier)
    windows = np.random.default_rng(0).standard_normal((4, 12, model.spec.window)).astype(np.float32)
    encoder, head = finetuned["encoder"].module, finetuned["head"]
    with torch.no_grad():
        want = torch.sigmoid(head(encoder.forward_features(torch.from_numpy(windows)))).numpy()
        got = model(torch.from_numpy(windows)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    thresholds = json.loads((classifier / "config.json").read_text())["thresholds"]["values"]
    assert (model.flags(got) == (got >= np.array([thresholds[x] for x in model.labels]))).all()


def test_edited_thresholds_or_an_encoder_folder_are_refused_in_one_line(
    classifier: Path, finetuned: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    edited = tmp_path / "edited"
    shutil.copytree(classifier, edited)
    config = json.loads((edited / "config.json").read_text())
    config["thresholds"]["values"]["SB"] = 0.01
    (edited / "config.json").write_text(json.dumps(config))
    with pytest.raises(ecgpos.errors.EcgposError, match="edited after export"):
        ecgpos.load_classifier(edited)
    assert cli("verify", edited) == 1
    assert cli("predict", "--model", finetuned["encoder_export"], "--input", edited, "--out", tmp_path / "p.csv") == 2
    assert "is an encoder export, not a classifier export" in capsys.readouterr().err
    assert cli("embed", "--encoder", classifier, "--input", edited, "--out", tmp_path / "e.csv") == 2
    err = capsys.readouterr().err.strip()
    assert "is a classifier export" in err and len(err.splitlines()) == 1


def test_predict_on_cpsc2018_reports_the_damaged_record(
    classifier: Path, cpsc_records: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "predictions.csv"
    assert cli("predict", "--model", classifier, "--input", cpsc_records, "--out", out, "--no-progress") == 0
    rows = list(csv.DictReader(out.open()))
    skipped = list(csv.DictReader((tmp_path / "predictions.skipped.csv").open()))
    assert [r["record_id"] for r in skipped] == ["feb2020/A0003"]
    assert len(rows) + len(skipped) == 14
    assert list(rows[0]) == ["record_id"] + [f"{x}_{k}" for x in ("SB", "AFIB", "SR") for k in ("probability", "flag")]
    # the command's probabilities are the API's for the same record
    from ecgpos.ecg.wfdb_io import read_wfdb_record

    model = ecgpos.load_classifier(classifier)
    raw = read_wfdb_record(cpsc_records / "snomed" / "A0689")
    want = model.predict_proba(raw.signal, raw.fs, raw.leads)
    row = next(r for r in rows if r["record_id"] == "snomed/A0689")
    np.testing.assert_allclose([float(row[f"{x}_probability"]) for x in model.labels], want, atol=2e-6)
    assert [int(row[f"{x}_flag"]) for x in model.labels] == model.flags(want).astype(int).tolist()
    assert "skipped feb2020/A0003" in capsys.readouterr().err


def _hub_env(cache: Path) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
    }


@pytest.mark.slow
def test_hub_references_load_from_an_offline_cache(
    finetuned: dict,
    classifier: Path,
    real_record: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    from classifier_fixtures import hub_cache

    cache = tmp_path / "hub"
    hub_cache(cache, "ecg-lab/tiny-encoder", finetuned["encoder_export"])
    commit = hub_cache(cache, "ecg-lab/tiny-classifier", classifier, commit="b" * 40)
    # the command line in a fresh interpreter: huggingface_hub reads HF_HUB_OFFLINE and HF_HUB_CACHE at import
    local, hub = tmp_path / "local.csv", tmp_path / "hub.csv"
    assert (
        cli("embed", "--encoder", finetuned["encoder_export"], "--input", real_record, "--out", local, "--no-progress")
        == 0
    )
    done = subprocess.run(
        [sys.executable, "-m", "ecgpos", "embed", "--encoder", "hf://ecg-lab/tiny-encoder", "--input", str(real_record)]
        + ["--out", str(hub), "--no-progress"],
        env=_hub_env(cache),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert hub.read_text() == local.read_text()
    # in this process (huggingface_hub's settings set as the environment would have set them at import):
    # the same loader behind verify, load_classifier and --model, at a pinned revision
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    capsys.readouterr()
    for ref, why in (("hf://ecg-lab/missing", "not in the Hub cache"), ("hf://ecg-lab/tiny-encoder@v9", "'v9'")):
        assert cli("verify", ref) == 2
        err = capsys.readouterr().err
        assert why in err and "HF_HUB_OFFLINE is set" in err and len(err.strip().splitlines()) == 1
    assert cli("verify", "hf://ecg-lab/tiny-encoder") == 0
    # what probe, finetune and geometry resolve --encoder with
    from ecgpos.inference.resolve import resolve_encoder

    loaded = resolve_encoder("hf://ecg-lab/tiny-encoder@main")
    assert loaded.source == "hf://ecg-lab/tiny-encoder@main" and loaded.arch == finetuned["encoder"].arch
    model = ecgpos.load_classifier(f"hf://ecg-lab/tiny-classifier@{commit}")
    assert (
        model.labels == ["SB", "AFIB", "SR"]
        and model.config["weights_sha256"] == json.loads((classifier / "config.json").read_text())["weights_sha256"]
    )
    assert (
        cli("predict", "--model", "hf://ecg-lab/tiny-classifier", "--input", real_record, "--out", tmp_path / "p.csv")
        == 0
    )


def test_encoder_card_opens_with_hub_metadata_and_its_probe_results(finetuned: dict, tmp_path: Path) -> None:
    from ecgpos.export.card import render_card

    config = json.loads((finetuned["encoder_export"] / "config.json").read_text())
    meta = yaml.safe_load((finetuned["encoder_export"] / "README.md").read_text().split("---\n")[1])
    assert meta["pipeline_tag"] == "feature-extraction" and "model-index" not in meta  # no probe results attached
    probes = tmp_path / "probe"
    probes.mkdir()
    rows = [
        "encoder,protocol,task,fraction,seed,test_auroc",
        "own,linear,ptbxl-super,1.0,0,0.8",
        "own,linear,ptbxl-super,1.0,1,0.7",
    ]
    rows += ["other,linear,ptbxl-super,1.0,0,0.5"]  # another encoder's row, probed beside it
    (probes / "results.csv").write_text("\n".join(rows) + "\n")
    key = json.dumps({"encoder": config["weights_sha256"]})
    (probes / "probe.json").write_text(
        json.dumps({"sources": {"own": key, "other": json.dumps({"encoder": "0" * 64})}})
    )
    meta = yaml.safe_load(render_card(config, probes, "mit").split("---\n")[1])
    (result,) = meta["model-index"][0]["results"]
    assert result["dataset"]["name"] == "ptbxl-super" and meta["license"] == "mit"
    assert result["metrics"] == [
        {"type": "roc_auc", "value": 0.75, "name": "macro AUROC, linear, 100 % of labels (own)"}
    ]


# ecgpos.load_classifier and `ecgpos predict` with every package of the train extra unimportable
PLAIN = """
import sys
for name in sys.argv[3].split(","):
    sys.modules[name] = None
import ecgpos
from ecgpos.cli import main
model = ecgpos.load_classifier(sys.argv[1])
sys.exit(main(["predict", "--model", sys.argv[1], "--input", sys.argv[2], "--out", sys.argv[4], "--no-progress"]))
"""


@pytest.mark.slow
def test_predict_needs_no_package_of_the_train_extra(classifier: Path, real_record: Path, tmp_path: Path) -> None:
    from ecgpos.extras import OPTIONAL

    blocked = sorted(set(OPTIONAL) - {"pandas"})  # wfdb itself imports pandas (tests/test_install_extras.py)
    out = tmp_path / "p.csv"
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN, str(classifier), str(real_record), ",".join(blocked), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sklearn" in blocked and len(out.read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_real_finetune_folder_exports_and_predicts_cpsc2018(
    shared_data: Path, cpsc_records: Path, tmp_path: Path
) -> None:
    """`ecgpos finetune` -> `ecgpos export --classifier` -> `ecgpos verify` -> `ecgpos predict`, as the README shows."""
    out, model = tmp_path / "finetune", tmp_path / "classifier"
    finetune = ["finetune", "--encoder", f"random:{ROOT / 'configs/tiny/level0.yaml'}", "--task", "cpsc2018"]
    finetune += ["--data-root", shared_data, "--splits", shared_data / "merl_splits", "--mode", "top:1"]
    assert cli(*finetune, "--fractions", "100", "--seeds", "1", "--epochs", "1", "--bootstrap", "0", "--out", out) == 0
    assert cli("export", "--classifier", out, "--seed", "0", "--fraction", "100", "--out", model) == 0
    assert cli("verify", model) == 0
    # one score, one number: the export's test macro AUROC is results.csv's (both rank the logits)
    (result,) = list(csv.DictReader((out / "results.csv").open()))
    test = json.loads((model / "config.json").read_text())["test"]
    assert test["macro_auroc"] == pytest.approx(float(result["test_auroc"]), abs=1e-6)
    predictions = tmp_path / "predictions.csv"
    assert cli("predict", "--model", model, "--input", cpsc_records, "--out", predictions, "--no-progress") == 0
    labels = json.loads((model / "config.json").read_text())["labels"]
    rows = list(csv.DictReader(predictions.open()))
    assert len(rows) == 13 and len(labels) == 9 and f"{labels[0]}_flag" in rows[0]
    assert (tmp_path / "predictions.skipped.csv").read_text().splitlines()[1].startswith("feb2020/A0003,")
