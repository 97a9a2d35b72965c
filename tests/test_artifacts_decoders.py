"""Decoders are bound to their encoder: decoders copied from another run's export are refused by
`score` and failed by `verify`, a missing settings hash warns, and `geometry` refuses tampered decoders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import FAST, one_line_error, run
from tiny_runs import pretrain_tiny

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import EcgposError


@pytest.fixture(scope="module")
def exports(tiny_run, tiny_shards, tmp_path_factory) -> dict[str, Path]:
    """Exports with decoders of two level-0 runs (the module's tiny run and another one) and of a level-1 run."""
    from ecgpos.cli import main

    root = tmp_path_factory.mktemp("decoders")
    other = pretrain_tiny(0, tiny_shards, root / "other-run", *FAST, "--set", "train.seed=7")
    nested = pretrain_tiny(1, tiny_shards, root / "level1-run", *FAST, base=tiny_run)
    out = {}
    for name, source in (("a", tiny_run), ("b", other), ("nested", nested)):
        assert main(["export", "--run-dir", str(source), "--out", str(root / name), "--with-decoders"]) == 0
        out[name] = root / name
    return out


def _edit_config(folder: Path, edit) -> None:
    data = json.loads((folder / "config.json").read_text())
    edit(data)
    (folder / "config.json").write_text(json.dumps(data, indent=2))


def _score_args(real_record: Path, tmp_path: Path) -> list:
    np.save(tmp_path / "x.npy", read_wfdb_record(real_record).signal)
    return ["score", "--input", tmp_path / "x.npy", "--fs", 500, "--leads", ",".join(CANONICAL_LEADS), "--masks", 1]


def test_decoders_copied_from_another_run_are_refused(exports, tmp_path, real_record, capsys):
    mixed = tmp_path / "mixed"
    shutil.copytree(exports["b"], mixed)
    shutil.copyfile(exports["a"] / "decoders.safetensors", mixed / "decoders.safetensors")
    foreign = json.loads((exports["a"] / "config.json").read_text())["decoders"]
    _edit_config(mixed, lambda c: c.update(decoders=foreign))  # the entry travels with them
    rc, _, err = run(capsys, *_score_args(real_record, tmp_path), "--run", mixed, "--out", tmp_path / "s.csv")
    one_line_error(rc, err, "score", "belongs to other encoder weights")
    assert not (tmp_path / "s.csv").exists()
    rc, report, _ = run(capsys, "verify", mixed)
    assert rc == 1 and "FAIL decoders.safetensors" in report and "other encoder weights" in report, report
    assert run(capsys, "verify", exports["b"])[0] == 0


def test_a_missing_settings_hash_warns(exports, tmp_path, real_record, capsys):
    old = tmp_path / "old"
    shutil.copytree(exports["a"], old)
    _edit_config(old, lambda c: c["decoders"].pop("settings_sha256"))
    rc, _, err = run(capsys, *_score_args(real_record, tmp_path), "--run", old, "--out", tmp_path / "s.csv")
    assert rc == 0 and err.count("warning") == 1 and "no settings_sha256" in err, err


def test_geometry_refuses_tampered_decoders(exports, tmp_path):
    from ecgpos.probes.geometry.cli import load_levels

    assert 1 in load_levels(str(exports["nested"])).objectives
    tampered = tmp_path / "tampered"
    shutil.copytree(exports["nested"], tampered)
    _edit_config(tampered, lambda c: c["decoders"]["level1"].update(mask_ratio=0.2))
    with pytest.raises(EcgposError, match="decoders settings no longer match"):
        load_levels(str(tampered))
    # an encoder-only export: the criterion is unavailable, said in a note, not refused
    bare = tmp_path / "bare"
    shutil.copytree(exports["nested"], bare)
    _edit_config(bare, lambda c: c.pop("decoders"))
    (bare / "decoders.safetensors").unlink()
    levels = load_levels(str(bare))
    assert levels.objectives == {} and "encoder-only export" in levels.note
