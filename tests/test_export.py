"""Export, load_encoder, ONNX and `ecgpos verify` on tiny real level-0/level-1 runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import cli

from ecgpos.errors import EcgposError
from ecgpos.export.format import CONFIG_FILE, ONNX_FILE, WEIGHTS_FILE, state_sha256
from ecgpos.export.load import load_encoder
from ecgpos.export.vectors import make_inputs
from ecgpos.files import read_safetensors as read_weights

torch.set_num_threads(1)


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


@pytest.mark.parametrize("which", ["level0", "level1"])
def test_export_reloads_in_fresh_process_with_checkpoint_features(which: str, request, tmp_path: Path) -> None:
    from ecgpos.inference.resolve import load_run_encoder

    run = request.getfixturevalue(f"{which}_run")
    export = request.getfixturevalue("export0" if which == "level0" else "export1")
    config = json.loads((export / CONFIG_FILE).read_text())
    assert config["arch"]["kind"] == ("level0" if which == "level0" else "nested")
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


def test_verify_passes_then_fails_on_tampered_weights(
    export0: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cli("verify", export0) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("PASS") and "(within atol 0.0001 + rtol 0.001" in out
    assert "NOTE" not in out
    # the stated tolerances are descriptive (outside the config hash): an edit is named, never applied
    loose = tmp_path / "loose"
    shutil.copytree(export0, loose)
    config = json.loads((loose / CONFIG_FILE).read_text())
    config["test_vectors"]["atol"] = 1e9
    (loose / CONFIG_FILE).write_text(json.dumps(config))
    assert cli("verify", loose) == 0
    assert "NOTE config.json: test_vectors states atol 1000000000.0" in capsys.readouterr().out
    tampered = tmp_path / "tampered"
    shutil.copytree(export0, tampered)
    blob = bytearray((tampered / WEIGHTS_FILE).read_bytes())
    blob[-5] ^= 0x40  # one bit of the last tensor's data: still a valid safetensors file
    (tampered / WEIGHTS_FILE).write_bytes(bytes(blob))
    assert cli("verify", tampered) == 1
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
    level0_run: Path, export0: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(EcgposError, match="not an ecgpos export folder"):
        load_encoder(tmp_path)
    with pytest.raises(EcgposError, match="training run folder"):
        load_encoder(level0_run)
    rc = cli("embed", "--encoder", tmp_path, "--input", tmp_path, "--out", tmp_path / "f.csv")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ecgpos embed: error:")
    assert cli("verify", tmp_path) == 2
    capsys.readouterr()
    (tmp_path / "notes.txt").write_text("not an export")
    assert cli("export", "--run-dir", level0_run, "--out", tmp_path) == 2
    assert "refusing to overwrite" in capsys.readouterr().err and (tmp_path / "notes.txt").is_file()
    again = tmp_path / "again"
    shutil.copytree(export0, again)
    assert cli("export", "--run-dir", level0_run, "--out", again) == 0  # replaces an export
    assert not (again / ONNX_FILE).exists() and cli("verify", again) == 0


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
    assert cli("verify", export1) == 0


def test_export_records_its_pretraining_shards_for_the_leakage_guard(
    export1: Path, level1_run: Path, arrhythmia_shards: Path
) -> None:
    from ecgpos.probes.shared.encoder import load_probe_encoder
    from ecgpos.probes.shared.leakage import recorded_pretraining

    enc = load_probe_encoder(str(export1))
    assert enc.info["shards"] == [str(arrhythmia_shards.resolve())]
    for path in (export1, level1_run):  # the export, and the run it came from (with its level-0 run)
        enc = load_probe_encoder(str(path))
        assert recorded_pretraining(enc.source, enc.info) == [arrhythmia_shards.resolve()]
