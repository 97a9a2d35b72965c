"""`ecgpos probe`, `probe --compare` and `geometry` write into an --out only their own files: a folder
holding another command's results, or a file none of them writes, is one line (exit 2) before anything
is loaded, and the folder is left byte for byte as it was; a rerun into the command's own folder works,
naming what it keeps there (a feature cache inside --out)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from refusal_helpers import TINY0, one_line_error, run
from test_probe_custom_tasks import _custom_task

pytestmark = pytest.mark.skipif(not TINY0.is_file(), reason="configs/tiny/level0.yaml not written yet")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder`, by relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _geometry(capsys, task: Path, out: Path) -> tuple[int, str, str]:
    """`ecgpos geometry` on the custom task into `out` (refused before its encoder would be loaded)."""
    args = ["--encoder", f"random:{TINY0}", "--task", f"custom:{task}", "--nominal", "fast,slow"]
    return run(capsys, "geometry", *args, "--anomalous", "other", "--out", out, "--device", "cpu")


def test_probe_compare_and_geometry_refuse_another_commands_folder_and_rerun_into_their_own(capsys, tmp_path):
    task = _custom_task(tmp_path / "task")
    out = tmp_path / "out"
    probe = ["probe", "--encoder", f"random:{TINY0}", "--task", f"custom:{task}", "--fractions", "100"]
    probe += ["--seeds", "1", "--epochs", "1", "--bootstrap", "0", "--cache-dir", out / "cache"]
    rc, _, err = run(capsys, *probe, "--out", out)
    assert rc == 0, err
    assert "keeping" not in err  # nothing of an earlier run was there
    rc, _, err = run(capsys, *probe, "--out", out)  # a rerun into its own folder, its cache inside it, works
    assert rc == 0, err
    assert f"ecgpos probe: keeping {out / 'cache'} in --out" in err
    assert set(pd.read_csv(out / "results.csv")["task"]) == {"custom:task"}

    # a fine-tune's folder: its probe.json records a mode, and it holds config.yaml and models/
    finetuned = tmp_path / "finetuned"
    shutil.copytree(out, finetuned, ignore=shutil.ignore_patterns("cache"))
    info = json.loads((finetuned / "probe.json").read_text())
    (finetuned / "probe.json").write_text(json.dumps(info | {"mode": "full"}))
    (finetuned / "config.yaml").write_text("epochs: 1\n")
    (finetuned / "models" / "custom:task").mkdir(parents=True)
    before = snapshot(finetuned)
    rc, _, err = run(capsys, *probe, "--out", finetuned)
    one_line_error(rc, err, "probe", f"--out {finetuned} holds the results of `ecgpos finetune` (probe.json)")
    rc, _, err = run(capsys, "probe", "--compare", out, "--bootstrap", "0", "--out", finetuned)
    one_line_error(rc, err, "probe", "holds the results of `ecgpos finetune` (probe.json)")
    assert snapshot(finetuned) == before

    # geometry into the probe's folder, and a probe or a compare (not of it) into a geometry folder
    before = snapshot(out)
    one_line_error(*_geometry(capsys, task, out)[::2], "geometry", "holds the results of `ecgpos probe` (probe.json)")
    assert snapshot(out) == before
    measured = tmp_path / "geometry"
    measured.mkdir()
    (measured / "metrics.csv").write_text("level,metric,x,x_hat,delta_pct\n1,S,1,2,100\n")
    (measured / "summary.md").write_text("# PoS representation dynamics\n")
    before = snapshot(measured)
    one_line_error(*run(capsys, *probe, "--out", measured)[::2], "probe", "`ecgpos geometry` (metrics.csv)")
    compare = ["probe", "--compare", out, "--bootstrap", "0", "--out"]
    one_line_error(*run(capsys, *compare, measured)[::2], "probe", "`ecgpos geometry` (metrics.csv)")
    assert snapshot(measured) == before

    # a compare refuses a probe's folder that is not one of its inputs; into its own folder it reruns
    other = tmp_path / "other"
    shutil.copytree(out, other, ignore=shutil.ignore_patterns("cache"))
    before = snapshot(other)
    one_line_error(*run(capsys, *compare, other)[::2], "probe", "holds the results of `ecgpos probe` (probe.json)")
    assert snapshot(other) == before
    for _ in range(2):
        rc, _, err = run(capsys, *compare, tmp_path / "cmp")
        assert rc == 0, err
    assert "compared" in json.loads((tmp_path / "cmp" / "probe.json").read_text())


def test_a_file_no_command_writes_is_named_and_kept(capsys, tmp_path):
    task = _custom_task(tmp_path / "task")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine\n")
    (notes / ".hidden").write_text("ignored\n")  # hidden files are never counted
    (notes / "results.csv").write_text("a file of the probe's name\n")
    before = snapshot(notes)
    probe = ["probe", "--encoder", f"random:{TINY0}", "--task", f"custom:{task}", "--cache-dir", tmp_path / "c"]
    one_line_error(*run(capsys, *probe, "--out", notes)[::2], "probe", "does not write (notes.txt)")
    one_line_error(*_geometry(capsys, task, notes)[::2], "geometry", "does not write (notes.txt, results.csv)")
    assert snapshot(notes) == before
