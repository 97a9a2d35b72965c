"""The pretraining loop behind `ecgpos pretrain` (every level), on Accelerate.

- Global batch = per-process batch x processes x grad_accum (train.batch_size is the global one).
  Accumulation is explicit (no_sync on all but the last micro-batch), the data sampler is ours
  (not Accelerate's), and the lr is set from `lr_at(step)` before each update.
- Randomness that decides what a step computes is a pure function of (seed, step, slice): the windows
  come from the sampler, the masks (and level-1 perturbations) from a generator seeded with (seed,
  step, global micro-batch slice). A resumed run repeats the uninterrupted one exactly, and N
  processes x accum a equals 1 process x accum N*a.
- Steady-state steps never wait for the device: batches arrive pinned, in the shards' float16, are
  copied with non_blocking and widened on the device; the masks' random numbers are drawn on the
  device before the forward (which is then one graph when compiled; validation and figures run it
  uncompiled), the stats stay device tensors (MetricsLog), and a non-finite loss or grad norm on any process
  is decided on the device (NonFiniteGuard: the fused AdamW skips that update and every later one).
  The host reads flags and stats at log, validation, figure and checkpoint steps; a non-finite step
  found there stops every process with the last good checkpoint named (exit 1), nothing saved after.
- SIGUSR1/SIGTERM/Ctrl-C set a flag (ecgpos.pretrain.stop); one process acts on it at the next step
  boundary, several agree (all-reduce) at the next log step; then a checkpoint is saved and the run
  exits 0 (130 after Ctrl-C). Under `accelerate launch`, SIGTERM to the launcher reaches the workers.
- The main process holds the run folder's lock (ecgpos.pretrain.run_lock) from the end of the input
  checks to the end of the run: a second trainer into the same folder is refused.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import torch

from ecgpos import __version__
from ecgpos.config import save_config
from ecgpos.errors import ConfigError
from ecgpos.files import atomic_write_json, atomic_write_text, remove_abandoned_temporaries
from ecgpos.pretrain.checkpoint import Resumed, check_resumed_slices, remove_partial, resume_checkpoint, save_checkpoint
from ecgpos.pretrain.data import (
    ShardDataset,
    StepBatchSampler,
    model_input,
    non_finite_records,
    open_files_note,
    train_loader,
)
from ecgpos.pretrain.evaluation import training_figures, validation_means
from ecgpos.pretrain.guard import NonFiniteGuard
from ecgpos.pretrain.metrics_log import MetricsLog
from ecgpos.pretrain.optim import (
    build_optimizer,
    compile_failure,
    compile_model,
    compile_name,
    compile_notice,
    quiet_compile_logs,
    resolve_compile,
    resolve_mixed_precision,
    uncompile_model,
)
from ecgpos.pretrain.plan import RunPlan, other_pool
from ecgpos.pretrain.records import check_resumed_records, read_index, records_digest, split_index
from ecgpos.pretrain.run_lock import run_folder_lock
from ecgpos.pretrain.schedule import lr_at, step_generator
from ecgpos.pretrain.stop import StopRequest
from ecgpos.runs.levels import base_of, build_model
from ecgpos.runs.run_folder import FIGURES_DIR, RUN_CONFIG, RUN_INFO, SPEC_FILE, newest_checkpoint


class Trainer:
    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.cfg = plan.cfg
        self.run_dir = plan.run_dir
        self.stop = StopRequest()
        self.held = contextlib.ExitStack()  # the run folder's lock, from _setup to the end of run()

    # -- setup -------------------------------------------------------------------------------------
    def _setup(self) -> None:
        from accelerate import Accelerator

        cfg = self.cfg
        # cpu=True on hosts without CUDA: under torchrun / `accelerate launch --multi_gpu` it makes
        # Accelerate use gloo (MULTI_CPU) instead of silently running N independent 1-process jobs.
        self.acc = Accelerator(
            mixed_precision=resolve_mixed_precision(cfg.train.mixed_precision),
            cpu=not torch.cuda.is_available(),
            step_scheduler_with_optimizer=False,
        )
        p = self.acc.num_processes
        if cfg.train.batch_size % (p * cfg.train.grad_accum):
            raise ConfigError(
                f"train.batch_size {cfg.train.batch_size} is not divisible by {p} processes x "
                f"train.grad_accum {cfg.train.grad_accum}"
            )
        index = read_index(self.plan.shards)
        train_index, val_index = split_index(index, cfg.train.val_fraction)
        warnings = [other_pool(self.plan), open_files_note(len(index.paths), len(index))]
        if cfg.train.val_fraction > 0 and val_index is None:
            warnings.append(
                f"train.val_fraction {cfg.train.val_fraction} holds out none (or all) "
                f"of the {len(index)} records: no validation loss will be logged"
            )
        for warning in filter(None, warnings if self.acc.is_main_process else []):
            print(f"ecgpos pretrain: warning: {warning}", file=sys.stderr)
        self.records_sha256 = records_digest(train_index)
        self.sampler = StepBatchSampler(
            len(train_index), cfg.train.batch_size, cfg.train.grad_accum, p, self.acc.process_index, cfg.train.seed
        )
        self.train_set = ShardDataset(train_index, cfg.preprocess.window, train=True, seed=cfg.train.seed)
        self.figure_set = ShardDataset(val_index or train_index, cfg.preprocess.window, train=False)
        self.val_set = ShardDataset(val_index, cfg.preprocess.window, train=False) if val_index else None
        torch.manual_seed(cfg.train.seed)  # same initial weights on every process
        model = build_model(cfg, self.plan.base)
        self.optimizer = build_optimizer(model, cfg)
        self.model, self.optimizer = self.acc.prepare(model, self.optimizer)
        self.objective = self.acc.unwrap_model(self.model)  # the bare module: draw_noise, eval passes
        self.compile_mode = resolve_compile(
            cfg.train.compile, self.acc.device, self.acc.num_processes, cfg.train.grad_accum
        )
        self.compile_fallback: str | None = None  # why "auto" trains eagerly after all
        compile_model(self.objective, self.compile_mode)
        self.trainable = [q for q in self.model.parameters() if q.requires_grad]
        self.guard = NonFiniteGuard(self.acc.device, p)
        self.stat_keys: list[str] | None = None
        self.start_step = 0
        if self.acc.is_main_process:  # after every check of the inputs, before the run folder is read or written
            self.held.enter_context(run_folder_lock(self.run_dir))
        self.resumed = resume_checkpoint(self.acc, self.run_dir) if self.plan.resume else Resumed()
        state = self.resumed.state
        if state is not None:
            check_resumed_records(state, len(train_index), self.records_sha256)
            self.start_step = int(state["step"])
            if self.start_step < cfg.optim.steps:  # a finished run is only checked, nothing is trained
                check_resumed_slices(state, self.run_dir, p, cfg.train.grad_accum)
        self.sampler.start_step = self.start_step
        self.metrics = MetricsLog(self.run_dir, self.acc.is_main_process, self.start_step, self.plan.resume)

    def _write_run_files(self) -> None:
        if not self.acc.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        remove_partial(self.run_dir)
        for folder in (self.run_dir, self.run_dir / FIGURES_DIR):  # what a killed run on this host left
            remove_abandoned_temporaries(folder)
        save_config(self.cfg, self.run_dir / RUN_CONFIG)
        atomic_write_text(self.run_dir / SPEC_FILE, self.cfg.preprocess.to_json() + "\n")
        if self.start_step < self.cfg.optim.steps:  # a finished run stays finished while it is re-checked
            self._write_run_info(finished=False)

    def _write_run_info(self, finished: bool, **extra: Any) -> None:
        if not self.acc.is_main_process:
            return
        checkpoint = newest_checkpoint(self.run_dir)
        info = {
            "level": self.cfg.level,
            "step": getattr(self, "step", self.start_step),
            "steps": self.cfg.optim.steps,
            "finished": finished,
            "base": self.plan.base_source,
            "shards": [str(folder.resolve()) for folder in self.plan.shards],
            "checkpoint": str(checkpoint.resolve()) if checkpoint else None,  # absolute, as the shards
            "num_processes": self.acc.num_processes,
            "global_batch": self.cfg.train.batch_size,
            "per_process_batch": self.sampler.per_process,
            "grad_accum": self.cfg.train.grad_accum,
            "mixed_precision": self.acc.mixed_precision,
            "compile": compile_name(self.compile_mode),
            **({"compile_fallback": self.compile_fallback} if self.compile_fallback else {}),
            "num_train_records": self.sampler.num_records,
            "steps_per_epoch": self.sampler.steps_per_epoch,
            "ecgpos_version": __version__,
            **self.resumed.run_info(),
            **extra,
        }
        if self.plan.base_info:
            info["base_weights_sha256"] = self.plan.base_info["weights_sha256"]
            info["chain"] = self.plan.base_info["chain"]
        atomic_write_json(self.run_dir / RUN_INFO, info)

    # -- the compile -------------------------------------------------------------------------------
    def _compile_step(self) -> None:
        """Compile the training forward and backward before step 1, on a synthetic micro-batch with
        noise of its own, so a failing compile shows before any step or checkpoint rather than at the
        first one: "auto" then says why in one line and trains eagerly (run_info.json and every
        metrics record say so); an explicit mode stops with one line. The weights, the optimizer,
        the data order and every random stream of the run are untouched: the batch's gradients are
        dropped and nothing steps."""
        if self.compile_mode is False:
            return
        acc, encoder = self.acc, self.objective.encoder
        shape = (self.sampler.per_process, encoder.num_leads, self.cfg.preprocess.window)
        draw = torch.Generator(acc.device).manual_seed(self.cfg.train.seed)
        x = torch.randn(shape, generator=draw, device=acc.device)
        try:
            with quiet_compile_logs():
                out = self.model(x, noise=self.objective.draw_noise(len(x), draw, acc.device))
                acc.backward(out["loss"])
        except Exception as error:  # noqa: BLE001 - whatever stopped the compile is named in the line below
            cause = compile_failure(error)
            if self.cfg.train.compile != "auto":
                raise ConfigError(
                    f"train.compile={self.cfg.train.compile} cannot compile the training step ({cause}); "
                    f"use train.compile=false to train eagerly"
                ) from None
            uncompile_model(self.objective)
            self.compile_mode, self.compile_fallback = False, cause
            acc.print(
                f"ecgpos pretrain: warning: train.compile=auto could not compile the training step ({cause}); "
                f"training eagerly",
                file=sys.stderr,
            )
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        self.metrics.compiled = self.compile_mode is not False

    # -- one optimizer step ------------------------------------------------------------------------
    def _train_step(self, batches: Any, step: int) -> None:
        """Forward/backward over grad_accum micro-batches and the update; queues work, never waits."""
        cfg, acc = self.cfg, self.acc
        lr = lr_at(step, cfg.optim)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        parts = []
        for m in range(cfg.train.grad_accum):
            x = model_input(next(batches), acc.device)  # pinned by the loader on CUDA
            slice_index = m * acc.num_processes + acc.process_index
            sync = m == cfg.train.grad_accum - 1
            with contextlib.nullcontext() if sync else acc.no_sync(self.model):
                # drawn outside the (compiled) forward, which then needs no generator and is one graph
                draw = step_generator(cfg.train.seed, step, slice_index, device=acc.device)
                out = self.model(x, noise=self.objective.draw_noise(len(x), draw, acc.device))
                acc.backward(out["loss"] / cfg.train.grad_accum)
            # "loss" and whatever terms the objective reports in "log" go to metrics.jsonl
            terms = {"loss": out["loss"], **out.get("log", {})}
            if self.stat_keys is None:
                self.stat_keys = list(terms)
            parts.append(
                torch.stack(
                    [torch.as_tensor(terms[k], device=acc.device).detach().float().reshape(()) for k in self.stat_keys]
                )
            )
        stats = torch.stack(parts).mean(0)
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        # the gradients are already all-reduced (no scaler with bf16), so torch's clipping is Accelerate's
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, clip)
        self.optimizer.optimizer.found_inf = self.guard.update(step, stats, grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.metrics.add(self.stat_keys, stats, grad_norm, lr)

    def _stop_requested(self, log_step: bool) -> bool:
        """The stop signal, the same on every process: one process acts on it at once; several agree
        at log steps only (an all-reduce read on the host waits for the device)."""
        if self.acc.num_processes == 1:
            return self.stop.signum is not None
        if not log_step:
            return False
        flag = torch.tensor([float(self.stop.signum is not None)], device=self.acc.device)
        return bool(self.acc.reduce(flag, reduction="sum")[0] > 0)

    def _fail_if_non_finite(self) -> bool:
        """At a step where the host acts: True (after reporting) when a non-finite step was skipped."""
        bad = self.guard.check()
        if bad is None:
            return False
        last = newest_checkpoint(self.run_dir)
        self.step = bad.step - 1  # the weights are those after this step
        self._write_run_info(finished=False, failed=f"non-finite loss or grad norm at step {bad.step}")
        if self.acc.is_main_process:
            damaged = non_finite_records(self.train_set, self.sampler, bad.step - 1)
            print(
                f"ecgpos pretrain: error: non-finite loss or gradient at step {bad.step} "
                f"(loss {bad.loss}, grad norm {bad.grad_norm}); that update and any after it were skipped"
                + (f"; its batch holds NaN or inf samples of {damaged}: damaged shards" if damaged else "")
                + f". Last good checkpoint: {last or 'none'}",
                file=sys.stderr,
            )
        return True

    # -- periodic work -----------------------------------------------------------------------------
    def _checkpoint(self, step: int) -> None:
        epoch, batch = self.sampler.position(step)
        save_checkpoint(
            self.acc,
            self.run_dir,
            step,
            {
                "epoch": epoch,
                "batch_in_epoch": batch,
                "samples_seen": step * self.cfg.train.batch_size,
                "num_train_records": self.sampler.num_records,
                "train_records_sha256": self.records_sha256,
                "seed": self.cfg.train.seed,
                "num_processes": self.acc.num_processes,
                "grad_accum": self.cfg.train.grad_accum,
                "level": self.cfg.level,
            },
            self.cfg.train.keep_checkpoints,
        )
        self.saved_step = step
        self._write_run_info(finished=False)

    def _validate(self, step: int) -> None:
        if self.val_set is None:
            return
        loss, violation = validation_means(
            self.objective, self.val_set, self.sampler.per_process, self.cfg.train, self.acc
        )
        self._keep_base_frozen()
        self.metrics.log_val(step, loss, val_push_violation=violation)

    def _figure(self, step: int) -> None:
        if self.acc.is_main_process:
            training_figures(self.objective, self.figure_set, self.cfg, self.acc, self.run_dir, self.metrics.path, step)
            self._keep_base_frozen()

    def _keep_base_frozen(self) -> None:
        base = base_of(self.objective)
        if base is not None:
            base.eval()

    # -- the loop ------------------------------------------------------------------------------------
    def run(self) -> int:
        try:
            with self.stop.installed(), self.held:
                return self._run()
        finally:
            from accelerate.state import AcceleratorState

            if getattr(self, "acc", None) is not None:
                self.acc.end_training()  # destroys the process group of a multi-process run
            AcceleratorState._reset_state(True)  # a later run in this process (tests, demo) starts afresh

    def _run(self) -> int:
        from tqdm.auto import tqdm

        self._setup()
        cfg, acc, total = self.cfg, self.acc, self.cfg.optim.steps
        self.step = self.saved_step = self.start_step
        if self.step < total:
            held_out = f" (+{len(self.val_set)} held out for validation)" if self.val_set is not None else ""
            acc.print(
                f"ecgpos pretrain: level {cfg.level}, steps {self.step}->{total}, "
                f"global batch {cfg.train.batch_size} "
                f"= {self.sampler.per_process} x {acc.num_processes} processes x {cfg.train.grad_accum} accum, "
                f"{self.sampler.num_records} records{held_out}, device {acc.device}, precision {acc.mixed_precision}"
                f"{compile_notice(self.compile_mode)}"
            )
            self.model.train()
            self._keep_base_frozen()
            self._compile_step()  # before the run's files: a mode that cannot compile leaves none
        self._write_run_files()
        if self.step >= total:
            acc.print(f"ecgpos pretrain: {self.run_dir} already finished at step {self.step}")
            self._write_run_info(finished=True)
            return 0
        batches = iter(train_loader(self.train_set, self.sampler, cfg.train.num_workers))
        shown = acc.is_main_process and sys.stderr.isatty()
        bar = tqdm(total=total, initial=self.step, disable=not shown, dynamic_ncols=True, desc=f"level {cfg.level}")
        self.metrics.restart()
        while self.step < total:
            self._train_step(batches, self.step)
            self.step += 1
            step, last = self.step, self.step == total
            save = step % cfg.train.checkpoint_every == 0 or last
            # a checkpoint's step is logged too: a run resumed from it loses no step's record
            log_step = step % cfg.train.log_every == 0 or save
            stop = self._stop_requested(log_step)
            save = save or stop
            val = self.val_set is not None and (step % cfg.train.val_every == 0 or last)
            figure = step % cfg.train.figure_every == 0 or last
            # the host waits for the device only here, and never writes anything after a bad step
            if (log_step or stop or val or figure or save) and self._fail_if_non_finite():
                bar.close()
                self.metrics.close()
                return 1
            if log_step or stop:
                record = self.metrics.flush(step, step / self.sampler.steps_per_epoch, cfg.train.batch_size, acc)
                if record is not None:
                    bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}")
                    if bar.disable and acc.is_main_process:  # no progress bar: a log line
                        print(self.metrics.describe(record, total), flush=True)
            bar.update(1)
            started = time.perf_counter()
            if val:
                self._validate(step)
            if figure:
                self._figure(step)
            if save:
                self._checkpoint(step)
            self.metrics.pause(time.perf_counter() - started)
            if stop and not last:  # a signal during the last step: just finish
                self._write_run_info(finished=False, stopped=f"{self.stop.name} at step {step}")
                bar.close()
                acc.print(
                    f"ecgpos pretrain: stopped by {self.stop.name} at step {step}; checkpoint "
                    f"{newest_checkpoint(self.run_dir)} saved, continue with --resume auto"
                )
                self.metrics.close()
                return self.stop.exit_code
        bar.close()
        self.metrics.close()
        self._write_run_info(finished=True)
        acc.print(f"ecgpos pretrain: finished {total} steps; run folder {self.run_dir}")
        return 0
