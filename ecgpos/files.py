"""Writing files so that a reader never sees half of one, and reading safetensors without pickle.

Every file ecgpos writes that another process may read while it is written (shards, sidecars,
index.csv, run_info.json, checkpoints' trainer state, metrics.jsonl rewrites, figures, feature
caches, `embed`'s feature files, `score`'s CSV, the result files of `probe` and `geometry`) goes
through `atomic_path`: written under a process-unique temporary name beside the target, then
renamed over it, which POSIX makes atomic within a file system. The temporary name carries the
host and the process id (`.index.csv.node07.4242.tmp`): processes on several nodes may write into
one shared folder, and only a temporary file of this host whose process is gone is known to be
abandoned (`remove_abandoned_temporaries`). Any other file written beside a target for a moment (a
write test) takes its name from `temporary_path`, so that cleanup sees it too.

Earlier versions named temporaries `.NAME.PID.tmp`, without the host. No rule removes those safely
when several nodes write one folder: the pid says nothing about another node, and the age of the
file does not either (a suspended Slurm job may hold one for days, then rename it). Nor can the
name tell them apart from another host's: `.index.csv.4242.tmp` reads as host `csv`. They are left
for a person to delete.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import re
import shutil
import socket
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ecgpos.errors import EcgposError


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path to write; on success it replaces `path`, on error it is removed.

    `suffix` keeps a file type visible to writers that choose the format by suffix (".png", ".npz").
    """
    tmp = temporary_path(path, suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_paths(paths: Sequence[str | Path], suffixes: Sequence[str] = ()) -> Iterator[list[Path]]:
    """`atomic_path` for files that belong together (features and their ids, scores and their skipped
    records), the first being the one readers look for. On success the earlier set is renamed aside
    (the first file first), the new files renamed into place (the first last), and the asides deleted:
    an interruption leaves the earlier set whole, or no first file, never a first file beside the other
    files of another run; a rename that fails (a full disk, a file made read-only or a folder in a file's
    place since the command began) puts the earlier set back whole before the error goes on. On error in
    the block every temporary is removed and the earlier set is untouched.
    A file of the set whose temporary the block did not write is deleted in its turn instead: an
    earlier run's file that this run has none of (a summary of a run without labels, the features of
    a run that embedded nothing) never stays beside this run's files.

    `suffixes` (one per path, "" by default) as in `atomic_path`.
    """
    paths = [Path(p) for p in paths]
    tmps = [temporary_path(p, s) for p, s in zip(paths, [*suffixes, *[""] * (len(paths) - len(suffixes))])]
    try:
        yield tmps
        _replace_set(tmps, paths)
    finally:
        for tmp in tmps:
            if tmp.exists():
                tmp.unlink()


def _replace_set(tmps: Sequence[Path], paths: Sequence[Path]) -> None:
    """Move the files at `paths` aside, rename `tmps` (those written) into place, then delete the asides;
    on any failure undo what was done, so the earlier set stays whole."""
    asides: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for path in paths:  # the first first: a reader then finds no set rather than a mixed one
            if path.is_file() or path.is_symlink():
                aside = temporary_path(path, ".old")
                os.replace(path, aside)
                asides.append((aside, path))
        for tmp, path in [*zip(tmps[1:], paths[1:]), (tmps[0], paths[0])]:
            if tmp.exists():
                os.replace(tmp, path)
                placed.append(path)
    except BaseException:
        for path in placed:
            with contextlib.suppress(OSError):
                path.unlink()
        for aside, path in reversed(asides):
            with contextlib.suppress(OSError):
                os.replace(aside, path)
        raise
    for aside, _ in asides:
        with contextlib.suppress(OSError):
            aside.unlink()


def temporary_path(path: str | Path, suffix: str = "") -> Path:
    """This process's temporary name for `path`, beside it: `.NAME.<host>.<pid>.tmp[suffix]`."""
    path = Path(path)
    return path.with_name(f".{path.name}.{host_tag()}.{os.getpid()}.tmp{suffix}")


def write_test(target: str | Path, what: str) -> None:
    """Create `target`'s folder and write and delete a real file beside `target`: EcgposError '`what` is
    not writable' otherwise, before any work. A real file, because os.access trusts permission bits
    that network file systems may not enforce; under `temporary_path`, because a kill before the
    delete then leaves a file `remove_abandoned_temporaries` knows."""
    probe = temporary_path(target)
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        try:
            probe.write_bytes(b"")
        finally:
            probe.unlink(missing_ok=True)
    except OSError as err:
        raise EcgposError(f"{what} is not writable: {err.strerror or err}") from None


_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.(?P<host>[^.]+)\.(?P<pid>\d+)\.tmp(\.[^.]+)?$")


def host_tag() -> str:
    """Where this process's pid means something, as it appears in temporary file names (no dots, only
    [A-Za-z0-9_-]): the host name, plus the pid namespace where the OS has them, because containers
    sharing a host name (host networking) do not share pids: another container's live writer would
    look dead."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname()) or "host"
    try:
        return f"{host}-pidns{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # no /proc (macOS): one pid space per host
        return host


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # not a pid this system can have
        return False
    return True


def remove_abandoned_temporaries(folder: str | Path, targets: Iterable[str] | None = None) -> int:
    """Delete the `temporary_path` files in `folder` that a killed process of this host left behind
    (its pid no longer runs); return how many. Files of other hosts, of live processes, or without a
    host in their name are left alone: their writer may still be at work. `targets` (file names)
    limits the cleanup to the temporaries of those files, for a folder ecgpos does not own."""
    wanted = None if targets is None else set(targets)
    removed = 0
    for path in Path(folder).glob(".*.tmp*"):
        match = _TEMPORARY.match(path.name)
        if match is None or match["host"] != host_tag() or _alive(int(match["pid"])) or not path.is_file():
            continue
        if wanted is not None and match["target"] not in wanted:
            continue
        # gone: another process of this host cleaned it first; refused: another user's, in a sticky folder
        with contextlib.suppress(FileNotFoundError, PermissionError):
            path.unlink()
            removed += 1
    return removed


def replace_folder(new: str | Path, target: str | Path) -> None:
    """Rename the complete folder `new` to `target`. An existing `target` is renamed aside first
    (`.NAME.old-PID` beside it) and deleted last, so a kill at any point leaves one complete folder
    under `target` or aside; `recover_replaced` finishes the job afterwards."""
    new, target = Path(new), Path(target)
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)  # an aside of an earlier process with this pid: target is newer
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def recover_replaced(parent: str | Path, name: str | None = None) -> int:
    """Finish the `replace_folder` calls a kill interrupted in `parent` (for the target `name` only,
    when given): an aside `.NAME.old-PID` is deleted when NAME is in place again, and renamed back to
    NAME when the kill came between the two renames (NAME is missing). Returns how many asides were found."""
    found = 0
    for aside in sorted(Path(parent).glob(f".{glob.escape(name)}.old-*" if name else ".*.old-*")):
        match = re.fullmatch(r"\.(?P<name>.+)\.old-\d+", aside.name)
        if match is None or not aside.is_dir():
            continue
        found += 1
        target = aside.with_name(match["name"])
        if target.exists():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.rename(target)
    return found


def walk_folders(src: Path) -> tuple[list[tuple[Path, list[str]]], list[tuple[Path, str]]]:
    """(folder relative to src, sorted file names) of every folder under src, sorted, and (folder, why)
    of the folders whose entries cannot be read, so that callers can report them (their records cannot
    even be counted); `Path(".")` among those means src itself, and `why` completes "folder ...":
    `cannot be listed (Permission denied)`, or `cannot be searched ...` for a folder that lists but
    whose entries cannot be opened (read but no execute permission: mode 0444). Symlinked folders are
    followed (a tree assembled from links holds records too), but each real folder is visited once: a
    link back up the tree would otherwise list the same records again at every level."""
    out, visited, unlisted = [], set(), []

    def failed(err: OSError) -> None:  # os.walk would otherwise leave the folder out without a word
        try:
            stat = os.stat(err.filename)
            key = (stat.st_dev, stat.st_ino)
        except OSError:
            key = err.filename
        if key not in visited:
            visited.add(key)
            unlisted.append((Path(err.filename).relative_to(src), f"cannot be listed ({err.strerror or err})"))

    for folder, dirs, files in os.walk(src, followlinks=True, onerror=failed):
        try:
            stat = os.stat(folder)
        except OSError:
            dirs[:] = []
            continue
        if (stat.st_dev, stat.st_ino) in visited:
            dirs[:] = []
            continue
        visited.add((stat.st_dev, stat.st_ino))
        dirs.sort()
        # A listable folder without search permission names entries that cannot be opened or stat'ed:
        # os.walk takes its symlinked (and, without d_type, all) subfolders for files and cannot enter
        # the others, so its names say nothing reliable. Looking up "." inside it needs that permission.
        try:
            os.stat(os.path.join(folder, os.curdir))
        except OSError as err:
            dirs[:] = []
            why = f"cannot be searched: its entries cannot be opened ({err.strerror or err})"
            unlisted.append((Path(folder).relative_to(src), why))
            continue
        out.append((Path(folder).relative_to(src), sorted(files)))
    return out, sorted(unlisted)


def user_path(text: str) -> Path:
    """The argparse type of every path option: `~` expanded, because the shell expands it only at the
    start of a word, so `--out=~/x` arrives as written. An empty path is refused: Path("") is the current
    folder, so `--out "$UNSET"` would write there (or read it as input) without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"empty path {text!r} (an unset shell variable?)")
    return Path(text).expanduser()


def make_output_folder(path: str | Path, flag: str = "--out", create: bool = True) -> Path:
    """The output folder `path`, created (with its parents) when `create`; one line, instead of an
    OSError traceback after the work is done, when it is a file or cannot be made. Call it with
    create=False before the work to refuse early without leaving an empty folder behind."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EcgposError(f"{flag} {path} is a file, not a folder")
    above = next((p for p in path.absolute().parents if p.exists()), None)
    if not path.exists() and above is not None and not above.is_dir():
        raise EcgposError(f"{flag} {path}: {above} is a file, not a folder")
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise EcgposError(f"{flag} {path} cannot be created: {err.strerror or err}") from None
    return path


def atomic_write_bytes(path: str | Path, data: bytes, sync: bool = True) -> None:
    """Write `data` to `path` atomically (fsync'd first when `sync`, so a crash leaves old or new)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        handle.write(data)
        if sync:
            handle.flush()
            os.fsync(handle.fileno())


def atomic_write_text(path: str | Path, text: str, sync: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), sync)


def atomic_write_json(path: str | Path, data: Any, compact: bool = False) -> None:
    """JSON with a trailing newline; `compact` for large machine-only files (RNG states)."""
    text = json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=1)
    atomic_write_text(path, text + "\n")


def read_safetensors(path: str | Path, what: str = "weights") -> dict[str, Any]:
    """Tensors of a .safetensors file on the CPU; EcgposError (one line) when missing, unreadable or
    holding NaN/inf weights (a diverged run or a damaged file gives NaN features and scores downstream).

    safetensors holds only tensors and cannot execute code, unlike pickle.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise EcgposError(f"{path} is missing: no {what}")
    try:
        path.open("rb").close()
    except PermissionError:  # safetensors would report it as a missing file
        raise EcgposError(f"permission denied: {path} (the {what}) is not readable by this user") from None
    try:
        state = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise EcgposError(f"{path} is not a readable safetensors file: {str(err).splitlines()[0]}") from None
    broken = [name for name, t in state.items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if broken:
        raise EcgposError(
            f"{path}: {len(broken)} of {len(state)} tensors hold NaN or inf values ({', '.join(sorted(broken)[:3])}"
            f"{', ...' if len(broken) > 3 else ''}): the run diverged or the file is damaged"
        )
    return state


def make_public(folder: Path) -> None:
    """Give `folder` and the files in it the permissions the user's umask asks for: mkdtemp and
    safetensors create owner-only files, which the user's collaborators (or jobs under another
    account) could not read."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for file in folder.iterdir():
        if file.is_file():
            file.chmod(0o666 & ~umask)
