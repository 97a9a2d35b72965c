"""`ecgpos probe --compare` merging result folders written from hand-made rows: two encoders, one
encoder across task folders, and a repeated encoder/task/fraction renamed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from refusal_helpers import run

from ecgpos.probes.shared.results import write_outputs, write_results


def test_compare_merges_result_folders(capsys, tmp_path):
    rng = np.random.default_rng(0)
    for name, signal in (("a", 2.0), ("b", 0.0)):
        rows = []
        for task in ("ptbxl-super", "cpsc2018"):
            for seed in range(2):
                rows.append(
                    {
                        "encoder": f"enc-{name}",
                        "task": task,
                        "fraction": 1.0,
                        "seed": seed,
                        "best_epoch": 3,
                        "val_auroc": 0.5 + signal / 5,
                        "test_auroc": 0.5 + signal / 5 + rng.normal(0, 0.01),
                        "excluded_val": "",
                        "excluded_test": "",
                        "test_auroc_per_class": "{}",
                        "note": "",
                    }
                )
        (tmp_path / name).mkdir()
        write_outputs(write_results(rows, tmp_path / name), tmp_path / name)
    rc, out, _ = run(capsys, "probe", "--compare", tmp_path / "a", tmp_path / "b", "--out", tmp_path / "both")
    assert rc == 0
    summary = (tmp_path / "both" / "summary.md").read_text()
    assert "| enc-a |" in summary and "| enc-b |" in summary and "| Super | CPSC2018 |" in summary
    assert "Mean ± population std (ddof 0) over" in summary  # says which std a reviewer reads
    assert (tmp_path / "both" / "summary.png").stat().st_size > 1000
    assert len(pd.read_csv(tmp_path / "both" / "results.csv")) == 8
    assert "enc-a" in out


def _result_folder(folder: Path, encoder: str, tasks: tuple[str, ...], auroc: float) -> Path:
    """A probe output folder written by the report code from hand-made rows (2 seeds per task)."""
    rows = [
        {
            "encoder": encoder,
            "task": task,
            "fraction": 1.0,
            "seed": seed,
            "best_epoch": 2,
            "val_auroc": auroc,
            "test_auroc": auroc + seed / 100,
            "excluded_val": "",
            "excluded_test": "",
            "test_auroc_per_class": "{}",
            "note": "",
        }
        for task in tasks
        for seed in range(2)
    ]
    folder.mkdir(parents=True)
    write_outputs(write_results(rows, folder), folder)
    return folder


def test_compare_keeps_one_encoder_across_task_folders(capsys, tmp_path):
    # an array job: one folder per task, all probed with --name level1
    super_ = _result_folder(tmp_path / "out" / "ptbxl-super", "level1", ("ptbxl-super",), 0.8)
    cpsc = _result_folder(tmp_path / "out" / "cpsc2018", "level1", ("cpsc2018",), 0.7)
    rc, out, err = run(capsys, "probe", "--compare", super_, cpsc, "--out", tmp_path / "merged")
    assert rc == 0, err
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "| Encoder | Super | CPSC2018 |" in summary
    assert "| level1 | 0.8050 ± 0.0050 | 0.7050 ± 0.0050 |" in summary
    assert "[" not in summary and summary in out
    assert (tmp_path / "merged" / "summary.png").stat().st_size > 1000
    merged = pd.read_csv(tmp_path / "merged" / "results.csv")
    assert set(merged["encoder"]) == {"level1"} and len(merged) == 4


def test_compare_renames_only_a_repeated_encoder_task_fraction(capsys, tmp_path):
    first = _result_folder(tmp_path / "run1", "level1", ("ptbxl-super", "cpsc2018"), 0.8)
    other = _result_folder(tmp_path / "other", "level1", ("ptbxl-rhythm",), 0.9)
    again = _result_folder(tmp_path / "run2", "level1", ("ptbxl-super",), 0.6)
    rc, out, err = run(capsys, "probe", "--compare", first, other, again, "--out", tmp_path / "merged")
    assert rc == 0, err
    summary = (tmp_path / "merged" / "summary.md").read_text()
    assert "| Encoder | Super | Rhythm | CPSC2018 |" in summary
    assert "| level1 | 0.8050 ± 0.0050 | 0.9050 ± 0.0050 | 0.8050 ± 0.0050 |" in summary
    assert "| level1 [run2] | 0.6050 ± 0.0050 | — | — |" in summary
    assert "level1 [run2]: rows of" in summary  # the rename is explained under Notes
    assert (tmp_path / "merged" / "summary.png").stat().st_size > 1000
    merged = pd.read_csv(tmp_path / "merged" / "results.csv")
    assert merged.groupby("encoder").size().to_dict() == {"level1": 6, "level1 [run2]": 2}
