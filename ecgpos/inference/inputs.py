"""What `ecgpos embed` and `ecgpos score` read: records in, features of each good record out.

Inputs (`open_source`): WFDB records or folders of them, HDF5 shard folders or files (already
preprocessed: only the spec is checked), and `.npy` arrays with their rate and lead names. Raw
records go through preprocessing's record screening (`ecgpos.ecg.screening`); a refused record is
reported with its reason and the others go on, and a record longer than 300 s is noted with its
duration (`EmbedResult.long`). The files written are `ecgpos.inference.outputs`'; the command's
help (ecgpos/cli/embed.py) spells out ids and formats.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ecgpos.ecg.rates import check_fs
from ecgpos.ecg.screening import DEFAULT_POLICY, ScreenPolicy
from ecgpos.ecg.shards import SHARD_GLOB
from ecgpos.ecg.signal import check_finite, pad_to, preprocess_batch, resample_factors
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError, SignalError
from ecgpos.export.load import ExportedEncoder, check_raw_record
from ecgpos.files import walk_folders
from ecgpos.models.features import DEFAULT_NUM_WINDOWS, record_means, record_windows, window_features

# Unicode categories of what no single line can hold as it is: control characters (line breaks, tab,
# NUL) and the line and paragraph separators, which str.splitlines also splits on.
_LINE_BREAKING = {"Cc", "Zl", "Zp"}

# (duration_s, used_from_s, used_to_s) of a raw record longer than 300 s (`Screened.span_seconds`),
# None for a record used whole
Span = tuple[str, str, str] | None
# One record of a source: its id and a thunk giving its preprocessed (12, T) float32 signal and span;
# the thunk raises SignalError for a bad record, which is reported and skipped.
Record = tuple[str, Callable[[], tuple[np.ndarray, Span]]]


@dataclass
class Source:
    kind: str
    count: int
    records: Iterator[Record]


@dataclass
class EmbedResult:
    ids: list[str] = field(default_factory=list)
    features: list[np.ndarray] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (record id, reason, detail)
    long: list[tuple[str, str, str, str]] = field(default_factory=list)  # (id, duration_s, used_from_s, used_to_s)


def raw_thunk(
    signal: Any,
    fs: float,
    leads: Sequence[str],
    spec: PreprocessSpec,
    policy: ScreenPolicy = DEFAULT_POLICY,
    total: int = -1,
    uncalibrated: Sequence[str] = (),
) -> Callable[[], tuple[np.ndarray, Span]]:
    """Deferred screening + preprocessing of one raw record (signal may be a memory-mapped array, or
    the span a reader read of a record of `total` samples; `uncalibrated`: as in `screen_record`).

    The screening is preprocessing's own (`screen_record`): a record preprocessing would skip
    (all-zero, flat, too many dead leads, too short, bad rate) is skipped with the same reason.
    """

    def run() -> tuple[np.ndarray, Span]:
        # screened as stored, as `encoder.embed` screens: a float32 copy first would turn float64
        # samples beyond float32's range into inf, refused as non_finite instead of units
        ok = check_raw_record(np.asarray(signal), fs, leads, spec, policy, total, uncalibrated)
        y = preprocess_batch(ok.signal[None], ok.fs, spec, ok.dead[None])[0]
        return (pad_to(y, spec.window) if policy.pad_short else y), (ok.span_seconds() if ok.cut else None)

    return run


def wfdb_source(path: Path, spec: PreprocessSpec, policy: ScreenPolicy = DEFAULT_POLICY) -> Source:
    from ecgpos.ecg.wfdb_fast import read_wfdb
    from ecgpos.ecg.wfdb_io import record_path

    unlisted: list[tuple[Path, str]] = []
    if path.is_dir():
        # symlinked folders are followed, as preprocessing follows them (rglob would skip their records)
        walked, unlisted = walk_folders(path)
        if unlisted and unlisted[0][0] == Path("."):
            raise EcgposError(f"{path} {unlisted[0][1]}")
        bases = sorted(
            {path / rel / name[: -len(".hea")] for rel, files in walked for name in files if name.endswith(".hea")}
        )
        ids = [b.relative_to(path).as_posix() for b in bases]
    else:
        bases = [record_path(path)]
        ids = [bases[0].name]
    if not bases and not unlisted:
        raise EcgposError(f"{path}: no WFDB records (*.hea) found")

    def records() -> Iterator[Record]:
        for record_id, base in zip(ids, bases):

            def run(base: Path = base) -> tuple[np.ndarray, Span]:
                raw = read_wfdb(base)
                return raw_thunk(raw.signal, raw.fs, raw.leads, spec, policy, raw.total, raw.uncalibrated)()

            yield record_id, run
        # a folder whose entries cannot be read is one skipped entry, named by its path: its records cannot be counted
        for rel, why in unlisted:

            def fail(why: str = why) -> tuple[np.ndarray, Span]:
                raise SignalError("unreadable", f"folder {why}")

            yield rel.as_posix(), fail

    return Source("WFDB records", len(bases) + len(unlisted), records())


def shard_source(path: Path, spec: PreprocessSpec) -> Source:
    import h5py

    from ecgpos.ecg.shards import check_shard, open_shard, shard_paths

    files = shard_paths(path) if path.is_dir() else [path]
    counts = []
    for file in files:
        stored_spec, count = check_shard(file)  # unreadable or malformed shards: one line, before any work
        spec.check_compatible(stored_spec, f"shard {file}")
        counts.append(count)

    def records() -> Iterator[Record]:
        for file in files:
            with open_shard(file) as handle:
                signals, lengths = handle["signals"], handle["lengths"][:]
                ids = [x.decode() if isinstance(x, bytes) else str(x) for x in handle["record_id"][:]]
                for row, record_id in enumerate(ids):

                    def run(
                        row: int = row, signals: h5py.Dataset = signals, lengths: np.ndarray = lengths
                    ) -> tuple[np.ndarray, Span]:
                        # a --pad-short record (length < window) is used zero-padded as stored,
                        # exactly the input pretraining saw; stored T is always >= window
                        stop = max(int(lengths[row]), min(spec.window, signals.shape[-1]))
                        x = np.asarray(signals[row, :, :stop], dtype=np.float32)
                        check_finite(x)
                        return x, None  # stored by `ecgpos preprocess`, whose index.csv has duration_s

                    yield record_id, run

    return Source("shard records", sum(counts), records())


def npy_source(
    path: Path, fs: float | None, leads: str | None, spec: PreprocessSpec, policy: ScreenPolicy = DEFAULT_POLICY
) -> Source:
    if fs is None or not leads:
        raise EcgposError("a .npy input needs --fs HZ and --leads I,II,... (its rows' lead names)")
    try:
        fs = check_fs(fs, spec, "--fs")
    except SignalError as err:  # one rate for every row: a bad one is the run's error, not a per-record skip
        raise EcgposError(f"{err.detail}") from None
    try:
        resample_factors(fs, spec.fs)  # e.g. 499.9 Hz: in range, but no exact resampling to the spec's rate
    except SignalError as err:
        raise EcgposError(f"--fs: {err.detail}") from None
    names = [name.strip() for name in leads.split(",") if name.strip()]
    try:
        with path.open("rb") as handle:
            magic = handle.read(6)
        if magic and magic != b"\x93NUMPY" and not magic.startswith(b"PK"):  # np.load would call it pickled data
            raise EcgposError(f"{path} is not a .npy file: it does not begin with NumPy's header")
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:  # EOFError: an empty file
        raise EcgposError(f"{path} is not a readable .npy array: {err}") from None
    if not isinstance(array, np.ndarray):  # np.load opens a zip archive (.npz) under any name
        raise EcgposError(f"{path} is an .npz archive, not a .npy array; save one array with np.save")
    if array.dtype.kind not in "iuf":  # one dtype for every row: the run's error, not N skips
        raise EcgposError(f"{path}: samples must be real numbers in mV, got dtype {array.dtype}")
    if array.ndim not in (2, 3):
        raise EcgposError(f"{path}: expected shape (leads, time) or (N, leads, time), got {array.shape}")
    if array.ndim == 3 and array.shape[0] == 0:  # not "none of the 0 records could be embedded"
        raise EcgposError(f"{path} holds no records: shape {array.shape}")
    items = [(path.stem, array)] if array.ndim == 2 else [(str(i), array[i]) for i in range(array.shape[0])]
    return Source("array records", len(items), ((rid, raw_thunk(x, fs, names, spec, policy)) for rid, x in items))


def open_source(
    path: Path, fs: float | None, leads: str | None, spec: PreprocessSpec, policy: ScreenPolicy = DEFAULT_POLICY
) -> Source:
    """The right reader for PATH (see module docstring); --fs/--leads only belong to .npy inputs."""
    if path.suffix == ".npy":
        if not path.is_file():
            raise EcgposError(f"{path} does not exist")
        return npy_source(path, fs, leads, spec, policy)
    if fs is not None or leads is not None:
        raise EcgposError("--fs and --leads apply to .npy input only (WFDB headers and shards carry their own)")
    if (path.is_dir() and any(path.glob(SHARD_GLOB))) or (path.suffix == ".h5" and path.is_file()):
        return shard_source(path, spec)
    if path.is_dir() or path.with_suffix(".hea").is_file() or path.suffix == ".hea":
        return wfdb_source(path, spec, policy)
    raise EcgposError(f"{path}: not a WFDB record, a folder of records or shards, or a .npy file")


def check_record_id(record_id: str) -> None:
    """SignalError `bad_record_id` when the id (a file name) holds a control character: no line of
    the stderr report or of a .npy output's `.ids.txt` could hold it, so the record is skipped."""
    bad = sorted({char for char in record_id if unicodedata.category(char) in _LINE_BREAKING})
    if bad:
        raise SignalError("bad_record_id", f"the id holds {', '.join(map(repr, bad))}; rename the file")


def source_windows(
    source: Source,
    window: int,
    num_windows: int,
    skipped: list[tuple[str, str, str]],
    prog: str,
    progress: bool = True,
    long: list[tuple[str, str, str, str]] | None = None,
) -> Iterator[tuple[str, np.ndarray]]:
    """(record id, windows) of every good record of `source`; each bad one (a bad id included, see
    `check_record_id`) is appended to `skipped` as (id, reason, detail) and reported on stderr, and
    the others go on. A good record longer than 300 s is appended to `long` (`outputs.LONG_COLUMNS`)."""
    from tqdm import tqdm

    bar = tqdm(
        source.records, total=source.count, unit="rec", desc=prog.split()[-1], disable=not progress, file=sys.stderr
    )
    for record_id, load in bar:
        try:
            check_record_id(record_id)
            signal, span = load()
            windows = record_windows(signal, window, num_windows)
        except (SignalError, EcgposError, OSError) as err:  # OSError: a damaged shard row or file
            reason = getattr(err, "reason", "unreadable")
            detail = getattr(err, "detail", (str(err).splitlines() or [type(err).__name__])[0])
            skipped.append((record_id, reason, detail))
            shown = record_id if reason != "bad_record_id" else ascii(record_id)  # one line on stderr
            bar.write(f"{prog}: skipped {shown}: {reason}: {detail}", file=sys.stderr)
            continue
        if span is not None and long is not None:
            long.append((record_id, *span))
        yield record_id, windows
    bar.close()


def finite_outputs(
    record_id: str, outputs: dict[str, Any], skipped: list[tuple[str, str, str]], prog: str, what: str
) -> bool:
    """True when every value of a record's `outputs` (name -> array) is finite; otherwise the record is
    appended to `skipped` as `non_finite` and reported on stderr, whatever its input format: no NaN or
    inf is ever written as a feature or a score (an extreme but finite sample can overflow on the way)."""
    bad = [name for name, values in outputs.items() if not np.isfinite(np.asarray(values, dtype=np.float64)).all()]
    if not bad:
        return True
    detail = f"its {what} ({', '.join(bad)}) are not finite: samples beyond what float32 preprocessing can hold?"
    skipped.append((record_id, "non_finite", detail))
    print(f"{prog}: skipped {record_id}: non_finite: {detail}", file=sys.stderr)
    return False


def embed_records(
    encoder: ExportedEncoder,
    source: Source,
    num_windows: int = DEFAULT_NUM_WINDOWS,
    batch_size: int = 64,
    progress: bool = True,
    prog: str = "ecgpos embed",
) -> EmbedResult:
    """Features (mean over each record's windows) of every good record; bad ones listed with reasons
    (on stderr, after `prog`). `encoder`: an ExportedEncoder, or anything with its forward_features,
    spec and device (an ExportedClassifier)."""
    result = EmbedResult()
    records = source_windows(source, encoder.spec.window, num_windows, result.skipped, prog, progress, result.long)

    def features(windows: np.ndarray) -> dict[str, np.ndarray]:
        return {"features": window_features(encoder, windows, batch_size, encoder.device)}

    for record_id, means in record_means(records, features, batch_size):
        if not finite_outputs(record_id, means, result.skipped, "ecgpos embed", "features"):
            continue
        result.ids.append(record_id)
        result.features.append(means["features"])
    return result
