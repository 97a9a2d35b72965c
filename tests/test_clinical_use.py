"""An exported encoder used as a clinical researcher has records: WFDB folders assembled from links,
one recording at other rates, lead orders and units, `.npy` arrays, and an export folder that lost
a file on its way. Each gives the canonical record's features, or one clear line."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.signal as sps
import torch
from refusal_helpers import ROOT, one_line_error, run, unprivileged
from shard_fixtures import write_mv_record

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError, SignalError
from ecgpos.export.format import CARD_FILE, CONFIG_FILE
from ecgpos.export.load import load_encoder

torch.set_num_threads(1)
LEADS = ",".join(CANONICAL_LEADS)
PTBXL = Path("ptbxl") / "records500" / "00000"


def _features(path: Path) -> dict[str, np.ndarray]:
    with path.open(newline="") as handle:
        return {row[0]: np.array(row[1:], dtype=np.float64) for row in list(csv.reader(handle))[1:]}


def _ptbxl(shared_data: Path, number: int) -> tuple[np.ndarray, list[str]]:
    raw = read_wfdb_record(shared_data / PTBXL / f"{number:05d}_hr")
    return raw.signal.astype(np.float64), raw.leads


def test_one_recording_at_other_rates_lead_orders_and_units_gives_its_features(export, shared_data, tmp_path, capsys):
    """What a clinic's devices write for one ECG (1000 Hz, 257 Hz, leads in another order, samples
    stored in uV) is embedded as the canonical 500 Hz record, within resampling error; another
    patient's record stays far away, so the tolerance is no blanket."""
    x, leads = _ptbxl(shared_data, 10)
    folder = tmp_path / "clinic"
    folder.mkdir()
    write_mv_record(folder, "canonical", x, 500, leads)
    write_mv_record(folder, "fs1000", sps.resample_poly(x, 2, 1, axis=-1), 1000, leads)
    write_mv_record(folder, "fs257", sps.resample_poly(x, 257, 500, axis=-1), 257, leads)
    order = [6, 7, 8, 9, 10, 11, 3, 4, 5, 0, 1, 2]
    write_mv_record(folder, "reordered", x[order], 500, [leads[i] for i in order])
    other, _ = _ptbxl(shared_data, 1)
    write_mv_record(folder, "other_patient", other, 500, leads)
    import wfdb

    uv = dict(units=["uV"] * 12, fmt=["16"] * 12, adc_gain=[1.0] * 12, baseline=[0] * 12)
    wfdb.wrsamp("microvolts", fs=500, sig_name=leads, p_signal=(x * 1000).T, write_dir=str(folder), **uv)
    rc, out, err = run(capsys, "embed", "--encoder", export, "--input", folder, "--out", tmp_path / "f.csv")
    assert rc == 0 and "embedded 6 of 6" in out, err
    features = _features(tmp_path / "f.csv")
    reference = features["canonical"]
    api = load_encoder(export).embed(x, 500, leads)
    assert np.allclose(api, reference, atol=1e-6)  # the API reads the same record the same way

    def distance(name: str) -> float:
        return float(np.linalg.norm(features[name] - reference) / np.linalg.norm(reference))

    assert distance("reordered") < 1e-6 and distance("microvolts") < 1e-6
    assert distance("fs1000") < 0.03 and distance("fs257") < 0.03
    assert distance("other_patient") > 5 * max(distance("fs1000"), distance("fs257"))


def test_records_in_symlinked_folders_are_embedded(export, shared_data, tmp_path, capsys):
    """A folder assembled from links (`clinic/ward2 -> /data/ward2`) had the linked records left out
    without a word: `embedded 1 of 1`, as if the folder held nothing else."""
    x, leads = _ptbxl(shared_data, 10)
    ward2 = tmp_path / "elsewhere" / "ward2"
    ward2.mkdir(parents=True)
    write_mv_record(ward2, "good", x, 500, leads)
    write_mv_record(ward2, "short", x[:, :1000], 500, leads)  # skipped, and counted
    clinic = tmp_path / "clinic"
    clinic.mkdir()
    write_mv_record(clinic, "local", x, 500, leads)
    (clinic / "ward2").symlink_to(ward2)
    (clinic / "ward2" / "again").symlink_to("..")  # a loop: each real folder is read once
    rc, out, err = run(capsys, "embed", "--encoder", export, "--input", clinic, "--out", tmp_path / "f.csv")
    assert rc == 0 and "embedded 2 of 3" in out and "ward2/short: too_short" in err, (out, err)
    features = _features(tmp_path / "f.csv")
    assert sorted(features) == ["local", "ward2/good"]
    assert np.array_equal(features["local"], features["ward2/good"])


def test_a_folder_that_cannot_be_listed_or_searched_is_a_counted_skip(export, shared_data, tmp_path):
    """os.walk leaves out a folder it cannot list without a word: its records vanished from the count.
    A folder of mode 0444 lists, but none of its entries can be opened: its records were skipped one by
    one as unreadable, its subfolder as a folder of its own, and a folder it links to was lost."""
    x, leads = _ptbxl(shared_data, 10)
    clinic = tmp_path / "clinic"
    (clinic / "locked").mkdir(parents=True)
    write_mv_record(clinic, "local", x, 500, leads)
    write_mv_record(clinic / "locked", "hidden", x, 500, leads)
    (clinic / "shelf" / "sub").mkdir(parents=True)
    (tmp_path / "ward").mkdir()
    write_mv_record(clinic / "shelf", "listed", x, 500, leads)
    write_mv_record(clinic / "shelf" / "sub", "under", x, 500, leads)
    write_mv_record(tmp_path / "ward", "far", x, 500, leads)
    (clinic / "shelf" / "ward").symlink_to(tmp_path / "ward")
    (clinic / "locked").chmod(0)
    (clinic / "shelf").chmod(0o444)
    command = [sys.executable, "-m", "ecgpos", "embed", "--encoder", str(export), "--no-progress", "--input"]
    try:
        runs = [
            subprocess.run(
                [*unprivileged(), *command, str(src), "--out", str(tmp_path / out)],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                timeout=300,
            )
            for src, out in ((clinic, "f.csv"), (clinic / "locked", "g.csv"))
        ]
    finally:
        (clinic / "locked").chmod(0o755)
        (clinic / "shelf").chmod(0o755)
    assert runs[0].returncode == 0 and "embedded 1 of 3" in runs[0].stdout, runs[0].stdout + runs[0].stderr
    assert sorted(_features(tmp_path / "f.csv")) == ["local"]
    with (tmp_path / "f.skipped.csv").open(newline="") as handle:
        skipped = list(csv.DictReader(handle))
    assert [(r["record_id"], r["reason"], r["detail"]) for r in skipped] == [
        ("locked", "unreadable", "folder cannot be listed (Permission denied)"),
        ("shelf", "unreadable", "folder cannot be searched: its entries cannot be opened (Permission denied)"),
    ]
    assert runs[1].returncode == 2 and "Traceback" not in runs[1].stderr
    assert runs[1].stderr.strip().splitlines() == [
        f"ecgpos embed: error: {clinic / 'locked'} cannot be listed (Permission denied)"
    ]


def test_npy_rate_that_cannot_be_resampled_exactly_is_one_line_before_any_record(export, tmp_path, capsys):
    """--fs 499.9 (inside the supported range, no small rational factor to 250 Hz) skipped every row
    of the array one by one, though one rate serves them all."""
    np.save(tmp_path / "batch.npy", np.zeros((3, 12, 5000)))
    out = tmp_path / "f.csv"
    args = ["embed", "--encoder", export, "--input", tmp_path / "batch.npy", "--out", out]
    rc, _, err = run(capsys, *args, "--fs", "499.9", "--leads", LEADS, "--no-progress")
    one_line_error(rc, err, "embed", "--fs: no small rational factor from 499.9 Hz")
    assert not out.with_name("f.skipped.csv").exists()


def test_lead_names_as_an_array_are_refused_on_one_line(export, real_record):
    """A numpy array of lead names was refused with its repr, which spans two lines."""
    encoder = load_encoder(export)
    raw = read_wfdb_record(real_record)
    with pytest.raises(EcgposError) as info:
        encoder.embed(raw.signal, raw.fs, np.array(raw.leads))
    assert "\n" not in str(info.value) and "pass list(names)" in str(info.value)
    assert encoder.embed(raw.signal, raw.fs, list(np.array(raw.leads))).shape == (encoder.width,)


def test_tensors_numpy_cannot_read_are_a_dtype_refusal(export, real_record):
    """A bfloat16 tensor, or one on another device (a GPU; `meta` stands in for it on a CPU-only
    machine), was torch's TypeError traceback from inside numpy."""
    encoder = load_encoder(export)
    raw = read_wfdb_record(real_record)
    signal = torch.from_numpy(raw.signal)
    for tensor in (signal.to(torch.bfloat16), signal.to("meta")):
        with pytest.raises(SignalError) as info:
            encoder.embed(tensor, raw.fs, raw.leads)
        assert info.value.reason == "dtype" and "\n" not in str(info.value)
        assert "cannot be read as a numpy array" in info.value.detail
    assert np.array_equal(encoder.embed(signal, raw.fs, raw.leads), encoder.embed(raw.signal, raw.fs, raw.leads))


def test_verify_fails_an_export_that_lost_its_card_or_its_listed_onnx(export, tmp_path, capsys):
    """An export copied without its model card, or without the encoder.onnx its config.json lists,
    passed `ecgpos verify`."""
    no_card = tmp_path / "no-card"
    shutil.copytree(export, no_card)
    (no_card / CARD_FILE).unlink()
    rc, out, _ = run(capsys, "verify", no_card)
    assert rc == 1 and f"FAIL {CARD_FILE}: the model card is missing" in out, out
    assert load_encoder(no_card).width > 0  # the weights still load: the card is documentation
    no_onnx = tmp_path / "no-onnx"
    shutil.copytree(export, no_onnx)
    config = json.loads((no_onnx / CONFIG_FILE).read_text())
    config["onnx"] = {"file": "encoder.onnx", "opset": 18}  # as `export --onnx` records it (not hash-bound)
    (no_onnx / CONFIG_FILE).write_text(json.dumps(config))
    rc, out, _ = run(capsys, "verify", no_onnx)
    assert rc == 1 and "FAIL encoder.onnx: config.json lists it but" in out, out
    assert run(capsys, "verify", export)[0] == 0
