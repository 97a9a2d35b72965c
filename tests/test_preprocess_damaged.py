"""Preprocess sidecar files that are valid JSON of another structure (hand-edited, or overwritten by
another tool): `--check` and a resume refuse them in one line naming the file and what to do, and
following that advice gives back the same set."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from refusal_helpers import one_line_error
from test_preprocess_build import arrhythmia_args, digests, preprocess


def _copy_of(arrhythmia_shards: Path, tmp_path: Path) -> Path:
    """A finished set of its own (the session's set is shared by every test)."""
    out = tmp_path / "set"
    shutil.copytree(arrhythmia_shards, out)
    return out


_SET_FIX = "it pins the settings and records of the set, so use a new --out (or remove {out})"
_MERGE_FIX = (
    "delete it and rerun the command (or `ecgpos preprocess --check --out {out}`) to merge it again from the chunks"
)
_CHUNK_FIX = (
    "delete it and preprocess.json and rerun the preprocess command (the --part that owns chunk 0, if the set "
    "was made in parts) to redo that chunk"
)
_ROW = '{"record_id": "JS00001", "shard": "shard-00000.h5"}'
# (file, its damaged text: valid JSON of another structure, what the refusal says is wrong, what to do)
DAMAGED = [
    ("preprocess.json", "{}", "no 'counts'", _MERGE_FIX),
    ("preprocess.json", "[]", "holds an array, not an object", _MERGE_FIX),
    ("preprocess.json", '{"counts": []}', "'counts' is an array, not an object", _MERGE_FIX),
    (
        "preprocess.json",
        '{"counts": {"found": 1, "stored": "1", "skipped": 0}}',
        "'counts.stored' is a string, not an integer",
        _MERGE_FIX,
    ),
    ("chunks/plan.json", "{}", "no 'settings'", _SET_FIX),
    ("chunks/plan.json", "[1]", "holds an array, not an object", _SET_FIX),
    (
        "chunks/plan.json",
        '{"settings": {"source": "ecg-arrhythmia"}, "found": 200, "num_chunks": 4}',
        "no 'settings.spec'",
        _SET_FIX,
    ),
    (
        "chunks/plan.json",
        '{"settings": {"source": "ptb", "spec": {}}, "found": 200, "num_chunks": 4}',
        "'settings.source' is 'ptb', not one of ecg-arrhythmia, code15",
        _SET_FIX,
    ),
    (
        "chunks/plan.json",
        '{"settings": {"source": "ecg-arrhythmia", "spec": {}}, "found": 200, "num_chunks": null}',
        "'num_chunks' is null, not an integer",
        _SET_FIX,
    ),
    ("chunks/chunk-00000.json", "{}", "no 'found'", _CHUNK_FIX),
    ("chunks/chunk-00000.json", "null", "holds null, not an object", _CHUNK_FIX),
    (
        "chunks/chunk-00000.json",
        '{"found": 1, "index": {}, "skipped": []}',
        "'index' is an object, not an array",
        _CHUNK_FIX,
    ),
    (
        "chunks/chunk-00000.json",
        '{"found": 1, "index": [["JS00001"]], "skipped": []}',
        "index row 0 is an array, not an object",
        _CHUNK_FIX,
    ),
    (
        "chunks/chunk-00000.json",
        '{"found": 1, "index": [{"shard": "x"}], "skipped": []}',
        "index row 0 has no 'record_id' string",
        _CHUNK_FIX,
    ),
    (
        "chunks/chunk-00000.json",
        f'{{"found": 2, "index": [{_ROW}, {_ROW[:-1]}, "extra": 1}}], "skipped": []}}',
        "index row 1 has field(s) that are no column of index.csv: 'extra'",
        _CHUNK_FIX,
    ),
    (
        "chunks/chunk-00000.json",
        '{"found": 1, "index": [], "skipped": [{"record_id": "JS00001", "reason": ["x"]}]}',
        "skipped row 0 has no 'reason' string",
        _CHUNK_FIX,
    ),
]


@pytest.mark.parametrize(
    ("name", "text", "problem", "fix"), DAMAGED, ids=[f"{Path(d[0]).stem}-{i}" for i, d in enumerate(DAMAGED)]
)
def test_check_refuses_a_sidecar_of_the_wrong_structure_in_one_line(
    arrhythmia_shards, tmp_path, capsys, name, text, problem, fix
):
    """Valid JSON of another structure in preprocess.json, the plan or a chunk's sidecar was a KeyError,
    TypeError or AttributeError traceback of --check: now one line naming the file and what to do."""
    out = _copy_of(arrhythmia_shards, tmp_path)
    (out / name).write_text(text)
    before = digests(out)
    rc, _, err = preprocess(capsys, "--check", "--out", str(out))
    assert one_line_error(rc, err, "preprocess") == (
        f"ecgpos preprocess: error: {out / name} is damaged ({problem}); {fix.format(out=out)}"
    )
    assert digests(out) == before  # nothing written


def test_a_damaged_preprocess_json_is_refused_on_resume_and_merged_again_once_deleted(
    shared_data, arrhythmia_shards, tmp_path, capsys
):
    out = _copy_of(arrhythmia_shards, tmp_path)
    finished = digests(out)
    args = arrhythmia_args(shared_data, out, "--records-per-shard", "64")
    for name, text in (("preprocess.json", "[]"), ("preprocess.json", '{"counts": {}}')):
        (out / name).write_text(text)
        rc, _, err = preprocess(capsys, *args)  # was an AttributeError (a list has no .get)
        one_line_error(rc, err, "preprocess", f"{out / name} is damaged (")
    (out / "preprocess.json").unlink()  # as the refusal says: the rerun merges it again from the chunks
    rc, printed, _ = preprocess(capsys, *args)
    assert rc == 0 and "stored 200 + skipped 0 = found 200 (4 shards" in printed
    assert digests(out) == finished
    (out / "preprocess.json").unlink()
    rc, printed, _ = preprocess(capsys, "--check", "--out", str(out))  # the other way the refusal names
    assert rc == 0 and "found 200 (4 shards" in printed and digests(out) == finished


def test_a_damaged_chunk_sidecar_of_an_unfinished_set_is_refused_and_redone_once_deleted(
    shared_data, arrhythmia_shards, tmp_path, capsys
):
    """A set whose every chunk is done but not yet merged (a run killed while merging): the resume
    merges, and a chunk sidecar of the wrong structure was a KeyError traceback there."""
    out = _copy_of(arrhythmia_shards, tmp_path)
    finished = digests(out)
    for name in ("preprocess.json", "index.csv", "skipped.csv"):
        (out / name).unlink()
    sidecar = out / "chunks" / "chunk-00002.json"
    sidecar.write_text('{"found": 64, "index": [], "skipped": {}}')
    args = arrhythmia_args(shared_data, out, "--records-per-shard", "64")
    rc, _, err = preprocess(capsys, *args)
    assert rc == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (  # after the line saying what it found
        f"ecgpos preprocess: error: {sidecar} is damaged ('skipped' is an object, not an array); delete it and "
        "rerun the preprocess command (the --part that owns chunk 2, if the set was made in parts) to redo "
        "that chunk"
    )
    rc, _, err = preprocess(capsys, "--check", "--out", str(out))
    one_line_error(rc, err, "preprocess", f"{sidecar} is damaged ('skipped' is an object")
    sidecar.unlink()
    rc, printed, _ = preprocess(capsys, *args)
    assert rc == 0 and "stored 200 + skipped 0 = found 200 (4 shards" in printed
    assert digests(out) == finished  # chunk 2 redone to the same bytes


def test_a_damaged_chunk_sidecar_of_a_finished_set_is_redone_once_it_and_preprocess_json_are_deleted(
    shared_data, arrhythmia_shards, tmp_path, capsys
):
    out = _copy_of(arrhythmia_shards, tmp_path)
    finished = digests(out)
    sidecar = out / "chunks" / "chunk-00000.json"
    sidecar.write_text("{}")
    rc, _, err = preprocess(capsys, "--check", "--out", str(out))
    one_line_error(rc, err, "preprocess", "delete it and preprocess.json and rerun")
    sidecar.unlink()
    (out / "preprocess.json").unlink()
    rc, printed, _ = preprocess(capsys, *arrhythmia_args(shared_data, out, "--records-per-shard", "64"))
    assert rc == 0 and "stored 200 + skipped 0 = found 200 (4 shards" in printed
    assert digests(out) == finished
