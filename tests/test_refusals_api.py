"""What the Python API of an exported encoder answers to a researcher's plausible mistakes.

Lists of leads of unequal length, (time, leads) arrays, records in uV or V, and export paths
written with `~`, as a file of the export or as None: each gets one clear line, never a traceback
or features of a misread record.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError, SignalError
from ecgpos.export.format import WEIGHTS_FILE
from ecgpos.export.load import load_encoder
from ecgpos.export.verify import verify

torch.set_num_threads(1)
LEADS = list(CANONICAL_LEADS)


def _reason(encoder, signal, leads=LEADS) -> SignalError:  # noqa: ANN001
    with pytest.raises(SignalError) as info:
        encoder.embed(signal, 500, leads)
    assert "\n" not in str(info.value)
    return info.value


def test_unequal_lead_lengths_and_transposed_arrays_are_shape_refusals(real_record, export):
    """A list of leads of unequal length was numpy's ValueError traceback."""
    encoder = load_encoder(export)
    x = read_wfdb_record(real_record).signal
    rows = x.tolist()
    rows[3] = rows[3][:-5]
    err = _reason(encoder, rows)
    assert err.reason == "shape" and "unequal lengths" in err.detail
    assert np.array_equal(encoder.embed(x.tolist(), 500, LEADS), encoder.embed(x, 500, LEADS))
    err = _reason(encoder, x.T.copy())  # (5000, 12): named, with the fix
    assert err.reason == "shape" and "signal.T" in err.detail


def test_records_not_in_mv_are_refused_with_the_likely_unit(real_record, export):
    """uV input was embedded silently: features of a uV record with a lead off differed from its mV
    features (the 10 uV dead-lead threshold was 1000x off); V input was called 'flat' without a hint."""
    encoder = load_encoder(export)
    x = read_wfdb_record(real_record).signal.astype(np.float64)
    x[7] = np.clip(0.002 * np.random.default_rng(0).standard_normal(x.shape[1]), -0.004, 0.004)  # V2 off
    reference = encoder.embed(x, 500, LEADS)  # mV, V2 zeroed as dead
    for scaled in (x * 1000, np.round(x * 1000).astype(np.int16)):  # uV as floats, uV integer counts
        err = _reason(encoder, scaled)
        assert err.reason == "units" and "uV" in err.detail
    err = _reason(encoder, x / 1000)
    assert err.reason == "flat" and "in V, multiply by 1000" in err.detail
    assert _reason(encoder, np.ones_like(x)).reason == "flat"  # constant leads: flat, no unit hint
    assert "in V" not in _reason(encoder, np.ones_like(x)).detail
    assert np.array_equal(encoder.embed(x, 500, LEADS), reference)


def test_export_paths_with_tilde_files_and_non_paths(export, tmp_path, monkeypatch):
    """`~/...` was 'not a folder' (Python does not expand it); a file of the export or None were a
    bare 'not a folder' and a TypeError traceback."""
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(export, tmp_path / "models" / "enc")
    encoder = load_encoder("~/models/enc")
    assert Path(encoder.source) == (tmp_path / "models" / "enc").resolve()
    assert load_encoder(Path("~/models/enc")).config == encoder.config
    passed, lines = verify(Path("~/models/enc"))
    assert passed, lines
    with pytest.raises(EcgposError, match=r"is a file of an export; pass its folder"):
        load_encoder(tmp_path / "models" / "enc" / WEIGHTS_FILE)
    for bad in (None, b"/tmp"):
        with pytest.raises(EcgposError, match="export folder is a str or Path"):
            load_encoder(bad)


def test_a_checkpoint_given_as_an_export_names_its_run(tiny_run):
    """A run's checkpoint folder, or its model.safetensors, was a bare 'not an export folder'."""
    checkpoint = sorted((tiny_run / "checkpoints").iterdir())[-1]
    for path in (tiny_run, checkpoint, checkpoint / WEIGHTS_FILE):
        with pytest.raises(EcgposError, match=rf"export the run first with `ecgpos export --run-dir {tiny_run} "):
            load_encoder(path)


def test_cli_paths_given_after_an_equals_sign_expand_tilde(real_record, export, tmp_path, monkeypatch):
    """The shell leaves `--out=~/x` as written; every path option expands it like the shell would."""
    from ecgpos.cli import main

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(export, tmp_path / "enc")
    assert main(["embed", "--encoder=~/enc", f"--input={real_record}.hea", "--out=~/features.csv"]) == 0
    assert (tmp_path / "features.csv").read_text().count("\n") == 2  # header + the record
    assert not (Path("~") / "features.csv").exists()


def test_short_constant_records_are_too_short_for_embed_and_the_api(export, tmp_path, capsys):
    """A 3-sample constant record was refused as flat (and an all-zero one as all_zero) by
    `encoder.embed` and skipped so by `ecgpos embed`, though its length is what is wrong."""
    from refusal_helpers import run

    encoder = load_encoder(export)
    for signal in (np.ones((12, 3)), np.zeros((12, 3)), np.ones((12, 2000))):
        err = _reason(encoder, signal)
        assert err.reason == "too_short", err
    np.save(tmp_path / "short.npy", np.stack([np.ones((12, 3)), np.zeros((12, 3))]))
    args = ["embed", "--encoder", export, "--input", tmp_path / "short.npy", "--out", tmp_path / "f.npy"]
    rc, _, err = run(capsys, *args, "--fs", "500", "--leads", ",".join(LEADS), "--no-progress")
    assert "skipped 0: too_short" in err and "skipped 1: too_short" in err, err
