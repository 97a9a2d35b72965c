"""Pretraining data: windows of shard records, in an order that a resumed run reproduces exactly.

- `ShardDataset` reads one window per item from the HDF5 shards. Files are opened lazily in the
  process that reads (a DataLoader worker), never in the parent before workers fork: an HDF5
  handle inherited across fork is not safe. Training draws a random window start from
  `lengths` (the true length; shards are zero-padded); evaluation takes the centre window.
- Windows travel in the shards' storage precision (float16 unless a shard is float32): half the
  bytes from worker to trainer and to the GPU. `model_input` widens a batch to float32 on the
  model's device, exactly (every float16 is a float32).
- `StepBatchSampler` is an endless stream of per-process micro-batches. The order of epoch e is
  a permutation drawn from (seed, e); optimizer step k of the whole run uses global batch
  k mod steps_per_epoch of epoch k // steps_per_epoch, so the data position is a pure function
  of the step. Each item is (index, epoch) and the window start comes from (seed, epoch, index),
  so a resumed run sees the same windows whichever worker reads them. That holds only for the same
  records in the same order, which `ecgpos.pretrain.records` checks on resume.
- The global batch is split the same way for any process count: micro-batch m of process p is
  a fixed slice of it, so 1 and N processes see identical global batches.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import h5py
import numpy as np
import torch
from h5py import h5s
from torch.utils.data import DataLoader, Dataset, Sampler, default_collate, get_worker_info

from ecgpos.errors import ConfigError
from ecgpos.pretrain.records import RecordIndex
from ecgpos.workers import born_with_sigterm_blocked, outlive_others_sigterm

MAX_OPEN_FILES = 512  # per reading process; the paper pool at 1000 records/shard is ~165 files


def open_files_note(num_shards: int, num_records: int) -> str:
    """'' when a loader process can keep every shard open; otherwise the warning to print. Beyond
    MAX_OPEN_FILES shards, a window from a shard that is not open pays an open and a close: with a fifth
    of the shards open, the loader's CPU per window was 2.5-2.8x (docs/benchmarks/data-loading.md, bench/scale.py)."""
    if num_shards <= MAX_OPEN_FILES:
        return ""
    per_shard = -(-num_records // MAX_OPEN_FILES)
    return (
        f"the records lie in {num_shards} shards, more than the {MAX_OPEN_FILES} a loader worker keeps open, so "
        f"most windows reopen their shard (up to ~2.5x the loader's CPU per sample); preprocessing with "
        f"--records-per-shard {per_shard} or more keeps them all open"
    )


def window_start(length: int, window: int, train: bool, seed: int, epoch: int, index: int) -> int:
    """Start of the window: uniform in [0, length - window] from (seed, epoch, index) in training,
    the centre in evaluation; 0 for records shorter than the window (zero-padded in the shard)."""
    slack = int(length) - window
    if slack <= 0:
        return 0
    if not train:
        return slack // 2
    return int(np.random.default_rng([seed, epoch, index]).integers(0, slack + 1))


class ShardDataset(Dataset):
    """Items are (index, epoch) pairs (from StepBatchSampler) or plain indices (epoch 0).

    __getitem__ -> tensor (12, window) in the shards' storage precision (`index.dtype`); the
    trainer widens batches on its device with `model_input`.
    """

    def __init__(self, index: RecordIndex, window: int, train: bool = True, seed: int = 0) -> None:
        self.index = index
        self.window = window
        self.train = train
        self.seed = seed
        self._files: OrderedDict[int, h5py.File] = OrderedDict()
        self._pid = -1

    def __len__(self) -> int:
        return len(self.index)

    def _signals(self, shard: int) -> h5py.Dataset:
        """The shard's `signals` dataset, its file kept open (LRU-bounded) in this process."""
        if self._pid != os.getpid():  # first use in this process (e.g. a fresh worker): never reuse a parent's handle
            self._files, self._pid = OrderedDict(), os.getpid()
        if shard in self._files:
            self._files.move_to_end(shard)
        else:
            if len(self._files) >= MAX_OPEN_FILES:  # least recently used handle goes (open-file limits)
                self._files.popitem(last=False)[1].file.close()
            # no chunk cache: a chunk is one record, whose window is read once, and h5py's default 1 MiB
            # cache per open file grew each loader process by ~110 MB per 165 shards (the paper's pool)
            self._files[shard] = h5py.File(self.index.paths[shard], "r", rdcc_nbytes=0)["signals"]
        return self._files[shard]

    def _starts(self, items: Sequence[int | tuple[int, int]]) -> tuple[np.ndarray, list[int]]:
        pairs = [(item, 0) if isinstance(item, (int, np.integer)) else item for item in items]
        i = np.array([int(p[0]) for p in pairs], dtype=np.int64)
        length = self.index.length
        return i, [
            window_start(int(length[k]), self.window, self.train, self.seed, e, int(k)) for k, (_, e) in zip(i, pairs)
        ]

    def __getitem__(self, item: int | tuple[int, int]) -> torch.Tensor:
        i, epoch = (item, 0) if isinstance(item, (int, np.integer)) else item
        start = window_start(int(self.index.length[i]), self.window, self.train, self.seed, epoch, i)
        return self._read(int(i), start)

    def _read(self, i: int, start: int) -> torch.Tensor:
        x = self._signals(int(self.index.shard[i]))[int(self.index.row[i]), :, start : start + self.window]
        if x.shape[-1] < self.window:  # stored width shorter than the window cannot happen for valid shards
            x = np.pad(x, ((0, 0), (0, self.window - x.shape[-1])))
        return torch.from_numpy(np.ascontiguousarray(x, dtype=self.index.dtype))

    def __getitems__(self, items: Sequence[int | tuple[int, int]]) -> torch.Tensor:
        """A whole batch -> one tensor (B, 12, window), equal to stacking self[item] for each item:
        rows read in (shard, row) order straight into the batch tensor, with no conversion."""
        i, starts = self._starts(items)
        leads = self._signals(int(self.index.shard[i[0]])).shape[1]
        out = _batch_tensor((len(i), leads, self.window), self.index.dtype)
        buf = out.numpy()
        memory, plain = h5s.create_simple(buf.shape[1:]), []
        for k in np.lexsort((self.index.row[i], self.index.shard[i])):
            signals, start = self._signals(int(self.index.shard[i[k]])), int(starts[k])
            if signals.dtype != buf.dtype or signals.shape[1] != buf.shape[1] or start + self.window > signals.shape[2]:
                plain.append(k)  # an odd shard (other dtype or too narrow): the per-item path
                continue
            # h5py's low-level read: one hyperslab straight into the buffer's row, without the
            # per-call selection machinery of dataset[...] (most of a window's read time)
            space = signals.id.get_space()
            space.select_hyperslab((int(self.index.row[i[k]]), 0, start), (1, buf.shape[1], self.window))
            signals.id.read(memory, space, buf[k])
        for k in plain:
            out[k] = self._read(int(i[k]), int(starts[k]))
        return out

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_files"], state["_pid"] = OrderedDict(), -1  # handles never travel to another process
        return state


def _batch_tensor(shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    """A zeroed tensor; in a DataLoader worker it lives in shared memory from the start, as
    default_collate's output does, so sending it to the main process copies nothing."""
    like = torch.from_numpy(np.zeros(0, dtype=dtype))
    if get_worker_info() is None:
        return like.new_zeros(shape)
    try:  # the allocation default_collate itself uses in workers (shared memory starts zeroed)
        storage = like._typed_storage()._new_shared(int(np.prod(shape)), device="cpu")
        return like.new(storage).view(shape)
    except AttributeError:  # a torch without that internal: the public way, one extra copy
        return like.new_zeros(shape).share_memory_()


def model_input(batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A loader batch as the model's float32 input on `device`: copied in storage precision (from
    pinned memory without waiting), widened there."""
    return batch.to(device, non_blocking=True).float()


def collate_windows(batch: torch.Tensor | list) -> torch.Tensor | list:
    """Collate for ShardDataset: a batch from __getitems__ is already one tensor."""
    return batch if isinstance(batch, torch.Tensor) else default_collate(batch)


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The record order of one epoch: a permutation of range(n) from (seed, epoch)."""
    return np.random.default_rng([seed, 1_000_003, epoch]).permutation(n)


class StepBatchSampler(Sampler):
    """Endless per-process micro-batches of (index, epoch), starting at optimizer step `start_step`.

    Step k uses global batch b = k % steps_per_epoch of epoch e = k // steps_per_epoch: records
    perm_e[b*G:(b+1)*G] (G = global batch; the last partial batch of an epoch is dropped).
    Micro-batch m (of grad_accum) for process p takes a fixed slice of per_process items.
    """

    def __init__(
        self,
        num_records: int,
        global_batch: int,
        grad_accum: int,
        num_processes: int,
        process_index: int,
        seed: int,
        start_step: int = 0,
    ) -> None:
        if global_batch % (grad_accum * num_processes):
            raise ConfigError(
                f"train.batch_size {global_batch} is not divisible by grad_accum {grad_accum} "
                f"x {num_processes} processes"
            )
        if num_records < global_batch:
            raise ConfigError(
                f"the shards hold {num_records} training records, fewer than the global batch {global_batch}"
            )
        self.num_records = num_records
        self.global_batch = global_batch
        self.grad_accum = grad_accum
        self.num_processes = num_processes
        self.process_index = process_index
        self.per_process = global_batch // (grad_accum * num_processes)
        self.seed = seed
        self.start_step = start_step
        self.steps_per_epoch = num_records // global_batch
        self._cached_epoch, self._cached_perm = -1, np.zeros(0, dtype=np.int64)

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch in epoch) of optimizer step `step` (0-based)."""
        return divmod(step, self.steps_per_epoch)

    def _perm(self, epoch: int) -> np.ndarray:
        if self._cached_epoch != epoch:  # one permutation per epoch, not per step
            self._cached_epoch, self._cached_perm = epoch, epoch_permutation(self.num_records, self.seed, epoch)
        return self._cached_perm

    def global_batch_indices(self, step: int) -> np.ndarray:
        """Record indices of the whole global batch of optimizer step `step`."""
        epoch, b = self.position(step)
        return self._perm(epoch)[b * self.global_batch : (b + 1) * self.global_batch]

    def micro_batches(self, step: int) -> list[list[tuple[int, int]]]:
        """This process's grad_accum micro-batches of (index, epoch) for step `step`."""
        epoch, _ = self.position(step)
        batch = self.global_batch_indices(step)
        out = []
        for m in range(self.grad_accum):
            first = (m * self.num_processes + self.process_index) * self.per_process
            out.append([(int(i), epoch) for i in batch[first : first + self.per_process]])
        return out

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        step = self.start_step
        while True:
            yield from self.micro_batches(step)
            step += 1


def non_finite_records(dataset: ShardDataset, sampler: StepBatchSampler, step: int) -> str:
    """Which records of optimizer step `step`'s (0-based) global batch hold NaN or inf samples, as
    'ID (shard row N), ...' ('' when none): what a non-finite loss from damaged shards is reported with."""
    epoch, _ = sampler.position(step)
    index = dataset.index
    bad = [int(i) for i in sampler.global_batch_indices(step) if not torch.isfinite(dataset[(int(i), epoch)]).all()]
    return ", ".join(f"{index.record_id[i]} ({index.paths[index.shard[i]]} row {index.row[i]})" for i in bad)


# Loader workers are forked where the OS can: they inherit the trainer's stop-signal handlers, so
# SIGUSR1 or Ctrl-C sent to the whole process group does not kill them, whatever the interpreter's
# default (forkserver from Python 3.14, whose server process would die of such a signal). SIGTERM, whose
# handler torch's worker start-up replaces, they ignore unless the trainer sends it (ecgpos.workers).
WORKER_START = "fork" if "fork" in multiprocessing.get_all_start_methods() else None


class WorkerLoader(DataLoader):
    """Its workers begin with SIGTERM blocked, until their worker_init_fn takes it (ecgpos.workers)."""

    def __iter__(self) -> Iterator:
        with born_with_sigterm_blocked():  # the first iter() forks the workers; later ones reuse them
            return super().__iter__()


def train_loader(dataset: ShardDataset, sampler: StepBatchSampler, num_workers: int) -> DataLoader:
    """DataLoader over the endless sampler; its own generator so it never touches the global RNG."""
    return WorkerLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        pin_memory=torch.cuda.is_available(),
        prefetch_factor=4 if num_workers > 0 else None,
        generator=torch.Generator().manual_seed(0),
        collate_fn=collate_windows,
        multiprocessing_context=WORKER_START if num_workers > 0 else None,
        worker_init_fn=outlive_others_sigterm,
    )


def eval_batches(
    dataset: ShardDataset, batch_size: int, max_batches: int, process_index: int = 0, num_processes: int = 1
) -> list[tuple[int, list[int]]]:
    """This process's fixed evaluation batches as (k, records): the first max_batches * batch_size
    records in batches of batch_size, batch k evaluated by process k % num_processes. Batch k (and
    the masks drawn for it from k) is the same for any number of processes."""
    n = min(len(dataset), batch_size * max_batches)
    starts = range(0, n, batch_size)
    return [
        (k, list(range(s, min(s + batch_size, n)))) for k, s in enumerate(starts) if k % num_processes == process_index
    ]


def eval_loader(dataset: ShardDataset, batches: Sequence[Sequence[int]], num_workers: int) -> DataLoader:
    """Loader for the validation set; persistent workers because it is iterated again and again."""
    workers = min(num_workers, 2)
    return WorkerLoader(
        dataset,
        batch_sampler=[list(b) for b in batches],
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=collate_windows,
        multiprocessing_context=WORKER_START if workers > 0 else None,
        worker_init_fn=outlive_others_sigterm,
    )
