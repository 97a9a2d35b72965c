"""Export, load_encoder, ONNX, `ecgpos embed` and `ecgpos verify` on tiny real Stage-0/Stage-1 runs."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import wfdb
from tiny_runs import pretrain_tiny

from ecgpos.cli import main
from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.shards import read_shard_spec
from ecgpos.ecg.signal import preprocess_signal
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError, SignalError
from ecgpos.export.format import CONFIG_FILE, ONNX_FILE, WEIGHTS_FILE, state_sha256
from ecgpos.export.load import load_encoder
from ecgpos.export.vectors import make_inputs
from ecgpos.files import read_safetensors as read_weights
from ecgpos.resources import config_dir

CONFIG_DIR = config_dir()

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
PTBXL_LEADS = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]


def _tiny_run(request: pytest.FixtureRequest, name: str, build) -> Path:  # noqa: ANN001
    """The lead's session fixture when conftest has it, else a tiny run built here."""
    try:
        return Path(request.getfixturevalue(name))
    except pytest.FixtureLookupError:
        return build()


@pytest.fixture(scope="module")
def stage0_run(request, arrhythmia_shards: Path, tmp_path_factory) -> Path:  # noqa: ANN001
    def build() -> Path:
        run = tmp_path_factory.mktemp("export-stage0") / "run"
        pretrain_tiny(0, arrhythmia_shards, run, *FAST)
        return run

    return _tiny_run(request, "tiny_stage0_run", build)


@pytest.fixture(scope="module")
def stage1_run(request, stage0_run: Path, arrhythmia_shards: Path, tmp_path_factory) -> Path:  # noqa: ANN001
    def build() -> Path:
        run = tmp_path_factory.mktemp("export-stage1") / "run"
        pretrain_tiny(1, arrhythmia_shards, run, *FAST, stage0=stage0_run)
        return run

    return _tiny_run(request, "tiny_stage1_run", build)


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory) -> Path:
    """A probe-results folder as `ecgpos probe` writes it (results.csv only: the card must tabulate it)."""
    folder = tmp_path_factory.mktemp("probe-results")
    (folder / "results.csv").write_text("task,fraction,macro_auroc\nptbxl_super,0.01,0.6123\n")
    return folder


@pytest.fixture(scope="module")
def export0(stage0_run: Path, probe_dir: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "stage0"
    assert (
        main(["export", "--run-dir", str(stage0_run), "--out", str(out), "--onnx", "--probe-results", str(probe_dir)])
        == 0
    )
    return out


@pytest.fixture(scope="module")
def export1(stage1_run: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "stage1"
    assert main(["export", "--run-dir", str(stage1_run), "--out", str(out)]) == 0
    return out


def _fresh_process_features(export: Path, inputs: np.ndarray, tmp_path: Path) -> np.ndarray:
    """forward_features of `export` computed by a new Python process (nothing shared in memory)."""
    np.save(tmp_path / "x.npy", inputs)
    code = (
        "import sys, numpy as np, torch; torch.set_num_threads(1); import ecgpos\n"
        "enc = ecgpos.load_encoder(sys.argv[1]); assert not enc.training\n"
        "with torch.no_grad(): f = enc.forward_features(torch.from_numpy(np.load(sys.argv[2])))\n"
        "np.save(sys.argv[3], f.numpy())\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(export), str(tmp_path / "x.npy"), str(tmp_path / "f.npy")],
        check=True,
        timeout=120,
    )
    return np.load(tmp_path / "f.npy")


@pytest.mark.parametrize("which", ["stage0", "stage1"])
def test_export_reloads_in_fresh_process_with_checkpoint_features(which: str, request, tmp_path: Path) -> None:
    from ecgpos.inference.resolve import load_run_encoder

    run = request.getfixturevalue(f"{which}_run")
    export = request.getfixturevalue("export0" if which == "stage0" else "export1")
    config = json.loads((export / CONFIG_FILE).read_text())
    assert config["arch"]["kind"] == ("stage0" if which == "stage0" else "nested")
    assert config["weights_sha256"] == state_sha256(read_weights(export / WEIGHTS_FILE))
    loaded = load_run_encoder(run)
    assert config["preprocess"] == loaded.spec.to_dict()
    rng = np.random.default_rng(3)
    inputs = np.concatenate(
        [make_inputs(loaded.spec, 2), rng.standard_normal((2, 12, loaded.spec.window)).astype(np.float32)]
    )
    with torch.no_grad():
        want = loaded.module.float().cpu().forward_features(torch.from_numpy(inputs)).numpy()
    got = _fresh_process_features(export, inputs, tmp_path)
    assert got.shape == want.shape == (4, config["io"]["features"])
    assert np.abs(got - want).max() <= 1e-6
    assert np.abs(want[0] - want[1]).max() > 1e-3  # features depend on the input (not a constant map)
    exported = load_encoder(export)
    with torch.no_grad():
        tokens = exported.forward_tokens(torch.from_numpy(inputs[:2]))
        assert torch.equal(tokens, loaded.module.forward_tokens(torch.from_numpy(inputs[:2])))
    assert tokens.shape == (2, *config["io"]["tokens"]) and tokens.shape[1] % 12 == 0


def test_onnx_matches_pytorch_at_batch_1_and_7(export0: Path) -> None:
    import onnx

    from ecgpos.export.onnx_export import onnx_features

    model = onnx.load(str(export0 / ONNX_FILE))
    assert max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx")) >= 17
    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")  # symbolic, i.e. dynamic batch
    encoder = load_encoder(export0)
    rng = np.random.default_rng(11)
    for batch in (1, 7):
        x = rng.standard_normal((batch, 12, encoder.spec.window)).astype(np.float32)
        with torch.no_grad():
            want = encoder.forward_features(torch.from_numpy(x)).numpy()
        got = onnx_features(export0 / ONNX_FILE, x)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_onnx_without_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from ecgpos.export.onnx_export import require_onnx

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import of a None entry raises ImportError
    with pytest.raises(EcgposError, match=r"onnxruntime.*ecgpos\[export\]"):
        require_onnx()


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
        main(
            [
                "preprocess",
                "ecg-arrhythmia",
                "--src",
                str(tmp_path / "src"),
                "--subset",
                "all",
                "--out",
                str(tmp_path / "f32"),
                "--dtype",
                "float32",
            ]
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
    assert (
        main(
            ["embed", "--encoder", str(export0), "--input", str(arrhythmia_shards), "--out", str(out), "--no-progress"]
        )
        == 0
    )
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
    swapped = raw.signal[[1, 0] + list(range(2, 12))]  # rows swapped but names not: must differ
    assert np.abs(encoder.embed(swapped, raw.fs, raw.leads) - reference).max() > 1e-4


def test_verify_passes_then_fails_on_tampered_weights(
    export0: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["verify", str(export0)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("PASS")
    tampered = tmp_path / "tampered"
    shutil.copytree(export0, tampered)
    blob = bytearray((tampered / WEIGHTS_FILE).read_bytes())
    blob[-5] ^= 0x40  # one bit of the last tensor's data: still a valid safetensors file
    (tampered / WEIGHTS_FILE).write_bytes(bytes(blob))
    assert main(["verify", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "FAIL weights" in out and "sha256" in out and out.strip().splitlines()[-1].startswith("FAIL")
    with pytest.raises(EcgposError, match="sha256"):
        load_encoder(tampered)


def _rewrite(export: Path, dest: Path, edit) -> Path:  # noqa: ANN001
    """Copy an export, edit its state dict, re-save and re-hash (so only the structure is wrong)."""
    from safetensors.torch import save_file

    shutil.copytree(export, dest)
    state = read_weights(dest / WEIGHTS_FILE)
    edit(state)
    save_file(state, str(dest / WEIGHTS_FILE))
    config = json.loads((dest / CONFIG_FILE).read_text())
    config["weights_sha256"] = state_sha256(state)
    (dest / CONFIG_FILE).write_text(json.dumps(config))
    return dest


def test_weights_that_do_not_fit_the_config_fail_loudly(export0: Path, tmp_path: Path) -> None:
    first = sorted(read_weights(export0 / WEIGHTS_FILE))[0]
    cases = {
        "missing": (lambda s: s.pop(first), first),
        "unexpected": (lambda s: s.__setitem__("extra.weight", torch.zeros(3)), "extra.weight"),
        "shape": (lambda s: s.__setitem__(first, torch.zeros(*s[first].shape, 2)), first),
    }
    for name, (edit, key) in cases.items():
        broken = _rewrite(export0, tmp_path / name, edit)
        with pytest.raises(EcgposError) as err:
            load_encoder(broken)
        message = str(err.value)
        assert name in message.lower() and key in message and "\n" not in message
    wrong_arch = tmp_path / "arch"
    shutil.copytree(export0, wrong_arch)
    config = json.loads((wrong_arch / CONFIG_FILE).read_text())
    config["arch"]["encoder"]["depth"] = config["arch"]["encoder"]["depth"] + 1
    (wrong_arch / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(EcgposError):
        load_encoder(wrong_arch)


def test_folder_that_is_not_an_export(
    stage0_run: Path, export0: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(EcgposError, match="not an ecgpos export folder"):
        load_encoder(tmp_path)
    with pytest.raises(EcgposError, match="training run folder"):
        load_encoder(stage0_run)
    rc = main(["embed", "--encoder", str(tmp_path), "--input", str(tmp_path), "--out", str(tmp_path / "f.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ecgpos embed: error:")
    assert main(["verify", str(tmp_path)]) == 2
    capsys.readouterr()
    (tmp_path / "notes.txt").write_text("not an export")
    assert main(["export", "--run-dir", str(stage0_run), "--out", str(tmp_path)]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err and (tmp_path / "notes.txt").is_file()
    again = tmp_path / "again"
    shutil.copytree(export0, again)
    assert main(["export", "--run-dir", str(stage0_run), "--out", str(again)]) == 0  # replaces an export
    assert not (again / ONNX_FILE).exists() and main(["verify", str(again)]) == 0


def _write_record(folder: Path, name: str, signal: np.ndarray, fs: float, leads: list[str]) -> None:
    wfdb.wrsamp(
        name,
        fs=fs,
        units=["mV"] * len(leads),
        sig_name=leads,
        p_signal=signal.T.astype(np.float64),
        fmt=["16"] * len(leads),
        adc_gain=[1000.0] * len(leads),
        baseline=[0] * len(leads),
        write_dir=str(folder),
    )


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
        _write_record(folder / Path(record_id).parent, Path(record_id).name, signal, fs, leads)
    encoder = load_encoder(export0)
    for record_id, reason in reasons.items():  # the Python API raises the same reasons
        signal, fs, leads = cases[record_id]
        with pytest.raises(SignalError) as err:
            encoder.embed(signal, fs, leads)
        assert err.value.reason == reason
    out = tmp_path / "feats.h5"
    assert main(["embed", "--encoder", str(export0), "--input", str(folder), "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    for record_id, reason in reasons.items():
        assert f"skipped {record_id}: {reason}" in captured.err
    assert "embedded 2 of 7" in captured.out
    with h5py.File(out, "r") as handle:
        ids = [x.decode() for x in handle["record_id"][:]]
        assert ids == ["good", "sub/good2"] and handle["features"].shape == (2, encoder.width)
        np.testing.assert_allclose(handle["features"][0], encoder.embed(raw.signal, 500, PTBXL_LEADS), atol=1e-6)
    assert (
        main(
            [
                "embed",
                "--encoder",
                str(export0),
                "--input",
                str(folder),
                "--out",
                str(tmp_path / "f.csv"),
                "--strict",
                "--no-progress",
            ]
        )
        == 1
    )


def test_npy_input_with_fs_and_leads(
    export0: Path, shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    raw = read_wfdb_record(shared_data / "ptbxl" / "records500" / "00000" / "00003_hr")
    bad = raw.signal.copy()
    bad[0, :10] = np.nan
    batch = np.stack([raw.signal, raw.signal[::-1], bad])  # rows 0, 1 differ by lead order; row 2 has NaN
    np.save(tmp_path / "batch.npy", batch)
    leads = ",".join(PTBXL_LEADS)
    assert (
        main(
            [
                "embed",
                "--encoder",
                str(export0),
                "--input",
                str(tmp_path / "batch.npy"),
                "--out",
                str(tmp_path / "f.npy"),
                "--fs",
                "500",
                "--leads",
                leads,
                "--num-windows",
                "2",
                "--no-progress",
            ]
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
        main(
            [
                "embed",
                "--encoder",
                str(export0),
                "--input",
                str(tmp_path / "batch.npy"),
                "--out",
                str(tmp_path / "g.npy"),
            ]
        )
        == 2
    )  # --fs/--leads missing
    assert "--fs" in capsys.readouterr().err


def test_embed_ptbxl_folder_to_csv(export0: Path, shared_data: Path, tmp_path: Path) -> None:
    """`ecgpos embed` of the PTB-XL sample folder to CSV, as the README shows it."""
    out = tmp_path / "feats.csv"
    assert (
        main(
            [
                "embed",
                "--encoder",
                str(export0),
                "--input",
                str(shared_data / "ptbxl" / "records500" / "00000"),
                "--out",
                str(out),
                "--no-progress",
            ]
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


def test_model_card_and_nested_verify(export0: Path, export1: Path) -> None:
    card = (export0 / "README.md").read_text()
    for text in (
        "not a medical device",
        "When Does Unsupervised Learning Succeed or Fail?",
        "ICLR 2027",
        "under review",
        "ecgpos.load_encoder",
        "| ptbxl_super | 0.01 | 0.6123 |",
        "Limitations",
    ):
        assert text in card
    assert "nested" in (export1 / "README.md").read_text()
    assert main(["verify", str(export1)]) == 0


def test_export_records_its_pretraining_shards_for_the_leakage_guard(
    export1: Path, stage1_run: Path, arrhythmia_shards: Path
) -> None:
    from probes.encoder import load_probe_encoder
    from probes.leakage import recorded_pretraining

    enc = load_probe_encoder(str(export1))
    assert enc.info["shards"] == [str(arrhythmia_shards.resolve())]
    for path in (export1, stage1_run):  # the export, and the run it came from (with its Stage-0 run)
        enc = load_probe_encoder(str(path))
        assert recorded_pretraining(enc.source, enc.info) == [arrhythmia_shards.resolve()]
