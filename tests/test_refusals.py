"""What ecgpos refuses, record by record: a bad record is skipped with its reason, the others go on.

Every test drives the CLI in-process (`ecgpos.cli.main`) on real sample records or their broken
copies, and checks the exit code, the one stderr line and what was written.
"""

from __future__ import annotations

import io
import json
import re

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.io
from refusal_helpers import (
    ROOT,
    copy_record,
    one_line_error,
    read_rows,
    run,
    set_rate,
)
from shard_fixtures import write_mv_record

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError


def test_unsupported_rate_skips_one_record_in_embed_and_probe(capsys, tmp_path, real_record, export):
    """fs 1 Hz (header 1e12, read by wfdb as 1) was a scipy `butter` traceback for the whole run."""
    folder = tmp_path / "records"
    copy_record(real_record, folder, "JS00001")
    copy_record(real_record, folder, "JS00002", lambda t: set_rate(t, "1e12"))
    rc, out, err = run(
        capsys, "embed", "--encoder", export, "--input", folder, "--out", tmp_path / "f.csv", "--no-progress"
    )
    assert rc == 0 and "Traceback" not in err, err
    assert [r["record_id"] for r in read_rows(tmp_path / "f.csv")] == ["JS00001"]
    skipped = read_rows(tmp_path / "f.skipped.csv")
    assert [(r["record_id"], r["reason"]) for r in skipped] == [("JS00002", "sampling_rate")]
    # one rate for a whole .npy: refused before any work, in one line
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    rc, _, err = run(
        capsys,
        "embed",
        "--encoder",
        export,
        "--input",
        tmp_path / "x.npy",
        "--fs",
        "1",
        "--leads",
        ",".join(CANONICAL_LEADS),
        "--out",
        tmp_path / "g.csv",
        "--no-progress",
    )
    one_line_error(rc, err, "embed", "--fs 1 Hz is outside the supported range")
    # the same bad record in a probe's train split: excluded with its reason, the probe runs
    task = tmp_path / "task"
    rows = []
    for i in range(12):
        copy_record(real_record, task, f"r{i:02d}", (lambda t: set_rate(t, "1e12")) if i == 0 else None)
        rows.append({"record": f"r{i:02d}", "a": i % 2, "b": 1 - i % 2})
    frame = pd.DataFrame(rows)
    frame.iloc[:6].to_csv(task / "train.csv", index=False)
    frame.iloc[6:9].to_csv(task / "val.csv", index=False)
    frame.iloc[9:].to_csv(task / "test.csv", index=False)
    rc, out, err = run(
        capsys,
        "probe",
        "--encoder",
        export,
        "--task",
        f"custom:{task}",
        "--seeds",
        "1",
        "--epochs",
        "1",
        "--fractions",
        "100",
        "--cache-dir",
        tmp_path / "cache",
        "--out",
        tmp_path / "probe",
    )
    assert rc == 0 and "Traceback" not in err, err
    assert "r00 (sampling_rate" in out
    assert (pd.read_csv(tmp_path / "probe" / "results.csv")["n_train"] == 5).all()


def test_preprocess_check_validates_shard_contents(capsys, tmp_path, shared_data):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    for real in sorted((shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010").glob("JS0000[1-4].hea")):
        copy_record(real.with_suffix(""), src, real.stem)
    out = tmp_path / "set"
    assert (
        run(capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", out)[0] == 0
    )
    assert run(capsys, "preprocess", "--check", "--out", out)[0] == 0  # real output passes the content check
    shard = out / "shard-00000.h5"
    original = shard.read_bytes()
    edits = {"NaN": lambda s: np.full_like(s, np.nan), "RMS": lambda s: s * 1000, "shape": lambda s: s[:, :8]}
    for needle, edit in edits.items():
        shard.write_bytes(original)
        with h5py.File(shard, "r+") as f:
            signals = edit(f["signals"][:])
            del f["signals"]
            f.create_dataset("signals", data=signals)
        rc, _, err = run(capsys, "preprocess", "--check", "--out", out)
        one_line_error(rc, err, "preprocess", needle)


def test_embed_refuses_what_preprocessing_skips(capsys, tmp_path, real_record, export):
    good = read_wfdb_record(real_record).signal
    constant = np.full_like(good, 0.7)
    micro = np.random.default_rng(0).normal(0, 1e-3, good.shape).astype(np.float32) * 1e-3
    dead3 = good.copy()
    dead3[[0, 5, 9]] = 0.0
    stack = np.stack([good, np.zeros_like(good), constant, micro, dead3])
    np.save(tmp_path / "x.npy", stack)
    rc, out, err = run(
        capsys,
        "embed",
        "--encoder",
        export,
        "--input",
        tmp_path / "x.npy",
        "--fs",
        "500",
        "--leads",
        ",".join(CANONICAL_LEADS),
        "--out",
        tmp_path / "f.csv",
        "--no-progress",
    )
    assert rc == 0 and "Traceback" not in err, err
    assert [r["record_id"] for r in read_rows(tmp_path / "f.csv")] == ["0"]
    reasons = {r["record_id"]: r["reason"] for r in read_rows(tmp_path / "f.skipped.csv")}
    assert reasons == {"1": "all_zero", "2": "flat", "3": "flat", "4": "dead_leads"}


def _lowercase_units(text: str) -> str:
    return text.replace("/mV", "/mv")


def test_wfdb_fallback_reader_checks_sizes(tmp_path, real_record, capsys):
    """Headers outside the fast path (lowercase `/mv`) get the same size checks as the fast reader."""
    folder = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, folder, "JS00001", _lowercase_units)
    long = copy_record(real_record, folder, "JS00002", lambda t: _lowercase_units(t.replace(" 5000", " 4600", 1)))
    short = copy_record(real_record, folder, "JS00003", _lowercase_units)
    data = short.with_suffix(".mat").read_bytes()
    short.with_suffix(".mat").write_bytes(data[: len(data) - 1000])
    with pytest.raises(SignalError) as info:
        read_wfdb_record(long)
    assert info.value.reason == "header_mismatch"
    with pytest.raises(SignalError) as info:
        read_wfdb_record(short)
    assert info.value.reason == "truncated_signal"
    rc, _, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "out"
    )
    assert rc == 0, err
    reasons = {r["record_id"]: r["reason"] for r in read_rows(tmp_path / "out" / "skipped.csv")}
    assert reasons == {"JS00002": "header_mismatch", "JS00003": "truncated_signal"}


@pytest.mark.parametrize("rate", ["-500", "500e3", "500.0.0", "1e12", "nan", "50"])
def test_malformed_rates_are_skipped_as_sampling_rate(capsys, tmp_path, real_record, export, rate):
    folder = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, folder, "JS00001")
    copy_record(real_record, folder, "JS00002", lambda t: set_rate(t, rate))
    copy_record(real_record, folder, "JS00003", lambda t: _lowercase_units(set_rate(t, rate)))  # fallback reader
    rc, _, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "out"
    )
    assert rc == 0, err
    skipped = {r["record_id"]: (r["reason"], r["detail"]) for r in read_rows(tmp_path / "out" / "skipped.csv")}
    assert {k: v[0] for k, v in skipped.items()} == {"JS00002": "sampling_rate", "JS00003": "sampling_rate"}
    assert "250 Hz" not in skipped["JS00002"][1] and " 1 Hz" not in skipped["JS00002"][1]
    rc, _, err = run(
        capsys, "embed", "--encoder", export, "--input", tmp_path / "src", "--out", tmp_path / "f.csv", "--no-progress"
    )
    assert rc == 0, err
    assert {r["reason"] for r in read_rows(tmp_path / "f.skipped.csv")} == {"sampling_rate"}


def test_finished_out_refuses_other_sources(capsys, tmp_path, real_record):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    out = tmp_path / "out"
    base = ["preprocess", "ecg-arrhythmia", "--subset", "all", "--out", out]
    assert run(capsys, *base, "--src", tmp_path / "src")[0] == 0
    assert json.loads((out / "preprocess.json").read_text())["sources"]["src"] == str((tmp_path / "src").resolve())
    rc, out_text, err = run(capsys, *base, "--src", tmp_path / "src")  # the same command: already complete
    assert rc == 0 and "left untouched)" in out_text + err and "now lists" not in out_text + err
    copy_record(real_record, src, "JS00002")  # a record added to the source since: said, the set kept
    before = (out / "index.csv").read_bytes()
    rc, out_text, err = run(capsys, *base, "--src", tmp_path / "src")
    assert rc == 0 and "now lists 2 records, not the 1 it was built from" in out_text + err, out_text + err
    assert (out / "index.csv").read_bytes() == before
    for other in (tmp_path / "does-not-exist", tmp_path):
        rc, _, err = run(capsys, *base, "--src", other)
        one_line_error(rc, err, "preprocess", "other sources")


def test_negative_max_dead_leads_is_refused(capsys, tmp_path, real_record):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    rc, _, err = run(
        capsys,
        "preprocess",
        "ecg-arrhythmia",
        "--src",
        tmp_path / "src",
        "--subset",
        "all",
        "--out",
        tmp_path / "out",
        "--max-dead-leads",
        "-1",
    )
    one_line_error(rc, err, "preprocess", "--max-dead-leads")
    assert not (tmp_path / "out").exists()


def test_empty_records_non_records_and_reason_docs(capsys, tmp_path, real_record):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    buffer = io.BytesIO()  # a 12 x 0 MATLAB v4 matrix under a header promising 0 samples
    scipy.io.savemat(buffer, {"val": np.zeros((12, 0), dtype=np.int16)}, format="4")
    (src / "JS00002.mat").write_bytes(buffer.getvalue())
    (src / "JS00002.hea").write_text(
        "JS00002 12 500 0\n" + "".join(f"JS00002.mat 16+24 1000/mV 16 0 0 0 0 {lead}\n" for lead in CANONICAL_LEADS)
    )
    (src / "notes.hea").write_text("not a record\n")
    (src / "notes.mat").write_bytes(b"")  # one name with its .hea
    (src / "RECORDS.mat").write_bytes(b"")
    rc, _, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "out"
    )
    assert rc == 0, err
    assert {r["record_id"]: r["reason"] for r in read_rows(tmp_path / "out" / "skipped.csv")} == {"JS00002": "empty"}
    assert json.loads((tmp_path / "out" / "preprocess.json").read_text())["counts"]["not_a_record"] == 2
    assert "2 .hea/.mat names" in err
    # every reason a reader or the screening can give is in the skip-reason table of docs/data.md
    table = (ROOT / "docs" / "data.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)`", table, re.M)) | set(re.findall(r" / `([a-z_]+)`", table))
    files = [*(ROOT / "ecgpos" / "ecg").glob("*.py"), *(ROOT / "preprocessing").glob("*.py")]
    code = "".join(p.read_text() for p in files)
    raised = set(re.findall(r'SignalError\(\s*"([a-z_]+)"', code))
    raised |= set(re.findall(r'problem\s*=\s*\("([a-z_]+)"', code))
    assert {"unreadable_part", "duplicate_record", "too_short", "units"} <= raised  # the patterns find them
    assert {"units", "empty", "sampling_rate"} <= documented
    assert raised - documented <= {"shape"} and "shape" in (ROOT / "docs" / "refusals.md").read_text()


def test_probe_and_embed_share_one_short_record_policy(capsys, tmp_path, real_record, export):
    """Probes zero-pad records shorter than the window (the published splits are used whole) and say
    so; embed refuses them unless --pad-short, which then gives the probe's features."""
    from ecgpos.probes.shared.datasets import PROBE_POLICY

    assert PROBE_POLICY.pad_short and PROBE_POLICY.max_dead_leads == 2
    short = read_wfdb_record(real_record).signal[:, :4000]  # 8 s at 500 Hz = 2000 samples at 250 Hz
    np.save(tmp_path / "s.npy", short)
    args = [
        "embed",
        "--encoder",
        export,
        "--input",
        tmp_path / "s.npy",
        "--fs",
        "500",
        "--leads",
        ",".join(CANONICAL_LEADS),
        "--no-progress",
    ]
    rc, _, err = run(capsys, *args, "--out", tmp_path / "a.csv")
    assert rc == 2 and "too_short" in err
    rc, _, err = run(capsys, *args, "--pad-short", "--out", tmp_path / "b.csv")
    assert rc == 0, err
    from ecgpos.export.load import load_encoder
    from ecgpos.probes.linear.features import encoder_source, extract_features
    from ecgpos.probes.shared.datasets import RecordLocator

    write_mv_record(tmp_path, "short", short, 500, list(CANONICAL_LEADS))
    enc = load_encoder(export)
    logged = []
    feats, stats = extract_features(
        encoder_source(enc, enc.spec, "enc"),
        "custom:x",
        ["short"],
        RecordLocator("custom", tmp_path, tmp_path),
        tmp_path / "cache",
        1,
        log=logged.append,
    )
    assert stats.padded == ["short"] and any("zero-padded" in line for line in logged)
    want = np.array([float(v) for v in list(read_rows(tmp_path / "b.csv")[0].values())[1:]], dtype=np.float32)
    np.testing.assert_allclose(feats["short"], want, rtol=1e-4, atol=1e-5)


def test_every_preprocessing_path_refuses_unsupported_rates(real_record):
    """The library entry point below every screening (`preprocess_signal`) gives the reason, not
    scipy's filter-design ValueError."""
    from ecgpos.ecg.signal import preprocess_signal

    x = read_wfdb_record(real_record).signal
    for fs in (1.0, 50.0, float("nan"), -500.0, 5e5):
        with pytest.raises(SignalError) as info:
            preprocess_signal(x, fs, CANONICAL_LEADS, DEFAULT_SPEC)
        assert info.value.reason == "sampling_rate"


def test_a_header_that_is_no_wfdb_header_is_skipped_as_unreadable(capsys, tmp_path, real_record, export):
    """Text in the signal-count field is no WFDB header: it was skipped as a malformed sampling rate."""
    folder = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, folder, "JS00001")
    copy_record(real_record, folder, "JS00002", lambda t: "this is not a header\n")
    rc, _, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "out"
    )
    assert rc == 0, err
    [row] = read_rows(tmp_path / "out" / "skipped.csv")
    assert (row["record_id"], row["reason"]) == ("JS00002", "unreadable") and "bad WFDB record line" in row["detail"]
    rc, _, err = run(
        capsys, "embed", "--encoder", export, "--input", tmp_path / "src", "--out", tmp_path / "f.csv", "--no-progress"
    )
    assert rc == 0, err
    assert [r["reason"] for r in read_rows(tmp_path / "f.skipped.csv")] == ["unreadable"]
