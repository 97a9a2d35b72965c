"""Every kind of bad input becomes a specific skipped.csv reason (or a one-line error), never a traceback."""

from __future__ import annotations

import csv
import io
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
from code15_fixtures import FS as CODE15_FS
from code15_fixtures import ecg_like, exam_row, padded_trace, write_exams_csv, write_part

from ecgpos.cli import main
from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.shards import iter_shard_records


def write_record(
    folder: Path, record_id: str, digital: np.ndarray, fs: int = 500, leads=CANONICAL_LEADS, sig_len: int | None = None
) -> None:
    """An ecg-arrhythmia style record: MATLAB v4 `val` int16 + CRLF header at 1000 adu/mV."""
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, {"val": digital.astype(np.int16)}, format="4")
    (folder / f"{record_id}.mat").write_bytes(buffer.getvalue())
    lines = [f"{record_id} {len(leads)} {fs} {sig_len or digital.shape[1]}"]
    for lead, row in zip(leads, digital.astype(np.int64)):
        lines.append(f"{record_id}.mat 16+24 1000/mV 16 0 {row[0]} {int(row.sum()) & 0xFFFF} 0 {lead}")
    lines += ["#Age: 60", "#Sex: Female", "#Dx: 426783006"]
    (folder / f"{record_id}.hea").write_bytes(("\r\n".join(lines) + "\r\n").encode())


def good_digital(seconds: float = 10, seed: int = 0) -> np.ndarray:
    return np.round(ecg_like(int(seconds * 500), 500, seed) * 1000).astype(np.int16)


def run(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["preprocess", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def bad_tree(shared_data, tmp_path_factory) -> Path:
    """A WFDBRecords tree: one good real record, corrupted real copies, and hand-built bad records."""
    root = tmp_path_factory.mktemp("bad-arrhythmia")
    a, b = root / "WFDBRecords" / "01" / "010", root / "WFDBRecords" / "02" / "020"
    real = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"
    a.mkdir(parents=True)

    def real_copy(new_id: str, folder: Path = a) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        header = real.with_suffix(".hea").read_bytes().replace(b"JS00001", new_id.encode())
        (folder / f"{new_id}.hea").write_bytes(header)
        shutil.copyfile(real.with_suffix(".mat"), folder / f"{new_id}.mat")
        return folder / new_id

    real_copy("JS00001")
    mat = real_copy("JS00002").with_suffix(".mat")
    mat.write_bytes(mat.read_bytes()[:-1000])  # truncated
    mat = real_copy("JS00003").with_suffix(".mat")
    data = bytearray(mat.read_bytes())
    data[5000:5010] = bytes(10)  # corrupt samples: checksums no longer match
    mat.write_bytes(bytes(data))
    hea = real_copy("JS00004").with_suffix(".hea")
    hea.write_bytes(hea.read_bytes().replace(b"JS00004 12 500 5000", b"JS00004 12 500 4000"))  # header disagrees
    write_record(a, "JS00005", good_digital()[:11], leads=CANONICAL_LEADS[:11])  # V6 missing
    write_record(a, "JS00006", good_digital(), leads=["I", "II", "II", *CANONICAL_LEADS[3:]])
    write_record(a, "JS00007", good_digital(), fs=360)
    nan = good_digital()
    nan[4, 100:110] = -32768  # WFDB's invalid-sample code -> NaN
    write_record(a, "JS00008", nan)
    write_record(a, "JS00009", np.zeros((12, 5000), np.int16))
    write_record(a, "JS00010", np.full((12, 5000), 100, np.int16))
    dead3 = good_digital()
    dead3[[1, 7, 9]] = 0
    write_record(a, "JS00011", dead3)
    dead1 = good_digital(seed=3)
    dead1[8] = 0  # V3 dead
    write_record(a, "JS00012", dead1)
    write_record(a, "JS00013", good_digital(seconds=5))
    write_record(a, "JS00014", good_digital())
    (a / "JS00014.hea").unlink()  # signal without header
    write_record(a, "JS00015", good_digital())
    (a / "JS00015.mat").unlink()  # header without signal
    write_record(a, "JS00016", good_digital())
    (a / "JS00016.hea").write_text("this is not a WFDB header\n")
    real_copy("JS00001", b)  # the same record id a second time
    return root


EXPECTED_ARRHYTHMIA = {
    "JS00002": "truncated_signal",
    "JS00003": "corrupt_signal",
    "JS00004": "header_mismatch",
    "JS00005": "missing_lead",
    "JS00006": "duplicate_lead",
    "JS00007": "unexpected_fs",
    "JS00008": "non_finite",
    "JS00009": "all_zero",
    "JS00010": "flat",
    "JS00011": "dead_leads",
    "JS00013": "too_short",
    "JS00014": "unreadable",
    "JS00015": "unreadable",
    "JS00016": "unreadable",
}


def test_arrhythmia_bad_inputs_are_skipped_with_reasons(bad_tree, tmp_path, capsys):
    rc, out, err = run(
        capsys,
        "ecg-arrhythmia",
        "--src",
        str(bad_tree),
        "--subset",
        "all",
        "--out",
        str(tmp_path / "o"),
        "--records-per-shard",
        "4",
    )
    assert rc == 0 and "Traceback" not in err
    assert "stored 2 + skipped 15 = found 17" in out
    skipped = read_csv(tmp_path / "o" / "skipped.csv")
    reasons = {row["record_id"]: row["reason"] for row in skipped if row["record_id"] != "JS00001"}
    assert reasons == EXPECTED_ARRHYTHMIA
    assert [row["reason"] for row in skipped if row["record_id"] == "JS00001"] == ["duplicate_record"]
    assert all(row["detail"] for row in skipped)
    index = read_csv(tmp_path / "o" / "index.csv")
    assert [(row["record_id"], row["dead_leads"]) for row in index] == [("JS00001", ""), ("JS00012", "V3")]
    signals = dict(iter_shard_records(tmp_path / "o"))
    v3 = CANONICAL_LEADS.index("V3")
    assert np.all(signals["JS00012"][v3] == 0) and np.isfinite(signals["JS00012"]).all()
    assert np.all(np.abs(np.delete(signals["JS00012"], v3, axis=0)).max(axis=1) > 0.5)


def test_pad_short_and_strict_dead_lead_policy(bad_tree, tmp_path, capsys):
    rc, out, _ = run(
        capsys,
        "ecg-arrhythmia",
        "--src",
        str(bad_tree),
        "--subset",
        "all",
        "--out",
        str(tmp_path / "o"),
        "--pad-short",
        "--max-dead-leads",
        "0",
    )
    assert rc == 0 and "stored 2 + skipped 15 = found 17" in out
    index = {row["record_id"]: row for row in read_csv(tmp_path / "o" / "index.csv")}
    assert set(index) == {"JS00001", "JS00013"} and index["JS00013"]["length"] == "1250"
    reasons = {row["record_id"]: row["reason"] for row in read_csv(tmp_path / "o" / "skipped.csv")}
    assert reasons["JS00012"] == "dead_leads"
    with h5py.File(tmp_path / "o" / "shard-00000.h5", "r") as f:
        row = list(f["record_id"].asstr()[:]).index("JS00013")
        assert f["lengths"][row] == 1250 and f["signals"].shape[2] == 2500
        assert np.all(f["signals"][row, :, 1250:] == 0) and np.any(f["signals"][row, :, :1250] != 0)


def test_code15_bad_inputs(tmp_path, capsys):
    src = tmp_path / "code15"
    ten, seven = padded_trace(ecg_like(4000, CODE15_FS, 1)), padded_trace(ecg_like(2800, CODE15_FS, 2))
    nan = ten.copy()
    nan[2000, 3] = np.nan
    write_part(src, 0, [1, 2, 3, 4, 5], [ten, seven, np.zeros_like(ten), ten, nan])
    (src / "exams_part1.hdf5").write_bytes(b"not an HDF5 file at all" * 10)
    with h5py.File(src / "exams_part2.hdf5", "w") as f:
        f.create_dataset("exam_id", data=np.array([8, 0]))  # no tracings
    write_exams_csv(
        src,
        [
            exam_row(1, 0, RBBB=True),
            exam_row(2, 0),
            exam_row(3, 0),
            exam_row(5, 0),
            exam_row(6, 1),
            exam_row(7, 1),
            exam_row(9, 17),
        ],
    )  # no row for exam 4
    rc, out, err = run(capsys, "code15", "--src", str(src), "--out", str(tmp_path / "o"))
    assert rc == 0 and "stored 1 + skipped 7 = found 8" in out
    reasons = {row["record_id"]: row["reason"] for row in read_csv(tmp_path / "o" / "skipped.csv")}
    assert reasons == {
        "2": "too_short",
        "3": "all_zero",
        "4": "missing_metadata",
        "5": "non_finite",
        "6": "unreadable_part",
        "7": "unreadable_part",
        "exams_part2.hdf5": "unreadable_part",
    }
    index = read_csv(tmp_path / "o" / "index.csv")
    assert [(r["record_id"], r["length"], r["RBBB"], r["patient_id"]) for r in index] == [("1", "2500", "1", "8")]
    rc, out, _ = run(capsys, "code15", "--src", str(src), "--out", str(tmp_path / "padded"), "--pad-short")
    assert rc == 0 and "stored 2 + skipped 6 = found 8" in out
    lengths = {r["record_id"]: r["length"] for r in read_csv(tmp_path / "padded" / "index.csv")}
    assert lengths == {"1": "2500", "2": "1750"}  # 7 s at 250 Hz, padded in the shard to 2250+


@pytest.mark.parametrize("dataset", ["ecg-arrhythmia", "code15"])
def test_src_without_records_is_a_one_line_error(dataset, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.txt").write_text("nothing here")
    for src in (tmp_path / "empty", tmp_path / "missing"):
        rc, out, err = run(capsys, dataset, "--src", str(src), "--out", str(tmp_path / "o"), "--subset", "all")
        assert rc == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and err.startswith("ecgpos preprocess: error:")
    assert not (tmp_path / "o" / "index.csv").exists()


def test_default_ningbo_subset_on_chapman_samples_says_why(shared_data, tmp_path, capsys):
    rc, out, err = run(
        capsys, "ecg-arrhythmia", "--src", str(shared_data / "ecg-arrhythmia"), "--out", str(tmp_path / "o")
    )
    assert rc == 2 and "200 records outside subset 'ningbo': try --subset all" in err


def test_a_failing_batch_run_skips_only_its_own_records(monkeypatch):
    """Records are filtered in batches; a run scipy cannot process (here: 20 samples, too short to
    filter even with --pad-short) is skipped record by record, its neighbours are stored."""
    from types import SimpleNamespace

    from ecgpos.ecg.spec import DEFAULT_SPEC
    from ecgpos.preprocessing import build
    from ecgpos.preprocessing.records import LoadedRecord, RecordPolicy, RecordRef

    lengths = {"a": 5000, "b": 20, "c": 5000, "d": 5000}
    source = SimpleNamespace(
        load_record=lambda src, ref: LoadedRecord(
            signal=ecg_like(lengths[ref.record_id], 500, 0),
            fs=500.0,
            leads=list(CANONICAL_LEADS),
            meta={"dx": ""},
        )
    )
    monkeypatch.setattr(
        build,
        "_state",
        {
            "source": source,
            "src": None,
            "spec": DEFAULT_SPEC,
            "policy": RecordPolicy(expected_fs=500.0, pad_short=True),
        },
    )
    out = build._process_batch([RecordRef(record_id=k, location=k) for k in lengths])
    assert [(r[0], r[1].record_id) for r in out] == [("ok", "a"), ("skip", "b"), ("ok", "c"), ("ok", "d")]
    assert out[1][2] == "too_short"
    assert all(r[2].shape == (12, 2500) and r[2].dtype == np.float16 for r in out if r[0] == "ok")


def test_short_constant_records_are_too_short_not_flat(tmp_path, capsys):
    """A 3-sample record (or any short record that is also constant or all zero) was skipped as flat or
    all_zero: the amplitude checks came before the length check."""
    folder = tmp_path / "WFDBRecords" / "01" / "010"
    write_record(folder, "JS00001", good_digital())
    write_record(folder, "JS00002", np.full((12, 3), 100, np.int16))  # 3 samples, constant
    write_record(folder, "JS00003", np.zeros((12, 3), np.int16))
    write_record(folder, "JS00004", np.full((12, 2500), 100, np.int16))  # 5 s, constant
    write_record(folder, "JS00005", np.full((12, 5000), 100, np.int16))  # long enough: flat it is
    rc, out, err = run(
        capsys, "ecg-arrhythmia", "--src", str(tmp_path), "--subset", "all", "--out", str(tmp_path / "o")
    )
    assert rc == 0 and "stored 1 + skipped 4 = found 5" in out, out + err
    reasons = {row["record_id"]: row["reason"] for row in read_csv(tmp_path / "o" / "skipped.csv")}
    assert reasons == {"JS00002": "too_short", "JS00003": "too_short", "JS00004": "too_short", "JS00005": "flat"}
