"""Probe data on the real sample records: PTB-XL split rows, CPSC2018 in its three published forms."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.io
from shard_fixtures import write_mv_record

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.signal import preprocess_signal
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.probes.shared.datasets import RecordLocator, index_cpsc, prepared_record, read_record
from ecgpos.probes.shared.tasks import SPLITS, read_split, resolve_task

# CPSC2018 label vocabularies -> MERL's ICBEB class columns
ABBREV = {
    "Normal": "NORM",
    "AF": "AFIB",
    "I-AVB": "1AVB",
    "LBBB": "CLBBB",
    "RBBB": "CRBBB",
    "PAC": "PAC",
    "PVC": "VPC",
    "STD": "STD",
    "STE": "STE",
}
REFERENCE_CODE = {1: "NORM", 2: "AFIB", 3: "1AVB", 4: "CLBBB", 5: "CRBBB", 6: "PAC", 7: "VPC", 8: "STD", 9: "STE"}


def _icbeb_rows(shared_data: Path) -> pd.DataFrame:
    task = resolve_task("cpsc2018")
    frames = [pd.read_csv(shared_data / "merl_splits" / task.files[s]) for s in SPLITS]
    return pd.concat(frames).set_index("filename")


@pytest.mark.parametrize("records,column", [("records500", "filename_hr"), ("records100", "filename_lr")])
def test_ptbxl_super_rows_present_under_sample_data(shared_data, records, column):
    task = resolve_task("ptbxl-super")
    locator = RecordLocator("ptbxl", shared_data)
    keys = [k for s in SPLITS for k in read_split(task, shared_data / "merl_splits", s, column).records]
    present = [k for k in keys if locator.locate(k) is not None]
    assert len(present) == 186
    assert len({p.split("/")[-1][:5] for p in present}) == 186
    assert all(k.startswith(records) for k in present)
    fs = 500.0 if records == "records500" else 100.0
    for key in present[::37]:  # a spread of records, read and preprocessed as probes do
        raw = read_record(*locator.locate(key))
        assert raw.signal.shape == (12, int(10 * fs)) and raw.fs == fs
        x = prepared_record(*locator.locate(key), DEFAULT_SPEC)
        assert x.shape == (12, 2500) and np.isfinite(x).all()
        assert np.array_equal(x, preprocess_signal(raw.signal, raw.fs, raw.leads, DEFAULT_SPEC))


def test_cpsc_all_samples_load_in_all_three_forms(shared_data):
    index = index_cpsc(shared_data / "cpsc2018")
    forms = {form for entry in index.values() for form in entry}
    assert forms == {"original", "cinc2020", "cinc-snomed"}
    counts = {f: sum(f in e for e in index.values()) for f in forms}
    on_disk = {
        f: len(list((shared_data / "cpsc2018" / d).rglob("A*.mat")))
        for f, d in (
            ("original", "original"),
            ("cinc2020", "cinc2020_wfdb_feb2020"),
            ("cinc-snomed", "cinc2021_wfdb_snomed"),
        )
    }
    assert counts == on_disk
    rows = _icbeb_rows(shared_data)
    reference = pd.read_csv(shared_data / "cpsc2018" / "original" / "REFERENCE.csv").set_index("Recording")
    locator = RecordLocator("cpsc2018", shared_data)
    for record_id, entry in index.items():
        for form, path in entry.items():
            raw = read_record(path, form)
            assert raw.fs == 500.0 and raw.signal.shape[0] == 12 and raw.signal.shape[1] >= 3000
            assert [n.upper() for n in raw.leads] == [n.upper() for n in CANONICAL_LEADS]
            assert np.isfinite(raw.signal).all() and 0.05 < np.abs(raw.signal).max() < 30  # mV, not uV or adu
        assert locator.locate(record_id) is not None
        # the record found by its A-number carries the labels the split gives that A-number
        positives = {c for c in REFERENCE_CODE.values() if rows.loc[record_id, c] == 1}
        codes = reference.loc[record_id].dropna().astype(int)
        assert {REFERENCE_CODE[c] for c in codes} == positives
        if "cinc2020" in entry:
            dx = read_wfdb_record(entry["cinc2020"]).header_fields()["Dx"].split(",")
            assert {ABBREV[d.strip()] for d in dx} == positives


def test_cpsc_forms_agree_for_a_record_held_twice(shared_data, tmp_path):
    # no sample record exists in two forms, so write the original-challenge form of WFDB records
    # the way the challenge stored it (struct ECG, float64 mV) beside the WFDB copies
    root = tmp_path / "cpsc2018"
    shutil.copytree(shared_data / "cpsc2018" / "cinc2020_wfdb_feb2020", root / "wfdb")
    shutil.copytree(shared_data / "cpsc2018" / "cinc2021_wfdb_snomed", root / "snomed")
    (root / "TrainingSet1").mkdir()
    for name in ("A0001", "A0689"):
        src = root / ("wfdb" if name == "A0001" else "snomed") / name
        raw = read_wfdb_record(src)
        ecg = {"sex": "Male", "age": 74.0, "data": raw.signal.astype(np.float64)}
        scipy.io.savemat(root / "TrainingSet1" / f"{name}.mat", {"ECG": ecg})
    index = index_cpsc(root)
    assert set(index["A0001"]) == {"original", "cinc2020"}
    assert set(index["A0689"]) == {"original", "cinc-snomed"}
    for name in ("A0001", "A0689"):
        arrays = {form: read_record(path, form).signal for form, path in index[name].items()}
        first, second = arrays.values()
        np.testing.assert_allclose(first, second, atol=1e-6)
        assert RecordLocator("cpsc2018", tmp_path).locate(name)[1] == "original"


def test_a_copy_held_in_several_folders_resolves_to_the_first_in_sorted_order(tmp_path):
    root = tmp_path / "cpsc2018"
    ecg = {"sex": "Male", "age": 74.0, "data": np.zeros((12, 5000))}
    for folder in ("k", "c", "x", "a", "q", "f", "m", "t", "b", "h"):  # creation order is not sorted order
        (root / folder).mkdir(parents=True)
        scipy.io.savemat(root / folder / "A0001.mat", {"ECG": ecg})
    assert index_cpsc(root)["A0001"]["original"] == root / "a" / "A0001"


def test_truncated_original_mat_is_a_signal_error(tmp_path):
    from ecgpos.errors import SignalError

    bad = tmp_path / "A0001.mat"
    bad.write_bytes(b"MATLAB 5.0 MAT-file, truncated")
    with pytest.raises(SignalError, match="A0001"):
        read_record(tmp_path / "A0001", "original")


def test_one_percent_subsets_lack_the_classes_merl_documents(shared_data):
    # MERL's 1% subsets (train_test_split, random_state=42) leave these classes without a positive
    from ecgpos.probes.shared.task_data import label_fraction_rows

    expected = {
        "ptbxl-super": set(),
        "ptbxl-sub": {"PMI"},
        "ptbxl-form": {"HVOLT", "TAB", "PRC(S)", "STE"},
        "ptbxl-rhythm": {"TRIGU", "SVTAC", "PSVT", "AFLT"},
        "cpsc2018": {"STE"},
    }
    for name, classes in expected.items():
        task = resolve_task(name)
        labels = read_split(task, shared_data / "merl_splits", "train").labels
        subset = labels[label_fraction_rows(len(labels), 0.01)]
        assert {c for c, k in zip(task.classes, subset.sum(axis=0)) if k == 0} == classes, name


def test_geometry_and_leakage_screen_records_like_preprocessing(shared_data, tmp_path):
    """A record preprocessing refuses (three dead leads) is neither fingerprinted nor measured."""
    from ecgpos.errors import SignalError
    from ecgpos.probes.shared.leakage import probe_fingerprints

    raw = read_record(*RecordLocator("ptbxl", shared_data).locate(_first_ptbxl(shared_data)))
    for name, signal in (("good", raw.signal), ("dead", np.where(np.arange(12)[:, None] < 3, 0.0, raw.signal))):
        write_mv_record(tmp_path, name, signal, raw.fs, raw.leads)
    locator = RecordLocator("custom", tmp_path, tmp_path)
    dead = read_record(*locator.locate("dead"))
    assert preprocess_signal(dead.signal, dead.fs, dead.leads, DEFAULT_SPEC).shape == (12, 2500)  # unscreened
    with pytest.raises(SignalError) as info:
        prepared_record(*locator.locate("dead"), DEFAULT_SPEC)
    assert info.value.reason == "dead_leads"
    prints = probe_fingerprints(["good", "dead"], locator, DEFAULT_SPEC, tmp_path / "cache", "custom:x")
    assert list(prints) == ["good"]


def _first_ptbxl(shared_data: Path) -> str:
    task = resolve_task("ptbxl-super")
    locator = RecordLocator("ptbxl", shared_data)
    keys = read_split(task, shared_data / "merl_splits", "test", "filename_hr").records
    return next(k for k in keys if locator.locate(k) is not None)
