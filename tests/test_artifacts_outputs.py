"""Outputs never touch inputs or exports: an --out inside an export, a run or a shard folder is one
line; re-exporting never deletes the user's files; a set of output files is replaced whole or not at all."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import one_line_error, run

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.wfdb_io import read_wfdb_record


@pytest.fixture(scope="module")
def npy(real_record, tmp_path_factory) -> Path:
    raw = read_wfdb_record(real_record)
    path = tmp_path_factory.mktemp("npy") / "x.npy"
    np.save(path, np.stack([np.roll(raw.signal, 250 * k, axis=1) for k in range(4)]))
    return path


def _input(npy: Path) -> list:
    return ["--input", npy, "--fs", 500, "--leads", ",".join(CANONICAL_LEADS), "--no-progress"]


def test_embed_and_score_refuse_an_out_inside_an_export_run_or_shard_folder(export, tiny_run, tiny_shards, npy, capsys):
    vectors = (export / "test_vectors.npz").read_bytes()
    targets = {
        export / "test_vectors.npz": "inside the exported encoder",
        export / "sub" / "f.npz": "inside the exported encoder",
        tiny_run / "feats.csv": "inside the training run",
        tiny_run / "checkpoints" / "feats.csv": "inside the training run",
        tiny_shards / "feats.csv": "inside the shard folder",
    }
    for out, needle in targets.items():
        rc, _, err = run(capsys, "embed", "--encoder", export, *_input(npy), "--out", out)
        one_line_error(rc, err, "embed", needle)
        if out.suffix == ".csv":
            rc, _, err = run(capsys, "score", "--run", tiny_run, *_input(npy), "--masks", 1, "--out", out)
            one_line_error(rc, err, "score", needle)
        assert out.name == "test_vectors.npz" or not out.exists()
    assert (export / "test_vectors.npz").read_bytes() == vectors and not (export / "sub").exists()
    assert run(capsys, "verify", export)[0] == 0


def test_probe_out_inside_a_shard_folder_is_refused(tiny_shards, tmp_path, capsys):
    (tmp_path / "results.csv").write_text("encoder,task,fraction,seed,test_auroc\nmine,ptbxl-super,1,0,0.61\n")
    rc, _, err = run(capsys, "probe", "--compare", tmp_path, "--out", tiny_shards / "cmp")
    one_line_error(rc, err, "probe", "inside the shard folder")
    assert not (tiny_shards / "cmp").exists()


def test_re_export_refuses_to_delete_files_it_does_not_own(tiny_run, tmp_path, capsys):
    out = tmp_path / "enc"
    assert run(capsys, "export", "--run-dir", tiny_run, "--out", out)[0] == 0
    (out / "notes.txt").write_text("mine")
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", out)
    one_line_error(rc, err, "export", "holds files an export does not own (notes.txt)")
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    assert run(capsys, "export", "--run-dir", tiny_run, "--out", out)[0] == 0  # its own files: replaced
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", out / "inner")
    one_line_error(rc, err, "export", "inside the exported encoder")


def test_a_failed_write_keeps_the_earlier_score_files_whole(tiny_run, npy, tmp_path, capsys, monkeypatch):
    labels = tmp_path / "labels.csv"
    labels.write_text("record_id,label\n0,N\n1,N\n2,A\n3,A\n")
    out = tmp_path / "o" / "scores.csv"
    first = ["score", "--run", tiny_run, *_input(npy), "--masks", 1, "--out", out]
    assert run(capsys, *first, "--labels", labels, "--nominal", "N", "--anomalous", "A")[0] == 0
    before = {p.name: p.read_bytes() for p in out.parent.iterdir()}
    assert set(before) == {"scores.csv", "scores.skipped.csv", "scores.summary.md"}
    replace = os.replace

    def disk_full(src, dst):
        if Path(dst).name == "scores.skipped.csv" and not str(src).endswith(".old"):  # the new file, not a restore
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full)
    rc, _, err = run(capsys, *first, "--masks", 2)  # another run: no labels, other scores
    monkeypatch.undo()
    one_line_error(rc, err, "score", "the earlier ones are kept")
    assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before  # whole, and no temporaries
    shutil.rmtree(out.parent)
