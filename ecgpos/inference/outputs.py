"""What `ecgpos embed` and `ecgpos score` write: FILE and the files beside it.

FILE (`write_features`: .csv, .h5, .npz or .npy; `ecgpos score`'s .csv), FILE's `.skipped.csv`
(the refused records, always written), FILE's `.long.csv` (the records longer than 300 s, used on
their centre span only; written when there is any) and, for .npy, FILE's `.ids.txt`. They replace an
earlier run's files together (`ecgpos.files.atomic_paths`), so no file of another run stays beside them.
"""

from __future__ import annotations

import contextlib
import csv
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ecgpos.ecg.screening import long_records_note
from ecgpos.ecg.shards import SHARD_GLOB
from ecgpos.errors import EcgposError
from ecgpos.export.load import ExportedEncoder
from ecgpos.files import atomic_paths, remove_abandoned_temporaries, write_test
from ecgpos.inference.resolve import artifact_above

OUTPUT_SUFFIXES = (".csv", ".h5", ".npz", ".npy")
LONG_COLUMNS = ("record_id", "duration_s", "used_from_s", "used_to_s")


def skipped_path(out: Path) -> Path:
    """Where the refused records of `out` are listed: FILE's name with `.skipped.csv` (feats.skipped.csv)."""
    return out.with_name(f"{out.stem}.skipped.csv")


def long_path(out: Path) -> Path:
    """Where the records of `out` used on their centre 300 s are listed: FILE's name with `.long.csv`."""
    return out.with_name(f"{out.stem}.long.csv")


def output_paths(out: Path) -> list[Path]:
    """Every file written for --out FILE: FILE, its `.skipped.csv`, its `.long.csv` (only when a record
    was longer than 300 s) and, for .npy, its `.ids.txt`."""
    return [out, skipped_path(out), long_path(out)] + ([out.with_suffix(".ids.txt")] if out.suffix == ".npy" else [])


def check_writable(
    out: Path, input_path: Path | None = None, also: Sequence[Path] = (), suffixes: Sequence[str] = ()
) -> None:
    """--out must be a file this process can create, with one of `suffixes` when given, and none of its
    files (`output_paths`, plus `also`) may be a folder or be (or join) the input: one line otherwise,
    before any record is read and before the write test makes --out's folder.
    A folder in a file's place would fail only after every record was processed; an output over the
    input would destroy it after it was read, and a `shard-*.h5` beside the input shards would join them.
    Abandoned temporaries of all these files (a killed run's) are removed."""
    if out.is_dir():
        raise EcgposError(f"--out {out} is a folder; give a file name")
    for path in [*output_paths(out), *also]:
        if path.is_dir():
            raise EcgposError(f"--out {out}: {path} is a folder where a file of the output goes; move it aside")
    if input_path is not None:
        source = input_path.resolve()
        for path in [*output_paths(out), *also]:
            target = path.resolve()
            beside = target.match(SHARD_GLOB) and target.parent in (source, source.parent)
            if target == source or beside:
                raise EcgposError(
                    f"--out {out}: {path} would overwrite or join the input {input_path}; write elsewhere"
                )
    if suffixes and out.suffix not in suffixes:
        raise EcgposError(f"--out {out}: give a file name ending in {' or '.join(suffixes)}")
    inside = artifact_above(out.parent)  # an export's test vectors, a run's files, a shard folder's index
    if inside is not None:
        raise EcgposError(f"--out {out} is inside {inside[1]} {inside[0]}: write the results elsewhere")
    write_test(out, f"--out {out}")
    # what a killed run of this command left beside these files (the folder is the user's: only ours)
    remove_abandoned_temporaries(out.parent, {path.name for path in [*output_paths(out), *also]})


@contextlib.contextmanager
def written_together(out: Path) -> Iterator[None]:
    """Around an `atomic_paths` block writing --out FILE's set: an OSError (a full disk, a file made
    read-only since the start) becomes one line saying the earlier files are kept, as they are."""
    try:
        yield
    except OSError as err:
        raise EcgposError(
            f"cannot write {out} and the files beside it ({err.strerror or err}); the earlier ones are kept"
        ) from None


def write_skipped(out: Path, skipped: Sequence[tuple[str, str, str]], also: Sequence[Path] = ()) -> Path:
    """The skipped list of a run that wrote nothing else: `record_id,reason,detail` of every refused
    record, replacing FILE's whole set (`output_paths` and `also`) at once, so an earlier run's
    FILE, `.ids.txt` or summary is deleted with it and never read as this run's."""
    paths = [*output_paths(out), *also]
    with atomic_paths(paths) as tmps:
        write_skipped_rows(tmps[1], skipped)
    return paths[1]


def write_skipped_rows(path: Path, skipped: Sequence[tuple[str, str, str]]) -> None:
    """The `.skipped.csv` text of `skipped` into `path` (a temporary name of `atomic_path(s)`)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["record_id", "reason", "detail"])
        writer.writerows(skipped)


def write_long_rows(path: Path, long: Sequence[tuple[str, str, str, str]]) -> None:
    """The `.long.csv` text of `long` (LONG_COLUMNS) into `path` (a temporary name of `atomic_paths`)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(LONG_COLUMNS)
        writer.writerows(long)


def long_note(long: Sequence[object], listed: Path) -> str:
    """`; N records longer than 300 s used on their centre 300 s (listed in FILE.long.csv)` for a
    command's closing line ('' when every record was used whole)."""
    return long_records_note(len(long), "used on", f"listed in {listed}")


def skipped_note(skipped: Sequence[tuple[str, str, str]]) -> str:
    """`; skipped N (reason count, ...)` for a command's closing line ('' when none was skipped)."""
    if not skipped:
        return ""
    reasons = Counter(reason for _, reason, _ in skipped)
    return f"; skipped {len(skipped)} ({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))})"


def write_features(
    out: Path,
    ids: list[str],
    features: np.ndarray,
    encoder: ExportedEncoder,
    skipped: Sequence[tuple[str, str, str]] | None = None,
    long: Sequence[tuple[str, str, str, str]] = (),
) -> list[Path]:
    """Write features (N, D) float32 with their record ids (and, when given, the `skipped` records in
    `.skipped.csv`, and the `long` records in `.long.csv`); returns the files written. They replace an
    earlier run's files together (`atomic_paths`): an earlier `.long.csv` goes when no record is long."""
    try:
        return _write_features(out, ids, features, encoder, skipped, long)
    except OSError as err:
        raise EcgposError(f"cannot write {out}: {err.strerror or err}") from None


def _write_features(
    out: Path, ids: list[str], features: np.ndarray, encoder: ExportedEncoder, skipped: Sequence | None, long: Sequence
) -> list[Path]:
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out] + ([out.with_suffix(".ids.txt")] if out.suffix == ".npy" else [])
    paths += [skipped_path(out)] if skipped is not None else []
    # the suffix keeps np.save from appending its own; the last path is deleted when no record is long
    with atomic_paths([*paths, long_path(out)], [out.suffix]) as (tmp, *companions, long_tmp):
        if out.suffix == ".csv":
            with tmp.open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["record_id"] + [f"f{i}" for i in range(features.shape[1])])
                for record_id, row in zip(ids, features):
                    writer.writerow([record_id] + [f"{v:.9g}" for v in row])
        elif out.suffix == ".h5":
            import h5py

            with h5py.File(tmp, "w") as handle:
                handle.create_dataset("features", data=features)
                handle.create_dataset("record_id", data=np.array(ids, dtype=object), dtype=h5py.string_dtype())
                handle.attrs["encoder"] = encoder.source
                handle.attrs["weights_sha256"] = encoder.config["weights_sha256"]
                handle.attrs["spec"] = encoder.spec.to_json()
        elif out.suffix == ".npz":
            np.savez(tmp, features=features, record_id=np.array(ids, dtype=str))
        else:
            np.save(tmp, features)
            companions[0].write_text("".join(f"{record_id}\n" for record_id in ids))
        if skipped is not None:
            write_skipped_rows(companions[-1], skipped)
        if long:
            write_long_rows(long_tmp, long)
    return paths + ([long_path(out)] if long else [])
