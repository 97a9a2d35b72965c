"""`ecgpos embed` and `ExportedEncoder.embed` with a tiny export: the same features whatever the
input path, lead order or names; bad records reported, the others embedded."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from shard_fixtures import write_mv_record
from tiny_runs import cli

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.shards import read_shard_spec
from ecgpos.ecg.signal import preprocess_signal
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.export.format import CONFIG_FILE
from ecgpos.export.load import load_encoder

torch.set_num_threads(1)
PTBXL_LEADS = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]


def _shard_row(shards: Path, record_id: str) -> np.ndarray:
    for file in sorted(shards.glob("*.h5")):
        with h5py.File(file, "r") as handle:
            ids = [x.decode() if isinstance(x, bytes) else str(x) for x in handle["record_id"][:]]
            if record_id in ids:
                row = ids.index(record_id)
                return np.asarray(handle["signals"][row, :, : int(handle["lengths"][row])], dtype=np.float32)
    raise AssertionError(f"{record_id} not in {shards}")


def test_embed_of_real_record_equals_its_shard_row(
    export0: Path, arrhythmia_shards: Path, shared_data: Path, tmp_path: Path
) -> None:
    """`embed` of a raw 500 Hz record vs forward_features of its shard row (same centre window).

    With float32 shards (`--dtype float32`) the two must be equal. The default float16 shards
    differ from float32 preprocessing by the float16 rounding alone: the row must equal our
    preprocessing to within one float16 ulp, and the features may differ by at most what that
    rounding does to them (measured here, about 1e-5 relative for the tiny run, not assumed).
    """
    encoder = load_encoder(export0)
    window = encoder.spec.window
    record = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"
    raw = read_wfdb_record(record)
    assert raw.fs == 500
    stored = _shard_row(arrhythmia_shards, "JS00001")
    start = (stored.shape[1] - window) // 2  # evaluation's centre window

    def features(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return encoder.forward_features(torch.from_numpy(x[None, :, start : start + window])).numpy()[0]

    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"  # a one-record corpus in the real layout
    src.mkdir(parents=True)
    for suffix in (".hea", ".mat"):
        (src / f"JS00001{suffix}").symlink_to(record.with_suffix(suffix))
    assert (
        cli(
            "preprocess",
            "ecg-arrhythmia",
            "--src",
            tmp_path / "src",
            "--subset",
            "all",
            "--out",
            tmp_path / "f32",
            "--dtype",
            "float32",
        )
        == 0
    )
    stored32 = _shard_row(tmp_path / "f32", "JS00001")
    assert np.abs(encoder.embed(raw.signal, raw.fs, raw.leads) - features(stored32)).max() <= 1e-6

    x = preprocess_signal(raw.signal, raw.fs, raw.leads, encoder.spec)
    assert x.shape == stored.shape
    np.testing.assert_allclose(stored, x, rtol=2.0**-10, atol=2.0**-24)  # one float16 ulp
    embedded = encoder.embed(raw.signal, raw.fs, raw.leads)
    assert np.abs(embedded - features(x)).max() <= 1e-6  # embed = centre window of the preprocessing
    shard_dtype = read_shard_spec(arrhythmia_shards).dtype
    rounding_effect = np.abs(features(x) - features(x.astype(shard_dtype).astype(np.float32))).max()
    assert np.abs(embedded - features(stored)).max() <= 2 * rounding_effect + 1e-6
    # `ecgpos embed` on the shard folder: stored rows, same centre window, same features
    out = tmp_path / "shard-feats.npz"
    assert cli("embed", "--encoder", export0, "--input", arrhythmia_shards, "--out", out, "--no-progress") == 0
    data = np.load(out)
    ids = list(data["record_id"])
    rows = 0
    for file in arrhythmia_shards.glob("*.h5"):
        with h5py.File(file, "r") as handle:
            rows += len(handle["lengths"])
    assert len(ids) == rows and data["features"].shape == (rows, encoder.width)
    assert np.abs(data["features"][ids.index("JS00001")] - features(stored)).max() <= 1e-6


def test_lead_order_and_names_do_not_change_features(export0: Path, shared_data: Path) -> None:
    encoder = load_encoder(export0)
    raw = read_wfdb_record(shared_data / "ptbxl" / "records500" / "00000" / "00001_hr")
    assert raw.leads == PTBXL_LEADS  # upper-case AVR/AVL/AVF as PTB-XL writes them
    reference = encoder.embed(raw.signal, raw.fs, CANONICAL_LEADS)
    order = np.random.default_rng(5).permutation(12)
    aliases = {"I": "DI", "II": "dii", "III": "D3", "aVR": "avr", "aVL": "AVL", "aVF": "aVf"}
    renamed = [aliases.get(CANONICAL_LEADS[i], CANONICAL_LEADS[i]) for i in order]
    for signal, leads in ((raw.signal, raw.leads), (raw.signal[order], renamed)):
        assert np.abs(encoder.embed(signal, raw.fs, leads) - reference).max() <= 1e-6
    # rows swapped but names not: must differ (chest leads: swapped limb leads are refused, lead_mismatch)
    swapped = raw.signal[[0, 1, 2, 3, 4, 5, 7, 6, 8, 9, 10, 11]]
    assert np.abs(encoder.embed(swapped, raw.fs, raw.leads) - reference).max() > 1e-4


def test_bad_records_are_reported_and_others_embedded(
    export0: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    raw = read_wfdb_record(shared_data / "ptbxl" / "records500" / "00000" / "00002_hr")
    folder = tmp_path / "records"
    (folder / "sub").mkdir(parents=True)
    nan = raw.signal.copy()
    nan[3, 100] = np.nan
    cases = {
        "good": (raw.signal, 500, PTBXL_LEADS),
        "sub/good2": (raw.signal[:, :4600], 500, PTBXL_LEADS),
        "eight": (raw.signal[:8], 500, PTBXL_LEADS[:8]),
        "unknown": (raw.signal, 500, PTBXL_LEADS[:11] + ["X7"]),
        "oddrate": (raw.signal, 1009, PTBXL_LEADS),
        "short": (raw.signal[:, :2000], 500, PTBXL_LEADS),
        "nan": (nan, 500, PTBXL_LEADS),
    }
    reasons = {
        "eight": "missing_lead",
        "unknown": "unknown_lead",
        "oddrate": "sampling_rate",
        "short": "too_short",
        "nan": "non_finite",
    }
    for record_id, (signal, fs, leads) in cases.items():
        write_mv_record(folder / Path(record_id).parent, Path(record_id).name, signal, fs, leads)
    encoder = load_encoder(export0)
    for record_id, reason in reasons.items():  # the Python API raises the same reasons
        signal, fs, leads = cases[record_id]
        with pytest.raises(SignalError) as err:
            encoder.embed(signal, fs, leads)
        assert err.value.reason == reason
    out = tmp_path / "feats.h5"
    assert cli("embed", "--encoder", export0, "--input", folder, "--out", out, "--no-progress") == 0
    captured = capsys.readouterr()
    for record_id, reason in reasons.items():
        assert f"skipped {record_id}: {reason}" in captured.err
    assert "embedded 2 of 7" in captured.out
    with h5py.File(out, "r") as handle:
        ids = [x.decode() for x in handle["record_id"][:]]
        assert ids == ["good", "sub/good2"] and handle["features"].shape == (2, encoder.width)
        np.testing.assert_allclose(handle["features"][0], encoder.embed(raw.signal, 500, PTBXL_LEADS), atol=1e-6)
    assert (
        cli("embed", "--encoder", export0, "--input", folder, "--out", tmp_path / "f.csv", "--strict", "--no-progress")
        == 1
    )


def test_npy_input_with_fs_and_leads(
    export0: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    raw = read_wfdb_record(shared_data / "ptbxl" / "records500" / "00000" / "00003_hr")
    bad = raw.signal.copy()
    bad[0, :10] = np.nan
    chest_reversed = np.concatenate([raw.signal[:6], raw.signal[:5:-1]])
    batch = np.stack([raw.signal, chest_reversed, bad])  # rows 0, 1 differ by lead order; row 2 has NaN
    np.save(tmp_path / "batch.npy", batch)
    leads = ",".join(PTBXL_LEADS)
    assert (
        cli(
            "embed",
            "--encoder",
            export0,
            "--input",
            tmp_path / "batch.npy",
            "--out",
            tmp_path / "f.npy",
            "--fs",
            "500",
            "--leads",
            leads,
            "--num-windows",
            "2",
            "--no-progress",
        )
        == 0
    )
    feats = np.load(tmp_path / "f.npy")
    assert (tmp_path / "f.ids.txt").read_text().split() == ["0", "1"]
    encoder = load_encoder(export0)
    want = encoder.embed(raw.signal, 500, PTBXL_LEADS, num_windows=2)
    assert np.abs(feats[0] - want).max() <= 1e-6 and np.abs(feats[1] - feats[0]).max() > 1e-4
    assert "skipped 2: non_finite" in capsys.readouterr().err
    assert (
        cli("embed", "--encoder", export0, "--input", tmp_path / "batch.npy", "--out", tmp_path / "g.npy") == 2
    )  # --fs/--leads missing
    assert "--fs" in capsys.readouterr().err


def test_embed_ptbxl_folder_to_csv(export0: Path, shared_data: Path, tmp_path: Path) -> None:
    """`ecgpos embed` of the PTB-XL sample folder to CSV, as docs/export.md shows it."""
    out = tmp_path / "feats.csv"
    assert (
        cli(
            "embed",
            "--encoder",
            export0,
            "--input",
            shared_data / "ptbxl" / "records500" / "00000",
            "--out",
            out,
            "--no-progress",
        )
        == 0
    )
    with out.open() as handle:
        rows = list(csv.reader(handle))
    width = json.loads((export0 / CONFIG_FILE).read_text())["io"]["features"]
    assert rows[0] == ["record_id"] + [f"f{i}" for i in range(width)]
    assert len(rows) == 201 and rows[1][0] == "00001_hr" and rows[-1][0] == "00200_hr"
    values = np.array([[float(v) for v in row[1:]] for row in rows[1:]])
    assert np.isfinite(values).all() and values.std(axis=0).max() > 0


@pytest.mark.parametrize(
    "command, text",
    [
        ("embed", "FILE's `.skipped.csv`"),
        ("score", "FILE's `.summary.md`"),
        ("export", "the model card README.md"),
        ("verify", "Exit 0 when all pass, 1 when any fails"),
    ],
)
def test_help_says_what_the_command_writes_and_returns(capsys, command: str, text: str) -> None:
    """--help shows the command's whole description (outputs, ids, exit codes), not its first line only."""
    with pytest.raises(SystemExit) as stop:
        cli(command, "--help")
    assert stop.value.code == 0 and text in capsys.readouterr().out
