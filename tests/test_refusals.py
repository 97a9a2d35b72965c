"""What ecgpos refuses: bad records are skipped with a reason, bad runs stop in one line (exit 2).

Every test drives the CLI in-process (`ecgpos.cli.main`) on real sample records, their broken
copies or tiny real runs, and checks the exit code, the one stderr line and what was written.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.io
import torch
import wfdb
from shard_fixtures import write_tiny_shards

from ecgpos.cli import main
from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.resources import config_dir

torch.set_num_threads(1)
TINY0 = config_dir() / "tiny" / "stage0.yaml"
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ["pretrain", "--stage", "0", "--config", str(TINY0)]


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(rc: int, err: str, command: str, needle: str = "") -> str:
    """rc 2, exactly one stderr line `ecgpos COMMAND: error: ...` (no traceback) containing needle."""
    lines = [line for line in err.strip().splitlines() if "warning" not in line]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"ecgpos {command}: error:"), err
    assert needle in lines[0], lines[0]
    return lines[0]


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def copy_record(real: Path, folder: Path, new_id: str, header_edit=None) -> Path:
    """A copy of a real WFDB record under a new name, its header optionally edited (text -> text)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = real.with_suffix(".hea").read_text().replace(real.name, new_id)
    if header_edit:
        text = header_edit(text)
    (folder / f"{new_id}.hea").write_text(text)
    shutil.copyfile(real.with_suffix(".mat"), folder / f"{new_id}.mat")
    return folder / new_id


def set_rate(text: str, rate: str) -> str:
    lines = text.splitlines(keepends=True)
    fields = lines[0].split(" ")
    fields[2] = rate
    return " ".join(fields) + "".join(lines[1:])


@pytest.fixture(scope="module")
def real_record(shared_data) -> Path:
    return shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory) -> Path:
    return write_tiny_shards(tmp_path_factory.mktemp("refusal-shards") / "shards", n_records=24, records_per_shard=12)


@pytest.fixture(scope="module")
def tiny_run(tiny_shards, tmp_path_factory) -> Path:
    """A 4-step Stage-0 run with checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("refusal-run") / "run"
    assert (
        main(
            [
                *PRETRAIN,
                "--shards",
                str(tiny_shards),
                "--run-dir",
                str(out),
                *FAST,
                "--set",
                "optim.steps=4",
                "--set",
                "train.checkpoint_every=2",
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def export(tiny_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("refusal-export") / "enc"
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(out)]) == 0
    return out


def test_1_unsupported_rate_skips_one_record_in_embed_and_probe(capsys, tmp_path, real_record, export):
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


def _broken_shards(tmp_path: Path, tiny_shards: Path) -> dict[str, Path]:
    """Shard folders broken the ways a disk or a hand edit breaks them."""
    good = sorted(tiny_shards.glob("shard-*.h5"))[0]
    cases = {}
    for name in ("truncated", "garbage_header", "empty", "eight_leads"):
        folder = tmp_path / name
        folder.mkdir()
        target = folder / good.name
        data = good.read_bytes()
        if name == "truncated":
            target.write_bytes(data[: len(data) // 2])
        elif name == "garbage_header":
            target.write_bytes(b"\x00garbage" * 8 + data[64:])
        elif name == "empty":
            target.write_bytes(b"")
        else:
            shutil.copyfile(good, target)
            with h5py.File(target, "r+") as f:
                signals = f["signals"][:, :8]
                del f["signals"]
                f.create_dataset("signals", data=signals)
        cases[name] = folder
    return cases


def test_2_unreadable_shards_are_one_line_for_pretrain_and_embed(capsys, tmp_path, tiny_shards, export):
    for name, folder in _broken_shards(tmp_path, tiny_shards).items():
        run_dir = tmp_path / f"run-{name}"
        rc, _, err = run(capsys, *PRETRAIN, "--shards", folder, "--run-dir", run_dir, *FAST)
        one_line_error(rc, err, "pretrain", "shard")
        assert not run_dir.exists(), name
        rc, _, err = run(
            capsys, "embed", "--encoder", export, "--input", folder, "--out", tmp_path / f"{name}.csv", "--no-progress"
        )
        one_line_error(rc, err, "embed", "shard")


def test_2_preprocess_check_validates_shard_contents(capsys, tmp_path, shared_data):
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


def test_3_embed_refuses_what_preprocessing_skips(capsys, tmp_path, real_record, export):
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


def test_4_edited_export_config_is_refused(capsys, tmp_path, export, real_record):
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    embed = ["--input", tmp_path / "x.npy", "--fs", "500", "--leads", ",".join(CANONICAL_LEADS), "--no-progress"]
    edits = {
        "heads": lambda c: c["arch"]["encoder"].update(heads=c["arch"]["encoder"]["heads"] * 2),
        "fs": lambda c: c["preprocess"].update(fs=200),
        "lowpass": lambda c: c["preprocess"].update(lowpass_hz=30.0),
    }
    for name, edit in edits.items():
        copy = tmp_path / f"enc-{name}"
        shutil.copytree(export, copy)
        config = json.loads((copy / "config.json").read_text())
        edit(config)
        (copy / "config.json").write_text(json.dumps(config, indent=2))
        rc, _, err = run(capsys, "embed", "--encoder", copy, *embed, "--out", tmp_path / f"{name}.csv")
        one_line_error(rc, err, "embed", "was edited after export")
        rc, out, _ = run(capsys, "verify", copy)
        assert rc == 1 and "FAIL weights" in out
    # an export written before config_sha256 existed still loads, with one warning
    old = tmp_path / "enc-old"
    shutil.copytree(export, old)
    config = json.loads((old / "config.json").read_text())
    del config["config_sha256"]
    (old / "config.json").write_text(json.dumps(config, indent=2))
    rc, _, err = run(capsys, "embed", "--encoder", old, *embed, "--out", tmp_path / "old.csv")
    assert rc == 0 and err.count("has no config_sha256") == 1, err
    assert run(capsys, "verify", export)[0] == 0


def _lowercase_units(text: str) -> str:
    return text.replace("/mV", "/mv")


def test_5_wfdb_fallback_reader_checks_sizes(tmp_path, real_record, capsys):
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


def test_6_corrupt_newest_checkpoint_falls_back_then_refuses(capsys, tmp_path, tiny_run, tiny_shards):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    assert [c.name for c in ckpts] == ["step-0000002", "step-0000004"]
    (ckpts[1] / "model.safetensors").write_bytes(b"not a safetensors file")
    args = [
        *PRETRAIN,
        "--shards",
        tiny_shards,
        "--run-dir",
        run_dir,
        *FAST,
        "--set",
        "optim.steps=4",
        "--set",
        "train.checkpoint_every=2",
        "--resume",
        "auto",
    ]
    rc, _, err = run(capsys, *args)
    assert rc == 0 and "Traceback" not in err, err
    assert "checkpoint step-0000004 does not load" in err and "resuming from step-0000002" in err
    info = json.loads((run_dir / "run_info.json").read_text())
    assert info["resumed_from"].endswith("step-0000002") and info["finished"] is True
    assert info["skipped_checkpoints"][0]["checkpoint"].endswith("step-0000004")
    # the resumed run rewrote step 4: the same weights as the uninterrupted run (bit-identical resume)
    from safetensors.torch import load_file

    want, got = (load_file(str(d / "checkpoints" / "step-0000004" / "model.safetensors")) for d in (tiny_run, run_dir))
    assert all(torch.equal(want[k], got[k]) for k in want)
    # now every optimizer state is corrupt: one line, exit 2
    for ckpt in sorted((run_dir / "checkpoints").glob("step-*")):
        (ckpt / "optimizer.bin").write_bytes(b"\x80\x04garbage")
    rc, _, err = run(capsys, *args)
    one_line_error(rc, err.replace("does not load", "warning does not load"), "pretrain", "none of the")


@pytest.mark.parametrize(
    "value",
    [
        "train.seed=-1",
        "train.seed=99999999999999999999",
        "optim.lr=!!python/object/apply:os.system [id]",
        "optim.lr=.inf",
    ],
)
def test_7_bad_set_values_are_one_line_before_the_run_folder(capsys, tmp_path, tiny_shards, value):
    run_dir = tmp_path / "run"
    rc, _, err = run(capsys, *PRETRAIN, "--shards", tiny_shards, "--run-dir", run_dir, *FAST, "--set", value)
    one_line_error(rc, err, "pretrain", value.split("=")[0])
    assert not run_dir.exists()


@pytest.mark.parametrize("rate", ["-500", "500e3", "500.0.0", "1e12", "nan", "50"])
def test_8_malformed_rates_are_skipped_as_sampling_rate(capsys, tmp_path, real_record, export, rate):
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


def test_9_finished_out_refuses_other_sources(capsys, tmp_path, real_record):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    out = tmp_path / "out"
    base = ["preprocess", "ecg-arrhythmia", "--subset", "all", "--out", out]
    assert run(capsys, *base, "--src", tmp_path / "src")[0] == 0
    assert json.loads((out / "preprocess.json").read_text())["sources"]["src"] == str((tmp_path / "src").resolve())
    assert run(capsys, *base, "--src", tmp_path / "src")[0] == 0  # the same command: already complete
    for other in (tmp_path / "does-not-exist", tmp_path):
        rc, _, err = run(capsys, *base, "--src", other)
        one_line_error(rc, err, "preprocess", "other sources")


def test_10_unwritable_outputs_are_one_line(capsys, tmp_path, real_record, export):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    (tmp_path / "a-file").write_text("x")
    for out in (tmp_path / "a-file", Path("/proc/ecgpos-test/out")):
        rc, _, err = run(
            capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", out
        )
        one_line_error(rc, err, "preprocess", str(out))
    rc, _, err = run(
        capsys, "embed", "--encoder", export, "--input", src / "JS00001", "--out", "/proc/x.csv", "--no-progress"
    )
    one_line_error(rc, err, "embed", "not writable")


def test_11_negative_max_dead_leads_is_refused(capsys, tmp_path, real_record):
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


def test_12_empty_records_non_records_and_reason_docs(capsys, tmp_path, real_record):
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    copy_record(real_record, src, "JS00001")
    buffer = io.BytesIO()  # a 12 x 0 MATLAB v4 matrix under a header promising 0 samples
    scipy.io.savemat(buffer, {"val": np.zeros((12, 0), dtype=np.int16)}, format="4")
    (src / "JS00002.mat").write_bytes(buffer.getvalue())
    (src / "JS00002.hea").write_text(
        "JS00002 12 500 0\n" + "".join(f"JS00002.mat 16+24 1000/mV 16 0 0 0 0 {lead}\n" for lead in CANONICAL_LEADS)
    )
    (src / "notes.hea").write_text("not a record\n")
    (src / "RECORDS.mat").write_bytes(b"")
    rc, _, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "out"
    )
    assert rc == 0, err
    assert {r["record_id"]: r["reason"] for r in read_rows(tmp_path / "out" / "skipped.csv")} == {"JS00002": "empty"}
    assert json.loads((tmp_path / "out" / "preprocess.json").read_text())["counts"]["not_a_record"] == 2
    assert "2 .hea/.mat files" in err
    # every reason a reader or the screening can give is in the README's table
    table = (ROOT / "preprocessing" / "README.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)`", table, re.M)) | set(re.findall(r" / `([a-z_]+)`", table))
    files = [*(ROOT / "ecgpos" / "ecg").glob("*.py"), *(ROOT / "preprocessing").glob("*.py")]
    code = "".join(p.read_text() for p in files)
    raised = set(re.findall(r'SignalError\(\s*"([a-z_]+)"', code))
    raised |= set(re.findall(r'problem\s*=\s*\("([a-z_]+)"', code))
    assert {"unreadable_part", "duplicate_record", "too_short", "units"} <= raised  # the patterns find them
    assert {"units", "empty", "sampling_rate"} <= documented
    assert raised - documented <= {"shape"} and "shape" in (ROOT / "README.md").read_text()


def test_12_exporting_an_unfinished_run_warns(capsys, tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    shutil.copytree(tiny_run, run_dir)
    info = json.loads((run_dir / "run_info.json").read_text())
    (run_dir / "run_info.json").write_text(json.dumps({**info, "finished": False, "step": 2}))
    rc, _, err = run(capsys, "export", "--run-dir", run_dir, "--out", tmp_path / "enc")
    assert rc == 0 and "warning" in err and "not finished" in err


def test_12_probe_and_embed_share_one_short_record_policy(capsys, tmp_path, real_record, export):
    """Probes zero-pad records shorter than the window (the published splits are used whole) and say
    so; embed refuses them unless --pad-short, which then gives the probe's features."""
    from probes.features import PROBE_POLICY

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
    from probes.datasets import RecordLocator
    from probes.features import encoder_source, extract_features

    wfdb.wrsamp(
        "short",
        fs=500,
        units=["mV"] * 12,
        sig_name=list(CANONICAL_LEADS),
        p_signal=short.T.astype(np.float64),
        fmt=["16"] * 12,
        adc_gain=[1000.0] * 12,
        baseline=[0] * 12,
        write_dir=str(tmp_path),
    )
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


def test_1_every_preprocessing_path_refuses_unsupported_rates(real_record):
    """The library entry points (geometry and leakage call preprocess_signal directly) give the
    reason, not scipy's filter-design ValueError."""
    from ecgpos.ecg.signal import preprocess_signal

    x = read_wfdb_record(real_record).signal
    for fs in (1.0, 50.0, float("nan"), -500.0, 5e5):
        with pytest.raises(SignalError) as info:
            preprocess_signal(x, fs, CANONICAL_LEADS, DEFAULT_SPEC)
        assert info.value.reason == "sampling_rate"
