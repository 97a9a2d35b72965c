"""Generated damage to every artifact a command reads besides records and shards (those: test_fuzz.py):
index.csv fingerprints, a probe folder's results.csv / probe.json / test_scores.npz, reference and label
CSVs, decoders.safetensors with its config.json entry, and .npy arrays of any dtype and magnitude.

Property: exit 0 with every output finite and every input accounted for, or exit 2 with one line and
no partial output; never a traceback. Budget: a few examples per test (FUZZ), derandomized in CI.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from refusal_helpers import read_rows
from shard_fixtures import write_tiny_shards

from ecgpos.cli import main
from ecgpos.ecg.fingerprint import fingerprint, fingerprint_problem
from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.shards import iter_shard_records
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError
from ecgpos.export.probe_scores import ScoreSet, save_scores
from ecgpos.probes.shared.leakage import load_pretraining

torch.set_num_threads(1)
_EXAMPLES = int(os.environ.get("ECGPOS_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_EXAMPLES or 6,
    deadline=None,
    derandomize=not _EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
LEADS = ",".join(CANONICAL_LEADS)
NUMBER_TOKENS = ["nan", "inf", "-inf", "1.7", "-3.0", "0.5", "0.61", "1", "0", "", " ", "x", "1e308", "0.5.1", "7"]


def _one_line_or_ok(rc: int, err: str) -> None:
    """rc 0, or rc 2 with exactly one `error:` line (skips, notes and warnings aside); never another code."""
    assert rc in (0, 2), err
    if rc == 2:
        errors = [line for line in err.splitlines() if ": error: " in line]
        assert len(errors) == 1 and "Traceback" not in err, err


def _run(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    rc = main([str(a) for a in args])
    return rc, capsys.readouterr().err


# --- index.csv fingerprints ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def printed_shards(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    folder = write_tiny_shards(tmp_path_factory.mktemp("fuzz-prints") / "shards", n_records=6, records_per_shard=6)
    true = {
        rid: fingerprint(x, DEFAULT_SPEC.fs, DEFAULT_SPEC.window, DEFAULT_SPEC.dtype)
        for rid, x in iter_shard_records(folder)
    }
    return folder, true


print_edit = st.tuples(
    st.integers(0, 5),
    st.one_of(
        st.tuples(st.just("cut"), st.integers(1, 140)),
        st.tuples(st.just("append"), st.text("0123456789abcdefXYZ ", min_size=1, max_size=4)),
        st.tuples(st.just("replace"), st.text("0123456789abcdefgG-", max_size=140)),
    ),
)


@FUZZ
@given(edits=st.lists(print_edit, min_size=1, max_size=3))
def test_fuzzed_index_fingerprints_are_found_or_refused(printed_shards, edits):
    source, true = printed_shards
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "shards"
        shutil.copytree(source, folder)
        with open(folder / "index.csv", newline="") as handle:
            rows = list(csv.DictReader(handle))
        for row in rows:
            row["fingerprint"] = true[row["record_id"]]
        for k, (op, arg) in edits:
            text = rows[k]["fingerprint"]
            rows[k]["fingerprint"] = text[:-arg] if op == "cut" else text + arg if op == "append" else arg
        with open(folder / "index.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        try:
            index = load_pretraining([folder], log=lambda s: None)
        except EcgposError as err:
            assert "\n" not in str(err)
            return
        prints = next(iter(index.by_spec.values()))
        assert len(index) == 6  # every record indexed, each findable under its true fingerprint
        for rid, fp in true.items():
            assert (f"shards:{rid}", 0) in prints.match(fp)
        assert all(not fingerprint_problem(p, DEFAULT_SPEC.fs, DEFAULT_SPEC.window) for p in prints.prints)


# --- a probe folder (results.csv, probe.json, test_scores.npz) and a --reference CSV ---------------------

probe_damage = st.fixed_dictionaries(
    {
        "aurocs": st.lists(st.sampled_from(NUMBER_TOKENS), min_size=2, max_size=2),
        "seeds": st.lists(st.sampled_from(["0", "1", "-1", "0.5", "x", ""]), min_size=2, max_size=2),
        "cut": st.none() | st.integers(1, 60),
        "scores": st.sampled_from(["none", "good", "nan", "seeds", "bytes"]),
        "info": st.sampled_from(["none", "garbage", "list", "good"]),
        "reference": st.none() | st.sampled_from(NUMBER_TOKENS),
    }
)


def _probe_folder(folder: Path, damage: dict) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    labels = np.array([[1, 0], [0, 1], [1, 1], [0, 0]] * 2)
    scores = rng.normal(size=(2, 8, 2)).astype(np.float32)
    from ecgpos.export.probe_scores import macro_aurocs

    true = macro_aurocs(labels, scores)
    header = "encoder,task,fraction,seed,test_auroc,note\n"
    lines = [f"enc,ptbxl-super,1.0,{s},{a},\n" for s, a in zip(damage["seeds"], damage["aurocs"])]
    if damage["scores"] == "good":  # rows that agree with the stored logits
        lines = [f"enc,ptbxl-super,1.0,{s},{a!r},\n" for s, a in enumerate(true)]
    text = header + "".join(lines)
    (folder / "results.csv").write_text(text[: -damage["cut"]] if damage["cut"] else text)
    keys = [f"r{i}" for i in range(8)]
    if damage["scores"] in ("good", "nan", "seeds"):
        bad = scores.copy()
        if damage["scores"] == "nan":
            bad[0, 0, 0] = np.nan
        seeds = [0, 1, 2] if damage["scores"] == "seeds" else [0, 1]
        save_scores([ScoreSet("enc", "ptbxl-super", 1.0, seeds, keys, labels, bad)], folder)
    elif damage["scores"] == "bytes":
        (folder / "test_scores.npz").write_bytes(b"PK\x03\x04 not really")
    info = {"garbage": "{not json", "list": "[1, 2]", "good": json.dumps({"sources": {"enc": "x"}})}
    if damage["info"] in info:
        (folder / "probe.json").write_text(info[damage["info"]])


@FUZZ
@given(damage=probe_damage)
def test_fuzzed_probe_folders_compare_or_refuse(capsys, damage):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _probe_folder(root / "p", damage)
        extra = []
        if damage["reference"] is not None:
            (root / "ref.csv").write_text(f"model,ptbxl-super\nMine,{damage['reference']}\n")
            extra = ["--reference", root / "ref.csv"]
        rc, err = _run(capsys, "probe", "--compare", root / "p", *extra, "--out", root / "out", "--bootstrap", "20")
        _one_line_or_ok(rc, err)
        if rc == 2:
            assert not (root / "out").exists()  # refused before anything was written
            return
        written = read_rows(root / "out" / "results.csv")
        assert len(written) == 2 and all(0 <= float(r["test_auroc"]) <= 1 for r in written)


# --- label CSVs, decoders and .npy arrays through score and embed -----------------------------------------


@pytest.fixture(scope="module")
def scored(real_record, tiny_run, tmp_path_factory) -> dict[str, Path]:
    """A .npy of four shifted copies of a real record, and an export with decoders of the tiny run."""
    root = tmp_path_factory.mktemp("fuzz-score")
    raw = read_wfdb_record(real_record)
    np.save(root / "x.npy", np.stack([np.roll(raw.signal, 250 * k, axis=1) for k in range(4)]))
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(root / "enc"), "--with-decoders"]) == 0
    return {"npy": root / "x.npy", "export": root / "enc", "signal": root / "x.npy"}


label_rows = st.lists(
    st.tuples(st.sampled_from(["0", "1", "2", "3", "ghost", "", " ", "0 "]), st.sampled_from(["N", "A", "", "B"])),
    max_size=3,
)
GOOD_LABELS = [("0", "N"), ("1", "N"), ("2", "A"), ("3", "A")]


@FUZZ
@given(
    keep=st.lists(st.booleans(), min_size=4, max_size=4),
    rows=label_rows,
    bom=st.booleans(),
    header=st.sampled_from(["record_id,label", "record_id,label", "id,label", "record_id"]),
)
@example(keep=[True] * 4, rows=[("ghost", "N")], bom=True, header="record_id,label")  # always one scored run
def test_fuzzed_label_csvs_give_a_finite_auroc_or_one_line(capsys, tiny_run, scored, keep, rows, bom, header):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        listed = [row for row, kept in zip(GOOD_LABELS, keep) if kept] + rows
        text = ("\ufeff" if bom else "") + header + "\n" + "".join(f"{i},{label}\n" for i, label in listed)
        (root / "labels.csv").write_text(text)
        rc, err = _run(capsys, "score", "--run", tiny_run, "--input", scored["npy"], "--fs", 500, "--leads", LEADS,
                       "--masks", 1, "--out", root / "s.csv", "--labels", root / "labels.csv", "--nominal", "N",
                       "--anomalous", "A", "--no-progress")  # fmt: skip
        _one_line_or_ok(rc, err)
        if rc == 0:
            summary = (root / "s.summary.md").read_text()
            values = [
                float(line.split("|")[2]) for line in summary.splitlines() if re.match(r"\| level[0-9]+ \|", line)
            ]
            assert values and all(math.isfinite(v) and 0 <= v <= 1 for v in values)
            named = {i for i, _ in listed if i not in {"0", "1", "2", "3"}}  # labelled ids no record has
            assert all(i in err for i in named if i.strip()), err
        else:
            assert not (root / "s.summary.md").exists()


decoder_damage = st.one_of(
    st.tuples(st.just("pop"), st.sampled_from(["sha256", "settings_sha256", "encoder_sha256", "level0", "file"])),
    st.tuples(st.just("set"), st.sampled_from(["sha256", "encoder_sha256", "settings_sha256"]), st.text(max_size=8)),
    st.tuples(st.just("mask_ratio"), st.floats(allow_nan=True, allow_infinity=True)),
    st.tuples(st.just("truncate"), st.integers(0, 4000)),
    st.tuples(st.just("overwrite"), st.integers(0, 4000), st.binary(min_size=1, max_size=16)),
)


@FUZZ
@given(damage=decoder_damage)
@example(damage=("pop", "encoder_sha256"))  # an older export's entry: scores, with a warning
def test_fuzzed_decoders_verify_fail_or_score(capsys, scored, damage):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "enc"
        shutil.copytree(scored["export"], folder)
        config = json.loads((folder / "config.json").read_text())
        entry, blob = config["decoders"], folder / "decoders.safetensors"
        if damage[0] == "pop":
            entry.pop(damage[1], None)
        elif damage[0] == "set":
            entry[damage[1]] = damage[2]
        elif damage[0] == "mask_ratio":
            entry["level0"]["mask_ratio"] = damage[1] if math.isfinite(damage[1]) else str(damage[1])
        elif damage[0] == "truncate":
            blob.write_bytes(blob.read_bytes()[: damage[1]])
        else:
            data = bytearray(blob.read_bytes())
            data[damage[1] : damage[1] + len(damage[2])] = damage[2]
            blob.write_bytes(bytes(data))
        (folder / "config.json").write_text(json.dumps(config))
        rc, err = _run(capsys, "verify", folder)
        assert rc in (0, 1), err
        rc, err = _run(capsys, "score", "--run", folder, "--input", scored["npy"], "--fs", 500, "--leads", LEADS,
                       "--masks", 1, "--out", Path(tmp) / "s.csv", "--no-progress")  # fmt: skip
        _one_line_or_ok(rc, err)
        if rc == 0:
            scores = [float(v) for r in read_rows(Path(tmp) / "s.csv") for k, v in r.items() if k != "record_id"]
            assert len(scores) == 4 and np.isfinite(scores).all()


npy_damage = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(
            ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint16", "bool"]
        ),
        "values": st.lists(
            st.tuples(
                st.integers(0, 1), st.integers(0, 11), st.integers(0, 4999), st.floats(-1e308, 1e308) | st.floats()
            ),
            max_size=4,
        ),
        "scale": st.sampled_from([1.0, 1e-3, 1e3, 1e6, 1e300]),
    }
)


@FUZZ
@given(damage=npy_damage)
@example(damage={"dtype": "float32", "values": [(1, 3, 500, 1e300)], "scale": 1.0})  # one record embedded, one skipped
def test_fuzzed_npy_arrays_embed_finite_or_refuse(capsys, export, scored, damage):
    x = np.load(scored["npy"])[:2].astype(np.float64) * damage["scale"]
    for row, lead, t, value in damage["values"]:
        x[row, lead, t] = value
    with np.errstate(all="ignore"), tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        np.save(root / "x.npy", x.astype(damage["dtype"]))
        rc, err = _run(capsys, "embed", "--encoder", export, "--input", root / "x.npy", "--fs", 500, "--leads", LEADS,
                       "--out", root / "f.csv", "--no-progress")  # fmt: skip
        _one_line_or_ok(rc, err)
        if rc == 0:
            rows = read_rows(root / "f.csv")
            features = np.array([[float(v) for k, v in r.items() if k != "record_id"] for r in rows])
            assert np.isfinite(features).all()
            assert len(rows) + len(read_rows(root / "f.skipped.csv")) == 2  # every record accounted for
        else:
            assert not (root / "f.csv").exists()
