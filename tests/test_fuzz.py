"""Generated malformed inputs never raise through the CLI; every record is stored or skipped with a reason.

hypothesis mutates real WFDB records (header fields, `.mat` bytes), CODE-15 parts and shard files.
Each example runs the commands in-process (`ecgpos.cli.main`): an exception escaping main fails
the test, as would a traceback for a user. A good record in the same run is always stored.
Budget: under a minute of CI time for the whole file (FUZZ below).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from code15_fixtures import FS as CODE15_FS
from code15_fixtures import ecg_like, exam_row, padded_trace, write_exams_csv, write_part
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shard_fixtures import write_tiny_shards
from tiny_runs import pretrain_tiny

from ecgpos.cli import main
from ecgpos.resources import config_dir

torch.set_num_threads(1)
# CI runs the same 12 examples per test every time (derandomize); ECGPOS_FUZZ_EXAMPLES=N explores N random ones.
_EXAMPLES = int(os.environ.get("ECGPOS_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=_EXAMPLES or 12,
    deadline=None,
    derandomize=not _EXAMPLES,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
REASONS = {
    "unreadable",
    "truncated_signal",
    "corrupt_signal",
    "header_mismatch",
    "missing_lead",
    "duplicate_lead",
    "unknown_lead",
    "units",
    "sampling_rate",
    "unexpected_fs",
    "empty",
    "non_finite",
    "all_zero",
    "flat",
    "dead_leads",
    "lead_mismatch",
    "too_short",
    "missing_metadata",
    "unreadable_part",
    "duplicate_record",
    "duplicate_exam_rows",
    "shape",
}
TOKENS = [
    "-500",
    "500e3",
    "500.0.0",
    "1e12",
    "nan",
    "inf",
    "0",
    "",
    "-1",
    "99999999999",
    "4600",
    "5001",
    "1",
    "16",
    "212",
    "8",
    "80",
    "16+24",
    "16+999",
    "1000/mv",
    "abc/mV",
    "0/uV",
    "1000(5)/mV",
    "x",
    "#",
    "I",
    "II",
    "JS00001.mat",
    "other.dat",
    "500/250(1)",
    "3",
    "13",
]


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def real(shared_data) -> Path:
    return shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fuzz-export")
    shards = write_tiny_shards(root / "shards", n_records=12, records_per_shard=12)
    pretrain_tiny(
        0, shards, root / "run", "--set", "optim.steps=1", "--set", "train.batch_size=4", "--set", "train.num_workers=0"
    )
    assert main(["export", "--run-dir", str(root / "run"), "--out", str(root / "enc")]) == 0
    return root / "enc"


# --- WFDB headers and .mat payloads --------------------------------------------------------------

header_edit = st.tuples(
    st.integers(0, 13),
    st.integers(0, 9),
    st.one_of(st.sampled_from(TOKENS), st.text("0123456789.-+e/()mVuvx#", max_size=8)),
)
payload_edit = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 120_100)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("overwrite"), st.integers(0, 120_100), st.binary(min_size=1, max_size=64)),
)


def write_mutated(real: Path, folder: Path, record_id: str, headers: list, payload: tuple | None) -> None:
    lines = real.with_suffix(".hea").read_text().replace(real.name, record_id).splitlines()
    for line_no, field_no, token in headers:
        line_no %= len(lines)
        fields = lines[line_no].split(" ")
        fields[field_no % len(fields)] = token
        lines[line_no] = " ".join(fields)
    (folder / f"{record_id}.hea").write_text("\n".join(lines) + "\n")
    data = bytearray(real.with_suffix(".mat").read_bytes())
    if payload and payload[0] == "truncate":
        data = data[: payload[1]]
    elif payload and payload[0] == "append":
        data += payload[1]
    elif payload:
        data[payload[1] : payload[1] + len(payload[2])] = payload[2]
    (folder / f"{record_id}.mat").write_bytes(bytes(data))


@FUZZ
@given(records=st.lists(st.tuples(st.lists(header_edit, max_size=3), st.none() | payload_edit), min_size=1, max_size=3))
def test_fuzzed_wfdb_records_are_stored_or_skipped(real, export, records):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        folder = root / "src" / "WFDBRecords" / "01" / "010"
        folder.mkdir(parents=True)
        shutil.copyfile(real.with_suffix(".hea"), folder / "JS00001.hea")
        shutil.copyfile(real.with_suffix(".mat"), folder / "JS00001.mat")
        ids = ["JS00001"]
        for i, (headers, payload) in enumerate(records):
            ids.append(f"JS0000{i + 2}")
            write_mutated(real, folder, ids[-1], headers, payload)
        assert (
            main(
                [
                    "preprocess",
                    "ecg-arrhythmia",
                    "--src",
                    str(root / "src"),
                    "--subset",
                    "all",
                    "--out",
                    str(root / "out"),
                ]
            )
            == 0
        )
        stored = [r["record_id"] for r in rows(root / "out" / "index.csv")]
        skipped = rows(root / "out" / "skipped.csv")
        assert "JS00001" in stored and sorted(stored + [r["record_id"] for r in skipped]) == ids
        assert {r["reason"] for r in skipped} <= REASONS
        assert (
            main(
                [
                    "embed",
                    "--encoder",
                    str(export),
                    "--input",
                    str(root / "src"),
                    "--out",
                    str(root / "f.csv"),
                    "--no-progress",
                ]
            )
            == 0
        )
        embedded = [Path(r["record_id"]).name for r in rows(root / "f.csv")]
        refused = rows(root / "f.skipped.csv")
        assert "JS00001" in embedded and sorted(embedded + [Path(r["record_id"]).name for r in refused]) == ids
        assert {r["reason"] for r in refused} <= REASONS


# --- CODE-15 parts ------------------------------------------------------------------------------

trace_kind = st.sampled_from(["good", "nan", "zeros", "huge", "constant", "short", "inf"])
part_damage = st.sampled_from(["none", "truncate", "garbage", "empty", "eight_leads", "no_exam_id", "ids_mismatch"])


def trace(kind: str, seed: int) -> np.ndarray:
    x = ecg_like(4000, CODE15_FS, seed)
    if kind == "short":
        x = x[:, :800]
    t = padded_trace(x)
    if kind == "nan":
        t[100, 3] = np.nan
    elif kind == "inf":
        t[200, 0] = np.inf
    elif kind == "zeros":
        t[:] = 0
    elif kind == "huge":
        t *= 1e30
    elif kind == "constant":
        t[:] = 0.5
    return t


@FUZZ
@given(
    kinds=st.lists(trace_kind, min_size=1, max_size=4),
    damage=part_damage,
    ids=st.lists(st.integers(0, 5), min_size=4, max_size=4),
    listed=st.sets(st.integers(0, 5)),
)
def test_fuzzed_code15_parts_are_stored_or_skipped(kinds, damage, ids, listed):
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        write_part(src, 0, [1], [trace("good", 0)])  # an intact part with one good exam
        exam_ids = [100 + ids[i] for i in range(len(kinds))]
        path = write_part(src, 1, exam_ids, [trace(k, i) for i, k in enumerate(kinds)])
        write_exams_csv(src, [exam_row(1, 0)] + [exam_row(100 + i, 1) for i in sorted(listed)])
        data = path.read_bytes()
        if damage == "truncate":
            path.write_bytes(data[: len(data) // 3])
        elif damage == "garbage":
            path.write_bytes(b"\x89HDF\r\n" + bytes(range(256)) * 4)
        elif damage == "empty":
            path.write_bytes(b"")
        elif damage in ("eight_leads", "no_exam_id", "ids_mismatch"):
            with h5py.File(path, "r+") as f:
                if damage == "eight_leads":
                    t = f["tracings"][:, :, :8]
                    del f["tracings"]
                    f.create_dataset("tracings", data=t)
                elif damage == "no_exam_id":
                    del f["exam_id"]
                else:
                    e = f["exam_id"][:-1]
                    del f["exam_id"]
                    f.create_dataset("exam_id", data=e)
        out = Path(tmp) / "out"
        assert main(["preprocess", "code15", "--src", str(src), "--out", str(out)]) == 0
        stored = [r["record_id"] for r in rows(out / "index.csv")]
        skipped = rows(out / "skipped.csv")
        assert "1" in stored
        counts = json.loads((out / "preprocess.json").read_text())["counts"]
        assert counts["found"] == len(stored) + len(skipped)
        assert {r["reason"] for r in skipped} <= REASONS


# --- shard files ------------------------------------------------------------------------------

shard_damage = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0.0, 0.99)),
    st.tuples(st.just("overwrite"), st.floats(0.0, 0.99), st.binary(min_size=1, max_size=256)),
    st.tuples(st.sampled_from(["nan", "leads", "no_lengths", "long_lengths", "ids", "spec", "rank"])),
)


def damage_shard(path: Path, damage: tuple) -> None:
    if damage[0] in ("truncate", "overwrite"):
        data = bytearray(path.read_bytes())
        at = int(damage[1] * len(data))
        data = data[:at] if damage[0] == "truncate" else data[:at] + damage[2] + data[at + len(damage[2]) :]
        path.write_bytes(bytes(data))
        return
    with h5py.File(path, "r+") as f:
        kind = damage[0]
        if kind == "nan":
            f["signals"][0, 0, :10] = np.nan
        elif kind == "leads":
            s = f["signals"][:, :7]
            del f["signals"]
            f.create_dataset("signals", data=s)
        elif kind == "no_lengths":
            del f["lengths"]
        elif kind == "long_lengths":
            f["lengths"][0] = 10**6
        elif kind == "ids":
            del f["record_id"]
            f.create_dataset("record_id", data=["a"], dtype=h5py.string_dtype())
        elif kind == "spec":
            f.attrs["spec"] = "{not json"
        else:
            s = f["signals"][:, 0]
            del f["signals"]
            f.create_dataset("signals", data=s)


@FUZZ
@given(damage=shard_damage)
def test_fuzzed_shards_never_raise(export, damage):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shards = write_tiny_shards(root / "shards", n_records=6, records_per_shard=3)
        damage_shard(sorted(shards.glob("shard-*.h5"))[1], damage)
        (root / "busy").write_text("")  # --run-dir is a file: pretrain stops right after checking the shards
        assert (
            main(
                [
                    "pretrain",
                    "--level",
                    "0",
                    "--config",
                    str(config_dir() / "tiny" / "level0.yaml"),
                    "--shards",
                    str(shards),
                    "--run-dir",
                    str(root / "busy"),
                ]
            )
            == 2
        )
        rc = main(
            ["embed", "--encoder", str(export), "--input", str(shards), "--out", str(root / "f.csv"), "--no-progress"]
        )
        assert rc in (0, 2)
        if rc == 0:  # the damage left a readable shard: every record embedded or listed with a reason
            done = rows(root / "f.csv") + rows(root / "f.skipped.csv")
            assert len(done) == 6
