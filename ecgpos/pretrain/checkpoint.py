"""Checkpoints of a run: written atomically, the last K kept, the newest complete one found on resume.

Layout: RUN/checkpoints/step-0001000/ holds what `accelerator.save_state` writes (model.safetensors,
optimizer.bin, random_states_<rank>.pkl) plus trainer_state.json (step, epoch, batch in epoch,
samples seen, per-process RNG states as JSON). Everything is first written to
step-0001000.tmp/ and renamed only when complete, so a crash mid-write leaves at worst a .tmp
folder (ignored and removed later), never a half-written step-N folder, and never touches the
previous checkpoint. Old checkpoints are deleted only after the new one is in place. A step saved
again (a stop signal right after a periodic save) replaces its folder the same way: the old one is
renamed aside (.step-0001000.old-PID), the new one renamed in, then the old one deleted; a kill in
between leaves the old one aside, and the next save or resume renames it back.
"""

from __future__ import annotations

import base64
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ecgpos.errors import ConfigError, EcgposError
from ecgpos.files import atomic_write_json, make_public, recover_replaced, replace_folder
from ecgpos.runs.run_folder import (
    CHECKPOINT_DIR,
    STATE_FILE,
    WEIGHTS_FILE,
    checkpoint_name,
    incomplete_checkpoints,
    list_checkpoints,
    read_trainer_state,
)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU, CUDA) as JSON-able values."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of rng_state()."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        cuda = [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def save_checkpoint(accelerator: Any, run_dir: str | Path, step: int, trainer_state: dict[str, Any], keep: int) -> Path:
    """Write checkpoint `step` atomically on all processes (collective call); prune to `keep`.

    trainer_state: JSON-able dict (step, epoch, batch_in_epoch, ...); the RNG states of every
    process are added under "rng" (a list indexed by process).
    """
    from accelerate.utils import gather_object

    root = Path(run_dir) / CHECKPOINT_DIR
    final = root / checkpoint_name(step)
    tmp = root / (final.name + ".tmp")
    rng = gather_object([rng_state()]) if accelerator.num_processes > 1 else [rng_state()]
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        make_public(tmp)  # safetensors writes the weights owner-only
        atomic_write_json(tmp / STATE_FILE, {**trainer_state, "step": step, "rng": rng}, compact=True)
        replace_folder(tmp, final)  # the same step saved again (e.g. a signal right after a periodic save)
        prune_checkpoints(run_dir, keep)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints, and leftover .tmp folders."""
    found = list_checkpoints(run_dir)
    for _, path in found[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)
    remove_partial(run_dir)


def remove_partial(run_dir: str | Path) -> None:
    """Finish a replacement of a checkpoint that a kill interrupted (the old folder set aside is put
    back, or deleted when the new one is in place), then remove .tmp folders a crash mid-save left."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if root.is_dir():
        recover_replaced(root)
        for path in root.glob("step-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(accelerator: Any, checkpoint: str | Path) -> dict[str, Any]:
    """Restore model, optimizer and RNG states (collective call) -> trainer state dict.

    accelerate's loader uses torch.load(weights_only=True) for the optimizer and safetensors for
    the weights; our own state is JSON, so nothing here unpickles arbitrary objects.
    """
    state = read_trainer_state(checkpoint)
    accelerator.load_state(str(checkpoint))
    rng = state.get("rng") or []
    if len(rng) == accelerator.num_processes:  # same world size: every process gets its own RNG back
        set_rng_state(rng[accelerator.process_index])
    return state


@dataclass
class Resumed:
    """What `resume_checkpoint` found: the trainer state (None: start fresh), and what it passed over."""

    state: dict[str, Any] | None = None
    checkpoint: Path | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)

    def run_info(self) -> dict[str, Any]:
        """run_info.json fields: resumed_from and, when any was passed over, skipped_checkpoints."""
        if self.checkpoint is None:
            return {}
        return {"resumed_from": str(self.checkpoint), **({"skipped_checkpoints": self.skipped} if self.skipped else {})}


def resume_checkpoint(accelerator: Any, run_dir: str | Path) -> Resumed:
    """Restore the newest complete checkpoint that loads (collective call).

    A checkpoint whose files do not load (a corrupt model.safetensors, optimizer.bin, RNG or
    trainer state) is reported in one line on stderr and the previous one is tried; the next
    complete checkpoint then restores every state in full, so nothing of the broken one remains.
    Once one loads, the broken ones are renamed step-N.corrupt: kept for inspection, but no longer
    taken for the run's newest checkpoint (by export, pruning or the next resume). So are step-N
    folders that lack their trainer state or weights, at once: a later save of their step would
    otherwise replace them without a word.
    No checkpoint at all: start fresh. Checkpoints, but none loads: EcgposError (exit 2).
    """
    if accelerator.is_main_process:  # a checkpoint a killed save set aside is put back first (run lock held)
        remove_partial(run_dir)
    accelerator.wait_for_everyone()
    incomplete = _set_aside_incomplete(accelerator, Path(run_dir).resolve())
    found = list_checkpoints(Path(run_dir).resolve())  # absolute: run_info.json is read from anywhere
    skipped: list[dict[str, str]] = []
    for _, path in reversed(found):
        try:
            state = load_checkpoint(accelerator, path)
        except Exception as err:  # safetensors, torch.load (weights_only) and pickle raise their own types
            reason = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"[:300]
            skipped.append({"checkpoint": str(path), "reason": reason})
            if accelerator.is_main_process:
                print(
                    f"ecgpos pretrain: checkpoint {path.name} does not load ({reason}); trying the previous one",
                    file=sys.stderr,
                    flush=True,
                )
            continue
        if skipped:
            accelerator.wait_for_everyone()  # every process is done reading before anything is renamed
            if accelerator.is_main_process:
                for entry in skipped:
                    entry["moved_to"] = str(_aside(Path(entry["checkpoint"])))
                print(
                    f"ecgpos pretrain: resuming from {path.name} (skipped {len(skipped)} newer checkpoint(s) "
                    "that do not load, renamed *.corrupt; see run_info.json skipped_checkpoints)",
                    file=sys.stderr,
                    flush=True,
                )
        return Resumed(state, path, incomplete + skipped)
    if found:
        raise EcgposError(
            f"none of the {len(found)} checkpoints in {Path(run_dir) / CHECKPOINT_DIR} loads "
            f"(newest: {skipped[0]['reason']}); start a new --run-dir"
        )
    return Resumed(skipped=incomplete)


def _set_aside_incomplete(accelerator: Any, run_dir: Path) -> list[dict[str, str]]:
    """Rename every incomplete step-N folder to step-N.corrupt (main process; collective call); their
    skipped_checkpoints entries."""
    skipped = []
    for path in incomplete_checkpoints(run_dir):
        lacks = [name for name in (STATE_FILE, WEIGHTS_FILE) if not (path / name).is_file()]
        skipped.append({"checkpoint": str(path), "reason": f"incomplete: lacks {' and '.join(lacks)}"})
        if accelerator.is_main_process:
            skipped[-1]["moved_to"] = str(_aside(path))
            print(
                f"ecgpos pretrain: checkpoint {path.name} is incomplete (lacks {' and '.join(lacks)}); "
                f"renamed {Path(skipped[-1]['moved_to']).name}",
                file=sys.stderr,
                flush=True,
            )
    accelerator.wait_for_everyone()  # no process lists checkpoints while the main one renames
    return skipped


def check_resumed_slices(state: dict[str, Any], run_dir: Path, num_processes: int, grad_accum: int) -> None:
    """ConfigError unless this run cuts each step's global batch into as many slices (processes x
    train.grad_accum) as the run that wrote the checkpoint: each slice draws its own masks, so another
    cut trains on other masks than the uninterrupted run. Checkpoints that do not record grad_accum
    were written when it could not change within a run: the run's config.yaml has it."""
    if "grad_accum" in state:
        accum = int(state["grad_accum"])
    else:
        from ecgpos.config import load_config
        from ecgpos.runs.run_config import RunConfig
        from ecgpos.runs.run_folder import RUN_CONFIG

        accum = load_config(RunConfig, run_dir / RUN_CONFIG).train.grad_accum
    processes = int(state.get("num_processes", num_processes))
    then = processes * accum
    if then == num_processes * grad_accum:
        return
    fix = f"--set train.grad_accum={then // num_processes}" if then % num_processes == 0 else f"{then} slices"
    raise ConfigError(
        f"checkpoint step {state['step']} was trained with processes x train.grad_accum = {processes} x {accum}, "
        f"this run has {num_processes} x {grad_accum}: each of the {then} slices of a step draws its own masks, "
        f"so it would not continue the same run; resume with {fix}"
    )


def _aside(path: Path) -> Path:
    """Rename a broken checkpoint folder to a free `<name>.corrupt[.k]` name beside it; the new path."""
    target, k = path.with_name(path.name + ".corrupt"), 1
    while target.exists():
        target, k = path.with_name(f"{path.name}.corrupt.{k}"), k + 1
    path.rename(target)
    return target
