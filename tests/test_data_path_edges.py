"""Odd but legal WFDB layouts, damage only a checksum reveals, and shard folders holding files of
another run: each was once a traceback, a silently wrong signal or silently pooled records."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import wfdb
from refusal_helpers import copy_record, one_line_error, run
from shard_fixtures import write_tiny_shards

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.shards import read_shard_spec
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError, SignalError


def _segments(folder: Path, lengths: list[int]) -> list[np.ndarray]:
    """Single-segment format-16 records `seg0`, `seg1`, ... (1000 adu/mV); their (leads, time) mV."""
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate(lengths):
        digital = rng.integers(-2000, 2000, size=(n, 12)).astype(np.int16)
        wfdb.wrsamp(
            f"seg{i}",
            fs=500,
            units=["mV"] * 12,
            sig_name=list(CANONICAL_LEADS),
            d_signal=digital,
            fmt=["16"] * 12,
            adc_gain=[1000.0] * 12,
            baseline=[0] * 12,
            write_dir=str(folder),
        )
        out.append(digital.T / 1000.0)
    return out


def _master(folder: Path, total: int, segments: list[tuple[str, int]]) -> Path:
    lines = [f"rec/{len(segments)} 12 500 {total}", *(f"{name} {n}" for name, n in segments)]
    (folder / "rec.hea").write_text("\n".join(lines) + "\n")
    return folder / "rec"


def test_multi_segment_record_is_read_whole_or_refused_with_a_reason(tmp_path):
    """wfdb reads multi-segment records, but the size checks assumed one signal file and raised
    AttributeError (a traceback in `embed` and the probes); a segment longer than the master header
    says was cut silently."""
    parts = _segments(tmp_path, [2500, 3000])
    rec = read_wfdb_record(_master(tmp_path, 5500, [("seg0", 2500), ("seg1", 3000)]))
    assert rec.fs == 500 and rec.leads == list(CANONICAL_LEADS)
    np.testing.assert_allclose(rec.signal, np.concatenate(parts, axis=1), atol=1e-6)
    for total, segments, needle in [
        (5000, [("seg0", 2000), ("seg1", 3000)], "segment seg0 holds 2500 samples, header says 2000"),
        (6000, [("seg0", 2500), ("seg1", 3000)], "segments hold 5500 samples, header says 6000"),
    ]:
        with pytest.raises(SignalError, match=needle) as err:
            read_wfdb_record(_master(tmp_path, total, segments))
        assert err.value.reason == "header_mismatch"
    _master(tmp_path, 5500, [("seg0", 2500), ("seg1", 3000)])
    data = tmp_path / "seg1.dat"
    flipped = bytearray(data.read_bytes())
    flipped[5000] ^= 0x10  # one bit of one sample: the segment's checksum no longer holds
    data.write_bytes(bytes(flipped))
    with pytest.raises(SignalError, match="segment seg1: lead") as err:
        read_wfdb_record(tmp_path / "rec")
    assert err.value.reason == "corrupt_signal"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(SignalError, match="seg1.dat") as err:
        read_wfdb_record(tmp_path / "rec")
    assert err.value.reason == "truncated_signal"


def _ptbxl_copy(shared_data: Path, folder: Path) -> Path:
    real = shared_data / "ptbxl" / "records500" / "00000" / "00001_hr"
    folder.mkdir()
    for suffix in (".hea", ".dat"):
        shutil.copyfile(real.with_suffix(suffix), folder / f"00001_hr{suffix}")
    return folder / "00001_hr"


def test_wfdb_reader_checks_checksums_like_the_fast_reader(shared_data, tmp_path):
    """Only the fast format-16 `.mat` reader compared samples with the header's checksums: a
    damaged PTB-XL `.dat` of the right size, or signal lines listed in another order than the
    file stores them, was read (by `embed` and the probes) as a good record."""
    base = _ptbxl_copy(shared_data, tmp_path / "flipped")
    data = bytearray(base.with_suffix(".dat").read_bytes())
    data[5001] ^= 0x40  # one flipped bit in one sample
    base.with_suffix(".dat").write_bytes(bytes(data))
    with pytest.raises(SignalError, match="checksum") as err:
        read_wfdb_record(base)
    assert err.value.reason == "corrupt_signal"

    base = _ptbxl_copy(shared_data, tmp_path / "swapped")
    lines = base.with_suffix(".hea").read_text().splitlines()
    lines[1], lines[2] = lines[2], lines[1]  # "II" first, while the file stores lead I first
    base.with_suffix(".hea").write_text("\n".join(lines) + "\n")
    with pytest.raises(SignalError, match="initial|first sample|checksum") as err:
        read_wfdb_record(base)
    assert err.value.reason == "corrupt_signal"


def test_shard_files_of_another_run_are_never_pooled(capsys, tmp_path, real_record):
    """A set's readers take every shard-*.h5 of its folder. Shards left by another run (a folder
    whose chunks/ was deleted, or files copied in) stayed beside the new ones, and `--check` called
    the set complete."""
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    for record_id in ("JS00001", "JS00002", "JS00003"):
        copy_record(real_record, src, record_id)
    out = tmp_path / "o"
    args = ("preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", out)
    rc, stdout, err = run(capsys, *args, "--records-per-shard", "1")
    assert rc == 0 and "stored 3 + skipped 0 = found 3" in stdout, stdout + err

    shutil.copyfile(out / "shard-00000.h5", out / "shard-00007.h5")
    rc, _, err = run(capsys, "preprocess", "--check", "--out", out)
    one_line_error(rc, err, "preprocess", "shard-00007.h5")

    shutil.rmtree(out / "chunks")
    (out / "preprocess.json").unlink()
    rc, _, err = run(capsys, *args, "--records-per-shard", "3")
    one_line_error(rc, err, "preprocess", "no chunks/plan.json")
    assert not (out / "chunks").exists()


def test_shard_with_numeric_record_ids_is_refused_before_any_reader_decodes_them(tmp_path):
    """The shard check passed a `record_id` of numbers; pretraining (and the leakage guard) then
    died decoding them as text with h5py's TypeError."""
    shards = write_tiny_shards(tmp_path / "shards", n_records=6, records_per_shard=3)
    with h5py.File(shards / "shard-00001.h5", "r+") as f:
        del f["record_id"]
        f.create_dataset("record_id", data=np.arange(3))
    with pytest.raises(EcgposError, match="shard-00001.h5: record_id has dtype int64, expected strings"):
        read_shard_spec(shards)
