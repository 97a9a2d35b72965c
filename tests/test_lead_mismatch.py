"""Limb leads that break Einthoven's and Goldberger's relations (swapped, inverted or misnamed leads)
are refused as `lead_mismatch` by the one screening step, in preprocess, embed and score alike."""

from __future__ import annotations

import csv
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import copy_record, read_rows, run

from ecgpos.ecg.leads import CANONICAL_LEADS, to_canonical_order
from ecgpos.ecg.limbs import LEAD_MISMATCH_MAX, derived_limb_leads, limb_residuals
from ecgpos.ecg.screening import ScreenPolicy, screen_record
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import SignalError
from ecgpos.probes.shared.datasets import read_cpsc_original

ARRHYTHMIA = Path("ecg-arrhythmia") / "WFDBRecords" / "01" / "010"


@cache
def real_records(root: Path) -> tuple[tuple[str, np.ndarray, float], ...]:
    """Every real sample record (PTB-XL, ecg-arrhythmia, CPSC2018 in all three forms) in canonical order."""
    raws = [read_wfdb_record(h.with_suffix("")) for h in sorted(root.rglob("*.hea"))]
    raws += [read_cpsc_original(m) for m in sorted((root / "cpsc2018" / "original").rglob("A*.mat"))]
    return tuple((r.record_id, to_canonical_order(r.signal, r.leads), r.fs) for r in raws)


def corrupted(x: np.ndarray) -> dict[str, np.ndarray]:
    """Copies of a canonical-order record with limb leads misnamed as real files get them wrong."""
    out = {}
    for name, rows in (("I<->II", [1, 0]), ("aVL<->aVF", [5, 4]), ("III<->aVR", [3, 2])):
        y = x.copy()
        y[sorted(rows)] = x[rows]
        out[name] = y
    for lead in ("I", "aVR"):
        y = x.copy()
        y[CANONICAL_LEADS.index(lead)] *= -1
        out[f"-{lead}"] = y
    return out


def swap_names(text: str, a: str, b: str) -> str:
    """A WFDB header whose signal lines name lead `a` as `b` and `b` as `a` (the data stay put)."""
    lines = text.split("\n")
    for k, line in enumerate(lines):
        head, _, name = line.rstrip("\r").rpartition(" ")
        if head and not line.startswith("#") and name in (a, b):
            lines[k] = f"{head} {b if name == a else a}" + ("\r" if line.endswith("\r") else "")
    return "\n".join(lines)


def test_every_real_record_obeys_the_relations_with_a_wide_margin(shared_data):
    records = real_records(shared_data)
    assert len(records) == 624
    worst = max(max(limb_residuals(x).values()) for _, x, _ in records)
    assert worst < LEAD_MISMATCH_MAX / 3, worst
    for _, x, fs in records:  # and none is refused for it
        screen_record(x, fs, CANONICAL_LEADS, DEFAULT_SPEC, ScreenPolicy(pad_short=True))


def test_every_corrupted_copy_breaks_them_by_far(shared_data):
    least = {}
    for _, x, _ in real_records(shared_data):
        for name, y in corrupted(x[:6]).items():
            least[name] = min(least.get(name, np.inf), max(limb_residuals(y).values()))
    assert min(least.values()) > 2.5 * LEAD_MISMATCH_MAX, least


def test_screening_names_the_broken_relation_and_passes_what_it_cannot_check(shared_data):
    raw = read_wfdb_record(shared_data / ARRHYTHMIA / "JS00001")
    x = to_canonical_order(raw.signal, raw.leads)
    swapped = [CANONICAL_LEADS[1], CANONICAL_LEADS[0], *CANONICAL_LEADS[2:]]
    with pytest.raises(SignalError) as err:
        screen_record(x, raw.fs, swapped, DEFAULT_SPEC)
    assert err.value.reason == "lead_mismatch"
    assert "limb leads break II = I + III: residual" in err.value.detail and "\n" not in err.value.detail
    kept = screen_record(x, raw.fs, swapped, DEFAULT_SPEC, ScreenPolicy(check_limb_leads=False))
    assert np.array_equal(kept.signal[0], x[1])
    dead_iii = x.copy()
    dead_iii[2] = 0.0  # a dead limb lead leaves nothing to check the others against
    screen_record(dead_iii, raw.fs, swapped, DEFAULT_SPEC)


def test_derived_limb_leads_obey_the_relations():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3000))
    assert max(limb_residuals(x).values()) > 1
    x[2:6] = derived_limb_leads(x[0], x[1])
    assert max(limb_residuals(x).values()) < 1e-12


@pytest.fixture(scope="module")
def swapped_tree(shared_data, tmp_path_factory) -> Path:
    """A real ecg-arrhythmia record, and a copy whose header names lead I as II and II as I."""
    root = tmp_path_factory.mktemp("swapped")
    folder = root / "WFDBRecords" / "01" / "010"
    copy_record(shared_data / ARRHYTHMIA / "JS00001", folder, "JS00001")
    copy_record(shared_data / ARRHYTHMIA / "JS00002", folder, "JS00002", lambda t: swap_names(t, "I", "II"))
    return root


def test_preprocess_skips_a_swapped_record_and_keeps_it_on_request(swapped_tree, tmp_path, capsys):
    args = ["preprocess", "ecg-arrhythmia", "--src", swapped_tree, "--subset", "all"]
    rc, out, err = run(capsys, *args, "--out", tmp_path / "a")
    assert rc == 0 and "stored 1 + skipped 1 = found 2" in out, err
    [row] = read_rows(tmp_path / "a" / "skipped.csv")
    assert (row["record_id"], row["reason"]) == ("JS00002", "lead_mismatch")
    assert row["detail"].startswith("limb leads break II = I + III: residual")
    rc, out, err = run(capsys, *args, "--keep-lead-mismatch", "--out", tmp_path / "b")
    assert rc == 0 and "stored 2 + skipped 0 = found 2" in out, err


def _skipped(out: Path) -> list[tuple[str, str]]:
    with out.with_name(f"{out.stem}.skipped.csv").open(newline="") as handle:
        return [(row["record_id"], row["reason"]) for row in csv.DictReader(handle)]


def test_embed_skips_a_swapped_record(swapped_tree, export, tmp_path, capsys):
    folder = swapped_tree / "WFDBRecords"
    out = tmp_path / "f.csv"
    rc, stdout, err = run(capsys, "embed", "--encoder", export, "--input", folder, "--out", out, "--no-progress")
    assert rc == 0 and "embedded 1 of 2 WFDB records" in stdout and "lead_mismatch" in err, err
    assert _skipped(out) == [("01/010/JS00002", "lead_mismatch")]
    keep = ("--keep-lead-mismatch", "--no-progress")
    rc, stdout, err = run(capsys, "embed", "--encoder", export, "--input", folder, "--out", out, *keep)
    assert rc == 0 and "embedded 2 of 2" in stdout, err


def test_score_skips_a_swapped_record(swapped_tree, level0_run, tmp_path, capsys):
    folder = swapped_tree / "WFDBRecords"
    out = tmp_path / "s.csv"
    args = ("score", "--run", level0_run, "--input", folder, "--masks", 1, "--no-progress")
    rc, stdout, err = run(capsys, *args, "--out", out)
    assert rc == 0 and "lead_mismatch" in err, err
    assert _skipped(out) == [("01/010/JS00002", "lead_mismatch")]
    with out.open(newline="") as handle:
        assert [row["record_id"] for row in csv.DictReader(handle)] == ["01/010/JS00001"]
    rc, stdout, err = run(capsys, *args, "--out", out, "--keep-lead-mismatch")
    assert rc == 0 and _skipped(out) == [], err
    with out.open(newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 2


def test_probes_keep_a_swapped_record_and_say_so(swapped_tree, export, tmp_path):
    """The probes evaluate the published splits whole: a record whose limb leads break the relations
    is embedded all the same, with the same features as with the check off, and the log names it."""
    from ecgpos.export.load import load_encoder
    from ecgpos.probes.linear.features import encoder_source, extract_features
    from ecgpos.probes.shared.datasets import RecordLocator

    folder = swapped_tree / "WFDBRecords" / "01" / "010"
    enc = load_encoder(export)
    logged: list[str] = []
    feats, stats = extract_features(
        encoder_source(enc, enc.spec, "enc"),
        "custom:x",
        ["JS00001", "JS00002"],
        RecordLocator("custom", folder, folder),
        tmp_path / "cache",
        1,
        log=logged.append,
    )
    assert sorted(feats) == ["JS00001", "JS00002"] and not stats.failed
    assert stats.mismatched == ["JS00002"]
    assert [line for line in logged if "Einthoven" in line] == [
        "  1 record (JS00002) kept, though their limb leads break Einthoven's relations (lead_mismatch)"
    ]
