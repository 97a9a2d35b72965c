"""metrics.jsonl and TensorBoard of a run: one record per logged step, continuous across resumes.

A training record is written every train.log_every steps and at every checkpoint step (so a
resumed run has the losses of every step before its checkpoint). Each: step (optimizer steps
done), epoch (fractional), loss (mean over the steps since the previous record and over all
processes), lr (of the last update), grad_norm (global, before clipping, of the last update),
samples_per_s (global; wall time of the interval's steps, read after the device finished them,
periodic work excluded), time; plus every scalar the objective reports in its "log" (level 1:
recon_loss, pp_loss, push_active, sp_loss). Validation records hold step and val_loss. On resume,
records after the checkpoint's step are dropped (TensorBoard: purged), so the file reads as one
uninterrupted run; a start without a checkpoint removes both logs of the attempt before.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from ecgpos.files import atomic_write_text
from ecgpos.runs.run_folder import METRICS_FILE, TB_DIR


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep only records with step <= last_step. A line that is no record is dropped as well: a
    half-written last line, or one that is not a JSON object or whose step is not a number."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                continue
            step = int(record.get("step", 0))
        except (ValueError, TypeError, OverflowError):  # unreadable JSON; a step such as "x", null, [1] or inf
            continue
        if step <= last_step:
            kept.append(line)
    atomic_write_text(path, "".join(k + "\n" for k in kept))


class MetricsLog:
    """Accumulates per-step stats as device tensors on every process; `flush` (a collective call)
    reads them once and writes a record."""

    def __init__(self, run_dir: Path, is_main: bool, start_step: int, resume: bool) -> None:
        self.path = run_dir / METRICS_FILE
        self.is_main = is_main
        self.writer = None
        self.compiled = False  # whether the training step ran compiled: each train record says so
        self._reset()
        if not is_main:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume and start_step > 0:
            truncate_metrics(self.path, start_step)
        else:  # a fresh start: nothing of an earlier attempt remains, in either log
            self.path.unlink(missing_ok=True)
            for events in (run_dir / TB_DIR).glob("events.out.tfevents.*"):
                events.unlink()
        try:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a crashed attempt wrote after the checkpoint
            self.writer = SummaryWriter(str(run_dir / TB_DIR), purge_step=start_step + 1 if start_step else None)
        except ImportError:  # tensorboard comes with the train extra; keep training if an install lacks it
            self.writer = None

    def _reset(self) -> None:
        self.keys: list[str] = []
        self.sums: torch.Tensor | None = None  # float64 on the device: per-key sums of the step means
        self.grad_norm: torch.Tensor | None = None
        self.steps = 0
        self.started = time.perf_counter()
        self.paused = 0.0
        self.lr = float("nan")

    def add(self, keys: list[str], stats: torch.Tensor, grad_norm: torch.Tensor, lr: float) -> None:
        """One step's means (a (len(keys),) device tensor) and grad norm; nothing waits for the device."""
        if self.sums is None:
            self.keys, self.sums = keys, stats.detach().double()
        else:
            self.sums += stats.detach().double()
        self.grad_norm = grad_norm.detach()
        self.steps += 1
        self.lr = lr

    def restart(self) -> None:
        """Start the interval's clock now (before the first step: set-up is not training time)."""
        self.started, self.paused = time.perf_counter(), 0.0

    def pause(self, seconds: float) -> None:
        """Time spent on periodic work (validation, figures, checkpoints): not training time."""
        self.paused += seconds

    def flush(self, step: int, epoch: float, global_batch: int, acc: Any) -> dict[str, Any] | None:
        """Average the interval over processes and write it (main process) -> the record or None.

        The one device->host read of the interval happens here; the interval's time is taken after
        it, so samples_per_s counts the time the device needed, not only the time to queue the work."""
        if self.steps == 0 or self.sums is None:
            return None
        local = torch.cat([self.sums / self.steps, self.grad_norm.double().reshape(1)]).tolist()
        seconds = time.perf_counter() - self.started - self.paused
        values = torch.tensor([*local[:-1], seconds], dtype=torch.float64, device=acc.device)
        if acc.num_processes > 1:
            values = acc.reduce(values, reduction="mean")
        record: dict[str, Any] = {"step": step, "epoch": round(epoch, 4)}
        # sorted keys: the records read the same whatever order the objective returns them in
        means = dict(zip(self.keys, values[:-1].tolist()))
        record.update({k: means[k] for k in sorted(means)})
        record.update(
            lr=self.lr,
            grad_norm=local[-1],
            samples_per_s=global_batch * self.steps / max(float(values[-1]), 1e-9),
            compiled=self.compiled,
            time=time.time(),
        )
        self._reset()
        if self.is_main:
            self._write(record)
            if self.writer is not None:
                for key, value in record.items():
                    if key not in ("step", "time", "compiled"):
                        self.writer.add_scalar(f"train/{key}", value, step)
        return record

    def log_val(self, step: int, val_loss: float, **extra: float) -> None:
        """One validation line; extra values (e.g. val_push_violation) go beside val_loss."""
        if self.is_main:
            self._write({"step": step, "val_loss": val_loss, **extra, "time": time.time()})
            if self.writer is not None:
                self.writer.add_scalar("val/loss", val_loss, step)
                for key, value in extra.items():
                    self.writer.add_scalar(f"val/{key.removeprefix('val_')}", value, step)

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")

    @staticmethod
    def describe(record: dict[str, Any], total: int) -> str:
        standard = ("step", "epoch", "loss", "lr", "grad_norm", "samples_per_s", "compiled", "time")
        extra = "".join(f" {k} {v:.4f}" for k, v in record.items() if k not in standard)
        return (
            f"step {record['step']}/{total} loss {record['loss']:.4f}{extra} lr {record['lr']:.3e} "
            f"grad_norm {record['grad_norm']:.3f} {record['samples_per_s']:.1f} samples/s"
        )

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None
