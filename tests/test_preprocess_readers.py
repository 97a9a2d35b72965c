"""Readers on real records (ecg-arrhythmia, PTB-XL) and on CODE-15 files built in the documented layout."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import wfdb
from code15_fixtures import FS, ecg_like, exam_row, padded_trace, write_exams_csv, write_part

from ecgpos.ecg.leads import CANONICAL_LEADS, to_canonical_order
from ecgpos.ecg.wfdb_fast import read_fast
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.preprocessing import code15, ecg_arrhythmia


def header_gains(path: Path) -> list[float]:
    """adc gains straight from the header text (e.g. '16+24 1000/mV' or '16 1000.0(0)/mV')."""
    lines = [l for l in path.read_text().splitlines() if l.strip() and not l.startswith("#")][1:]
    return [float(re.match(r"([\d.]+)", l.split()[2]).group(1)) for l in lines]


def test_arrhythmia_walk_and_subsets(shared_data):
    src = shared_data / "ecg-arrhythmia"
    refs, notes = ecg_arrhythmia.find_records(src, "all")
    ids = [r.record_id for r in refs]
    assert len(ids) == 200 and ids == sorted(ids) and len(set(ids)) == 200
    assert ids[0] == "JS00001" and "JS01053" in ids and "JS00003" not in ids  # gaps in the id range
    assert {r.location.split("/")[1] for r in refs} == {"01", "02"}  # found by walking WFDBRecords/NN/NNN
    assert all(r.problem is None for r in refs)
    assert len(ecg_arrhythmia.find_records(src, "chapman")[0]) == 200  # the samples are all Chapman ids
    ningbo, notes = ecg_arrhythmia.find_records(src, "ningbo")
    assert ningbo == [] and notes["outside_subset"] == 200


def test_arrhythmia_names_with_a_line_break_or_other_digits_are_not_records(shared_data, tmp_path):
    """A file named "JS00001\n.hea" would be a second record id that no index line could hold;
    it is counted as not an ecg-arrhythmia record, as any other foreign .hea/.mat file is."""
    record = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"
    folder = tmp_path / "WFDBRecords" / "01" / "010"
    folder.mkdir(parents=True)
    for stem in ("JS00001", "JS00002\n", "JS0000\u0663"):  # \u0663: ARABIC-INDIC DIGIT THREE
        for ext in (".hea", ".mat"):
            (folder / f"{stem}{ext}").symlink_to(record.with_suffix(ext))
    refs, notes = ecg_arrhythmia.find_records(tmp_path, "all")
    assert [r.record_id for r in refs] == ["JS00001"] and notes["not_a_record"] == 2


def test_arrhythmia_values_are_mv_from_digital_samples_and_gains(shared_data):
    src = shared_data / "ecg-arrhythmia"
    refs, _ = ecg_arrhythmia.find_records(src, "all")
    for ref in refs[::40]:
        record = ecg_arrhythmia.load_record(src, ref)
        base = src / ref.location
        digital = scipy.io.loadmat(base.with_suffix(".mat"))["val"]  # (12, 5000) int16, independent reader
        gains = np.array(header_gains(base.with_suffix(".hea")))
        assert record.fs == 500 and record.leads == list(CANONICAL_LEADS)
        assert record.signal.shape == (12, 5000) and record.signal.dtype == np.float32
        np.testing.assert_array_equal(record.signal, (digital / gains[:, None]).astype(np.float32))
        assert record.meta["age"].isdigit() and record.meta["sex"] in ("M", "F")
        assert record.meta["dx"] and all(code.isdigit() for code in record.meta["dx"].split(","))


def test_fast_reader_equals_wfdb_rdrecord(shared_data):
    paths = (
        sorted((shared_data / "ecg-arrhythmia").rglob("*.hea"))
        + sorted((shared_data / "ptbxl" / "records500").rglob("*.hea"))[:10]
        + sorted((shared_data / "ptbxl" / "records100").rglob("*.hea"))[:10]
    )
    for path in paths:
        base = path.with_suffix("")
        fast = read_fast(base)
        rec = wfdb.rdrecord(str(base))
        assert fast is not None, base
        np.testing.assert_array_equal(fast.signal, rec.p_signal.T.astype(np.float32))
        assert fast.leads == rec.sig_name and fast.fs == rec.fs and fast.comments == rec.comments


def test_ptbxl_reader_upper_case_leads(shared_data):
    for sub, name, fs in (("records500", "00001_hr", 500), ("records100", "00001_lr", 100)):
        base = shared_data / "ptbxl" / sub / "00000" / name
        raw = read_wfdb_record(base)
        assert raw.fs == fs and raw.signal.shape == (12, 10 * fs)
        assert raw.leads[3:6] == ["AVR", "AVL", "AVF"]  # upper case as written
        digital = np.fromfile(base.with_suffix(".dat"), dtype="<i2").reshape(-1, 12).T
        gains = np.array(header_gains(base.with_suffix(".hea")))
        np.testing.assert_allclose(raw.signal, digital / gains[:, None], rtol=1e-6, atol=1e-7)
        canonical = to_canonical_order(raw.signal, raw.leads)
        np.testing.assert_array_equal(canonical, raw.signal)  # PTB-XL's order is the canonical one


def test_code15_true_extent():
    for n in (2800, 4000, 4096, 2801):
        x = ecg_like(n, FS, n)
        trace = padded_trace(x)
        start, stop = code15.true_extent(trace)
        assert stop - start == n
        np.testing.assert_array_equal(trace[start:stop].T, x)
    x = ecg_like(2800, FS, 1)
    x[:, :5] = 0  # a recorded edge that happens to be zero on every lead
    start, stop = code15.true_extent(padded_trace(x))
    assert (start, stop) == (648, 648 + 2800)
    assert code15.true_extent(np.zeros((4096, 12), np.float32)) == (0, 0)


def test_code15_reader_on_built_files(tmp_path):
    short, full = ecg_like(2800, FS, 1), ecg_like(4000, FS, 2)
    write_part(tmp_path, 0, [11, 12], [padded_trace(short), padded_trace(full)])
    write_part(tmp_path, 1, [21], [padded_trace(ecg_like(4096, FS, 3))])
    write_exams_csv(
        tmp_path,
        [
            exam_row(11, 0, age=71, is_male=False, RBBB=True),
            exam_row(12, 0, AF=True),
            exam_row(21, 1, SB=True),
            exam_row(99, 5),
        ],
    )  # part 5 not downloaded
    refs, notes = code15.find_records(tmp_path)
    assert [(r.record_id, r.location, r.row) for r in refs] == [
        ("11", "exams_part0.hdf5", 0),
        ("12", "exams_part0.hdf5", 1),
        ("21", "exams_part1.hdf5", 0),
    ]
    assert notes == {"padding_rows": 2}  # the exam_id 0 rows are not exams
    first = code15.load_record(tmp_path, refs[0])
    assert first.fs == 400 and first.leads[:3] == ["DI", "DII", "DIII"]
    np.testing.assert_array_equal(to_canonical_order(first.signal, first.leads), short)
    assert first.meta["age"] == "71" and first.meta["sex"] == "F" and first.meta["patient_id"] == "18"
    assert first.meta["RBBB"] == "1" and first.meta["AF"] == "0" and first.meta["normal_ecg"] == "1"
    assert code15.load_record(tmp_path, refs[1]).signal.shape == (12, 4000)
    assert code15.load_record(tmp_path, refs[2]).signal.shape == (12, 4096)


def test_damaged_dat_files_get_specific_reasons(shared_data, tmp_path):
    import shutil

    from ecgpos.errors import SignalError

    source = shared_data / "ptbxl" / "records500" / "00000" / "00001_hr"
    cases = {
        "truncated_signal": lambda b: b[:-100],
        "header_mismatch": lambda b: b + b"\0\0" * 24,
        "corrupt_signal": lambda b: b[:2000] + bytes(40) + b[2040:],
    }
    for reason, damage in cases.items():
        folder = tmp_path / reason
        folder.mkdir()
        shutil.copyfile(source.with_suffix(".hea"), folder / "00001_hr.hea")
        (folder / "00001_hr.dat").write_bytes(damage(source.with_suffix(".dat").read_bytes()))
        with pytest.raises(SignalError) as err:
            read_fast(folder / "00001_hr")
        assert err.value.reason == reason


def test_read_wfdb_reads_as_read_wfdb_record_through_the_fast_path_where_it_can(shared_data, tmp_path):
    """What probes, geometry and score read records with: read_wfdb_record's record, field for field."""
    import dataclasses

    from ecgpos.ecg.wfdb_fast import read_wfdb

    paths = sorted((shared_data / "ptbxl" / "records500").rglob("*.hea"))[:5]
    paths += sorted((shared_data / "ecg-arrhythmia").rglob("*.hea"))[:5]
    for path in paths:
        got, want = read_wfdb(path.with_suffix("")), read_wfdb_record(path.with_suffix(""))
        for field in dataclasses.fields(want):
            a, b = getattr(got, field.name), getattr(want, field.name)
            assert np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b, (path, field.name)
    # outside the fast path (microvolts): read_wfdb_record's reading, in mV
    x = np.random.default_rng(0).standard_normal((1000, 3)) * 500
    wfdb.wrsamp("uv", fs=500, units=["uV"] * 3, sig_name=["I", "II", "V1"], p_signal=x, fmt=["16"] * 3,
                adc_gain=[1.0] * 3, baseline=[0] * 3, write_dir=str(tmp_path))  # fmt: skip
    assert read_fast(tmp_path / "uv") is None
    np.testing.assert_array_equal(read_wfdb(tmp_path / "uv").signal, read_wfdb_record(tmp_path / "uv").signal)
    with pytest.raises(SignalError) as err:  # no header: read_wfdb_record's answer
        read_wfdb(tmp_path / "absent")
    assert err.value.reason == "unreadable" and "no header file" in err.value.detail
    lines = (tmp_path / "uv.hea").read_text().replace("uV", "mV").splitlines()
    lines[1] = lines[1].rsplit(" ", 4)[0] + " - 0 0 I"  # lead I's initial value is no number
    (tmp_path / "uv.hea").write_text("\n".join(lines) + "\n")
    with pytest.raises(SignalError) as err:  # a field the fast grammar cannot convert: read_wfdb_record's answer
        read_wfdb(tmp_path / "uv")
    assert err.value.reason == "unreadable"
