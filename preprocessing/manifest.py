"""Book-keeping of a shard set: the plan, per-chunk sidecars, and the merged index/skipped/preprocess.json.

Records are sorted (see each reader) and cut into fixed chunks of --records-per-shard; chunk k
becomes `shard-k.h5` and the sidecar `chunks/chunk-k.json` (its index and skipped rows), written
after the shard. A chunk is done when its sidecar exists, so a killed run redoes only unfinished
chunks, and any process that finds every sidecar present merges them into index.csv, skipped.csv
and, last, preprocess.json (whose presence means "finished"). The plan (`chunks/plan.json`) pins
the settings and the record list, so runs with other settings cannot mix into the same folder.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import h5py

from ecgpos import __version__
from ecgpos.ecg.shards import shard_name, shard_paths
from ecgpos.errors import ConfigError, EcgposError
from ecgpos.files import atomic_write_bytes
from ecgpos.preprocessing.records import RecordRef

FORMAT_VERSION = 1
# length: samples stored (at spec.fs); fingerprint: ecgpos.ecg.fingerprint of the stored window (what the
# probes' pretraining-leakage guard compares); duration_s: the whole source record's duration, which is
# longer than what `length` covers for a record longer than 300 s (stored as its centre 300 s)
INDEX_BASE = (
    "shard",
    "row",
    "source",
    "record_id",
    "patient_id",
    "age",
    "sex",
    "length",
    "dead_leads",
    "fingerprint",
    "duration_s",
)
SKIPPED_COLUMNS = ("source", "record_id", "reason", "detail")


def records_digest(refs: Sequence[RecordRef]) -> str:
    """sha256 of the ordered record list: parts of one run must agree on it."""
    h = hashlib.sha256()
    for ref in refs:
        h.update(f"{ref.record_id}\t{ref.location}\t{ref.row}\t{ref.problem}\n".encode())
    return h.hexdigest()


def chunk_dir(out: Path) -> Path:
    return out / "chunks"


def sidecar_path(out: Path, chunk: int) -> Path:
    return chunk_dir(out) / f"chunk-{chunk:05d}.json"


def write_json(path: Path, data: dict, compact: bool = False) -> None:
    """Sorted keys; `compact` (no indentation) lets json use its C encoder: chunk sidecars hold
    one index row per record, and the indenting pure-Python encoder cost ~3 % of a build."""
    if compact:
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    else:
        text = json.dumps(data, indent=1, sort_keys=True)
    atomic_write_bytes(path, (text + "\n").encode())


def read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise EcgposError(f"cannot read {path}: {err}".splitlines()[0]) from None


# What the readers below need of each file: key -> (JSON type(s), required[, the fields of an object value]).
# A file that parses but lacks them (hand-edited, or overwritten by another tool) is refused in one line
# naming the file and what to do, never a KeyError or TypeError deep inside a merge or --check. (JSON
# true/false pass as integers: bool is an int, and these numbers are only compared and added.)
Fields = Mapping[str, tuple]
FINISHED_FIELDS: Fields = {
    "counts": (
        dict,
        True,
        {"found": (int, True), "stored": (int, True), "skipped": (int, True), "long_records": (int, False)},
    ),
    "settings": (dict, False),  # absent: a set of an earlier ecgpos (check_settings names what is missing)
    "sources": ((dict, type(None)), False),  # absent or null: written before sources were recorded
}
PLAN_FIELDS: Fields = {
    "settings": (dict, True, {"source": (str, True), "spec": (dict, True)}),
    "found": (int, True),
    "num_chunks": (int, True),
    "notes": (dict, False),
    "sources": ((dict, type(None)), False),
}
SIDECAR_FIELDS: Fields = {
    "found": (int, True),
    "index": (list, True),
    "skipped": (list, True),
    "long_records": (int, False),  # absent from sets written before it was counted
}
_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true/false",
    type(None): "null",
}


def _kind(value: object) -> str:
    return _NAMES.get(type(value), type(value).__name__)


def _problem(data: object, fields: Fields, prefix: str = "") -> str | None:
    """What keeps `data` from being a JSON object with `fields` (None if nothing); nested keys are dotted."""
    if not isinstance(data, dict):
        return f"{f'{prefix[:-1]!r} is' if prefix else 'holds'} {_kind(data)}, not an object"
    for key, (types, required, *inner) in fields.items():
        name, kinds = prefix + key, types if isinstance(types, tuple) else (types,)
        if key not in data:
            if required:
                return f"no {name!r}"
            continue
        if not isinstance(data[key], kinds):
            return f"{name!r} is {_kind(data[key])}, not {' or '.join(_NAMES[t] for t in kinds)}"
        if inner and (problem := _problem(data[key], inner[0], name + ".")):
            return problem
    return None


def _damaged(path: Path, problem: str, fix: str) -> EcgposError:
    return EcgposError(f"{path} is damaged ({problem}); {fix}")


def read_finished(out: Path) -> dict:
    """preprocess.json of a finished set, with the counts (and settings, sources) its readers use."""
    path = out / "preprocess.json"
    data = read_json(path)
    problem = _problem(data, FINISHED_FIELDS)
    if problem:
        raise _damaged(
            path,
            problem,
            f"delete it and rerun the command (or `ecgpos preprocess --check --out {out}`) to merge it again "
            "from the chunks",
        )
    return data


def _read_plan_file(path: Path, out: Path, sources: Collection[str] = ()) -> dict:
    """chunks/plan.json with the fields merge and --check use (`sources`: the source names known, if checked)."""
    data = read_json(path)
    problem = _problem(data, PLAN_FIELDS)
    if not problem and sources and data["settings"]["source"] not in sources:
        problem = f"'settings.source' is {data['settings']['source']!r}, not one of {', '.join(sources)}"
    if problem:
        raise _damaged(
            path, problem, f"it pins the settings and records of the set, so use a new --out (or remove {out})"
        )
    return data


def read_sidecar(out: Path, chunk: int, index_columns: Sequence[str]) -> dict:
    """chunks/chunk-k.json: its index rows (each with a record_id, only index.csv columns) and skipped rows."""
    path = sidecar_path(out, chunk)
    data = read_json(path)
    problem = _problem(data, SIDECAR_FIELDS)
    if not problem:
        problem = _rows_problem(data["index"], "index", "record_id", (*INDEX_BASE, *index_columns))
    if not problem:
        problem = _rows_problem(data["skipped"], "skipped", "reason", SKIPPED_COLUMNS)
    if problem:
        also = " and preprocess.json" if (out / "preprocess.json").exists() else ""  # else a rerun finds it done
        raise _damaged(
            path,
            problem,
            f"delete it{also} and rerun the preprocess command (the --part that owns chunk {chunk}, if the set "
            "was made in parts) to redo that chunk",
        )
    return data


def _rows_problem(rows: list, name: str, key: str, columns: Sequence[str]) -> str | None:
    """What keeps a sidecar's rows from being CSV rows of `columns`, each with a string `key`."""
    known = set(columns)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            return f"{name} row {i} is {_kind(row)}, not an object"
        if not isinstance(row.get(key), str):
            return f"{name} row {i} has no {key!r} string"
        extra = [k for k in row if k not in known]
        if extra:
            return f"{name} row {i} has field(s) that are no column of {name}.csv: {', '.join(map(repr, extra[:3]))}"
    return None


def check_settings(found: dict, wanted: dict, out: Path) -> None:
    """Refuse to resume or reuse a folder written with other settings, or by an earlier version that
    did not record (nor apply) a setting: no option makes such a folder resumable."""
    missing = [k for k in wanted if k not in found]
    if missing:
        raise ConfigError(
            f"{out} holds a preprocessing run of an earlier ecgpos, made without the settings "
            f"{', '.join(missing)}: no option resumes it; use a new --out (or remove {out})"
        )
    diffs = [f"{k}: {found[k]!r} != {wanted[k]!r}" for k in wanted if found[k] != wanted[k]]
    if diffs:
        raise ConfigError(
            f"{out} holds a preprocessing run with other settings ({'; '.join(diffs)}); "
            "use a new --out or the same options"
        )


def check_sources(found: dict | None, wanted: dict, out: Path) -> None:
    """Refuse a folder built from other sources (sets written before sources were recorded pass)."""
    if found is None:
        return
    diffs = [f"{k}: {found.get(k)!r} != {wanted[k]!r}" for k in wanted if found.get(k) != wanted[k]]
    if diffs:
        raise ConfigError(
            f"{out} holds a preprocessing run of other sources ({'; '.join(diffs)}); use a new --out or the same --src"
        )


def write_or_check_plan(
    out: Path, settings: dict, refs: Sequence[RecordRef], num_chunks: int, notes: dict, sources: dict | None = None
) -> dict:
    """Create chunks/plan.json, or check that an existing one describes the same run."""
    plan = {
        "settings": settings,
        "found": len(refs),
        "num_chunks": num_chunks,
        "records_sha256": records_digest(refs),
        "notes": notes,
        "sources": sources,
    }
    path = chunk_dir(out) / "plan.json"
    if path.exists():
        old = _read_plan_file(path, out)
        check_settings(old["settings"], settings, out)
        if sources is not None:
            check_sources(old.get("sources"), sources, out)
        if old.get("records_sha256") != plan["records_sha256"]:
            raise ConfigError(
                f"{out} was started on a different set of input records "
                f"({old.get('found')} then, {len(refs)} now); use a new --out"
            )
        return old
    # Shards without a plan come from another run (or a set whose chunks/ was deleted): chunks of
    # this run would overwrite some and leave the others for every reader of the folder to pool.
    stray = shard_paths(out)
    if stray:
        raise ConfigError(
            f"{out} holds {len(stray)} shard file(s) ({stray[0].name} ...) but no {path.relative_to(out)}: "
            "not a set this command started; use a new --out"
        )
    chunk_dir(out).mkdir(parents=True, exist_ok=True)
    write_json(path, plan)
    return plan


def check_out_folder(out: Path) -> None:
    """ConfigError when `out` holds files but is no set that preprocessing started (no chunks/): someone's
    data, among which a set's files could not be told apart from it. (A folder of shard files without a
    plan, a set whose chunks/ was deleted, is named by `write_or_check_plan`.)"""
    if not out.is_dir() or chunk_dir(out).is_dir() or shard_paths(out):
        return
    foreign = sorted(p.name for p in out.iterdir() if not _temporary(p.name))
    if foreign:
        raise ConfigError(
            f"--out {out} is a non-empty folder that is not a preprocessing output ({len(foreign)} entries, e.g. "
            f"{foreign[0]}); give a new or empty folder"
        )


def _temporary(name: str) -> bool:
    """A temporary file of ecgpos.files (a part starting beside this one, or one a kill left)."""
    return name.startswith(".") and ".tmp" in name


def read_plan(out: Path, sources: Collection[str] = ()) -> dict:
    """chunks/plan.json of `out`; `sources`: the source names this ecgpos reads (checked when given)."""
    path = chunk_dir(out) / "plan.json"
    if not path.exists():
        raise EcgposError(f"{out} has no {path.relative_to(out)}: no preprocessing run was started there")
    return _read_plan_file(path, out, sources)


def missing_chunks(out: Path, num_chunks: int) -> list[int]:
    return [k for k in range(num_chunks) if not sidecar_path(out, k).exists()]


def _csv_bytes(columns: Sequence[str], rows) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return buffer.getvalue().encode()


def merge(out: Path, plan: dict, index_columns: Sequence[str], write: bool = True) -> dict:
    """Check every chunk and (if write) write index.csv, skipped.csv, then preprocess.json. Returns the counts.

    Raises EcgposError when chunks are missing or a shard disagrees with its sidecar.
    """
    missing = missing_chunks(out, plan["num_chunks"])
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise EcgposError(
            f"{len(missing)} of {plan['num_chunks']} chunks not done yet (chunk {shown}); "
            "rerun the command (or the --part that owns them: part = chunk % num-parts)"
        )
    index_rows, skipped_rows, shards, long_records = [], [], [], 0
    for k in range(plan["num_chunks"]):
        side = read_sidecar(out, k, index_columns)
        if side.get("found") != len(side["index"]) + len(side["skipped"]):
            raise EcgposError(f"chunk {k}: stored + skipped != found in its sidecar")
        if side["index"]:
            shard = out / shard_name(k)
            try:
                with h5py.File(shard, "r") as f:
                    ids = list(f["record_id"].asstr()[:])
            except (OSError, KeyError) as err:
                raise EcgposError(
                    f"{shard.name}: unreadable ({err}); delete {sidecar_path(out, k).name} and rerun"
                ) from None
            if ids != [row["record_id"] for row in side["index"]]:
                raise EcgposError(
                    f"{shard.name} does not hold the records its sidecar lists; "
                    f"delete {sidecar_path(out, k).name} and rerun"
                )
            shards.append(shard.name)
        index_rows += side["index"]
        skipped_rows += side["skipped"]
        long_records += side.get("long_records", 0)  # absent from sets written before it was counted
    extra = [p.name for p in shard_paths(out) if p.name not in shards]
    if extra:  # readers take every shard-*.h5 of the folder: one no chunk wrote would be pooled silently
        raise EcgposError(
            f"{out} holds shard file(s) that no chunk of this set wrote ({', '.join(extra[:5])}"
            f"{' ...' if len(extra) > 5 else ''}); move them out of the folder"
        )
    counts = {
        "found": len(index_rows) + len(skipped_rows),
        "stored": len(index_rows),
        "skipped": len(skipped_rows),
        "shards": len(shards),
        "skipped_by_reason": dict(sorted(Counter(r["reason"] for r in skipped_rows).items())),
        **plan.get("notes", {}),
        # only when any: a set finished before long records were counted still passes --check
        **({"long_records": long_records} if long_records else {}),
    }
    if counts["found"] != plan["found"]:
        raise EcgposError(f"chunks account for {counts['found']} records, the plan found {plan['found']}")
    if not write:
        return counts
    atomic_write_bytes(out / "index.csv", _csv_bytes((*INDEX_BASE, *index_columns), index_rows))
    atomic_write_bytes(out / "skipped.csv", _csv_bytes(SKIPPED_COLUMNS, skipped_rows))
    settings = plan["settings"]
    write_json(
        out / "preprocess.json",
        {
            "version": __version__,
            "format": FORMAT_VERSION,
            "source": settings["source"],
            "spec": settings["spec"],
            "settings": settings,
            "sources": plan.get("sources"),
            "counts": counts,
            "shards": shards,
        },
    )
    return counts
