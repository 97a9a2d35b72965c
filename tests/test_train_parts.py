"""Pieces of the trainer on their own: data order and windows, lazy HDF5, checkpoints, figures."""

from __future__ import annotations

import itertools
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from shard_fixtures import write_tiny_shards

from ecgpos.errors import ConfigError
from ecgpos.pretrain.checkpoint import prune_checkpoints
from ecgpos.pretrain.data import ShardDataset, StepBatchSampler, model_input, train_loader, window_start
from ecgpos.pretrain.figures import plot_reconstruction, plot_training_curves
from ecgpos.pretrain.records import read_index, split_index
from ecgpos.runs.run_folder import checkpoint_name, list_checkpoints, newest_checkpoint


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_shards(
        tmp_path_factory.mktemp("parts") / "shards", n_records=30, records_per_shard=12, max_length=3500
    )


def take(sampler: StepBatchSampler, count: int) -> list[list[tuple[int, int]]]:
    return list(itertools.islice(iter(sampler), count))


def test_global_batches_do_not_depend_on_process_count() -> None:
    one = StepBatchSampler(50, 8, grad_accum=2, num_processes=1, process_index=0, seed=3)
    two = [StepBatchSampler(50, 8, grad_accum=1, num_processes=2, process_index=p, seed=3) for p in (0, 1)]
    for step in range(20):  # crosses epoch boundaries (6 steps per epoch)
        a = one.micro_batches(step)
        b = [two[p].micro_batches(step)[0] for p in (0, 1)]
        assert a == b and len(a[0]) == 4


def test_epochs_visit_each_record_once_and_reshuffle() -> None:
    sampler = StepBatchSampler(50, 8, 1, 1, 0, seed=0)
    epoch0 = np.concatenate([sampler.global_batch_indices(s) for s in range(6)])
    epoch1 = np.concatenate([sampler.global_batch_indices(s) for s in range(6, 12)])
    assert len(set(epoch0)) == 48 and len(set(epoch1)) == 48
    assert not np.array_equal(epoch0, epoch1)
    assert {e for batch in take(sampler, 12) for _, e in batch} == {0, 1}


def test_resumed_sampler_continues_the_same_stream() -> None:
    full = take(StepBatchSampler(50, 8, 2, 1, 0, seed=5), 2 * 15)
    resumed = take(StepBatchSampler(50, 8, 2, 1, 0, seed=5, start_step=7), 2 * 8)
    assert resumed == full[14:]


def test_window_starts_random_in_training_and_centred_in_eval() -> None:
    starts = {window_start(3000, 2250, True, 0, epoch, 7) for epoch in range(50)}
    assert len(starts) > 10 and min(starts) >= 0 and max(starts) <= 750
    assert window_start(3000, 2250, True, 0, 4, 7) == window_start(3000, 2250, True, 0, 4, 7)
    assert window_start(3000, 2250, False, 0, 4, 7) == 375
    assert window_start(2000, 2250, True, 0, 0, 0) == 0


def test_dataset_reads_true_lengths_and_opens_files_lazily(shards: Path) -> None:
    index = read_index(shards)
    assert len(index) == 30 and len(set(index.length.tolist())) > 5
    data = ShardDataset(index, 2250, train=False)
    assert len(data._files) == 0  # nothing opened by construction
    x = data[4]
    assert x.shape == (12, 2250) and x.dtype == torch.float16 and len(data._files) == 1  # storage precision
    i, start = 4, (int(index.length[4]) - 2250) // 2
    with h5py.File(index.paths[index.shard[i]], "r") as f:
        expected = f["signals"][index.row[i], :, start : start + 2250]
    assert np.array_equal(x.numpy(), expected)
    clone = pickle.loads(pickle.dumps(data))  # what a worker receives: no handles
    assert len(clone._files) == 0 and torch.equal(clone[4], x)


def test_open_files_are_bounded(shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ecgpos.pretrain.data

    monkeypatch.setattr(ecgpos.pretrain.data, "MAX_OPEN_FILES", 2)
    data = ShardDataset(read_index(shards), 2250, train=False)
    first = [data[i] for i in range(30)]  # 3 shards
    assert len(data._files) == 2 and all(torch.equal(a, data[i]) for i, a in enumerate(first))


def test_several_shard_folders_are_pooled(shards: Path, tmp_path: Path) -> None:
    other = write_tiny_shards(tmp_path / "other", n_records=7, seed=9)
    pooled = read_index([shards, other])
    assert len(pooled) == 37 and len(pooled.paths) == 4 and pooled.record_id[-1].startswith("TINY09")
    data = ShardDataset(pooled, 2250, train=False)
    assert torch.equal(data[36], ShardDataset(read_index(other), 2250, train=False)[6])
    with pytest.raises(ConfigError, match="more than once"):
        read_index([shards, shards])
    # overlapping folders (a subset beside its corpus, one set copied under another name) would train
    # on the shared records twice as often
    (tmp_path / "copy").mkdir()
    shutil.copy(sorted(shards.glob("shard-*.h5"))[1], tmp_path / "copy")
    copied = read_index(tmp_path / "copy")
    expected = f"{len(copied)} record id(s) occur more than once in the shards, e.g. {copied.record_id[0]} in"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        read_index([shards, other, tmp_path / "copy"])


def test_workers_deliver_the_same_batches_as_the_main_process(shards: Path) -> None:
    index = read_index(shards)
    data = ShardDataset(index, 2250, train=True, seed=1)
    batches = []
    for workers in (0, 2):
        sampler = StepBatchSampler(len(index), 6, 1, 1, 0, seed=1, start_step=3)
        loader = train_loader(data, sampler, workers)
        if workers:  # forked: the workers inherit the trainer's stop-signal handlers on any Python
            assert loader.multiprocessing_context.get_start_method() == "fork"
        stream = iter(loader)
        batches.append([next(stream) for _ in range(4)])
        del stream
    for a, b in zip(*batches):
        assert torch.equal(a, b)


LOADER_IN_A_TRAINER = """
import multiprocessing, sys
from pathlib import Path
from ecgpos.pretrain.data import ShardDataset, StepBatchSampler, train_loader
from ecgpos.pretrain.records import read_index
index = read_index([Path(sys.argv[1])])
sampler = StepBatchSampler(len(index), 4, 1, 1, 0, seed=0)
BATCHES = iter(train_loader(ShardDataset(index, 2250, train=True, seed=0), sampler, 1))
next(BATCHES)
print(*[child.pid for child in multiprocessing.active_children()], flush=True)
sys.stdin.readline()
for _ in range(3):
    next(BATCHES)
print("read", flush=True)
"""  # BATCHES is still referenced at exit: multiprocessing then terminates the worker and waits for it


def test_loader_workers_outlive_a_sigterm_from_others_but_not_their_trainers(shards: Path) -> None:
    """Slurm's SIGTERM reaches every process of a job: a worker killed by it crashed the trainer
    ("DataLoader worker ... killed by signal") before it could checkpoint. The trainer's own SIGTERM
    still ends a worker: at exit multiprocessing terminates a live worker and waits for it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LOADER_IN_A_TRAINER, str(shards)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 1, proc.stderr.read() if proc.poll() is not None else workers
        os.kill(workers[0], signal.SIGTERM)  # sent by this process, not by the trainer: Slurm's
        time.sleep(0.5)
        out, err = proc.communicate("go\n", timeout=120)  # waiting forever here is the failure too
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.strip() == "read", err[-2000:]


LOADER_STARTING_UNDER_A_JOB_WIDE_SIGTERM = """
import os, sys, time
from pathlib import Path
from ecgpos.pretrain.data import ShardDataset, StepBatchSampler, train_loader
from ecgpos.pretrain.records import read_index
from ecgpos.pretrain.stop import StopRequest
from ecgpos.workers import outlive_others_sigterm

def slow_start(worker_id):
    # torch's worker start-up (its SIGTERM handler already installed) until our worker_init_fn takes
    # over lasts tens of milliseconds; here long enough for the signal to land in it every time
    os.write(1, b"starting\\n")  # one write: the two workers' lines never interleave (print writes twice)
    time.sleep(1)
    outlive_others_sigterm()

index = read_index([Path(sys.argv[1])])
loader = train_loader(ShardDataset(index, 2250, train=True, seed=0), StepBatchSampler(len(index), 4, 1, 1, 0, 0), 2)
loader.worker_init_fn = slow_start
with StopRequest().installed() as stop:
    batches = iter(loader)
    for _ in range(6):
        next(batches)
print("read after", stop.name, flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="sigwaitinfo tells a signal's sender on Linux")
def test_loader_workers_still_starting_outlive_a_job_wide_sigterm(shards: Path) -> None:
    """A SIGTERM to the whole process group (Slurm) while the loader workers start used to kill a worker
    in torch's start-up, before worker_init_fn ran, and the trainer died with it ("DataLoader worker
    ... exited unexpectedly") instead of writing its checkpoint. Now the trainer alone takes it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LOADER_STARTING_UNDER_A_JOB_WIDE_SIGTERM, str(shards)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline() == "starting\n", proc.stderr.read() if proc.poll() is not None else ""
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out.splitlines()[-1] == "read after SIGTERM", err[-2000:]
    with pytest.raises(ProcessLookupError):  # and no worker is left behind
        os.killpg(proc.pid, 0)


def test_batches_are_widened_to_float32_exactly(shards: Path) -> None:
    data = ShardDataset(read_index(shards), 2250, train=False)
    batch = data.__getitems__(list(range(8)))
    x = model_input(batch, "cpu")
    assert x.dtype == torch.float32 and np.array_equal(x.numpy(), batch.numpy().astype(np.float32))


def test_pooled_float16_and_float32_shards_keep_float32_values(shards: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    from ecgpos.ecg.spec import DEFAULT_SPEC

    wide = write_tiny_shards(tmp_path / "f32", n_records=5, seed=3, spec=replace(DEFAULT_SPEC, dtype="float32"))
    pooled = read_index([shards, wide])
    assert pooled.dtype == np.float32 and read_index(shards).dtype == np.float16
    data = ShardDataset(pooled, 2250, train=False)
    items = [30, 0, 34, 5]  # float32 rows and float16 rows in one batch
    batch = data.__getitems__(items)
    assert batch.dtype == torch.float32 and torch.equal(batch, torch.stack([data[i] for i in items]))
    with h5py.File(pooled.paths[-1], "r") as f:
        start = (int(pooled.length[34]) - 2250) // 2
        assert np.array_equal(batch[2].numpy(), f["signals"][pooled.row[34], :, start : start + 2250])


def test_validation_split_by_record_id(shards: Path) -> None:
    index = read_index(shards)
    train, val = split_index(index, 0.3)
    assert val is not None and 0 < len(val) < len(index)
    assert set(train.record_id).isdisjoint(val.record_id) and len(train) + len(val) == len(index)
    assert split_index(index, 0.3)[1].record_id == val.record_id
    assert split_index(index, 0.0)[1] is None


def test_newest_checkpoint_ignores_partial_and_prune_keeps_last(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (5, 10, 15):
        folder = root / checkpoint_name(step)
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text(f'{{"step": {step}}}')
        (folder / "model.safetensors").write_bytes(b"x")
    (root / f"{checkpoint_name(20)}.tmp").mkdir()
    (root / checkpoint_name(25)).mkdir()  # no trainer state: not complete
    assert newest_checkpoint(tmp_path).name == checkpoint_name(15)
    prune_checkpoints(tmp_path, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [10, 15]
    assert not (root / f"{checkpoint_name(20)}.tmp").exists()


def test_figures_write_pngs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 2250)).astype(np.float32)
    mask = np.zeros((12, 30), dtype=bool)
    mask[:, ::2] = True
    out = plot_reconstruction(x, x.reshape(12, 30, 75) * 0.5, mask, tmp_path / "r.png")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(f'{{"step": {s}, "loss": {1 / s:f}, "lr": 0.1, "grad_norm": 1}}\n' for s in range(1, 9))
        + '{"step": 8, "val_loss": 0.3}\n{"step": 9, "lo'
    )
    curves = plot_training_curves(metrics, tmp_path / "c.png")
    for path in (out, curves):
        assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 5000


def test_batched_reads_equal_per_item_reads_bit_for_bit(shards: Path) -> None:
    rng = np.random.default_rng(0)
    index = read_index(shards)
    for train in (True, False):
        data = ShardDataset(index, 2250, train=train, seed=4)
        items = [(int(i), int(e)) for i, e in zip(rng.permutation(30), rng.integers(0, 100, 30))]
        batch = data.__getitems__(items)
        assert batch.dtype == torch.float16 and torch.equal(batch, torch.stack([data[item] for item in items]))
        assert torch.equal(data.__getitems__(list(range(30))), torch.stack([data[i] for i in range(30)]))


def test_a_step_saved_twice_replaces_its_checkpoint_without_a_moment_of_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saving a step that already had a checkpoint deleted the old folder before renaming the new one in:
    a kill between the two lost the step. Now the old one is renamed aside, the new one in, then the old
    one deleted; a kill in between leaves the old one aside, and the next save or resume puts it back."""
    import os

    from accelerate import Accelerator

    from ecgpos.config import save_config
    from ecgpos.files import read_safetensors
    from ecgpos.pretrain.checkpoint import resume_checkpoint, save_checkpoint
    from ecgpos.pretrain.plan import check_run_dir
    from ecgpos.runs.run_config import RunConfig
    from ecgpos.runs.run_folder import RUN_CONFIG

    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    model, optimizer = acc.prepare(model, torch.optim.AdamW(model.parameters()))
    root, final = tmp_path / "checkpoints", tmp_path / "checkpoints" / checkpoint_name(30)

    def save(value: float, step: int = 30) -> Path:
        with torch.no_grad():
            model.weight.fill_(value)
        return save_checkpoint(acc, tmp_path, step, {"epoch": 0, "value": value}, keep=3)

    def weight(folder: Path) -> float:
        return float(read_safetensors(folder / "model.safetensors")["weight"][0, 0])

    assert save(1.0) == final and weight(final) == 1.0
    assert save(2.0) == final and weight(final) == 2.0  # saved twice: the second one is kept
    assert [p.name for p in root.iterdir()] == [final.name]  # nothing set aside is left

    # killed after the old folder went aside, before the new one was renamed in
    renames = os.rename, os.replace

    def killed(src, dst, *args, **kwargs):  # noqa: ANN001, ANN202
        if str(src).endswith(".tmp") and Path(dst) == final:
            raise KeyboardInterrupt("killed")
        return renames[0](src, dst, *args, **kwargs)

    def save_killed(value: float) -> None:
        with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
            patched.setattr(os, "rename", killed)
            patched.setattr(os, "replace", killed)
            save(value)

    save_killed(3.0)
    assert newest_checkpoint(tmp_path) is None  # step 30 is only aside: --resume auto must still resume
    save_config(RunConfig(), tmp_path / RUN_CONFIG)  # what the trainer writes before its first step
    assert check_run_dir(RunConfig(), tmp_path, True, {}) is True
    resumed = resume_checkpoint(acc, tmp_path)  # puts the set-aside step 30 back, drops the unfinished one
    assert resumed.checkpoint == final and resumed.state["value"] == 2.0 and weight(final) == 2.0
    assert sorted(p.name for p in root.iterdir()) == [final.name]
    save_killed(4.0)  # the same kill again; this time the next save cleans up
    save(5.0, step=40)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [30, 40] and weight(final) == 2.0
    assert sorted(p.name for p in root.iterdir()) == [final.name, checkpoint_name(40)]


def test_more_shards_than_a_worker_keeps_open_are_named_with_the_shard_size_that_fits() -> None:
    from ecgpos.pretrain.data import MAX_OPEN_FILES, open_files_note

    assert open_files_note(MAX_OPEN_FILES, 1000 * MAX_OPEN_FILES) == ""
    records = 2_300_000  # CODE's size in 1000-record shards: 2,300 files
    note = open_files_note(records // 1000, records)
    assert "2300 shards" in note and f"more than the {MAX_OPEN_FILES}" in note
    per_shard = int(note.split("--records-per-shard ")[1].split()[0])
    assert -(-records // per_shard) <= MAX_OPEN_FILES < -(-records // (per_shard - 1))  # the smallest that fits
