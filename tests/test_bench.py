"""The benchmarks still run and still print their figure last (smallest sizes; nothing is timed here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench_process(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run bench/<script> in a fresh process."""
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def run_bench(script: str, *args: str, timeout: int = 300) -> list[str]:
    """Run bench/<script>, which must succeed; returns its stdout lines."""
    proc = bench_process(script, *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()


@pytest.mark.slow
def test_preprocess_bench_prints_both_ratios_last(shared_data: Path, tmp_path: Path) -> None:
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    src.mkdir(parents=True)
    for header in sorted((shared_data / "ecg-arrhythmia").rglob("JS*.hea"))[:4]:
        for path in (header, header.with_suffix(".mat")):
            (src / path.name).symlink_to(path.resolve())
    lines = run_bench("preprocess.py", "--src", str(tmp_path / "src"), "--scale", "2")
    assert re.fullmatch(r"ratio: \d+\.\d\dx .* \(over the stricter one: \d+\.\d\dx\)", lines[-1]), lines[-1]
    assert any(line.startswith("peak RSS") and "4 records" in line and "8 records" in line for line in lines)


@pytest.mark.slow
def test_probe_bench_prints_its_figure_last(shared_data: Path) -> None:  # the bench reads the sample records
    lines = run_bench("probe.py", "--epochs", "1", "--seeds", "1")
    assert re.match(r"full probe protocol on 2 CPU cores: \d+\.\d s wall", lines[-1]), lines[-1]


@pytest.mark.slow
def test_train_step_bench_reports_the_frozen_level0_share() -> None:
    lines = run_bench(
        "train_step.py",
        "--config",
        str(ROOT / "configs/tiny/level1.yaml"),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--threads",
        "1",
    )
    fields = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    assert fields["level"] == "1" and float(fields["samples_per_s"]) > 0
    assert 0 < float(fields["level0_forward_share"]) < 1


@pytest.mark.slow
def test_train_step_bench_puts_a_level_2_step_next_to_a_level_1_step() -> None:
    config = str(ROOT / "configs/tiny/level1.yaml")
    lines = run_bench(
        "train_step.py", "--config", config, "--level", "2", "--batch", "4", "--steps", "1", "--warmup", "0"
    )
    fields = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    assert fields["level"] == "2" and float(fields["level1_step_ms"]) > 0 and float(fields["level2_over_level1"]) > 0
    assert 0 < float(fields["base_forward_ms"])


@pytest.mark.slow
def test_train_step_bench_compiles_the_step_as_one_graph() -> None:
    """The bench draws the masks outside the model, as the trainer does: one graph, and the first
    line says how many there were and how long the first (compiling) step took."""
    lines = run_bench(
        "train_step.py", "--config", str(ROOT / "configs/tiny/level0.yaml"), "--batch", "8", "--compile",
        "--steps", "2", "--warmup", "1", "--threads", "1",
    )  # fmt: skip
    assert re.search(r"compile True \(1 graph\), first step [\d.]+ s", lines[0]), lines[0]
    fields = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    assert fields["compile"] == "True" and fields["graphs"] == "1" and float(fields["first_step_s"]) > 0


@pytest.mark.slow
def test_train_step_bench_compiles_latent_levels_1_and_2() -> None:
    """`--level 2 --compile` compiles a level-2 step (the frozen levels 0 and 1 inside its graph) and
    the level-1 step it is timed beside; both print, with their ratio."""
    lines = run_bench(
        "train_step.py", "--config", str(ROOT / "configs/tiny/level1.yaml"), "--level", "2", "--compile",
        "--batch", "4", "--steps", "1", "--warmup", "1", "--threads", "1", timeout=600,
    )  # fmt: skip
    assert re.search(r"compile True \(1 graph\)", lines[0]), lines[0]
    fields = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    assert fields["level"] == "2" and fields["compile"] == "True" and float(fields["step_ms"]) > 0
    assert float(fields["level1_step_ms"]) > 0 and float(fields["level2_over_level1"]) > 0


@pytest.mark.slow
def test_predict_bench_prints_records_per_s_last(shared_data: Path) -> None:  # it predicts the sample records
    lines = run_bench(
        "predict.py", "--config", str(ROOT / "configs/tiny/level0.yaml"), "--records", "4", "--batch", "2",
        "--threads", "1",
    )  # fmt: skip
    pattern = r"predict: \d+\.\d records/s end to end; classifier alone torch \d+\.\d, onnxruntime \d+\.\d records/s"
    assert re.fullmatch(pattern + r" \(\d+\.\d\dx\)", lines[-1]), lines[-1]


@pytest.mark.slow
def test_finetune_bench_prints_its_ratio_to_pretraining_last() -> None:
    lines = run_bench(
        "finetune.py",
        "--config",
        str(ROOT / "configs/tiny/level0.yaml"),
        "--batch",
        "4",
        "--steps",
        "1",
        "--warmup",
        "1",
    )
    assert re.fullmatch(r"finetune/pretrain samples/s: \d+\.\d\dx \(FLOP/s: \d+\.\d\dx; .*\)", lines[-1]), lines[-1]
    assert any(line.startswith("finetune: step") for line in lines) and any(
        line.startswith("pretrain:") for line in lines
    )


def test_loader_bench_prints_samples_per_s_last(arrhythmia_shards: Path) -> None:
    lines = run_bench(
        "loader.py",
        "--shards",
        str(arrhythmia_shards),
        "--workers",
        "0",
        "--batch",
        "8",
        "--batches",
        "3",
        "--train-samples-per-s",
        "100",
    )
    fields = dict(item.split("=", 1) for item in lines[-1].split()[1:])
    assert float(fields["samples_per_s"]) > 0
    assert float(fields["ratio"]) == pytest.approx(float(fields["samples_per_s"]) / 100, rel=0.01, abs=0.05)


def test_bench_bad_input_is_one_line(tmp_path: Path) -> None:
    proc = bench_process("loader.py", "--shards", str(tmp_path / "none"))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"shard folder {tmp_path / 'none'} does not exist"]


def test_gpu_check_reports_wheels_and_sample_data_it_could_not_set_up(tmp_path: Path) -> None:
    """A wheel that does not install or a sample-data archive that does not unpack is a summary row,
    not a silent run without wfdb or without the real-data tests."""
    copy = tmp_path / "repo"
    (copy / "bench").mkdir(parents=True)
    (copy / "bench" / "gpu_check.sh").write_bytes((ROOT / "bench" / "gpu_check.sh").read_bytes())
    (copy / ".whl").mkdir()
    (copy / ".whl" / "broken-1.0-py3-none-any.whl").write_bytes(b"not a wheel")
    (copy / "gpu_data").mkdir()
    (copy / "gpu_data" / "sample-data.tar.xz").write_bytes(b"not an archive")
    # an interpreter without wfdb, as on the GPU image, so that the script installs the wheels into it
    bare = tmp_path / "bare-python"
    subprocess.run([sys.executable, "-m", "venv", str(bare)], check=True, capture_output=True, timeout=120)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": str(bare / "bin" / "python"),
        "BUDGET": "5",
        "SKIP_PYTEST": "1",
        "OUT": str(tmp_path / "out"),
    }
    proc = subprocess.run(
        ["bash", str(copy / "bench" / "gpu_check.sh")], cwd=copy, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert re.search(r"^install \.whl +1 .*failed", summary, re.M), summary
    assert re.search(r"^unpack sample data +1 .*failed", summary, re.M), summary
    # the checkout is installed into that interpreter as an editable install would be: importable, on PATH
    assert [p.read_text().strip() for p in bare.glob("lib/python*/site-packages/ecgpos-checkout.pth")] == [str(copy)]
    assert f"{bare / 'bin' / 'python'} -m ecgpos" in (bare / "bin" / "ecgpos").read_text()


@pytest.mark.slow
def test_scale_bench_prints_its_table_and_the_worst_growth_last(tmp_path: Path) -> None:
    """bench/scale.py at its smallest: one tiny corpus, every cost measured, the growth line last, the
    corpus removed."""
    work = tmp_path / "work"
    lines = run_bench(
        "scale.py", "--sizes", "64", "--steps", "2", "--probe-set-records", "200", "--probe-records", "24",
        "--loader-batches", "10", "--work", str(work),
    )  # fmt: skip
    assert re.fullmatch(r"worst growth 64 -> 64 records: \d+\.\d\dx \(.+\)", lines[-1]), lines[-1]
    rows = [line for line in lines if line.startswith("| ")]
    assert len(rows) == 14 and rows[0].startswith("| cost | unit | N=64 | growth |")
    assert re.search(r"ecgpos geometry \(2 levels\) [\d.]+ s .* ecgpos score \(2 levels, 8 masks\) [\d.]+ s", lines[-2])
    assert any(re.match(r"N=64: start-up [\d.]+ s, resume [\d.]+ s, trainer RSS \d+ MB", line) for line in lines)
    assert not work.exists()


@pytest.mark.slow
def test_depth_study_quick_names_both_depths(tmp_path: Path) -> None:
    """Two levels, one seed, both settings: the label-free and label-based readings per level, and the
    depths they give on the last line."""
    import json

    lines = run_bench("depth_study.py", "--quick", "--out", str(tmp_path / "study"), timeout=1500)
    assert re.fullmatch(r"right depth [01],[01]; criterion depth [01],[01]; agree [0-2]/2", lines[-1]), lines[-1]
    results = json.loads((tmp_path / "study" / "results.json").read_text())
    assert [(r["setting"], len(r["levels"])) for r in results] == [("off", 2), ("push-pull", 2)]  # seed 0 of each
    for level in (r for result in results for r in result["levels"]):
        assert 0 <= level["criterion"] <= 1 and 0 <= level["pass_through"]
        assert 0 <= level["auroc_join"][0] <= 1 and level["auroc_join"][1] <= level["auroc_join"][2]
        assert level["rankme"] >= 1 and level["perturbation"] == "principal"
        assert 0 <= level["probe_auroc"] <= 1 and level["perturbation_over_error"] == pytest.approx(2, rel=1e-3)
    for result in results:  # geometry measures each level against the one above it
        assert result["levels"][0]["geometry"] == {} and {"S", "rho", "IC"} <= set(result["levels"][1]["geometry"])
    assert (tmp_path / "study" / "depth.png").stat().st_size > 5000
    assert "Agreement with the right depth" in (tmp_path / "study" / "table.md").read_text()
