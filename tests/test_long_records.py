"""Records longer than 300 s (Holter recordings): read, screened and preprocessed on their centre
span alone, in bounded memory, by `embed`, the API and `preprocess`; records up to 300 s unchanged.
Every output says which records were so cut and how long they were."""

from __future__ import annotations

import csv
import json
import tracemalloc
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import wfdb
from tiny_runs import cli

from ecgpos.ecg.signal import preprocess_signal
from ecgpos.ecg.wfdb_fast import read_fast
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.export.load import load_encoder
from ecgpos.inference.inputs import embed_records, open_source
from ecgpos.models.features import record_windows, window_features

torch.set_num_threads(1)
FS = 500
SPAN = 300 * FS  # the documented bound, 300 s at the record's own rate
HOUR = 3600 * FS
GAIN = 1000.0  # PTB-XL's 1 uV resolution
PTBXL_LEADS = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]


def _tiled_digital(shared_data: Path, length: int) -> np.ndarray:
    """(12, length) int16: a real PTB-XL 10 s record tiled, each copy's chest leads shifted by a few
    uV so no two spans of the long record are alike (the limb leads keep Einthoven's relations)."""
    rec = wfdb.rdrecord(str(shared_data / "ptbxl" / "records500" / "00000" / "00001_hr"), physical=False)
    base = rec.d_signal.T.astype(np.int32)
    reps = -(-length // base.shape[1])
    chest = np.arange(12)[:, None] >= 6
    tiled = np.concatenate([base + 7 * (k % 13) * chest for k in range(reps)], axis=1)[:, :length]
    return tiled.astype(np.int16)


def _write(folder: Path, name: str, digital: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wfdb.wrsamp(
        name,
        fs=FS,
        units=["mV"] * 12,
        sig_name=PTBXL_LEADS,
        d_signal=np.ascontiguousarray(digital.T),
        fmt=["16"] * 12,
        adc_gain=[GAIN] * 12,
        baseline=[0] * 12,
        write_dir=str(folder),
    )
    return folder / name


def _mv(digital: np.ndarray) -> np.ndarray:
    """The samples in mV as the readers give them: (digital - 0) / gain in float64, then float32."""
    return (digital / GAIN).astype(np.float32)


@pytest.fixture(scope="module")
def hour_record(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A 1 h, 500 Hz, 12-lead WFDB record (43 MB) and its stored samples."""
    digital = _tiled_digital(shared_data, HOUR + 1)  # odd length: the span is not trivially aligned
    return _write(tmp_path_factory.mktemp("holter"), "holter", digital), digital


def test_the_documented_bound_is_300_seconds() -> None:
    from ecgpos.ecg.signal import MAX_WHOLE_SECONDS, record_span

    assert MAX_WHOLE_SECONDS == 300.0
    assert record_span(SPAN, FS) == (0, SPAN)  # at the bound: whole
    assert record_span(SPAN + 3, FS) == (1, SPAN + 1)  # beyond: the centred span
    assert record_span(10**12, 10_000.0) == ((10**12 - 3_000_000) // 2, (10**12 + 3_000_000) // 2)
    assert record_span(5000, float("nan")) == (0, 5000)  # a bad rate: left to screening


def test_long_record_is_embedded_on_its_centre_span_in_bounded_memory(
    export0: Path, hour_record: tuple[Path, np.ndarray]
) -> None:
    """`ecgpos embed`'s reading path on a 1 h record: peak numpy memory far below the record's
    size (the whole-record pipeline peaks near 1 GB here), features those of the hand-cut span."""
    encoder = load_encoder(export0)
    base, digital = hour_record
    tracemalloc.start()
    try:
        result = embed_records(encoder, open_source(base.parent, None, None, encoder.spec), 1, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.ids == ["holter"] and not result.skipped
    # a few float64 copies of the 300 s span (14 MB each) and one checksum block; reading and
    # preprocessing the whole hour peaked at about 780 MB
    assert peak < 120e6, f"peak {peak / 1e6:.0f} MB"
    start = (digital.shape[1] - SPAN) // 2
    by_hand = encoder.embed(_mv(digital[:, start : start + SPAN]), FS, PTBXL_LEADS)
    np.testing.assert_array_equal(result.features[0], by_hand)
    # --num-windows spreads its windows over the span, as over a cut record of 300 s
    spread = embed_records(encoder, open_source(base.parent, None, None, encoder.spec), 4, progress=False)
    np.testing.assert_allclose(
        spread.features[0], encoder.embed(_mv(digital[:, start : start + SPAN]), FS, PTBXL_LEADS, 4), atol=1e-6
    )


def test_api_and_npy_inputs_use_the_same_span(
    export0: Path, hour_record: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    encoder = load_encoder(export0)
    _, digital = hour_record
    long = _mv(digital[:, : 20 * 60 * FS + 11])  # 20 min
    start = (long.shape[1] - SPAN) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the span itself is a record of 300 s: used whole, no warning
        by_hand = encoder.embed(np.ascontiguousarray(long[:, start : start + SPAN]), FS, PTBXL_LEADS)
    with pytest.warns(UserWarning, match="longer than 300 s is embedded on its centre 300 s only") as caught:
        np.testing.assert_array_equal(encoder.embed(long, FS, PTBXL_LEADS), by_hand)
    assert [w.filename for w in caught] == [__file__]  # names the caller's line, as the default filter keys it
    np.save(tmp_path / "long.npy", long)
    source = open_source(tmp_path / "long.npy", FS, ",".join(PTBXL_LEADS), encoder.spec)
    result = embed_records(encoder, source, progress=False)
    np.testing.assert_array_equal(result.features[0], by_hand)
    # 600,011 samples at 500 Hz; the span [225,005, 375,005)
    assert result.long == [("long", "1200.022", "450.01", "750.01")]


def test_record_at_the_bound_gives_the_whole_record_features(export0: Path, shared_data: Path) -> None:
    """300 s exactly: preprocessed whole, as every record was before the bound existed."""
    encoder = load_encoder(export0)
    x = _mv(_tiled_digital(shared_data, SPAN))
    whole = preprocess_signal(x, FS, PTBXL_LEADS, encoder.spec)  # the whole-record pipeline
    for count in (1, 3):
        expected = window_features(encoder, record_windows(whole, encoder.spec.window, count)).mean(axis=0)
        np.testing.assert_array_equal(encoder.embed(x, FS, PTBXL_LEADS, count), expected)


def test_readers_read_the_span_and_still_check_every_checksum(hour_record: tuple[Path, np.ndarray]) -> None:
    base, digital = hour_record
    start = (digital.shape[1] - SPAN) // 2
    for reader in (read_fast, read_wfdb_record):
        raw = reader(base)
        assert (raw.start, raw.total, raw.signal.shape) == (start, digital.shape[1], (12, SPAN))
        np.testing.assert_array_equal(raw.signal, _mv(digital[:, start : start + SPAN]))
    # one sample changed far outside the span: the checksum over the whole file still sees it
    corrupt = base.parent / "corrupt"
    corrupt.mkdir()
    (corrupt / "holter.hea").write_bytes(base.with_suffix(".hea").read_bytes())
    data = bytearray(base.with_suffix(".dat").read_bytes())
    data[2 * 12 * 1000] ^= 0x01  # lead I, frame 1000
    (corrupt / "holter.dat").write_bytes(bytes(data))
    for reader in (read_fast, read_wfdb_record):
        with pytest.raises(SignalError) as err:
            reader(corrupt / "holter")
        assert err.value.reason == "corrupt_signal", err.value


def test_preprocess_stores_the_span_of_a_long_record(
    hour_record: tuple[Path, np.ndarray], real_record: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ecgpos preprocess` shares the reading and screening: a long ecg-arrhythmia record is stored
    as its centre 300 s (75,000 samples at 250 Hz), exactly what `embed` preprocesses; the closing
    line counts it and index.csv `duration_s` gives every record's whole duration."""
    base, digital = hour_record
    src = tmp_path / "src"
    src.mkdir()
    header = base.with_suffix(".hea").read_text().replace("holter", "JS99999")
    (src / "JS99999.hea").write_text(header)
    (src / "JS99999.dat").symlink_to(base.with_suffix(".dat"))
    for suffix in (".hea", ".mat"):  # a 10 s record, stored whole
        (src / real_record.with_suffix(suffix).name).symlink_to(real_record.with_suffix(suffix))
    out = tmp_path / "out"
    assert cli("preprocess", "ecg-arrhythmia", "--src", src, "--subset", "all", "--out", out) == 0
    note = "; 1 record longer than 300 s stored as its centre 300 s (index.csv duration_s: the whole record)"
    assert f"stored 2 + skipped 0 = found 2 (1 shards in {out}){note}" in capsys.readouterr().out
    with h5py.File(next(out.glob("shard-*.h5")), "r") as handle:
        assert int(handle["lengths"][1]) == SPAN // 2 and handle["signals"].shape[-1] == SPAN // 2
    with (out / "index.csv").open(newline="") as handle:
        index = [(r["record_id"], r["length"], r["duration_s"]) for r in csv.DictReader(handle)]
    assert index == [("JS00001", "2500", "10"), ("JS99999", str(SPAN // 2), "3600.002")]
    assert json.loads((out / "preprocess.json").read_text())["counts"]["long_records"] == 1
    # a rerun into the finished set and --check say the same
    assert cli("preprocess", "ecg-arrhythmia", "--src", src, "--subset", "all", "--out", out) == 0
    assert note in capsys.readouterr().out
    assert cli("preprocess", "--check", "--out", out) == 0
    assert note in capsys.readouterr().out


def _rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


def test_embed_and_score_list_the_records_used_on_their_span(
    export0: Path,
    level0_run: Path,
    hour_record: tuple[Path, np.ndarray],
    shared_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The closing line counts the records longer than 300 s and FILE.long.csv lists them with their
    whole duration and the span used; a record up to 300 s is in neither."""
    base, _ = hour_record
    folder = tmp_path / "in"
    folder.mkdir()
    short = shared_data / "ptbxl" / "records500" / "00000" / "00001_hr"
    for source in (base, short):
        for suffix in (".hea", ".dat"):
            (folder / source.with_suffix(suffix).name).symlink_to(source.with_suffix(suffix))
    # 1,800,001 samples at 500 Hz; the span [825,000, 975,000)
    listed = [["record_id", "duration_s", "used_from_s", "used_to_s"], ["holter", "3600.002", "1650", "1950"]]
    out = tmp_path / "f.npy"
    assert cli("embed", "--encoder", export0, "--input", folder, "--out", out, "--no-progress") == 0
    printed = capsys.readouterr().out
    assert f"; 1 record longer than 300 s used on its centre 300 s (listed in {tmp_path / 'f.long.csv'})" in printed
    assert _rows(tmp_path / "f.long.csv") == listed
    assert (tmp_path / "f.ids.txt").read_text().split() == ["00001_hr", "holter"]
    scores = tmp_path / "s.csv"
    args = ("score", "--run", level0_run, "--input", folder, "--masks", 1, "--no-progress")
    assert cli(*args, "--out", scores) == 0
    assert "; 1 record longer than 300 s used on its centre 300 s" in capsys.readouterr().out
    assert _rows(tmp_path / "s.long.csv") == listed
    # a later run without a long record leaves no earlier list beside its files
    assert cli("embed", "--encoder", export0, "--input", folder / "00001_hr", "--out", out, "--no-progress") == 0
    assert "longer than" not in capsys.readouterr().out and not (tmp_path / "f.long.csv").exists()
    assert cli(*args[:4], short, *args[5:], "--out", scores) == 0
    assert not (tmp_path / "s.long.csv").exists()
