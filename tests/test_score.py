"""`ecgpos score`, `ecgpos export --with-decoders`, val_push_violation and `ecgpos geometry` on tiny real runs."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from refusal_helpers import ctrl_c_when_renaming
from tiny_runs import cli, pretrain_tiny

from ecgpos.cli import main
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.files import host_tag
from ecgpos.resources import config_dir

CONFIG_DIR = config_dir()

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
PTBXL = "ptbxl/records500/00000"


@pytest.fixture(scope="module")
def runs(arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("score-runs")
    pretrain_tiny(0, arrhythmia_shards, root / "s0", *FAST)
    for path in _left_by_killed_runs(root / "s1", "run_info.json") + _left_by_killed_runs(
        root / "s1" / "figures", "curves.png", ".png"
    ):  # a killed start of the level-1 run; pretrain removes those of this host (test_pretrain_removes_...)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half a file\n")
    pretrain_tiny(
        1,
        arrhythmia_shards,
        root / "s1",
        *FAST,
        "--set",
        "train.val_fraction=0.1",
        "--set",
        "train.val_every=1",
        "--set",
        "train.val_batches=1",
        base=root / "s0",
    )
    return {"level0": root / "s0", "level1": root / "s1"}


@pytest.fixture(scope="module")
def records(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six real PTB-XL records, one of them duplicated under another name (the same signal)."""
    folder = tmp_path_factory.mktemp("score-records")
    for n in range(1, 7):
        for ext in ("hea", "dat"):
            (folder / f"{n:05d}_hr.{ext}").write_bytes((shared_data / PTBXL / f"{n:05d}_hr.{ext}").read_bytes())
    return folder


def _left_by_killed_runs(folder: Path, name: str, suffix: str = "") -> list[Path]:
    """Temporary files for `name` in `folder` of a dead process of this host, and of one on another host."""
    finished = subprocess.Popen(["true"])
    finished.wait()  # its pid no longer runs
    return [folder / f".{name}.{host}.{finished.pid}.tmp{suffix}" for host in (host_tag(), f"{host_tag()}-other-node")]


def test_pretrain_removes_what_killed_runs_of_this_host_left(runs: dict[str, Path]) -> None:
    for folder in (runs["level1"], runs["level1"] / "figures"):
        left = [path.name for path in folder.glob(".*.tmp*")]
        assert len(left) == 1 and f".{host_tag()}-other-node." in left[0], left


def score(run: Path, records: Path, out: Path, *extra: object) -> int:
    """`ecgpos score --run RUN --input RECORDS --out OUT --no-progress EXTRA...`; its exit code."""
    return cli("score", "--run", run, "--input", records, "--out", out, "--no-progress", *extra)


def _read(path: Path) -> tuple[list[str], dict[str, list[float]]]:
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    return list(rows[0]), {r["record_id"]: [float(r[k]) for k in list(r)[1:]] for r in rows}


def test_level1_scores_both_levels_deterministically(runs: dict[str, Path], records: Path, tmp_path: Path) -> None:
    assert score(runs["level1"], records, tmp_path / "a.csv", "--masks", "3") == 0
    assert score(runs["level1"], records, tmp_path / "b.csv", "--masks", "3", "--batch-size", "2") == 0
    header, a = _read(tmp_path / "a.csv")
    assert header == ["record_id", "level0_score", "level1_score"]
    _, b = _read(tmp_path / "b.csv")
    assert len(a) == 6
    for key in a:  # same masks whatever the batch: the same record gets the same score
        assert np.allclose(a[key], b[key], rtol=1e-5, atol=1e-7)
    values = np.array(list(a.values()))
    assert np.all(values > 0) and np.all(np.isfinite(values))
    assert len(np.unique(values[:, 0].round(6))) == 6  # the scores tell records apart
    # more masks give a different (averaged) value: the mask count is really used
    assert score(runs["level1"], records, tmp_path / "c.csv", "--masks", "1") == 0
    _, c = _read(tmp_path / "c.csv")
    assert any(not np.allclose(a[k], c[k]) for k in a)


def test_masked_errors_of_several_masks_equal_one_mask_at_a_time(runs: dict[str, Path]) -> None:
    """Scoring embeds a window (and runs the frozen levels below) once for all its masks: each mask's
    errors equal a full masked forward under that mask alone."""
    from ecgpos.inference.scoring import load_recon_models
    from ecgpos.models.masking import expand_masking, fixed_masking
    from ecgpos.objectives.level0_mae import masked_mse_per_sample

    models = load_recon_models(runs["level1"])
    x = torch.randn(3, 12, models.spec.window, generator=torch.Generator().manual_seed(0))
    for model in models.levels.values():
        enc = model.encoder
        maskings = [expand_masking(fixed_masking(12, enc.num_patches, model.mask_ratio, s), 3, "cpu") for s in range(3)]
        together = model.masked_errors(x, maskings)
        inputs = model.level_inputs(x)
        for m, masking in enumerate(maskings):
            latent, mask, restore = enc.forward_masked(inputs, model.mask_ratio, masking=masking)
            alone = masked_mse_per_sample(model.decoder(latent, restore), model.target(inputs), mask)
            torch.testing.assert_close(together[m], alone, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(together[0], together[1])  # the masks really differ


def test_level0_run_gives_level0_scores_only(runs: dict[str, Path], records: Path, tmp_path: Path) -> None:
    assert score(runs["level0"], records, tmp_path / "s.csv", "--masks", "2") == 0
    header, rows = _read(tmp_path / "s.csv")
    assert header == ["record_id", "level0_score"]
    assert len(rows) == 6


def test_skipped_records_are_listed_beside_the_scores(
    runs: dict[str, Path], records: Path, tmp_path: Path, capsys
) -> None:
    folder = tmp_path / "records"
    folder.mkdir()
    for path in records.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    dat = folder / "00002_hr.dat"
    dat.write_bytes(dat.read_bytes()[:1000])  # a truncated download
    assert score(runs["level0"], folder, tmp_path / "s.csv", "--masks", "2") == 0
    assert len(_read(tmp_path / "s.csv")[1]) == 5
    with (tmp_path / "s.skipped.csv").open() as handle:
        skipped = list(csv.DictReader(handle))
    assert [(row["record_id"], row["reason"]) for row in skipped] == [("00002_hr", "truncated_signal")]
    assert "; skipped 1 (truncated_signal 1)" in capsys.readouterr().out


def test_scores_invariant_to_lead_order(runs: dict[str, Path], records: Path, tmp_path: Path) -> None:
    raw = read_wfdb_record(records / "00001_hr")
    order = np.random.default_rng(0).permutation(12)
    np.save(tmp_path / "a.npy", raw.signal)
    np.save(tmp_path / "b.npy", raw.signal[order])
    leads = list(raw.leads)
    for name, names in (("a", leads), ("b", [leads[i] for i in order])):
        assert (
            score(
                runs["level1"],
                tmp_path / f"{name}.npy",
                tmp_path / f"{name}.csv",
                "--fs",
                raw.fs,
                "--leads",
                ",".join(names),
                "--masks",
                "2",
            )
            == 0
        )
    assert _read(tmp_path / "a.csv")[1]["a"] == _read(tmp_path / "b.csv")[1]["b"]
    # and the .npy path scores the same as the WFDB record it came from
    assert score(runs["level1"], records / "00001_hr", tmp_path / "x.csv", "--masks", "2") == 0
    assert np.allclose(_read(tmp_path / "a.csv")[1]["a"], _read(tmp_path / "x.csv")[1]["00001_hr"], rtol=1e-6)


def test_labels_give_auroc_per_level(runs: dict[str, Path], records: Path, tmp_path: Path, capsys) -> None:
    labels = tmp_path / "labels.csv"
    labels.write_text("record_id,label\n" + "".join(f"{n:05d}_hr,{'A' if n <= 3 else 'N'}\n" for n in range(1, 7)))
    out = tmp_path / "o" / "scores.csv"
    dead, other_host = _left_by_killed_runs(out.parent, "scores.summary.md")
    for path in (dead, other_host):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half a file\n")
    assert (
        score(runs["level1"], records, out, "--masks", "2", "--labels", labels, "--nominal", "N", "--anomalous", "A")
        == 0
    )
    assert not dead.exists() and other_host.exists()
    text = (out.parent / "scores.summary.md").read_text()
    _, rows = _read(out)
    from sklearn.metrics import roc_auc_score

    y = [1, 1, 1, 0, 0, 0]
    for level, col in (("level0", 0), ("level1", 1)):
        want = roc_auc_score(y, [rows[f"{n:05d}_hr"][col] for n in range(1, 7)])
        assert f"| {level} | {want:.3f} |" in text
    assert "| level0 |" in capsys.readouterr().out


def test_a_rerun_without_a_summary_leaves_no_earlier_summary_beside_its_scores(
    runs: dict[str, Path], records: Path, tmp_path: Path
) -> None:
    """FILE.summary.md describes the scores beside it: a rerun without --labels, or with labels
    that name no scored record (exit 2, scores written), used to leave the earlier AUROC table there."""
    labels, elsewhere = tmp_path / "labels.csv", tmp_path / "elsewhere.csv"
    labels.write_text("record_id,label\n" + "".join(f"{n:05d}_hr,{'A' if n <= 3 else 'N'}\n" for n in range(1, 7)))
    elsewhere.write_text("record_id,label\nother/00001_hr,A\nother/00004_hr,N\n")
    out, summary = tmp_path / "o" / "scores.csv", tmp_path / "o" / "scores.summary.md"
    labelled = ["--masks", "1", "--nominal", "N", "--anomalous", "A", "--labels"]
    assert score(runs["level0"], records, out, *labelled, labels) == 0 and summary.is_file()
    assert score(runs["level0"], records, out, "--masks", "1") == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["scores.csv", "scores.skipped.csv"]
    assert score(runs["level0"], records, out, *labelled, labels) == 0 and summary.is_file()
    assert score(runs["level0"], records, out, *labelled, elsewhere) == 2
    assert sorted(p.name for p in out.parent.iterdir()) == ["scores.csv", "scores.skipped.csv"]
    assert len(_read(out)[1]) == 6
    assert score(runs["level0"], records, out, *labelled, labels) == 0
    other = out.with_name("other.csv")  # more scores in the same folder: each set keeps its own summary
    assert score(runs["level0"], records, other, "--masks", "1") == 0
    assert summary.is_file() and not other.with_name("other.summary.md").exists()


def test_export_with_decoders_scores_like_the_run(runs: dict[str, Path], records: Path, tmp_path: Path) -> None:
    plain, full = tmp_path / "plain", tmp_path / "full"
    assert cli("export", "--run-dir", runs["level1"], "--out", plain) == 0
    assert cli("export", "--run-dir", runs["level1"], "--out", full, "--with-decoders") == 0
    assert not (plain / "decoders.safetensors").exists()
    assert "decoders" not in json.loads((plain / "config.json").read_text())
    assert set(json.loads((full / "config.json").read_text())["decoders"]) >= {"level0", "level1", "sha256"}
    # the model card's file list names what the folder holds
    assert (
        "- `decoders.safetensors`: the reconstruction decoders of levels level0, level1"
        in (full / "README.md").read_text()
    )
    assert "decoders.safetensors" not in (plain / "README.md").read_text()
    assert cli("score", "--run", plain, "--input", records, "--out", tmp_path / "p.csv") == 2
    for source, name in ((runs["level1"], "r"), (full, "e")):
        assert score(source, records, tmp_path / f"{name}.csv", "--masks", "2") == 0
    _, r = _read(tmp_path / "r.csv")
    _, e = _read(tmp_path / "e.csv")
    for key in r:
        assert np.allclose(r[key], e[key], rtol=1e-5)
    assert cli("verify", full) == 0


def test_val_push_violation_logged(runs: dict[str, Path]) -> None:
    lines = [json.loads(s) for s in (runs["level1"] / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in lines if "val_loss" in r]
    assert val and all(0.0 <= r["val_push_violation"] <= 1.0 for r in val)


def test_the_criterion_matches_its_definition(runs: dict[str, Path]) -> None:
    from ecgpos.objectives.criterion import window_generator, window_violations
    from ecgpos.objectives.push_pull import per_sample_distance, perturb
    from ecgpos.runs.run_folder import load_run_model

    model = load_run_model(runs["level1"])[0].eval()
    x = torch.randn(3, 12, 2250, generator=torch.Generator().manual_seed(5))
    names = [("a", 0), ("a", 1), ("b", 0)]
    got = window_violations(model, x, names)
    tokens = model.latent_tokens(x)
    by_lead = tokens.reshape(3, 12, -1, tokens.shape[-1])  # the patch tokens are perturbed, the SEP outputs not
    noisy = torch.cat(  # each window from its own stream, with its own std
        [perturb(by_lead[i : i + 1, :, 1:-1], "gaussian", 0.1, window_generator(0, *names[i])) for i in range(3)]
    )
    tilde = torch.cat([by_lead[:, :, :1], noisy, by_lead[:, :, -1:]], dim=2).flatten(1, 2)
    t, tt = model.target(tokens), model.target(tilde)
    want = 1.0 * per_sample_distance(tt, t) > per_sample_distance(model.reconstruct(tilde), tt)
    assert torch.equal(got, want)
    # a margin between the two smallest ratios d(x^, x~) / d(x~, x): exactly one window violates it
    ratio = sorted((per_sample_distance(model.reconstruct(tilde), tt) / per_sample_distance(tt, t)).tolist())
    model.push_pull.enabled, model.push_pull.alpha = True, (ratio[0] + ratio[1]) / 2
    split = window_violations(model, x, names)
    alpha = model.push_pull.alpha
    assert torch.equal(split, alpha * per_sample_distance(tt, t) > per_sample_distance(model.reconstruct(tilde), tt))
    assert 0 < float(split.float().mean()) < 1
    # alpha large enough: every sample violates; alpha 0: none
    model.push_pull.enabled, model.push_pull.alpha = True, 1e6
    assert bool(window_violations(model, x, names).all())
    model.push_pull.alpha = 0.0
    assert not bool(window_violations(model, x, names).any())


def _custom_task(root: Path, shared_data: Path, labels: dict[int, str]) -> Path:
    classes = sorted(set(labels.values()))
    lines = ["record," + ",".join(classes)]
    lines += [
        f"{shared_data / PTBXL / f'{n:05d}_hr'}," + ",".join(str(int(c == lab)) for c in classes)
        for n, lab in labels.items()
    ]
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test"):
        (root / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return root


def test_geometry_writes_outputs(runs: dict[str, Path], shared_data: Path, tmp_path: Path) -> None:
    labels = {n: ("A" if n <= 4 else "B" if n <= 8 else "X") for n in range(1, 11)}
    task = _custom_task(tmp_path / "task", shared_data, labels)
    out = tmp_path / "geo"
    dead, other_host = _left_by_killed_runs(out / "features", "metrics.csv")
    for path in (dead, other_host):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half a file\n")
    for space in ("features", "reconstruction"):
        assert (
            cli(
                "geometry",
                "--encoder",
                runs["level1"],
                "--task",
                f"custom:{task}",
                "--nominal",
                "A,B",
                "--anomalous",
                "X",
                "--space",
                space,
                "--out",
                out / space,
                "--device",
                "cpu",
            )
            == 0
        )
        data = np.load(out / space / "features.npz")
        assert data["x"].shape == data["x_hat"].shape == (10, 64)
        assert list(data["labels"]) == [labels[n] for n in range(1, 11)]
        from ecgpos.probes.geometry.dynamics import geometry

        res = geometry(data["x"], data["x_hat"], data["labels"], ["A", "B"], ["X"])
        with (out / space / "metrics.csv").open() as handle:
            rows = {r["metric"]: r for r in csv.DictReader(handle) if r["level"] == "1"}
        assert list(rows) == ["D_inter", "R", "S", "rho", "d_samp", "d_pool", "IC"]
        for m, r in rows.items():
            assert float(r["delta_pct"]) == pytest.approx(res.delta_pct[m], rel=1e-6)
        summary = (out / space / "summary.md").read_text()
        assert "Delta S > 0" in summary and "Carving criterion per level" in summary
        assert "## Levels 0 -> 1" in summary and (out / space / "depth.png").stat().st_size > 5000
        assert (out / space / "geometry.png").stat().st_size > 5000
    assert not dead.exists() and other_host.exists()
    # the two spaces are different readings of the same records
    assert not np.allclose(
        np.load(out / "features" / "features.npz")["x_hat"], np.load(out / "reconstruction" / "features.npz")["x_hat"]
    )


def test_geometry_interrupted_while_writing_leaves_no_earlier_run_beside_its_files(
    runs: dict[str, Path], shared_data: Path, tmp_path: Path, monkeypatch
) -> None:
    """A second geometry run into one --out (another --space), stopped by Ctrl-C as it renames
    features.npz into place: the earlier run's features, summary and figure used to stay beside the new metrics."""
    labels = {n: ("A" if n <= 4 else "B" if n <= 8 else "X") for n in range(1, 11)}
    task = _custom_task(tmp_path / "task", shared_data, labels)
    out = tmp_path / "geo"
    args = ["geometry", "--encoder", runs["level1"], "--task", f"custom:{task}", "--nominal", "A,B"]
    args += ["--anomalous", "X", "--out", out, "--device", "cpu"]
    assert cli(*args, "--space", "features") == 0
    ctrl_c_when_renaming(monkeypatch, "features.npz")
    assert cli(*args, "--space", "reconstruction") == 130
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["metrics.csv"]  # this run's, and no temporaries


def test_geometry_refusals(runs: dict[str, Path], shared_data: Path, tmp_path: Path, capsys) -> None:
    task = _custom_task(tmp_path / "task", shared_data, {1: "A", 2: "A", 3: "B", 4: "X"})
    base = ["geometry", "--encoder", str(runs["level1"]), "--task", f"custom:{task}", "--out", str(tmp_path / "g")]
    cases = [
        (["--nominal", "A", "--anomalous", "X"], "at least two"),
        (["--nominal", "A,B", "--anomalous", "B"], "both nominal and anomalous"),
        (["--nominal", "A,Q", "--anomalous", "X"], "no class Q"),
    ]
    task2 = _custom_task(tmp_path / "task2", shared_data, {1: "A", 2: "B", 3: "B", 4: "Y", 5: "A"})
    cases.append((["--task", f"custom:{task2}", "--nominal", "A,B", "--anomalous", "Y"], None))
    for extra, text in cases:
        capsys.readouterr()
        code = main(base + extra)
        if text is None:
            assert code == 0
            continue
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0]
    task4 = _custom_task(tmp_path / "task4", shared_data, {1: "A", 2: "B", 3: "C"})
    capsys.readouterr()
    task5 = _custom_task(tmp_path / "task5", shared_data, {1: "A", 2: "B", 3: "C", 4: "D"})
    (task5 / "test.csv").write_text(
        "record,A,B,C,D\n"
        + f"{shared_data / PTBXL / '00001_hr'},1,0,0,0\n"
        + f"{shared_data / PTBXL / '00002_hr'},0,1,0,0\n"
    )
    assert (
        cli(
            "geometry",
            "--encoder",
            runs["level1"],
            "--task",
            f"custom:{task5}",
            "--nominal",
            "A,B",
            "--anomalous",
            "C",
            "--out",
            tmp_path / "g",
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "anomalous record" in err[0]
    assert (
        cli(
            "geometry",
            "--encoder",
            runs["level0"],
            "--task",
            f"custom:{task4}",
            "--nominal",
            "A,B",
            "--anomalous",
            "C",
            "--out",
            tmp_path / "g",
        )
        == 2
    )
