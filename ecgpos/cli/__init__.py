"""`ecgpos <command>`: one CLI; each command lives in its own module with `main(argv) -> int`
(COMMANDS: ecgpos.cli.*, ecgpos.preprocessing.cli, ecgpos.probes.linear.cli, ecgpos.probes.finetune.cli,
ecgpos.probes.geometry.cli, ecgpos.demo.demo)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from ecgpos import __version__
from ecgpos.errors import EcgposError
from ecgpos.extras import from_import_error, require
from ecgpos.workers import DeferredStops

Main = Callable[[list[str]], "int | None"]


@dataclasses.dataclass(frozen=True)
class Command:
    """One `ecgpos <command>`: `load` imports its module and returns its main(argv); `help` is its line
    in `ecgpos --help`. Imported when run, so that `ecgpos --help` and light commands (embed, verify: the
    core install) do not pay for torch or need the packages of the train extra."""

    load: Callable[[], Main]
    help: str


def _preprocess() -> Main:
    from ecgpos.preprocessing.cli import main

    return main


def _pretrain() -> Main:
    from ecgpos.cli.pretrain import main

    return main


def _probe() -> Main:
    from ecgpos.probes.linear.cli import main

    return main


def _finetune() -> Main:
    from ecgpos.probes.finetune.cli import main

    return main


def _export() -> Main:
    from ecgpos.cli.export import main

    return main


def _embed() -> Main:
    from ecgpos.cli.embed import main

    return main


def _verify() -> Main:
    from ecgpos.cli.verify import main

    return main


def _predict() -> Main:
    from ecgpos.cli.predict import main

    return main


def _geometry() -> Main:
    from ecgpos.probes.geometry.cli import main

    return main


def _score() -> Main:
    from ecgpos.cli.score import main

    return main


def _carve() -> Main:
    from ecgpos.cli.carve import main

    return main


def _demo() -> Main:
    from ecgpos.demo.demo import main

    return main


COMMANDS: dict[str, Command] = {
    "preprocess": Command(_preprocess, "filter, standardise, resample raw corpora into HDF5 shards"),
    "pretrain": Command(
        _pretrain, "pretrain level 0 (masked ECG transformer) or a level N >= 1 (latent MAE) with Accelerate"
    ),
    "probe": Command(_probe, "linear probes on frozen features: PTB-XL super/sub/form/rhythm, CPSC2018"),
    "finetune": Command(_finetune, "fine-tune the encoder on the probe tasks: full, top:K blocks, lora:R or lp-ft"),
    "export": Command(_export, "export a frozen encoder: safetensors, config, model card, test vectors, ONNX"),
    "embed": Command(_embed, "embed WFDB records, shards or .npy arrays with an exported encoder"),
    "verify": Command(_verify, "check an exported encoder or classifier against its test vectors"),
    "predict": Command(_predict, "each label's probability and flag for WFDB records, shards or .npy arrays"),
    "geometry": Command(_geometry, "PoS representation dynamics between two levels, and the carving criterion"),
    "score": Command(_score, "per-record reconstruction anomaly scores per level (+ AUROC)"),
    "carve": Command(_carve, "carve level after level until the push-margin criterion says stop"),
    "demo": Command(_demo, "run the whole pipeline on a synthetic corpus in minutes"),
}

# command -> the packages of the `train` extra it needs (ecgpos.extras), checked before its module is
# imported: without them it stops at once with one line naming them and `pip install 'ecgpos[train]'`.
# embed, verify, score and export need none of them (embed's shard inputs and .h5 output need h5py,
# reported the same way when used).
NEEDS: dict[str, tuple[str, ...]] = {
    "preprocess": ("h5py", "pandas"),
    "pretrain": ("accelerate", "h5py", "matplotlib"),
    "probe": ("sklearn", "pandas", "h5py", "matplotlib"),
    "finetune": ("accelerate", "sklearn", "pandas", "h5py", "matplotlib"),
    "geometry": ("sklearn", "pandas", "matplotlib"),
    "carve": ("accelerate", "h5py", "matplotlib"),
    "demo": ("neurokit2", "accelerate", "h5py", "pandas", "sklearn", "matplotlib"),
}


# Every command takes this SIGTERM handler. pretrain's trainer replaces it while it trains: a SIGTERM
# then checkpoints at the next step and exits 0 (ecgpos.pretrain.stop); before (imports, checks) and
# after, pretrain stops like the others. preprocess and probe's --workers pools (and the demo's
# simulation) defer the signal until their workers are stopped (ecgpos.workers.mapped_in_workers),
# then raise it here.


class _Sigterm:
    """SIGTERM (`kill`, `scancel`, a Slurm time limit) stops a command the way Ctrl-C does: as
    KeyboardInterrupt in the main thread, so the command removes its temporaries and keeps what a
    rerun continues from; `run_command` then says `terminated:` and returns 143 (128 + SIGTERM, what a
    shell reports for a process the signal killed)."""

    def __init__(self) -> None:
        self.owner: int | None = None
        self.received = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if os.getpid() != self.owner:  # a forked worker dies of it silently, as before: the command reports
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Handle SIGTERM inside the block; a command run by another (the demo's steps) keeps its handler.
        Handlers can only be installed from the main thread: elsewhere SIGTERM keeps its default."""
        if signal.getsignal(signal.SIGTERM) is self or threading.current_thread() is not threading.main_thread():
            yield
            return
        self.owner, self.received = os.getpid(), False
        previous = signal.signal(signal.SIGTERM, self)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


_SIGTERM = _Sigterm()


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: ecgpos <command> [options]   (ecgpos {__version__})",
        "",
        "ECG self-supervised pretraining with nested manifold carving.",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {command.help}" for name, command in COMMANDS.items()]
    lines += ["", "Run `ecgpos <command> --help` for a command's options."]
    return "\n".join(lines)


def run_command(name: str, argv: Sequence[str]) -> int:
    """Run one command's main; user errors, missing optional packages and files the user may not read
    or write become one line on stderr and exit code 2, Ctrl-C one `interrupted:` line and 130,
    SIGTERM one `terminated:` line and 143."""
    with _SIGTERM.installed():
        return _run(name, argv)


def _run(name: str, argv: Sequence[str]) -> int:
    try:
        with DeferredStops():  # a signal lands after the imports, never inside one
            require(*NEEDS.get(name, ()))
            command_main = COMMANDS[name].load()
        return int(command_main(list(argv)) or 0)
    except EcgposError as err:
        print(f"ecgpos {name}: error: {err}", file=sys.stderr)
        return 2
    except PermissionError as err:  # a file or folder this user may not read or write: the user's to fix
        where = " and ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
        print(f"ecgpos {name}: error: permission denied: {where or err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:  # an optional package imported where it is first used
        missing = from_import_error(err)
        if missing is None:
            raise
        print(f"ecgpos {name}: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        # commands that keep work say what and how to go on (Interrupted); the others write whole files only
        kept = str(err) or "no partial output was kept; run the same command again"
        if _SIGTERM.received:
            print(f"ecgpos {name}: terminated: {kept}", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"ecgpos {name}: interrupted: {kept}", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(__version__)
        return 0
    if argv[0] not in COMMANDS:
        print(f"ecgpos: error: unknown command {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return run_command(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
