"""Building a shard set: list records, process chunks (optionally in worker processes), merge.

Determinism: the reader's sorted record list is cut into fixed chunks of `records_per_shard`;
chunk k is always shard k, whichever process or worker computes it, and `--part I --num-parts N`
takes the chunks with k % N == I. Each record is processed independently in one thread, so the
bytes written do not depend on --workers or --part (tests compare them).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from types import ModuleType
from typing import TextIO

from ecgpos.ecg.fingerprint import fingerprint
from ecgpos.ecg.limbs import LEAD_MISMATCH_MAX
from ecgpos.ecg.screening import long_records_note
from ecgpos.ecg.shards import check_shard, check_shard_contents, shard_name, shard_paths, write_shard
from ecgpos.ecg.signal import DEAD_LEAD_PTP_MV, check_filter, seconds_text
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError, Interrupted, SignalError
from ecgpos.files import remove_abandoned_temporaries, write_test
from ecgpos.preprocessing import code15, ecg_arrhythmia, manifest
from ecgpos.preprocessing.progress import Progress
from ecgpos.preprocessing.records import RecordPolicy, RecordRef, prepare_many, validate
from ecgpos.workers import mapped_in_workers, max_workers, usable_cpus

SOURCES: dict[str, ModuleType] = {ecg_arrhythmia.NAME: ecg_arrhythmia, code15.NAME: code15}
DEFAULT_RECORDS_PER_SHARD = 1000
BATCH = 8
"""Records read, then filtered and resampled together (one scipy call per batch): amortises scipy's
per-call overhead; the output of a record does not depend on its batch (see records.prepare_many)."""


@dataclass(frozen=True)
class BuildRequest:
    """Everything `ecgpos preprocess` was asked to do."""

    dataset: str
    src: Path
    out: Path
    spec: PreprocessSpec
    subset: str | None = None
    pad_short: bool = False
    max_dead_leads: int = 2
    keep_lead_mismatch: bool = False
    records_per_shard: int = DEFAULT_RECORDS_PER_SHARD
    workers: int = 1
    part: int = 0
    num_parts: int = 1

    def settings(self) -> dict:
        """What must be equal for two runs to share an output folder (not workers/parts)."""
        return {
            "source": self.dataset,
            "subset": self.subset,
            "spec": self.spec.to_dict(),
            "records_per_shard": self.records_per_shard,
            "pad_short": self.pad_short,
            "max_dead_leads": self.max_dead_leads,
            "dead_lead_ptp_mv": DEAD_LEAD_PTP_MV,
            "keep_lead_mismatch": self.keep_lead_mismatch,
            "lead_mismatch_max": LEAD_MISMATCH_MAX,
        }

    def sources(self) -> dict:
        """Where the records came from (preprocess.json `sources`): a finished set answers only the same."""
        return {"dataset": self.dataset, "src": str(self.src)}

    def policy(self) -> RecordPolicy:
        return RecordPolicy(
            expected_fs=SOURCES[self.dataset].FS,
            pad_short=self.pad_short,
            max_dead_leads=self.max_dead_leads,
            check_limb_leads=not self.keep_lead_mismatch,
        )


@dataclass
class Summary:
    stored: int
    skipped: int
    found: int
    complete: bool
    message: str
    long_records: int = 0  # stored records longer than 300 s, stored as their centre 300 s

    def line(self) -> str:
        long = long_records_note(self.long_records, "stored as", "index.csv duration_s: the whole record")
        return f"stored {self.stored} + skipped {self.skipped} = found {self.found}{self.message}{long}"


# --- per-record work (runs in worker processes: module-level state set by the initializer) -----

_state: dict = {}


def _init_worker(dataset: str, src: str, spec: PreprocessSpec, policy: RecordPolicy) -> None:
    _state.update(source=SOURCES[dataset], src=Path(src), spec=spec, policy=policy)


def _skip(ref: RecordRef, err: Exception) -> tuple:
    if isinstance(err, SignalError):
        return ("skip", ref, err.reason, err.detail)
    # a file no reader check anticipated: skipped with its error, never a traceback
    return ("skip", ref, "unreadable", f"{type(err).__name__}: {err}".splitlines()[0])


def _process_batch(refs: list[RecordRef]) -> list[tuple]:
    """Per ref, in order: ('ok', ref, signal, dead, meta, (duration_s, cut)) or ('skip', ref, reason, detail)."""
    spec, out, valid = _state["spec"], [], []
    for ref in refs:
        try:
            loaded = _state["source"].load_record(_state["src"], ref)
            valid.append((len(out), validate(loaded, spec, _state["policy"]), loaded.meta))
            out.append(None)
        except Exception as err:
            out.append(_skip(ref, err))
    try:
        prepared = prepare_many([v for _, v, _ in valid], spec)
    except Exception:  # some run of the batch failed: redo record by record for per-record reasons
        prepared = []
        for _, v, _ in valid:
            try:
                prepared.extend(prepare_many([v], spec))
            except Exception as err:
                prepared.append(err)
    for (i, v, meta), p in zip(valid, prepared):
        out[i] = (
            _skip(refs[i], p)
            if isinstance(p, Exception)
            else ("ok", refs[i], p.signal.astype(spec.dtype), p.dead, meta, (seconds_text(v.total, v.fs), v.cut))
        )
    return out


@contextlib.contextmanager
def _results(req: BuildRequest, refs: list[RecordRef]) -> Iterator[Iterator[tuple]]:
    """The records' results in order, in this process or in --workers processes (ecgpos.workers: a
    Ctrl-C or SIGTERM stops them cleanly and then raises KeyboardInterrupt here)."""
    args = (req.dataset, str(req.src), req.spec, req.policy())
    batches = [refs[i : i + BATCH] for i in range(0, len(refs), BATCH)]
    if req.workers <= 1:
        _init_worker(*args)
        yield (result for batch in batches for result in _process_batch(batch))
        return
    with mapped_in_workers(_process_batch, batches, req.workers, _init_worker, args) as done:
        yield (result for batch in done for result in batch)


# --- the run ----------------------------------------------------------------------------------


def _counted(items: Iterable[tuple], progress: Progress) -> Iterator[tuple]:
    for item in items:
        progress.update()
        yield item


def _chunks(refs: list[RecordRef], size: int) -> list[list[RecordRef]]:
    return [refs[i : i + size] for i in range(0, len(refs), size)]


def _write_chunk(
    req: BuildRequest, chunk: int, results: Iterable[tuple], index_columns: tuple[str, ...]
) -> tuple[int, int, int]:
    """Write chunk `chunk`'s shard (if any record was stored), then its sidecar; returns (stored, skipped, long)."""
    signals, ids, index_rows, skipped_rows, found, long_records = [], [], [], [], 0, 0
    name = shard_name(chunk)
    sidecar = manifest.sidecar_path(req.out, chunk)
    # Temporary files a killed run left for this chunk (only this part ever writes them).
    for stale in [*req.out.glob(f".{name}.*.tmp"), *sidecar.parent.glob(f".{sidecar.name}.*.tmp")]:
        stale.unlink(missing_ok=True)
    for result in results:
        found += 1
        if result[0] == "ok":
            _, ref, signal, dead, meta, (duration, cut) = result
            long_records += cut
            index_rows.append(
                {
                    "shard": name,
                    "row": len(signals),
                    "source": req.dataset,
                    "record_id": ref.record_id,
                    "patient_id": meta.get("patient_id", ""),
                    "age": meta.get("age", ""),
                    "sex": meta.get("sex", ""),
                    "length": int(signal.shape[-1]),
                    "dead_leads": " ".join(dead),
                    "fingerprint": fingerprint(signal, req.spec.fs, req.spec.window, req.spec.dtype),
                    "duration_s": duration,
                    **{c: meta.get(c, "") for c in index_columns},
                }
            )
            signals.append(signal)
            ids.append(ref.record_id)
        else:
            _, ref, reason, detail = result
            skipped_rows.append({"source": req.dataset, "record_id": ref.record_id, "reason": reason, "detail": detail})
    if signals:
        write_shard(req.out / name, signals, ids, req.spec, attrs={"source": req.dataset, "chunk": chunk})
    # The sidecar comes last: its presence marks the chunk (and its shard) as complete.
    manifest.write_json(
        sidecar,
        {
            "chunk": chunk,
            "shard": name if signals else None,
            "found": found,
            "index": index_rows,
            "skipped": skipped_rows,
            "long_records": long_records,
        },
        compact=True,
    )
    return len(index_rows), len(skipped_rows), long_records


def _finished(req: BuildRequest) -> Summary | None:
    final = req.out / "preprocess.json"
    if not final.exists():
        return None
    done = manifest.read_finished(req.out)
    manifest.check_settings(done.get("settings", {}), req.settings(), req.out)
    manifest.check_sources(done.get("sources"), req.sources(), req.out)
    c, message = done["counts"], f" (already complete in {req.out}; left untouched{_source_changed(req)})"
    return Summary(c["stored"], c["skipped"], c["found"], True, message, c.get("long_records", 0))


def _source_changed(req: BuildRequest) -> str:
    """'; ...' when --src now lists other records than the finished set was built from ('' otherwise, or
    when that cannot be told: --src gone, or the set's plan removed)."""
    if not req.src.is_dir() or not (manifest.chunk_dir(req.out) / "plan.json").is_file():
        return ""
    try:
        refs, _ = SOURCES[req.dataset].find_records(req.src, req.subset)
        plan = manifest.read_plan(req.out)
    except EcgposError:
        return ""
    if manifest.records_digest(refs) == plan.get("records_sha256"):
        return ""
    return (
        f"; but {req.src} now lists {len(refs)} records, not the {plan['found']} it was built from: "
        "preprocess into a new --out to include them"
    )


def _remove_abandoned(out: Path, stream: TextIO) -> None:
    """Temporary files (a merge's index.csv, skipped.csv, preprocess.json; a chunk's shard or sidecar)
    that a killed run of this host left in `out`; those of other hosts may belong to a running part."""
    removed = remove_abandoned_temporaries(out)
    if removed:
        print(
            f"ecgpos preprocess: removed {removed} temporary file(s) that killed runs on this host left in {out}",
            file=stream,
            flush=True,
        )


def run(req: BuildRequest, stream: TextIO = sys.stderr) -> Summary:
    """Process this part's unfinished chunks; merge when every chunk of the set is done."""
    source = SOURCES[req.dataset]
    if req.num_parts < 1:
        raise EcgposError(f"--num-parts must be at least 1, got {req.num_parts}")
    if not 0 <= req.part < req.num_parts:
        raise EcgposError(f"--part must be in 0..{req.num_parts - 1}, got {req.part}")
    if req.records_per_shard < 1 or req.workers < 1:
        raise EcgposError("--records-per-shard and --workers must be at least 1")
    check_filter(req.spec)
    if req.workers > max_workers():  # the pool starts every worker at once
        raise EcgposError(
            f"--workers {req.workers} is more than this machine's {usable_cpus()} CPUs can serve "
            f"(at most {max_workers()}); e.g. --workers {usable_cpus()}"
        )
    if not 0 <= req.max_dead_leads < len(req.spec.leads):
        raise EcgposError(f"--max-dead-leads must be in 0..{len(req.spec.leads) - 1}, got {req.max_dead_leads}")
    if req.out.exists() and not req.out.is_dir():
        raise EcgposError(f"--out {req.out} exists and is not a folder")
    if req.out.is_dir():
        _remove_abandoned(req.out, stream)
    finished = _finished(req)
    if finished:
        return finished
    manifest.check_out_folder(req.out)
    if not req.src.is_dir():
        raise EcgposError(f"--src {req.src} is not a folder")
    refs, notes = source.find_records(req.src, req.subset)
    if not refs:
        hint = (
            f" ({notes['outside_subset']} records outside subset {req.subset!r}: try --subset all)"
            if notes.get("outside_subset")
            else ""
        )
        raise EcgposError(f"no {req.dataset} records found under {req.src}{hint}")
    chunks = _chunks(refs, req.records_per_shard)
    try:
        return _build(req, refs, chunks, notes, stream)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM by way of the CLI's handler
        done = len(chunks) - len(manifest.missing_chunks(req.out, len(chunks)))
        raise Interrupted(
            f"{done} of {len(chunks)} chunks are saved in {req.out}; the same command continues with the others"
        ) from None


def _build(
    req: BuildRequest, refs: list[RecordRef], chunks: list[list[RecordRef]], notes: dict, stream: TextIO
) -> Summary:
    """`run` once the records are listed: its part's unfinished chunks, then the merge if all are done."""
    source = SOURCES[req.dataset]
    write_test(req.out / "write-test", f"--out {req.out}")  # a folder this process can create and write into
    plan = manifest.write_or_check_plan(req.out, req.settings(), refs, len(chunks), notes, req.sources())
    if notes.get("not_a_record"):
        print(
            f"ecgpos preprocess: {notes['not_a_record']} .hea/.mat names under {req.src} (a .hea and its .mat "
            f"count once) are not {req.dataset} records (name not JSnnnnn): not counted as found "
            "(preprocess.json counts.not_a_record)",
            file=stream,
            flush=True,
        )
    if notes.get("repeated_exam_rows"):
        print(
            f"ecgpos preprocess: {notes['repeated_exam_rows']} exams.csv rows repeat an earlier row of their exam "
            "exactly: each exam is counted once (preprocess.json counts.repeated_exam_rows)",
            file=stream,
            flush=True,
        )
    todo = [
        k
        for k in range(len(chunks))
        if k % req.num_parts == req.part and not manifest.sidecar_path(req.out, k).exists()
    ]
    progress = Progress(sum(len(chunks[k]) for k in todo), stream)
    print(
        f"ecgpos preprocess: found {len(refs)} records in {len(chunks)} chunks; part {req.part}/{req.num_parts} "
        f"has {len(todo)} chunks to do",
        file=stream,
        flush=True,
    )
    stored = skipped = long_records = 0
    try:
        with _results(req, [ref for k in todo for ref in chunks[k]]) as results:
            for k in todo:
                counted = _counted(islice(results, len(chunks[k])), progress)
                s, sk, lr = _write_chunk(req, k, counted, source.INDEX_COLUMNS)
                stored, skipped, long_records = stored + s, skipped + sk, long_records + lr
                progress.chunk_done(k, s, sk)
    finally:
        progress.close()
    if manifest.missing_chunks(req.out, len(chunks)):
        pending = len(manifest.missing_chunks(req.out, len(chunks)))
        return Summary(
            stored,
            skipped,
            stored + skipped,
            False,
            f" in part {req.part}/{req.num_parts} ({len(todo)} chunks); {pending} chunks of other parts pending",
            long_records,
        )
    counts = manifest.merge(req.out, plan, source.INDEX_COLUMNS)
    message = f" ({counts['shards']} shards in {req.out})"
    return Summary(counts["stored"], counts["skipped"], counts["found"], True, message, counts.get("long_records", 0))


def check(out: Path) -> Summary:
    """Verify a set (SLURM's final step): every chunk done, shards match sidecars and hold what
    preprocessing writes (readable, 12 leads, finite standardised signals); merge if needed."""
    plan = manifest.read_plan(out, SOURCES)
    _remove_abandoned(out, sys.stderr)
    source = SOURCES[plan["settings"]["source"]]
    final = out / "preprocess.json"
    done = final.exists()
    counts = manifest.merge(out, plan, source.INDEX_COLUMNS, write=False)
    if done and manifest.read_finished(out)["counts"] != counts:
        raise EcgposError(f"{final} disagrees with the chunks it was merged from")
    expected = PreprocessSpec.from_dict(plan["settings"]["spec"])
    for path in shard_paths(out):  # NaN, garbage or a wrong lead count is not "complete"
        spec, _ = check_shard(path)
        expected.check_compatible(spec, f"shard {path.name}")
        check_shard_contents(path)
    if not done:  # a finished set is only read
        manifest.merge(out, plan, source.INDEX_COLUMNS, write=True)
    message = f" ({counts['shards']} shards in {out}; complete)"
    return Summary(counts["stored"], counts["skipped"], counts["found"], True, message, counts.get("long_records", 0))
