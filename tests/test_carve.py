"""`ecgpos carve`: the stop rules on constructed criteria, and one carve end to end on the real samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_runs import cli

from ecgpos.objectives.criterion import criterion
from ecgpos.pretrain.carve_plan import CONTINUE, STOP_BELOW, STOP_DROP, STOP_MAX, LevelRecord, decide
from ecgpos.pretrain.carving import shard_violations, validation_index
from ecgpos.pretrain.data import ShardDataset

torch.set_num_threads(1)
CARVE_KEYS = (
    "clean_error",
    "perturbation_over_error",
    "criterion",
    "criterion_ci",
    "criterion_literal",
    "pass_through",
    "pass_through_ci",
    "perturbation",
)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]


def test_stops_below_the_threshold() -> None:
    d = decide([0.5, 0.04], max_levels=4, stop_below=0.05, min_drop=0.01)
    assert (d.stop, d.rule) == (True, STOP_BELOW) and "0.0400" in d.reason
    assert decide([0.01], 4, 0.05, 0.01).rule == STOP_BELOW  # level 0 alone can be enough


def test_stops_when_the_criterion_no_longer_falls() -> None:
    d = decide([0.5, 0.3, 0.295], max_levels=5, stop_below=0.05, min_drop=0.01)
    assert (d.stop, d.rule) == (True, STOP_DROP) and "+0.0050" in d.reason
    assert decide([0.3, 0.35], 5, 0.05, 0.01).rule == STOP_DROP  # a rise is no drop


def test_stops_at_the_depth_budget_and_carves_on_before() -> None:
    assert decide([0.5, 0.3], max_levels=2, stop_below=0.05, min_drop=0.01).rule == STOP_MAX
    go = decide([0.5, 0.3], max_levels=3, stop_below=0.05, min_drop=0.01)
    assert (go.stop, go.rule) == (False, CONTINUE) and "level 2" in go.reason
    # the threshold wins over the budget: the reason names the rule that would stop anyway
    assert decide([0.5, 0.01], max_levels=2, stop_below=0.05, min_drop=0.01).rule == STOP_BELOW


def _record(level: int, criterion: float) -> LevelRecord:
    families = {"principal": {"criterion": criterion, "pass_through": 0.4}}
    families["gaussian"] = {"criterion": 0.0, "pass_through": 0.02, "perturbation_over_error": 2.0}
    return LevelRecord(
        level=level,
        run_dir=f"runs/level{level}",
        steps=10,
        val_loss=1.0,
        clean_error=12.5,
        perturbation_over_error=2.0,
        criterion=criterion,
        criterion_ci=(criterion - 0.1, criterion + 0.1),
        criterion_literal=0.0,
        pass_through=0.4,
        pass_through_ci=(0.3, 0.5),
        perturbation="principal",
        records=20,
        decision={"stop": bool(level), "rule": STOP_MAX if level else CONTINUE, "reason": "r"},
        families=families,
    )


def test_carve_files_show_the_calibrated_reading(tmp_path: Path) -> None:
    """carve.json holds the calibrated reading's keys per level; carve.md tabulates them, the other families
    below; a level written before the calibrated criterion is not reused (it is measured again)."""
    from ecgpos.pretrain.carve_checks import level_record
    from ecgpos.pretrain.carve_plan import read_carve, write_carve

    settings = {"stop_below": 0.05, "min_drop": 0.01, "max_levels": 2}
    write_carve(tmp_path, settings, [_record(0, 0.6), _record(1, 0.3)])
    _, levels = read_carve(tmp_path)
    assert all(set(CARVE_KEYS) <= set(r) for r in levels) and levels[1]["perturbation"] == "principal"
    assert level_record(levels[1]) == _record(1, 0.3)  # a round trip, intervals as tuples
    text = (tmp_path / "carve.md").read_text()
    head = next(line for line in text.splitlines() if line.startswith("| level | run"))
    for column in ("clean error", "delta / eps", "criterion", "pass-through", "literal", "perturbation", "map"):
        assert f" {column} |" in head
    assert "| 1 | `runs/level1` | 10 | 1.0000 | 12.500 | 2.00 | 0.3000 | [0.2000, 0.4000] | 0.4000 |" in text
    assert "| 0 | gaussian | 0.0000 | 0.0200 | 2.00 |" in text  # the family that did not decide
    assert (tmp_path / "carve.png").stat().st_size > 10_000
    old = {k: v for k, v in levels[0].items() if k not in ("clean_error", "criterion_ci")} | {"interval": [0, 1]}
    assert level_record(old) is None


def test_bad_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli("carve", "--shards", tmp_path, "--run-dir", tmp_path / "r", "--max-levels", "0") == 2
    assert "--max-levels must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_carve_three_levels_on_the_real_samples(
    arrhythmia_shards: Path, shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three tiny levels, the criterion after each equal to the trainer's last val_push_violation and to
    a measurement with another batch size; a rerun resumes (trains nothing, keeps the measurements).
    On the three-level run, `score` writes a column per level and `geometry` measures both pairs and
    gives every level's criterion record for record as carve's measurement does."""
    runs = tmp_path / "carve"
    args = ["carve", "--config", "tiny/level0", "--latent-config", "tiny/level1", "--shards", arrhythmia_shards]
    args += ["--run-dir", runs, "--max-levels", "3", "--stop-below", "0", "--min-drop", "-1", *FAST]
    assert cli(*args) == 0
    levels = json.loads((runs / "carve.json").read_text())["levels"]
    assert [r["level"] for r in levels] == [0, 1, 2]
    assert [r["decision"]["rule"] for r in levels] == [CONTINUE, CONTINUE, STOP_MAX]
    val = ShardDataset(validation_index(arrhythmia_shards, 0.1), 2250, train=False)
    from ecgpos.pretrain.carving import shard_reading
    from ecgpos.runs.run_folder import load_run_model

    for r in levels:
        run = runs / f"level{r['level']}"
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert r["records"] == len(val) == 22 and r["steps"] == 2
        assert set(CARVE_KEYS) <= set(r) and r["map"] == "masked"  # no push-pull: the masked map
        assert r["perturbation"] == "principal"
        assert r["criterion_literal"] == pytest.approx(
            [x for x in logged if "val_push_violation" in x][-1]["val_push_violation"], abs=1e-6
        )
        model = load_run_model(run)[0]
        assert criterion(shard_violations(model, val, 7)) == pytest.approx(r["criterion_literal"], abs=1e-12)
        again = shard_reading(model, val, 7).families[r["perturbation"]]  # another batch size
        assert criterion(again.violation) == pytest.approx(r["criterion"], abs=1e-12)
        assert criterion(again.pass_through) == pytest.approx(r["pass_through"], rel=1e-4)
        assert 0 <= r["criterion"] <= 1 and r["criterion_ci"][0] <= r["criterion"] <= r["criterion_ci"][1]
        assert 0 < r["pass_through"] < 1 and r["pass_through_ci"][0] < r["pass_through"] < r["pass_through_ci"][1]
        assert r["perturbation_over_error"] >= 2
    text = (runs / "carve.md").read_text()
    assert "| 2 |" in text and "Decision after level 2: stopped, reached --max-levels 3" in text
    assert (runs / "carve.png").stat().st_size > 10_000
    stamp = (runs / "level2" / "run_info.json").stat().st_mtime_ns
    assert cli(*args) == 0  # resumes: every level is finished, nothing is trained again
    assert (runs / "level2" / "run_info.json").stat().st_mtime_ns == stamp
    assert json.loads((runs / "carve.json").read_text())["levels"] == levels
    # a carve.json written before the calibrated criterion resumes: its levels are measured again
    data = json.loads((runs / "carve.json").read_text())
    for r in data["levels"]:
        r["interval"] = r.pop("criterion_ci")
        for key in CARVE_KEYS[:2] + CARVE_KEYS[4:]:
            r.pop(key, None)
    (runs / "carve.json").write_text(json.dumps(data))
    assert cli(*args) == 0 and json.loads((runs / "carve.json").read_text())["levels"] == levels

    # score: one column per level of the three-level run
    records = [
        next((shared_data / "ecg-arrhythmia").rglob(f"{rid}.hea")).with_suffix("") for rid in val.index.record_id
    ]
    folder = tmp_path / "records"
    folder.mkdir()
    for record in records[:4]:
        for ext in (".hea", ".mat"):
            (folder / (record.name + ext)).write_bytes(record.with_suffix(ext).read_bytes())
    assert cli("score", "--run", runs / "level2", "--input", folder, "--out", tmp_path / "s.csv", "--no-progress") == 0
    assert (tmp_path / "s.csv").read_text().splitlines()[0] == "record_id,level0_score,level1_score,level2_score"
    # geometry on the validation records themselves, with alpha between two margin ratios so that answers split
    from ecgpos.objectives import criterion as crit
    from ecgpos.objectives.push_pull import PushPullConfig

    monkeypatch.setattr(crit, "criterion_settings", lambda model: PushPullConfig(enabled=True, alpha=2.9))
    task = tmp_path / "task"
    task.mkdir()
    rows = ["record,A,B,X"] + [
        f"{r},{int(i % 3 == 0)},{int(i % 3 == 1)},{int(i % 3 == 2)}" for i, r in enumerate(records)
    ]
    for split in ("train", "val", "test"):
        (task / f"{split}.csv").write_text("\n".join(rows) + "\n")
    geo = tmp_path / "geo"
    args = [
        "geometry",
        "--encoder",
        runs / "level2",
        "--task",
        f"custom:{task}",
        "--nominal",
        "A,B",
        "--anomalous",
        "X",
    ]
    assert cli(*args, "--out", geo, "--device", "cpu") == 0
    import csv

    with (geo / "metrics.csv").open() as handle:
        assert sorted({r["level"] for r in csv.DictReader(handle)}) == ["1", "2"]
    data = np.load(geo / "features.npz")
    nominal = [i for i, label in enumerate(data["labels"]) if label != "X"]
    for level in range(3):
        direct = shard_violations(load_run_model(runs / f"level{level}")[0], val, 5)
        from_geometry = {
            str(data["record_ids"][i]).rsplit("/", 1)[-1]: data[f"violation_level{level}"][i] for i in nominal
        }
        assert from_geometry == {rid: direct[rid] for rid in from_geometry}
        if level == 0:
            assert 0 < np.mean(list(from_geometry.values())) < 1  # a split answer, not all 0 or all 1
    assert cli(*args, "--level", "1", "--out", tmp_path / "geo1", "--device", "cpu") == 0
    assert "## Levels 0 -> 1" in (tmp_path / "geo1" / "summary.md").read_text()


@pytest.mark.slow
def test_carve_on_two_processes_measures_what_one_process_does(arrhythmia_shards: Path, tmp_path: Path) -> None:
    """`accelerate launch` (2 CPU processes, gloo): the level trains on both, the trainer's all-reduced
    val_push_violation, carve's criterion and a one-process measurement with another batch size agree,
    with alpha set so that the records split."""
    import os
    import socket
    import subprocess
    import sys

    from ecgpos.runs.run_folder import load_run_model

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), "CUDA_VISIBLE_DEVICES": ""}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += ["--main_process_port", str(port), "-m", "ecgpos", "carve", "--config", "tiny/level0"]
    launch += ["--shards", str(arrhythmia_shards), "--run-dir", str(tmp_path / "carve"), "--max-levels", "1", *FAST]
    launch += ["--set", "push_pull.enabled=true", "--set", "push_pull.lambda_pp=0", "--set", "push_pull.alpha=2.9"]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "carve" / "level0"
    assert json.loads((run / "run_info.json").read_text())["num_processes"] == 2
    (level,) = json.loads((tmp_path / "carve" / "carve.json").read_text())["levels"]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = ShardDataset(validation_index(arrhythmia_shards, 0.1), 2250, train=False)
    one = criterion(shard_violations(load_run_model(run)[0], val, 3))
    assert 0 < one < 1 and level["records"] == len(val)
    assert level["criterion_literal"] == pytest.approx(one, abs=1e-12)
    assert [r["val_push_violation"] for r in logged if "val_push_violation" in r][-1] == pytest.approx(one, abs=1e-6)
