"""Generated damage to what carve, fine-tuning and the classifier path read back (the other artifacts:
test_fuzz_artifacts.py, whose property and budget these share): carve.json, a carve folder's level runs, a
classifier export's config.json field by field, and a fine-tune output folder's model folders.

Property: exit 0 with whole outputs, or exit 2 with one line (verify: exit 1); never a traceback, never a
level trained again without a word. A classifier's config.json field either fails `verify` when edited
(config_sha256 binds it) or is proven not to change `predict`'s output.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st
from test_fuzz_artifacts import FUZZ, _one_line_or_ok, _run

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
CARVE = ["carve", "--config", "tiny/level0", "--latent-config", "tiny/level1", "--max-levels", "2"]
CARVE += ["--stop-below", "0", "--min-drop", "-1", *FAST]
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@pytest.fixture(scope="module")
def carved(arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("fuzz-carve") / "carve"
    assert _run_quiet(*CARVE, "--shards", arrhythmia_shards, "--run-dir", runs) == 0
    return runs


def _run_quiet(*args: object) -> int:
    from ecgpos.cli import main

    return main([str(a) for a in args])


def _copy_carve(carved: Path, root: Path) -> Path:
    """A copy of the carve whose level 1 names the copy's level 0 as its base (the copy is a chain of its own)."""
    runs = root / "carve"
    shutil.copytree(carved, runs)
    info = json.loads((runs / "level1" / "run_info.json").read_text())
    (runs / "level1" / "run_info.json").write_text(json.dumps({**info, "base": str(runs / "level0")}))
    return runs


def _stamps(runs: Path) -> list[int]:
    return [(runs / f"level{k}" / "run_info.json").stat().st_mtime_ns for k in (0, 1)]


# --- carve.json -------------------------------------------------------------------------------------------------

carve_json_damage = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 2000)),
    st.tuples(st.just("top"), JSON_VALUES),
    st.tuples(st.just("levels"), JSON_VALUES),
    st.tuples(st.just("settings"), JSON_VALUES),
    st.tuples(
        st.just("entry"),
        st.integers(0, 1),
        st.sampled_from(["level", "run_dir", "steps", "val_loss", "interval", "records", "decision", "geometry", "x"]),
        JSON_VALUES,
    ),
    st.tuples(st.just("pop"), st.integers(0, 1), st.sampled_from(["level", "run_dir", "steps", "records"])),
)


@FUZZ
@given(damage=carve_json_damage)
@example(damage=("truncate", 300))
@example(damage=("entry", 0, "interval", [float("nan"), 1.0]))
def test_fuzzed_carve_json_is_measured_again_or_refused(capsys, carved, arrhythmia_shards, damage):
    with tempfile.TemporaryDirectory() as tmp:
        runs = _copy_carve(carved, Path(tmp))
        path = runs / "carve.json"
        data = json.loads(path.read_text())
        if damage[0] == "truncate":
            path.write_text(path.read_text()[: damage[1]])
        else:
            if damage[0] == "top":
                data = damage[1]
            elif damage[0] in ("levels", "settings"):
                data[damage[0]] = damage[1]
            elif damage[0] == "entry":
                data["levels"][damage[1]][damage[2]] = damage[3]
            else:
                data["levels"][damage[1]].pop(damage[2])
            path.write_text(json.dumps(data))
        before = _stamps(runs)
        rc, err = _run(capsys, *CARVE, "--shards", arrhythmia_shards, "--run-dir", runs)
        _one_line_or_ok(rc, err)
        assert _stamps(runs) == before  # the finished levels are kept, whatever carve.json says
        if rc == 0:
            levels = json.loads(path.read_text())["levels"]
            assert [r["level"] for r in levels] == [0, 1] and all(r["records"] == 22 for r in levels)


# --- a carve folder's level runs ---------------------------------------------------------------------------------

folder_damage = st.one_of(
    st.tuples(
        st.sampled_from(["level0", "level1"]),
        st.sampled_from(["config.yaml", "run_info.json", "metrics.jsonl"]),
        st.just("truncate"),
        st.integers(0, 400),
    ),
    st.tuples(
        st.sampled_from(["level0", "level1"]),
        st.sampled_from(["config.yaml", "run_info.json", "metrics.jsonl"]),
        st.just("delete"),
        st.just(0),
    ),
    st.tuples(
        st.sampled_from(["level0", "level1"]),
        st.sampled_from(["shards", "base", "finished", "step", "level"]),
        st.just("info"),
        JSON_VALUES,
    ),
)


@FUZZ
@given(damage=folder_damage)
@example(damage=("level1", "base", "info", "/elsewhere/level0"))
@example(damage=("level0", "metrics.jsonl", "truncate", 100))
def test_fuzzed_carve_folders_carve_on_or_refuse(capsys, carved, arrhythmia_shards, damage):
    level, name, kind, value = damage
    with tempfile.TemporaryDirectory() as tmp:
        runs = _copy_carve(carved, Path(tmp))
        run = runs / level
        if kind == "truncate":
            (run / name).write_text((run / name).read_text()[:value])
        elif kind == "delete":
            (run / name).unlink()
        else:
            info = json.loads((run / "run_info.json").read_text())
            (run / "run_info.json").write_text(json.dumps({**info, name: value}))
        rc, err = _run(capsys, *CARVE, "--shards", arrhythmia_shards, "--run-dir", runs)
        _one_line_or_ok(rc, err)
        if rc == 0:
            levels = json.loads((runs / "carve.json").read_text())["levels"]
            assert [r["level"] for r in levels] == [0, 1]


# --- a classifier export's config.json, field by field -----------------------------------------------------------


@pytest.fixture(scope="module")
def classifier(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from classifier_fixtures import write_finetune_out

    root = tmp_path_factory.mktemp("fuzz-classifier")
    finetuned = write_finetune_out(shared_data, root / "finetune")
    assert _run_quiet("export", "--classifier", finetuned["out"], "--out", root / "clf", "--onnx") == 0
    record = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"
    predicted = root / "p.csv"
    assert _run_quiet("predict", "--model", root / "clf", "--input", record, "--out", predicted, "--no-progress") == 0
    return {"out": finetuned["out"], "export": root / "clf", "record": record, "predicted": predicted.read_text()}


def _edited(value):
    """Another value of the same kind, one that would change an output if the loader read the field."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value * 4 + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value[::-1] if len(value) > 1 else [*value, value[0] if value else 1]
    edited = dict(value)
    key = next(
        (k for k in edited if isinstance(edited[k], (int, float, str, list)) and edited[k] not in ("", [])), None
    )
    if key is None:
        edited["extra"] = 1
    else:
        edited[key] = _edited(edited[key])
    return edited


CLASSIFIER_FIELDS = ["format", "version", "ecgpos_version", "arch", "preprocess", "pooling", "head", "labels",
                     "thresholds", "windows", "io", "weights_sha256", "test_vectors", "training", "test",
                     "config_sha256", "onnx"]  # fmt: skip


@pytest.mark.parametrize("field", CLASSIFIER_FIELDS)
def test_each_classifier_config_field_is_hash_checked_or_changes_no_output(capsys, classifier, field):
    config = json.loads((classifier["export"] / "config.json").read_text())
    assert set(config) == set(CLASSIFIER_FIELDS)  # a new field is listed here and so examined
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "clf"
        shutil.copytree(classifier["export"], folder)
        (folder / "config.json").write_text(json.dumps({**config, field: _edited(config[field])}))
        rc, err = _run(capsys, "verify", folder)
        out = Path(tmp) / "p.csv"
        args = ["predict", "--model", folder, "--input", classifier["record"], "--out", out, "--no-progress"]
        if rc in (1, 2):  # bound (1), or no longer read as a classifier (2): predict refuses it too, in one line
            rc, err = _run(capsys, *args)
            assert rc == 2 and not out.exists()
            _one_line_or_ok(rc, err)
        else:
            assert rc == 0, err
            rc, err = _run(capsys, *args)
            assert rc == 0 and out.read_text() == classifier["predicted"], f"{field} changes predict's output"


# --- fine-tune output folders ------------------------------------------------------------------------------------

finetune_damage = st.one_of(
    st.tuples(
        st.sampled_from(["model.json", "val_scores.npz", "test_scores.npz", "model.safetensors"]),
        st.just("truncate"),
        st.integers(0, 3000),
    ),
    st.tuples(
        st.sampled_from(
            [
                "labels",
                "encoder_arch",
                "preprocess",
                "val_macro_auroc",
                "windows",
                "fraction",
                "seed",
                "task",
                "selected_epoch",
            ]
        ),
        st.just("info"),
        JSON_VALUES,
    ),
    st.tuples(
        st.sampled_from(["y_true", "y_score", "logits", "labels"]),
        st.just("scores"),
        st.sampled_from(["nan", "inf", "short", "drop", "negative"]),
    ),
)


@FUZZ
@given(damage=finetune_damage)
@example(damage=("windows", "info", "abc"))
@example(damage=("logits", "scores", "inf"))
def test_fuzzed_finetune_folders_export_or_refuse(capsys, classifier, damage):
    name, kind, value = damage
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "finetune"
        shutil.copytree(classifier["out"], out)
        seeds = sorted((out / "models").glob("*/*/seed*"))
        for seed in seeds:  # both seeds, so that neither is picked around the damage
            if kind == "truncate":
                (seed / name).write_bytes((seed / name).read_bytes()[:value])
            elif kind == "info":
                info = json.loads((seed / "model.json").read_text())
                (seed / "model.json").write_text(json.dumps({**info, name: value}))
            else:
                path = seed / "test_scores.npz"
                with np.load(path) as data:
                    arrays = {k: data[k] for k in data.files}
                    arrays.setdefault("logits", np.log(arrays["y_score"] / (1 - arrays["y_score"] + 1e-12) + 1e-12))
                if value == "drop":
                    arrays.pop(name)
                elif value == "short":
                    arrays[name] = arrays[name][:-1]
                elif name != "labels":
                    bad = {"nan": np.nan, "inf": np.inf, "negative": -1.0}[value]
                    arrays[name] = arrays[name].astype(np.float64)
                    arrays[name][0, 0] = bad
                np.savez(path, **arrays)
        export = Path(tmp) / "clf"
        rc, err = _run(capsys, "export", "--classifier", out, "--out", export)
        _one_line_or_ok(rc, err)
        if rc == 0:
            assert _run(capsys, "verify", export)[0] == 0
        else:
            assert not export.exists()
