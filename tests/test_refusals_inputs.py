"""What ecgpos refuses at its edges: odd arrays, outputs over inputs, devices, unreadable text files.

Each bad input was once a traceback or a silently wrong result; each test drives the CLI in-process
(or the Python API a researcher calls) and checks the one stderr line, exit 2 and what was written.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from refusal_helpers import FAST, PRETRAIN, copy_record, one_line_error, read_rows, run

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError, SignalError

LEADS = ",".join(CANONICAL_LEADS)


def _embed_npy(capsys, export: Path, npy: Path, out: Path, *extra) -> tuple[int, str, str]:
    args = ["embed", "--encoder", export, "--input", npy, "--fs", "500", "--leads", LEADS, "--out", out]
    return run(capsys, *args, "--no-progress", *extra)


def test_npy_without_real_samples_is_one_line(capsys, tmp_path, real_record, export):
    """complex lost its imaginary part silently; text, an empty file and an .npz under a .npy name
    were tracebacks (UFuncTypeError, EOFError, AttributeError); an array of no records was "none of
    the 0 records could be embedded (0 skipped)"."""
    x = read_wfdb_record(real_record).signal
    cases = {
        "complex": (x.astype(np.complex64) + 1j, "got dtype complex64"),
        "text": (x.astype(str), "got dtype <U"),
        "bool": (x > 0, "got dtype bool"),
    }
    for name, (array, needle) in cases.items():
        np.save(tmp_path / f"{name}.npy", array)
        rc, _, err = _embed_npy(capsys, export, tmp_path / f"{name}.npy", tmp_path / f"{name}.csv")
        one_line_error(rc, err, "embed", needle)
        assert not (tmp_path / f"{name}.csv").exists()
    (tmp_path / "empty.npy").write_bytes(b"")
    rc, _, err = _embed_npy(capsys, export, tmp_path / "empty.npy", tmp_path / "e.csv")
    one_line_error(rc, err, "embed", "not a readable .npy array")
    (tmp_path / "words.npy").write_text("hello world")  # NumPy itself calls this "pickled (object) data"
    rc, _, err = _embed_npy(capsys, export, tmp_path / "words.npy", tmp_path / "w.csv")
    one_line_error(rc, err, "embed", "is not a .npy file: it does not begin with NumPy's header")
    np.save(tmp_path / "none.npy", np.zeros((0, 12, 5000), np.float32))
    rc, _, err = _embed_npy(capsys, export, tmp_path / "none.npy", tmp_path / "n.csv")
    one_line_error(rc, err, "embed", "holds no records: shape (0, 12, 5000)")
    assert not (tmp_path / "n.skipped.csv").exists()
    np.savez(tmp_path / "archive.npz", x=x)
    shutil.copyfile(tmp_path / "archive.npz", tmp_path / "archive.npy")
    rc, _, err = _embed_npy(capsys, export, tmp_path / "archive.npy", tmp_path / "a.csv")
    one_line_error(rc, err, "embed", ".npz archive")
    # integers pass the dtype check (uV integers are then refused by their amplitude); float64 is embedded
    np.save(tmp_path / "int.npy", (x * 1000).astype(np.int32))
    rc, _, err = _embed_npy(capsys, export, tmp_path / "int.npy", tmp_path / "i.csv")
    assert rc == 2 and "skipped int: units" in err and "dtype" not in err
    np.save(tmp_path / "f64.npy", x.astype(np.float64))
    assert _embed_npy(capsys, export, tmp_path / "f64.npy", tmp_path / "f.csv")[0] == 0
    # float64 beyond float32's range: was cast to inf first and called non_finite (encoder.embed said units)
    np.save(tmp_path / "huge.npy", x.astype(np.float64) * 1e300)
    rc, _, err = _embed_npy(capsys, export, tmp_path / "huge.npy", tmp_path / "h.csv")
    assert rc == 2 and "skipped huge: units" in err and "non_finite" not in err


def test_record_ids_with_control_characters_are_skipped_with_a_reason(capsys, tmp_path, real_record, export):
    """A file name holding a line break became a record id that split the `.ids.txt` beside a .npy
    output (one id per line) and the skip report on stderr; it is skipped, and the skipped list
    reads back the exact name."""
    folder = tmp_path / "records"
    copy_record(real_record, folder, "JS00001")
    for ext in (".hea", ".mat"):
        (folder / f"JS00002\nold{ext}").symlink_to(folder / f"JS00001{ext}")
    out = tmp_path / "f.npy"
    rc, _, err = run(capsys, "embed", "--encoder", export, "--input", folder, "--out", out, "--no-progress")
    assert rc == 0 and (tmp_path / "f.ids.txt").read_text() == "JS00001\n", err
    skipped = read_rows(tmp_path / "f.skipped.csv")
    assert [(row["record_id"], row["reason"]) for row in skipped] == [("JS00002\nold", "bad_record_id")]
    assert [line for line in err.splitlines() if "skipped" in line][0].endswith(
        "skipped 'JS00002\\nold': bad_record_id: the id holds '\\n'; rename the file"
    )
    np.save(tmp_path / "tab\there.npy", read_wfdb_record(real_record).signal)  # a 2-D array's id is its name
    rc, _, err = _embed_npy(capsys, export, tmp_path / "tab\there.npy", tmp_path / "t.csv")
    assert rc == 2 and "skipped 'tab\\there': bad_record_id" in err


def test_api_refuses_what_it_cannot_embed(real_record, export):
    from ecgpos.export.load import load_encoder

    enc = load_encoder(export)
    x = read_wfdb_record(real_record).signal
    for bad in (x.astype(np.complex128), x.astype(str), x.astype(object), x > 0):
        with pytest.raises(SignalError) as info:
            enc.embed(bad, 500, CANONICAL_LEADS)
        assert info.value.reason == "dtype"
    with pytest.raises(EcgposError, match="list of lead names"):
        enc.embed(x, 500, None)
    with pytest.raises(EcgposError, match="list of lead names"):
        enc.embed(x, 500, LEADS)  # a comma-joined string is not twelve names
    for windows in (0, -1, 2.5):  # were silently one window
        with pytest.raises(EcgposError, match="num_windows"):
            enc.embed(x, 500, CANONICAL_LEADS, num_windows=windows)
    window = enc.spec.window
    for bad, needle in (
        (torch.zeros(2, 12, window, dtype=torch.float64), "float32 tensor on cpu, got float64"),
        (torch.zeros(2, 12, window, dtype=torch.int64), "got int64"),
        (np.zeros((2, 12, window), np.float32), "got ndarray"),
    ):
        for call in (enc.forward_features, enc.forward_tokens):
            with pytest.raises(EcgposError, match=needle):
                call(bad)
    assert enc.forward_features(torch.zeros(2, 12, window)).shape == (2, enc.width)
    for device, needle in (("meta", "holds no data"), ("bogus", "not a torch device"), ("cuda", "not available")):
        with pytest.raises(EcgposError, match=needle):
            load_encoder(export, device=device)


def test_unusable_device_is_one_line(capsys, tmp_path, real_record, tiny_run, export):
    """--device cuda on a machine without one (CUDA is hidden from the tests) was a torch traceback."""
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    for device in ("cuda", "bogus", "meta"):
        rc, _, err = _embed_npy(capsys, export, tmp_path / "x.npy", tmp_path / "f.csv", "--device", device)
        one_line_error(rc, err, "embed", f"device '{device}'")
        rc, _, err = run(capsys, "verify", export, "--device", device)
        one_line_error(rc, err, "verify", f"device '{device}'")  # not a FAIL of the export's weights
        args = ["score", "--run", tiny_run, "--input", tmp_path / "x.npy", "--fs", "500", "--leads", LEADS]
        rc, _, err = run(capsys, *args, "--out", tmp_path / "s.csv", "--device", device, "--no-progress")
        one_line_error(rc, err, "score", f"device '{device}'")
    assert not (tmp_path / "f.csv").exists() and not (tmp_path / "s.csv").exists()


def test_out_over_the_input_is_refused(capsys, tmp_path, real_record, tiny_shards, tiny_run, export):
    """--out equal to the .npy input replaced it with the features; --out shards/shard-N.h5 replaced
    a shard or joined the set as a shard of features."""
    npy = tmp_path / "x.npy"
    np.save(npy, read_wfdb_record(real_record).signal)
    before = npy.read_bytes()
    rc, _, err = _embed_npy(capsys, export, npy, npy)
    one_line_error(rc, err, "embed", "would overwrite or join the input")
    assert npy.read_bytes() == before
    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards, shards)
    first = sorted(shards.glob("shard-*.h5"))[0]
    for out, source in ((first, first), (shards / "shard-00009.h5", shards), (shards / "shard-00001.h5", first)):
        kept = sorted(p.name for p in shards.iterdir())
        rc, _, err = run(capsys, "embed", "--encoder", export, "--input", source, "--out", out, "--no-progress")
        one_line_error(rc, err, "embed", "would overwrite or join the input")
        rc, _, err = run(capsys, "score", "--run", tiny_run, "--input", source, "--out", out, "--no-progress")
        one_line_error(rc, err, "score", "would overwrite or join the input")
        assert sorted(p.name for p in shards.iterdir()) == kept
    # nor beside the shards under another name: a shard folder holds shards only
    rc, _, err = run(capsys, "embed", "--encoder", export, "--input", shards, "--out", shards / "f.h5", "--no-progress")
    one_line_error(rc, err, "embed", "inside the shard folder")
    assert sorted(p.name for p in shards.iterdir()) == kept


def test_interrupted_feature_write_keeps_the_previous_file(tmp_path, export):
    """Feature files are written under a temporary name and renamed: Ctrl-C mid-write used to leave
    a half CSV under the final name."""
    from ecgpos.export.load import load_encoder
    from ecgpos.inference.outputs import write_features

    enc = load_encoder(export)
    features = np.ones((3, enc.width), np.float32)
    for suffix in (".csv", ".npy", ".npz", ".h5"):
        out = tmp_path / f"f{suffix}"
        assert write_features(out, ["a", "b", "c"], features, enc)[0] == out

    def interrupted():  # Ctrl-C after the first row (the CSV writer consumes ids row by row)
        yield "a"
        raise KeyboardInterrupt

    before = (tmp_path / "f.csv").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        write_features(tmp_path / "f.csv", interrupted(), features, enc)
    assert (tmp_path / "f.csv").read_bytes() == before
    assert read_rows(tmp_path / "f.csv")[2]["record_id"] == "c"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.csv", "f.h5", "f.ids.txt", "f.npy", "f.npz"]


def test_score_refuses_bad_out_and_labels_before_scoring(capsys, tmp_path, real_record, tiny_run):
    """An --out folder or unwritable path failed after every record was scored; an --out not ending
    in .csv got CSV text anyway; a --labels file that is not text was a UnicodeDecodeError."""
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    args = ["score", "--run", tiny_run, "--input", tmp_path / "x.npy", "--fs", "500", "--leads", LEADS, "--no-progress"]
    (tmp_path / "folder").mkdir()
    rc, _, err = run(capsys, *args, "--out", tmp_path / "folder")
    one_line_error(rc, err, "score", "is a folder")
    rc, _, err = run(capsys, *args, "--out", "/proc/ecgpos-test/s.csv")
    one_line_error(rc, err, "score", "not writable")
    for name in ("s.npy", "s.h5", "s.tsv"):  # were CSV text under a name that promises another format
        rc, _, err = run(capsys, *args, "--out", tmp_path / name)
        one_line_error(rc, err, "score", "ending in .csv")
        assert not (tmp_path / name).exists()
    (tmp_path / "labels.csv").write_bytes(b"\xff\xfe\x00garbage\x81")
    labels = ["--labels", tmp_path / "labels.csv", "--nominal", "a", "--anomalous", "b"]
    rc, _, err = run(capsys, *args, "--out", tmp_path / "s.csv", *labels)
    one_line_error(rc, err, "score", "not a readable CSV")
    (tmp_path / "labels.csv").write_text("record_id,label\nx,a\ny,c\n")  # nothing labelled b
    rc, _, err = run(capsys, *args, "--out", tmp_path / "s.csv", *labels)
    one_line_error(rc, err, "score", "has no record labelled --anomalous b")
    assert not (tmp_path / "s.csv").exists()


def test_score_refuses_labels_that_would_be_silently_miscounted_before_scoring(capsys, tmp_path, real_record, tiny_run):
    """A label both --nominal and --anomalous was counted as anomalous only, a --nominal label no row
    carries was left out of the AUROC, and a record id listed twice with two labels took the last one,
    each after every record was scored, exit 0; a --labels folder was said not to exist."""
    from ecgpos.cli.score import read_labels
    from ecgpos.inference.scoring import auroc_by_level

    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    out = tmp_path / "o" / "s.csv"
    args = ["score", "--run", tiny_run, "--input", tmp_path / "x.npy", "--fs", "500", "--leads", LEADS]
    args += ["--out", out, "--no-progress"]
    labels = tmp_path / "labels.csv"
    labels.write_text("record_id,label\nx,a\ny,b\nz,c\n")
    cases = [
        (["--nominal", "a,b", "--anomalous", "b"], "labels both nominal and anomalous: b"),
        (["--nominal", "a,q", "--anomalous", "b"], "has no record labelled --nominal q (its labels: 'a', 'b', 'c')"),
        (["--nominal", "q", "--anomalous", "b,r"], "has no record labelled --nominal q; --anomalous r ("),
    ]
    for flags, needle in cases:
        rc, stdout, err = run(capsys, *args, "--labels", labels, *flags)
        one_line_error(rc, err, "score", needle)
        assert "scored" not in stdout and not out.parent.exists()  # refused before any record was scored
    duplicated = tmp_path / "duplicated.csv"
    duplicated.write_text("record_id,label\nx,a\ny,b\nx,b\n")
    rc, stdout, err = run(capsys, *args, "--labels", duplicated, "--nominal", "a", "--anomalous", "b")
    one_line_error(rc, err, "score", "record 'x' is listed twice with different labels, 'a' (line 2) and 'b' (line 4)")
    assert "scored" not in stdout and not out.parent.exists()
    rc, _, err = run(capsys, *args, "--labels", tmp_path, "--nominal", "a", "--anomalous", "b")
    one_line_error(rc, err, "score", f"--labels {tmp_path} is a folder, not a CSV file")
    assert not out.parent.exists()
    duplicated.write_text("record_id,label\nx,a\ny,b\nx,a\n")  # the same label twice is one record
    assert read_labels(duplicated) == {"x": "a", "y": "b"}
    with pytest.raises(EcgposError, match="labels both nominal and anomalous: b"):
        auroc_by_level(["x", "y"], {"level0": [0.1, 0.2]}, {"x": "a", "y": "b"}, ["a", "b"], ["b"])


def test_a_folder_where_an_output_file_goes_is_one_line(capsys, tmp_path, real_record, tiny_run, export):
    """A folder at FILE.skipped.csv, FILE.ids.txt or FILE.summary.md was an IsADirectoryError
    traceback after every record was processed, with FILE already written and its ids missing."""
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    out = tmp_path / "out"
    for name, sibling in (("f.csv", "f.skipped.csv"), ("f.npy", "f.ids.txt")):
        (out / sibling).mkdir(parents=True)
        rc, _, err = _embed_npy(capsys, export, tmp_path / "x.npy", out / name)
        one_line_error(rc, err, "embed", f"{sibling} is a folder")
        (out / sibling).rmdir()
        assert not any(out.iterdir())
    (out / "s.summary.md").mkdir()
    (tmp_path / "labels.csv").write_text("record_id,label\nx,a\ny,b\n")
    args = ["score", "--run", tiny_run, "--input", tmp_path / "x.npy", "--fs", "500", "--leads", LEADS]
    labels = ["--labels", tmp_path / "labels.csv", "--nominal", "a", "--anomalous", "b"]
    rc, _, err = run(capsys, *args, "--out", out / "s.csv", *labels, "--no-progress")
    one_line_error(rc, err, "score", "s.summary.md is a folder")
    assert not (out / "s.csv").exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        (b"optim:\n  lr: 1.0e-3\n  lr: 5\n", "duplicate key 'lr'"),  # PyYAML kept lr: 5 silently
        (b"optim:\n  lr: 1.0e-3\noptim:\n  warmup_steps: 1\n", "duplicate key 'optim'"),
        (b"optim:\n  lr: \xff\xfe\n", "not a UTF-8 text file"),
    ],
    ids=["duplicate-lr", "duplicate-section", "binary"],
)
def test_config_file_with_duplicate_keys_or_binary_is_refused(capsys, tmp_path, tiny_shards, text, needle):
    config = tmp_path / "c.yaml"
    config.write_bytes(text)
    args = ["pretrain", "--level", "0", "--config", config, "--shards", tiny_shards, "--run-dir", tmp_path / "run"]
    rc, _, err = run(capsys, *args, *FAST)
    one_line_error(rc, err, "pretrain", needle)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["=3", "optim..lr=3", "optim={lr: 1, lr: 2}"], ids=["no-key", "empty-part", "dup"])
def test_set_without_a_key_or_with_duplicate_keys_is_refused(capsys, tmp_path, tiny_shards, value):
    rc, _, err = run(capsys, *PRETRAIN, "--shards", tiny_shards, "--run-dir", tmp_path / "run", *FAST, "--set", value)
    one_line_error(rc, err, "pretrain", "--set")
    assert not (tmp_path / "run").exists()


def test_run_dir_that_holds_shards_is_refused(capsys, tmp_path, tiny_shards):
    """--run-dir given the shard folder itself trained and wrote the run among the shards."""
    shards = tmp_path / "shards"
    shutil.copytree(tiny_shards, shards)
    before = sorted(p.name for p in shards.iterdir())
    rc, _, err = run(capsys, *PRETRAIN, "--shards", shards, "--run-dir", shards, *FAST)
    one_line_error(rc, err, "pretrain", "holds shard files")
    assert sorted(p.name for p in shards.iterdir()) == before


def test_unreadable_csv_and_vector_files_are_one_line(capsys, tmp_path, tiny_run, export):
    """Empty or binary split, results and probe-results files were pandas/Unicode tracebacks; an
    empty test_vectors.npz was an EOFError in verify."""
    binary = b"\x89\xee\x00\xff" * 16
    for name, data in (("empty", b""), ("binary", binary)):
        task = tmp_path / f"task-{name}"
        task.mkdir()
        (task / "train.csv").write_bytes(data)
        rc, _, err = run(capsys, "probe", "--encoder", export, "--task", f"custom:{task}", "--out", tmp_path / "p")
        one_line_error(rc, err, "probe", "cannot read CSV")
        results = tmp_path / f"results-{name}"
        results.mkdir()
        (results / "results.csv").write_bytes(data)
        rc, _, err = run(capsys, "probe", "--compare", results, "--out", tmp_path / "cmp")
        one_line_error(rc, err, "probe", "cannot read CSV")
    export_args = ["export", "--run-dir", tiny_run, "--out", tmp_path / "enc"]
    rc, _, err = run(capsys, *export_args, "--probe-results", tmp_path / "results-binary")
    one_line_error(rc, err, "export", "not a probe results folder")
    assert not (tmp_path / "enc").exists()
    copy = tmp_path / "enc-copy"
    shutil.copytree(export, copy)
    (copy / "test_vectors.npz").write_bytes(b"")
    rc, out, err = run(capsys, "verify", copy)
    assert rc == 1 and "Traceback" not in err and "FAIL test vectors" in out and "not a readable" in out, out + err
    # readable vectors of the wrong kind were a TypeError / numpy ufunc traceback
    good = dict(np.load(export / "test_vectors.npz"))
    for key, value in (("raw_fs", np.array([500.0, 250.0])), ("features", good["features"].astype(str))):
        np.savez(copy / "test_vectors.npz", **{**good, key: value})
        rc, out, err = run(capsys, "verify", copy)
        assert rc == 1 and f"FAIL test vectors: stored {key} must" in out, out + err


def test_export_config_fields_of_the_wrong_kind_are_one_line(capsys, tmp_path, export):
    """A config.json `training` that is not an object (a hand edit; it is descriptive, so no hash
    binds it) was a ValueError traceback in load_encoder, hence embed and verify."""
    from ecgpos.export.load import load_encoder

    for key in ("training", "io", "arch"):
        copy = tmp_path / key
        shutil.copytree(export, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, key: "edited"}))
        with pytest.raises(EcgposError, match=f"{key} must be a JSON object"):
            load_encoder(copy)
        rc, _, err = run(capsys, "verify", copy)
        one_line_error(rc, err, "verify", f"{key} must be a JSON object")


@pytest.mark.parametrize(
    "argv",
    [
        ["preprocess", "ecg-arrhythmia", "--src", "{src}", "--out", ""],
        ["pretrain", "--level", "0", "--config", "tiny/level0", "--shards", "{shards}", "--run-dir", ""],
        ["probe", "--encoder", "{export}", "--task", "ptbxl-super", "--data-root", "", "--splits", ".", "--out", "p"],
        ["probe", "--encoder", "{export}", "--task", "ptbxl-super", "--out", " "],
        ["export", "--run-dir", "{run}", "--out", ""],
        ["embed", "--encoder", "{export}", "--input", "", "--out", "f.csv"],
        ["score", "--run", "{run}", "--input", "{record}", "--out", ""],
        ["verify", ""],
        ["geometry", "--encoder", "{run}", "--task", "csn", "--nominal", "a,b", "--anomalous", "c", "--out", ""],
        ["demo", "--out", ""],
    ],
    ids=lambda argv: argv[0],
)
def test_an_empty_path_is_refused_not_read_as_the_current_folder(
    capsys, tmp_path, monkeypatch, shared_data, real_record, tiny_shards, tiny_run, export, argv
):
    """Path("") is ".": `--out "$UNSET"` wrote shards, a run or probe results into the current folder,
    and `--input ""` embedded whatever records it held, all with exit 0."""
    monkeypatch.chdir(tmp_path)
    names = {"src": real_record.parent, "shards": tiny_shards, "export": export, "run": tiny_run, "record": real_record}
    with pytest.raises(SystemExit) as stop:  # argparse's own usage error
        run(capsys, *[a.format(**names) for a in argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "empty path" in err.strip().splitlines()[-1], err
    assert not any(tmp_path.iterdir())


def test_score_and_embed_refuse_what_they_would_have_ignored(capsys, tmp_path, real_record, tiny_run, export):
    """--masks 99999999999999999999 exhausted memory in a traceback; an --out not ending in .csv was
    refused only after its folder was made; an empty --nominal or --leads was taken for no flag."""
    score = ["score", "--run", tiny_run, "--input", real_record, "--no-progress"]
    rc, _, err = run(capsys, *score, "--masks", "99999999999999999999", "--out", tmp_path / "s.csv")
    one_line_error(rc, err, "score", "at most 1000 fixed masks")
    rc, _, err = run(capsys, *score, "--out", tmp_path / "new" / "s.txt")
    one_line_error(rc, err, "score", "ending in .csv")
    rc, _, err = run(capsys, *score, "--out", tmp_path / "s.csv", "--nominal", "")
    one_line_error(rc, err, "score", "--nominal/--anomalous need --labels CSV")
    for command, flag in (("score", "--run"), ("embed", "--encoder")):
        model = tiny_run if command == "score" else export
        args = [command, flag, model, "--input", real_record, "--out", tmp_path / "f.csv", "--leads", ""]
        rc, _, err = run(capsys, *args, "--no-progress")
        one_line_error(rc, err, command, "--fs and --leads apply to .npy input only")
    assert not any(tmp_path.iterdir())


def test_demo_seeds_are_any_non_negative_integer(capsys, tmp_path):
    """--seed -1 was a numpy traceback after --out was made, and a seed of 42950 or more one from
    neurokit2 (its per-record seeds passed 2**32) after minutes of simulation."""
    from ecgpos.demo import synthetic

    rc, _, err = run(capsys, "demo", "--out", tmp_path / "d", "--seed", "-1")
    one_line_error(rc, err, "demo", "--seed must be 0 or more, got -1")
    assert not (tmp_path / "d").exists()
    assert [p.seed for p in synthetic.random_params(2, 3)] == [300_009, 300_010]  # seeds that fitted are kept
    assert all(0 <= p.seed < 2**32 for p in synthetic.random_params(3, 10**20))


def test_preprocess_into_a_folder_of_other_files_is_refused(capsys, tmp_path, real_record):
    """--out a folder holding someone's files (not a set preprocess started) is one line, and nothing is written."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    rc, _, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", real_record.parent, "--subset", "all", "--out", out
    )
    one_line_error(rc, err, "preprocess", "is a non-empty folder that is not a preprocessing output")
    assert "e.g. notes.txt" in err and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
