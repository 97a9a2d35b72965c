"""Commands killed (SIGKILL) or interrupted (Ctrl-C) at a chosen moment, then run again: the rerun
continues without repeating or losing work, and the interruption is reported in one line."""

from __future__ import annotations

import csv
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from pretrain_helpers import FAST, TINY0, TINY1, max_diff, metrics, pretrain, weights
from shard_fixtures import write_tiny_shards

from ecgpos.cli import main
from ecgpos.demo.demo import _carve
from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.ecg.wfdb_io import read_wfdb_record
from ecgpos.errors import Interrupted
from ecgpos.export.load import load_encoder
from ecgpos.pretrain.data import StepBatchSampler
from ecgpos.probes.linear.features import extract_features, raw_source
from ecgpos.probes.shared.datasets import RecordLocator
from ecgpos.runs.run_folder import list_checkpoints

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def start(*args: str | Path) -> subprocess.Popen:
    """`ecgpos ARGS` in a process group of its own (as a terminal or Slurm runs it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ecgpos.cli", *map(str, args)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert path.exists(), proc.communicate()[1][-2000:]


def test_pretrain_killed_after_a_checkpoint_off_the_log_cadence_logs_every_step(shards: Path, tmp_path: Path) -> None:
    """log_every 3, checkpoint_every 5: killed right after the step-5 checkpoint, the resumed run's
    metrics.jsonl equals the uninterrupted one's (no record repeated, no step's loss left out)."""
    flags = ["--set", "train.log_every=3", "--set", "train.checkpoint_every=5", "--set", "train.figure_every=1000"]
    flags += ["--set", "optim.steps=12"]
    assert pretrain(0, shards, tmp_path / "straight", *flags) == 0
    run = tmp_path / "killed"
    args = ["pretrain", "--level", "0", "--config", TINY0, "--shards", shards, "--run-dir", run, *FAST, *flags]
    proc = start(*args)
    wait_for(run / "checkpoints" / "step-0000005", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [s for s, _ in list_checkpoints(run)] in ([5], [10])
    assert pretrain(0, shards, run, *flags, "--resume", "auto") == 0
    straight, resumed = metrics(tmp_path / "straight"), metrics(run)
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == [3, 5, 6, 9, 10, 12]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], abs=1e-6)
    assert max_diff(weights(run), weights(tmp_path / "straight")) <= 1e-6


def test_pretrain_restarted_before_its_first_checkpoint_keeps_no_curve_of_the_attempt_before(tmp_path: Path) -> None:
    """A run that stopped before any checkpoint (here a non-finite loss at step 3) starts afresh on
    --resume auto: metrics.jsonl and TensorBoard hold the new attempt's steps once each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    bad = int(StepBatchSampler(48, 8, 1, 1, 0, seed=0).global_batch_indices(2)[0])
    shards = write_tiny_shards(tmp_path / "nan", n_records=48, records_per_shard=48, nan_records={bad})
    run = tmp_path / "run"
    flags = ["--set", "optim.steps=6", "--set", "train.checkpoint_every=100", "--set", "train.figure_every=100"]
    assert pretrain(0, shards, run, *flags) == 1
    assert pretrain(0, shards, run, *flags, "--resume", "auto") == 1
    assert list_checkpoints(run) == [] and [r["step"] for r in metrics(run)] == [1, 2]
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2]


def _file_size_limit() -> None:
    """In the child: writes past 600 bytes of a file fail (EFBIG), as on a full disk or quota."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600, resource.RLIM_INFINITY))


def test_pretrain_resume_that_cannot_write_keeps_the_run_config(tiny_run: Path, tiny_shards: Path, tmp_path) -> None:
    """Each start rewrites config.yaml: a write that fails there (here a file size limit, as a full
    disk) leaves the run's config as it was, so the next resume goes on."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    shutil.rmtree(run / "checkpoints" / "step-0000004")
    before = (run / "config.yaml").read_bytes()
    assert len(before) > 600
    sets = ["optim.steps=4", "train.batch_size=4", "train.num_workers=0", "train.checkpoint_every=2"]
    args = ["pretrain", "--level", "0", "--config", "tiny/level0", "--shards", tiny_shards, "--run-dir", run]
    args += [*(a for s in sets for a in ("--set", s)), "--resume", "auto"]
    command = [sys.executable, "-m", "ecgpos.cli", *map(str, args)]
    done = subprocess.run(command, env=ENV, capture_output=True, text=True, preexec_fn=_file_size_limit, timeout=120)
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr[-2000:]
    assert (run / "config.yaml").read_bytes() == before and [p.name for p in run.glob(".config.yaml*")] == []
    assert main([str(a) for a in args]) == 0
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]


def test_probe_ctrl_c_during_extraction_keeps_the_features_extracted(shared_data: Path, tmp_path: Path) -> None:
    """Ctrl-C while the third chunk is embedded: the first two chunks are in the cache, and the rerun
    extracts only the records after them."""
    source = raw_source(DEFAULT_SPEC)
    embed, calls = source.embed, []

    def interrupted(records: list[np.ndarray], windows: int) -> np.ndarray:
        calls.append(len(records))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return embed(records, windows)

    keys = [f"records500/00000/{i:05d}_hr" for i in range(1, 41)]
    locator = RecordLocator("ptbxl", shared_data)
    source.embed = interrupted
    with pytest.raises(Interrupted, match=f"the features extracted so far are cached in {tmp_path};"):
        extract_features(source, "ptbxl", keys, locator, tmp_path, windows=1, chunk=8)
    source.embed = embed
    features, stats = extract_features(source, "ptbxl", keys, locator, tmp_path, windows=1, chunk=8)
    assert (stats.cached, stats.extracted, len(features)) == (16, 24, 40)
    again, _ = extract_features(raw_source(DEFAULT_SPEC), "ptbxl", keys, locator, tmp_path / "fresh", 1, chunk=8)
    assert all(np.array_equal(features[k], again[k]) for k in keys)


def test_probe_ctrl_c_says_features_are_cached_only_when_they_are(shared_data, tmp_path, monkeypatch, capsys):
    """Ctrl-C before any record was extracted (while the encoder loads) used to say that the features
    were cached in a --cache-dir that did not even exist; after the extraction it names the cache."""
    import ecgpos.probes.linear.cli

    task, cache = tmp_path / "task", tmp_path / "cache"
    task.mkdir()
    for split, numbers in (("train", range(1, 9)), ("val", range(9, 13)), ("test", range(13, 17))):
        rows = [f"{shared_data / 'ptbxl/records500/00000' / f'{n:05d}_hr'},{n % 2},{1 - n % 2}" for n in numbers]
        (task / f"{split}.csv").write_text("\n".join(["record,A,B", *rows]) + "\n")
    args = ["probe", "--encoder", "random:tiny/level0", "--task", f"custom:{task}", "--fractions", "100"]
    args += ["--seeds", "1", "--epochs", "1", "--workers", "1", "--cache-dir", cache, "--out", tmp_path / "out"]

    def ctrl_c(*_args, **_kwargs):
        raise KeyboardInterrupt

    lines = []
    for where in ("load_probe_encoder", "run_jobs"):  # before the extraction; after it, as the probes train
        monkeypatch.setattr(ecgpos.probes.linear.cli, where, ctrl_c)
        capsys.readouterr()
        assert main([str(a) for a in args]) == 130
        monkeypatch.undo()
        lines.append(capsys.readouterr().err.strip().splitlines()[-1])
        assert cache.exists() == (where == "run_jobs")
    assert lines == [
        "ecgpos probe: interrupted: no partial output was kept; run the same command again",
        f"ecgpos probe: interrupted: the features extracted so far are cached in {cache}; the same command reuses them",
    ]
    assert len(list(cache.glob("custom-*.npz"))) == 1


def test_sigterm_stops_probe_with_one_line_and_the_rerun_completes(shared_data, tmp_path) -> None:
    """SIGTERM (scancel, a Slurm time limit) used to kill `ecgpos probe` without a word (exit -15);
    now it stops as Ctrl-C does: one `terminated:` line, exit 143, no temporaries, and the rerun works."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = ["probe", "--encoder", "random:tiny/level0", "--task", "ptbxl-super", "--data-root", shared_data]
    args += ["--splits", shared_data / "merl_splits", "--fractions", "100", "--seeds", "1", "--epochs", "1"]
    args += ["--workers", "1", "--cache-dir", cache, "--out", out]
    proc = start(*args)
    wait_for(cache, proc)  # made just before the extraction
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("ecgpos probe: terminated: "), err
    assert [p.name for folder in (cache, out) for p in folder.glob(".*")] == []
    assert main([str(a) for a in args]) == 0 and (out / "probe.json").is_file()


def _kill_export_while_staging(tiny_run: Path, out: Path) -> None:
    """Start `ecgpos export` to `out` and SIGKILL it once its staging folder holds the weights."""
    proc = start("export", "--run-dir", tiny_run, "--out", out)
    deadline = time.monotonic() + 120
    while not list(out.parent.glob(f".{out.name}.partial-*/model.safetensors")) and time.monotonic() < deadline:
        time.sleep(0.002)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_export_killed_while_staging_keeps_the_old_export_and_the_rerun_cleans_up(
    tiny_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "enc"
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(out)]) == 0
    before = (out / "model.safetensors").read_bytes()
    _kill_export_while_staging(tiny_run, out)
    assert (out / "model.safetensors").read_bytes() == before and load_encoder(out) is not None
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc"]  # no staging folder left beside it
    assert main(["verify", str(out)]) == 0


def test_an_export_a_kill_left_aside_survives_the_next_killed_export(tiny_run: Path, tmp_path: Path) -> None:
    """A kill between the two renames of a re-export leaves the earlier export only aside (.enc.old-PID);
    the next export puts it back before anything else, instead of deleting it as a leftover, so a second
    kill does not lose the only complete export."""
    out = tmp_path / "enc"
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(out)]) == 0
    before = (out / "model.safetensors").read_bytes()
    out.rename(tmp_path / ".enc.old-4242")  # the state a kill between the two renames leaves
    _kill_export_while_staging(tiny_run, out)
    assert (out / "model.safetensors").read_bytes() == before and load_encoder(out) is not None


@pytest.mark.parametrize(
    ("sig", "said"),
    [(signal.SIGINT, "continues from its `carve` step"), (signal.SIGTERM, "carving stopped at level 0")],
)
def test_demo_step_stopped_by_a_signal_is_an_interruption_not_an_error(
    shards: Path, tmp_path: Path, sig: int, said: str
) -> None:
    """Ctrl-C or SIGTERM during the demo's carving: the level in training saves a checkpoint (exit 130, or
    0 after SIGTERM, as a scheduler expects), and the demo reports an interruption that its rerun continues
    from: not a failed step (exit 2), and never the next step built on an unfinished level."""
    runs = tmp_path / "runs"
    metrics_file = runs / "level0" / "metrics.jsonl"

    def signal_after_three_steps() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 3:
                os.kill(os.getpid(), sig)  # the trainer's handler, in the main thread, takes it
                return
            time.sleep(0.01)

    threading.Thread(target=signal_after_three_steps, daemon=True).start()
    args = ["--config", TINY0, "--latent-config", TINY1, "--shards", shards, "--stop-below", 0, "--min-drop", -1]
    with pytest.raises(Interrupted, match=said):
        _carve(runs, 2, *args, *FAST, "--set", "optim.steps=400", "--set", "train.checkpoint_every=1000")
    assert len(list_checkpoints(runs / "level0")) == 1


def test_a_second_trainer_into_a_busy_run_folder_is_refused(shards: Path, tmp_path: Path, capsys) -> None:
    """Two trainers must never interleave checkpoints and metrics in one run folder; the lock goes
    with its process, so once the first is killed the same folder resumes."""
    run = tmp_path / "run"
    flags = ["--set", "optim.steps=300", "--set", "train.checkpoint_every=5", "--set", "train.num_workers=1"]
    proc = start("pretrain", "--level", "0", "--config", TINY0, "--shards", shards, "--run-dir", run, *FAST, *flags)
    try:
        wait_for(run / "checkpoints" / "step-0000005", proc)
        capsys.readouterr()
        assert proc.poll() is None
        assert pretrain(0, shards, run, *flags, "--resume", "auto") == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and f"is being written by another ecgpos pretrain (pid {proc.pid} on " in err
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    steps = [r["step"] for r in metrics(run)]
    assert steps == list(range(1, steps[-1] + 1))  # the refused trainer wrote nothing
    assert pretrain(0, shards, run, *flags, "--resume", "auto") == 0
    assert [r["step"] for r in metrics(run)] == list(range(1, 301))


def _npy_inputs(real_record: Path, folder: Path) -> None:
    """three.npy: two records and one refused (NaN, listed in FILE.skipped.csv); one.npy: one record;
    bad.npy: only the refused one."""
    folder.mkdir(parents=True, exist_ok=True)
    x = read_wfdb_record(real_record).signal
    bad = x.copy()
    bad[3, 100] = np.nan
    np.save(folder / "three.npy", np.stack([x, x[:, ::-1], bad]))
    np.save(folder / "one.npy", x[None])
    np.save(folder / "bad.npy", bad[None])


def _npy_args(command: str, model: Path, npy: Path, out: Path, *more: str | Path) -> list[str]:
    model_flag = "--encoder" if command == "embed" else "--run"
    flags = ["--fs", "500", "--leads", ",".join(CANONICAL_LEADS), "--out", out, "--no-progress", *more]
    return [str(a) for a in (command, model_flag, model, "--input", npy, *flags)]


@pytest.mark.parametrize("command", ["embed", "score"])
def test_output_files_interrupted_between_renames_never_mix_two_runs(
    command, export, tiny_run, real_record, tmp_path, monkeypatch
) -> None:
    """embed writes FILE.npy, FILE.ids.txt and FILE.skipped.csv, score FILE.csv and FILE.skipped.csv.
    Interrupted between two of their renames, FILE used to hold the new run's rows beside the earlier
    run's ids or skipped list; now FILE is the earlier run's with its own files, or absent."""
    _npy_inputs(real_record, tmp_path)
    out = tmp_path / ("f.npy" if command == "embed" else "s.csv")
    model = export if command == "embed" else tiny_run

    def args(npy: str) -> list[str]:
        return _npy_args(command, model, tmp_path / npy, out)

    assert main(args("three.npy")) == 0
    files = [p for p in tmp_path.iterdir() if p.name.startswith(f"{out.stem}.")]
    assert len(files) == (3 if command == "embed" else 2)
    before = {p: p.read_bytes() for p in files}
    replace = os.replace
    for n in range(1, len(files) + 1):  # Ctrl-C at the n-th rename of the second run
        renamed: list[str] = []

        def interrupted(src, dst, n=n, renamed=renamed):
            renamed.append(dst)
            if len(renamed) == n:
                raise KeyboardInterrupt
            replace(src, dst)

        monkeypatch.setattr(os, "replace", interrupted)
        assert main(args("one.npy")) == 130
        monkeypatch.undo()
        if out.exists():
            assert {p: p.read_bytes() for p in files} == before, n
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporaries
        for path, data in before.items():
            path.write_bytes(data)
    assert main(args("one.npy")) == 0
    assert (tmp_path / f"{out.stem}.skipped.csv").read_text().splitlines() == ["record_id,reason,detail"]


@pytest.mark.parametrize("command", ["embed", "score"])
def test_a_run_that_embeds_or_scores_nothing_leaves_no_earlier_output_beside_its_skipped_list(
    command, export, tiny_run, real_record, tmp_path, capsys
) -> None:
    """Every record refused: the run writes FILE.skipped.csv (exit 2). The earlier run's FILE,
    FILE.ids.txt and FILE.summary.md used to stay beside it and read as this run's output."""
    _npy_inputs(real_record, tmp_path / "in")
    out = tmp_path / "out" / ("f.npy" if command == "embed" else "s.csv")
    model = export if command == "embed" else tiny_run
    labels = tmp_path / "in" / "labels.csv"
    labels.write_text("record_id,label\n0,A\n1,N\n2,A\n3,N\n")  # an AUROC needs 2 records of each class
    x = np.load(tmp_path / "in" / "one.npy")[0]
    np.save(tmp_path / "in" / "four.npy", np.stack([x, x[:, ::-1], np.roll(x, 500, 1), np.roll(x[:, ::-1], 500, 1)]))
    more = ["--labels", labels, "--nominal", "N", "--anomalous", "A"] if command == "score" else []
    assert main(_npy_args(command, model, tmp_path / "in" / "four.npy", out, *more)) == 0
    earlier = ["f.ids.txt", "f.npy", "f.skipped.csv"] if command == "embed" else ["s.csv", "s.skipped.csv"]
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([*earlier, *(["s.summary.md"] if more else [])])
    capsys.readouterr()
    assert main(_npy_args(command, model, tmp_path / "in" / "bad.npy", out)) == 2
    assert "none of the 1 " in capsys.readouterr().err
    assert sorted(p.name for p in out.parent.iterdir()) == [f"{out.stem}.skipped.csv"]  # and no temporaries
    with (out.parent / f"{out.stem}.skipped.csv").open() as handle:
        assert [row["record_id"] for row in csv.DictReader(handle)] == ["0"]
