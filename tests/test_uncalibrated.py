"""Uncalibrated WFDB leads (header gain 0 or none): both readers read them at 200 adu/mV and name
them, and screening judges them on no made-up millivolts, in preprocess, embed and score alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import wfdb
from refusal_helpers import copy_record, read_rows, run

from ecgpos.ecg.leads import CANONICAL_LEADS, to_canonical_order
from ecgpos.ecg.screening import screen_record
from ecgpos.ecg.spec import DEFAULT_SPEC, PreprocessSpec
from ecgpos.ecg.wfdb_fast import read_fast
from ecgpos.ecg.wfdb_io import header_gain, read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.inference.inputs import wfdb_source

ARRHYTHMIA = Path("ecg-arrhythmia") / "WFDBRecords" / "01" / "010"
PER_RECORD = PreprocessSpec(standardise="record")


def zero_gains(*leads: str):
    """A header edit setting the ADC gain of the named leads to 0 (`1000/mV` -> `0/mV`)."""

    def edit(text: str) -> str:
        lines = text.split("\n")
        for k, line in enumerate(lines[1:], 1):
            fields = line.split(" ")
            if not line.startswith("#") and len(fields) > 2 and fields[-1].rstrip("\r") in leads:
                fields[2] = "0" + fields[2][len(fields[2].split("/")[0].split("(")[0]) :]
                lines[k] = " ".join(fields)
        return "\n".join(lines)

    return edit


@pytest.fixture(scope="module")
def tree(shared_data, tmp_path_factory) -> Path:
    """Real ecg-arrhythmia records: JS00001 as published, JS00002 with V1 and V2 uncalibrated,
    JS00004 with lead I uncalibrated."""
    root = tmp_path_factory.mktemp("gain0")
    folder = root / "WFDBRecords" / "01" / "010"
    copy_record(shared_data / ARRHYTHMIA / "JS00001", folder, "JS00001")
    copy_record(shared_data / ARRHYTHMIA / "JS00002", folder, "JS00002", zero_gains("V1", "V2"))
    copy_record(shared_data / ARRHYTHMIA / "JS00004", folder, "JS00004", zero_gains("I"))
    return root


@pytest.fixture(scope="module")
def fine_adc(shared_data, tmp_path_factory) -> Path:
    """A real record rewritten (format 32, outside the fast path) at 20000 adu/mV, every gain then set to 0."""
    real = wfdb.rdrecord(str(shared_data / ARRHYTHMIA / "JS00001"))
    folder = tmp_path_factory.mktemp("fine")
    wfdb.wrsamp(
        "fine", fs=real.fs, units=["mV"] * 12, sig_name=real.sig_name, p_signal=real.p_signal,
        fmt=["32"] * 12, adc_gain=[20000.0] * 12, baseline=[0] * 12, write_dir=str(folder),
    )  # fmt: skip
    header = folder / "fine.hea"
    header.write_text(header.read_text().replace("20000.0(0)/mV", "0(0)/mV"))
    return folder / "fine"


def test_both_readers_read_uncalibrated_leads_at_200_adu_per_mv_and_name_them(shared_data, tree, fine_adc):
    published = read_wfdb_record(shared_data / ARRHYTHMIA / "JS00004")
    base = tree / ARRHYTHMIA.relative_to("ecg-arrhythmia") / "JS00004"
    fast, slow = read_fast(base), read_wfdb_record(base)
    assert fast.uncalibrated == slow.uncalibrated == ("I",)
    np.testing.assert_array_equal(fast.signal, slow.signal)
    # the header's 1000 adu/mV replaced by WFDB's assumed 200: lead I comes out 5x, the others as published
    np.testing.assert_allclose(slow.signal[0], published.signal[0] * 5, rtol=1e-6)
    np.testing.assert_array_equal(slow.signal[1:], published.signal[1:])
    assert header_gain("") is header_gain("0") is header_gain("0.0") is None and header_gain("1000.0") == 1000
    fine = read_wfdb_record(fine_adc)
    assert read_fast(fine_adc) is None and fine.uncalibrated == tuple(fine.leads)
    assert read_fast(shared_data / ARRHYTHMIA / "JS00001").uncalibrated == published.uncalibrated == ()
    assert read_wfdb_record(shared_data / "ptbxl" / "records500" / "00000" / "00001_hr").uncalibrated == ()


def test_screening_judges_uncalibrated_leads_on_no_made_up_millivolts(tree, fine_adc):
    folder = tree / ARRHYTHMIA.relative_to("ecg-arrhythmia")
    mixed = read_wfdb_record(folder / "JS00002")
    with pytest.raises(SignalError) as err:  # one z-score over every lead would weigh V1, V2 by a made-up gain
        screen_record(mixed.signal, mixed.fs, mixed.leads, PER_RECORD, uncalibrated=mixed.uncalibrated)
    assert err.value.reason == "units" and err.value.detail.startswith("leads V1 V2 are uncalibrated")
    assert not screen_record(
        mixed.signal, mixed.fs, mixed.leads, DEFAULT_SPEC, uncalibrated=mixed.uncalibrated
    ).dead.any()
    # lead I 5x the others: the limb relations have no common scale to be checked on
    limb = read_wfdb_record(folder / "JS00004")
    screen_record(limb.signal, limb.fs, limb.leads, DEFAULT_SPEC, uncalibrated=limb.uncalibrated)
    # every lead uncalibrated: no units median on 100x made-up mV, and one shared scale cancels per record
    fine = read_wfdb_record(fine_adc)
    with pytest.raises(SignalError, match="^units: median lead peak-to-peak"):  # what its made-up mV would say
        screen_record(fine.signal, fine.fs, fine.leads, DEFAULT_SPEC)
    for spec in (DEFAULT_SPEC, PER_RECORD):
        screen_record(fine.signal, fine.fs, fine.leads, spec, uncalibrated=fine.uncalibrated)
    # an uncalibrated lead is dead when it spans at most one ADC step (0.005 made-up mV)
    x = to_canonical_order(mixed.signal, mixed.leads).copy()
    v1 = CANONICAL_LEADS.index("V1")
    for steps, dead in ((1, ["V1"]), (3, [])):
        x[v1] = 0.005 * (np.arange(x.shape[1]) % (steps + 1))
        ok = screen_record(x, mixed.fs, CANONICAL_LEADS, DEFAULT_SPEC, uncalibrated=("V1", "V2"))
        assert ok.dead_names == dead


def test_preprocess_skips_mixed_gains_only_when_standardising_per_record(tree, tmp_path, capsys):
    args = ["preprocess", "ecg-arrhythmia", "--src", tree, "--subset", "all"]
    rc, out, err = run(capsys, *args, "--out", tmp_path / "lead")
    assert rc == 0 and "stored 3 + skipped 0 = found 3" in out, err
    rc, out, err = run(capsys, *args, "--standardise", "record", "--out", tmp_path / "record")
    assert rc == 0 and "stored 1 + skipped 2 = found 3" in out, err
    rows = {row["record_id"]: row for row in read_rows(tmp_path / "record" / "skipped.csv")}
    assert {rid: row["reason"] for rid, row in rows.items()} == {"JS00002": "units", "JS00004": "units"}
    assert rows["JS00002"]["detail"].startswith("leads V1 V2 are uncalibrated (header gain 0 or none)")


def test_embed_and_score_inputs_screen_uncalibrated_leads_alike(tree):
    """`embed` and `score` read WFDB folders through `wfdb_source`, so they skip what preprocess skips."""
    folder = tree / "WFDBRecords"
    for spec, refused in ((DEFAULT_SPEC, set()), (PER_RECORD, {"01/010/JS00002", "01/010/JS00004"})):
        seen = set()
        for record_id, load in wfdb_source(folder, spec).records:
            try:
                load()
            except SignalError as err:
                assert err.reason == "units", err
                seen.add(record_id)
        assert seen == refused
