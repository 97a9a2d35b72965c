"""The pretraining-leakage guard: which probe records are (copies of) records the encoder was pretrained on.

Record ids are not enough: one recording is published under other ids and in other file formats
(CinC 2020/2021 copies of PTB-XL and CPSC2018, the ecg-arrhythmia records behind MERL's CSN splits).
So the guard compares content fingerprints (ecgpos.ecg.fingerprint) of each probe record, preprocessed
with the shards' spec, against those of the pretraining shards: read from their index.csv
(`fingerprint` column, written by `ecgpos preprocess`) or, for older shards without it, computed
from the stored signals. Probe-record fingerprints are cached beside the feature cache, each with
the stamp of its record's files (`ecgpos.probes.shared.datasets.record_stamp`): a record changed on disk since is
fingerprinted again.

With those fingerprints at hand the guard also compares a task's splits with each other: a val or test
record that matches a record of an earlier split (train; for test also val) is the same recording
under another file name (a copy, one ECG published twice), which the key and file checks of
`ecgpos.probes.shared.tasks.read_splits` and `ecgpos.probes.shared.datasets.check_distinct` cannot see.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ecgpos.ecg.fingerprint import (
    BLOCK_SECONDS,
    MIN_BLOCKS,
    FingerprintIndex,
    blocks_per_lead,
    fingerprint,
    fingerprint_problem,
    max_distance,
)
from ecgpos.ecg.shards import iter_shard_records, read_shard_spec
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError, EcgposError
from ecgpos.export.format import CONFIG_FILE
from ecgpos.files import atomic_path
from ecgpos.probes.shared.datasets import RecordLocator, prepared_record, record_stamp
from ecgpos.probes.shared.tasks import SPLITS
from ecgpos.runs.run_folder import RUN_INFO, base_source, listed_folders, read_json_object, run_chain

CACHE_VERSION = 2  # 2: [stamp of the record's files, fingerprint] per record (1: the fingerprint alone)


def recorded_pretraining(source: str, info: dict) -> list[Path]:
    """Shard folders an encoder was pretrained on, as recorded: an export's `shards`, a run's run_info.json
    `shards`, and those of every level below a latent level's run: its base run or export, and the chain
    of levels its run_info.json records (each level's shards, and each level's run or export in turn)."""
    folders = listed_folders(info.get("shards"))
    todo, seen = [Path(source)], set()
    while todo:
        path = todo.pop()
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        run_info = read_json_object(path / RUN_INFO)
        folders += listed_folders(run_info.get("shards"))
        training = read_json_object(path / CONFIG_FILE).get("training")
        folders += listed_folders(training.get("shards") if isinstance(training, dict) else None)
        base = base_source(run_info)
        if base:
            todo.append(Path(base))
        for entry in run_chain(run_info):
            folders += listed_folders(entry.get("shards"))
            if isinstance(entry.get("source"), str):
                todo.append(Path(entry["source"]))
        if isinstance(training, dict) and base_source(training):  # an export of a latent level
            todo.append(Path(str(base_source(training))))
        for entry in run_chain(training) if isinstance(training, dict) else ():
            folders += listed_folders(entry.get("shards"))
    return [Path(f) for f in dict.fromkeys(map(str, folders))]


@dataclass
class PretrainingIndex:
    """Fingerprints of the pretraining records, one FingerprintIndex per preprocessing spec."""

    folders: list[Path]
    by_spec: dict[PreprocessSpec, FingerprintIndex] = field(default_factory=dict)
    computed: int = 0  # records fingerprinted on the fly (shards written before fingerprints existed)

    def __len__(self) -> int:
        return sum(len(i) for i in self.by_spec.values())


def _indexed_prints(folder: Path, spec: PreprocessSpec) -> tuple[dict[str, str] | None, list[tuple[str, str]]]:
    """record_id -> fingerprint from index.csv (None when the column is absent or incomplete), and
    (record_id, 'line N: why') of each row whose fingerprint cannot be one of this spec's windows."""
    path = folder / "index.csv"
    if not path.is_file():
        return None, []
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.DictReader(handle))
    except (UnicodeDecodeError, csv.Error) as err:
        raise EcgposError(f"leakage guard: {path} is not a readable CSV: {err}") from None
    if not rows or not all(row.get("fingerprint") for row in rows):
        return None, []
    prints, damaged = {}, []
    for line, row in enumerate(rows, start=2):
        why = fingerprint_problem(row["fingerprint"], spec.fs, spec.window, len(spec.leads))
        if not row.get("record_id"):
            raise EcgposError(f"leakage guard: {path} line {line} has no record_id")
        if why:
            damaged.append((row["record_id"], f"line {line}: {why}"))
        else:
            prints[row["record_id"]] = row["fingerprint"]
    return prints, damaged


def _recomputed(folder: Path, spec: PreprocessSpec, wanted: set[str] | None) -> dict[str, str]:
    """Fingerprints computed from the stored signals of `folder` (of the records in `wanted` only, when given)."""
    try:
        return {
            rid: fingerprint(x, spec.fs, spec.window, spec.dtype)
            for rid, x in iter_shard_records(folder)
            if wanted is None or rid in wanted
        }
    except (OSError, KeyError, ValueError) as err:
        raise EcgposError(f"leakage guard: the shards of {folder} cannot be read to fingerprint them: {err}") from None


def pretraining_spec(folder: Path) -> PreprocessSpec:
    """The spec of a pretraining shard folder; EcgposError when it is none or its windows are too short
    to fingerprint (cheap: `ecgpos probe` checks --pretraining-index with it before any output)."""
    if not folder.is_dir():
        raise EcgposError(f"--pretraining-index {folder} is not a folder")
    try:
        spec = read_shard_spec(folder)
    except ConfigError as err:
        raise EcgposError(f"--pretraining-index: {err}") from None
    if blocks_per_lead(spec.fs, spec.window) < MIN_BLOCKS:  # matching nothing would read as "no overlap"
        raise EcgposError(
            f"leakage guard: {folder} holds {spec.window / spec.fs:g} s windows, shorter than the "
            f"{MIN_BLOCKS * BLOCK_SECONDS:g} s a content fingerprint needs to tell recordings apart"
        )
    return spec


def load_pretraining(folders: Sequence[Path], log: Callable[[str], None] = print) -> PretrainingIndex:
    """Fingerprints of every record in the shard folders (EcgposError when one is not a shard folder)."""
    index = PretrainingIndex([Path(f) for f in folders])
    for folder in index.folders:
        spec = pretraining_spec(folder)
        target = index.by_spec.setdefault(spec, FingerprintIndex(max_distance=max_distance(spec.fs, spec.window)))
        prints, damaged = _indexed_prints(folder, spec)
        if prints is None:
            prints = _recomputed(folder, spec, None)
            index.computed += len(prints)
            log(
                f"leakage guard: {folder} has no fingerprints in index.csv; fingerprinted its {len(prints)} "
                "records from the shards"
            )
        elif damaged:  # never left out: a copy behind a damaged fingerprint would read as "no overlap"
            fixed = _recomputed(folder, spec, {rid for rid, _ in damaged})
            lost = [f"{rid} ({why})" for rid, why in damaged if rid not in fixed]
            if lost:
                raise EcgposError(
                    f"leakage guard: {folder / 'index.csv'} holds a damaged fingerprint that its shards cannot "
                    f"replace (no stored record of that id): {lost[0]}"
                )
            prints.update(fixed)
            index.computed += len(fixed)
            rid, why = damaged[0]
            log(
                f"leakage guard: {folder / 'index.csv'} holds {len(damaged)} damaged fingerprint(s) (e.g. {rid}, "
                f"{why}); fingerprinted those records again from the shards"
            )
        target.extend((f"{folder.name}:{rid}", fp) for rid, fp in prints.items())
    return index


def _cache_path(cache_dir: Path, dataset_key: str, spec: PreprocessSpec) -> Path:
    key = json.dumps({"version": CACHE_VERSION, "dataset": dataset_key, "spec": spec.to_dict()}, sort_keys=True)
    return cache_dir / f"fingerprints-{dataset_key.split(':')[0]}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def probe_fingerprints(
    keys: Sequence[str], locator: RecordLocator, spec: PreprocessSpec, cache_dir: Path, dataset_key: str
) -> dict[str, str]:
    """Fingerprint (under `spec`) of every readable record among `keys`; cached per dataset and spec,
    and computed again for a record whose files changed since (another `record_stamp`)."""
    path = _cache_path(cache_dir, dataset_key, spec)
    try:
        loaded = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:  # a damaged cache is recomputed
        loaded = {}
    # [stamp, fingerprint] pairs; anything else (a hand-edited or foreign file) is recomputed
    store: dict[str, list[str]] = {
        k: v
        for k, v in (loaded.items() if isinstance(loaded, dict) else ())
        if isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, str) for x in v)
        and not fingerprint_problem(v[1], spec.fs, spec.window, len(spec.leads))
    }
    located = {k: locator.locate(k) for k in dict.fromkeys(keys)}
    stamps = {k: record_stamp(*found) for k, found in located.items() if found is not None}
    todo = [k for k in stamps if store.get(k, [None])[0] != stamps[k]]
    for key in todo:
        store.pop(key, None)  # stale: not kept when the record now fails to read
        try:
            record_print = fingerprint(prepared_record(*located[key], spec), spec.fs, spec.window, spec.dtype)
        except EcgposError:  # unreadable and refused records are reported by feature extraction
            continue
        store[key] = [stamps[key], record_print]
    if todo:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(store))
    return {k: store[k][1] for k in stamps if k in store}


@dataclass
class Overlap:
    """Probe records of one task that match pretraining records: split -> [(key, match, bits)]; and those
    that match a record of an earlier split of the task: split -> [(key, earlier split, its record, bits)]."""

    task: str
    checked: int
    matches: dict[str, list[tuple[str, str, int]]]
    copies: dict[str, list[tuple[str, str, str, int]]] = field(default_factory=dict)

    @property
    def keys(self) -> set[str]:
        return {m[0] for found in self.matches.values() for m in found}

    @property
    def copy_keys(self) -> set[str]:
        """Val and test records whose recording an earlier split holds (what --exclude-overlap drops)."""
        return {c[0] for found in self.copies.values() for c in found}

    def copy_counts(self) -> dict[str, int]:
        """Copies per split pair, 'train/val', 'train/test', 'val/test' (each val or test record counted
        once, under the earliest split that holds its recording)."""
        pairs = {f"{a}/{b}": 0 for i, b in enumerate(SPLITS) for a in SPLITS[:i]}
        for split, found in self.copies.items():
            for _, earlier, _, _ in found:
                pairs[f"{earlier}/{split}"] += 1
        return pairs

    def line(self, excluded: bool) -> str:
        total = sum(len(v) for v in self.matches.values())
        if not total:
            return f"{self.task}: no overlap (0 of {self.checked} located records match a pretraining record)"
        per_split = ", ".join(f"{s} {len(v)}" for s, v in self.matches.items() if v)
        examples = "; ".join(
            f"{k} = {name} ({bits} bits)" for k, name, bits in [m for found in self.matches.values() for m in found][:3]
        )
        verdict = (
            "excluded from the probe (--exclude-overlap)"
            if excluded
            else "kept: these results include records the encoder was pretrained on"
        )
        return (
            f"{self.task}: {total} of {self.checked} located records match pretraining records ({per_split}); "
            f"e.g. {examples}; {verdict}"
        )

    def copy_line(self, excluded: bool) -> str:
        """One line on copies across the task's splits."""
        found = [(split, *c) for split, listed in self.copies.items() for c in listed]
        if not found:
            return f"{self.task}: no copies across splits (no val or test record matches a record of an earlier split)"
        pairs = ", ".join(f"{pair} {n}" for pair, n in self.copy_counts().items() if n)
        examples = "; ".join(f"{split} {k} = {was} {other} ({bits} bits)" for split, k, was, other, bits in found[:3])
        verdict = (
            "dropped from their val or test split (--exclude-overlap)"
            if excluded
            else "kept: val and test scores include recordings the probe was trained or selected on"
        )
        return (
            f"{self.task}: {len(found)} val or test records are copies of records of an earlier split ({pairs}); "
            f"e.g. {examples}; {verdict}"
        )


def _split_copies(
    splits: Mapping[str, Sequence[str]], prints: Mapping[str, str], threshold: int, copies: dict[str, list]
) -> None:
    """Add to `copies` each val or test record (not yet listed) whose fingerprint is within `threshold` bits
    of a record of an earlier split: its nearest match in the earliest split (train before val)."""
    earlier: list[tuple[str, FingerprintIndex]] = []
    for split in [s for s in SPLITS if s in splits]:
        if earlier:
            listed = copies.setdefault(split, [])
            done = {c[0] for c in listed}
            for key in [k for k in splits[split] if k in prints and k not in done]:
                for name, index in earlier:
                    hit = index.match(prints[key])
                    if hit:
                        listed.append((key, name, *hit[0]))
                        break
        index = FingerprintIndex(max_distance=threshold)
        index.extend((k, prints[k]) for k in splits[split] if k in prints)
        earlier.append((split, index))


def task_overlap(
    task: str,
    splits: dict[str, Sequence[str]],
    locator: RecordLocator,
    index: PretrainingIndex,
    cache_dir: Path,
    dataset_key: str,
) -> Overlap:
    """Match every located record of the task's splits against the pretraining fingerprints, and each val
    and test record against the records of the earlier splits (the same fingerprints, read once)."""
    matches: dict[str, list[tuple[str, str, int]]] = {s: [] for s in splits}
    copies: dict[str, list[tuple[str, str, str, int]]] = {}
    checked: set[str] = set()
    for spec, prints in index.by_spec.items():
        ours = probe_fingerprints([k for keys in splits.values() for k in keys], locator, spec, cache_dir, dataset_key)
        checked |= set(ours)
        for split, keys in splits.items():
            done = {m[0] for m in matches[split]}
            for key in keys:
                if key in ours and key not in done:
                    hit = prints.match(ours[key])
                    if hit:
                        matches[split].append((key, hit[0][0], hit[0][1]))
                        done.add(key)
        _split_copies(splits, ours, prints.max_distance, copies)
    return Overlap(task, len(checked), matches, copies)


def overlap_markdown(index: PretrainingIndex, overlaps: Sequence[Overlap], excluded: bool) -> str:
    """The summary.md section of the guard's report: overlap with the pretraining records, then copies
    across each task's splits."""
    thresholds = " / ".join(
        f"{prints.max_distance} of {prints.leads * blocks_per_lead(spec.fs, spec.window)} bits"
        for spec, prints in index.by_spec.items()
    )
    lines = [
        "## Pretraining overlap (leakage guard)",
        "",
        f"Probe records compared by content fingerprint (at most {thresholds} apart) with the "
        f"{len(index)} records of {', '.join(map(str, index.folders))}.",
        "",
    ]
    lines += [f"- {o.line(excluded)}" for o in overlaps]
    lines += [
        "",
        "### Copies across splits",
        "",
        "Each val and test record compared by the same fingerprint with the train records (test records also "
        "with the val records): one recording under two file names in two splits"
        + (" (dropped from the later split: the Records table's copy column)." if excluded else "."),
        "",
    ]
    lines += [f"- {o.copy_line(excluded)}" for o in overlaps]
    return "\n".join(lines)


SPLIT_COPIES = "split_copies.csv"


def write_overlap(overlaps: Sequence[Overlap], out: Path) -> None:
    """OUT/overlap.csv: task, split, record, pretraining record (folder:id), distance in bits; and
    OUT/split_copies.csv: task, split, record, the earlier split and its record of the same recording,
    distance in bits."""
    with atomic_path(out / "overlap.csv") as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["task", "split", "record", "pretraining_record", "distance_bits"])
        for o in overlaps:
            for split, found in o.matches.items():
                writer.writerows([o.task, split, *m] for m in found)
    with atomic_path(out / SPLIT_COPIES) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["task", "split", "record", "matches_split", "matches_record", "distance_bits"])
        for o in overlaps:
            for split, listed in o.copies.items():
                writer.writerows([o.task, split, *c] for c in listed)
