"""`ecgpos preprocess` end to end on the real records: format, round trip, --workers/--part, resume, --check."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
from refusal_helpers import read_rows

from ecgpos.cli import main
from ecgpos.ecg.shards import iter_shard_records, read_shard_spec
from ecgpos.ecg.signal import preprocess_signal
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.preprocessing import ecg_arrhythmia


def preprocess(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["preprocess", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def arrhythmia_args(shared_data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "ecg-arrhythmia",
        "--src",
        str(shared_data / "ecg-arrhythmia"),
        "--subset",
        "all",
        "--out",
        str(out),
        *extra,
    ]


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every file in a shard folder (relative path -> digest)."""
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_done_when_200_real_records(arrhythmia_shards):
    index = read_rows(arrhythmia_shards / "index.csv")
    assert len(index) == 200 and read_rows(arrhythmia_shards / "skipped.csv") == []
    assert list(index[0])[:9] == [
        "shard",
        "row",
        "source",
        "record_id",
        "patient_id",
        "age",
        "sex",
        "length",
        "dead_leads",
    ]
    info = json.loads((arrhythmia_shards / "preprocess.json").read_text())
    assert info["counts"]["found"] == info["counts"]["stored"] == 200 and info["counts"]["skipped"] == 0
    assert info["spec"] == DEFAULT_SPEC.to_dict() and info["source"] == "ecg-arrhythmia" and info["version"]
    shards = sorted(arrhythmia_shards.glob("shard-*.h5"))
    assert [p.name for p in shards] == [f"shard-{k:05d}.h5" for k in range(4)]  # 64 records per shard
    rows = 0
    for path in shards:
        with h5py.File(path, "r") as f:
            signals = f["signals"]
            assert signals.dtype == np.float16 and signals.shape[1:] == (12, 2500)
            assert signals.chunks == (1, 12, 2500)
            assert f.attrs["fs"] == 250 and list(f.attrs["leads"]) == list(DEFAULT_SPEC.leads)
            assert np.all(f["lengths"][:] == 2500)
            rows += signals.shape[0]
            assert np.isfinite(signals[:]).all()
    assert rows == 200
    assert read_shard_spec(arrhythmia_shards) == DEFAULT_SPEC


def test_shard_round_trip(arrhythmia_shards, shared_data):
    src = shared_data / "ecg-arrhythmia"
    refs = {r.record_id: r for r in ecg_arrhythmia.find_records(src, "all")[0]}
    index = {row["record_id"]: row for row in read_rows(arrhythmia_shards / "index.csv")}
    seen = 0
    for record_id, x in iter_shard_records(arrhythmia_shards):
        seen += 1
        if seen % 25:
            continue
        raw = ecg_arrhythmia.load_record(src, refs[record_id])
        expected = preprocess_signal(raw.signal, raw.fs, raw.leads, DEFAULT_SPEC)
        assert x.dtype == np.float32 and x.shape == expected.shape == (12, int(index[record_id]["length"]))
        np.testing.assert_allclose(x, expected, atol=2e-3 * np.abs(expected).max())  # float16 storage
        assert index[record_id]["age"] == raw.meta["age"] and index[record_id]["dx"] == raw.meta["dx"]
    assert seen == 200


def test_workers_and_parts_write_the_same_bytes(shared_data, tmp_path, capsys):
    rc, out, _ = preprocess(capsys, *arrhythmia_args(shared_data, tmp_path / "one", "--records-per-shard", "16"))
    assert rc == 0 and "stored 200 + skipped 0 = found 200" in out
    reference = digests(tmp_path / "one")
    assert len([k for k in reference if k.startswith("shard-")]) == 13
    rc, _, _ = preprocess(
        capsys, *arrhythmia_args(shared_data, tmp_path / "two", "--records-per-shard", "16", "--workers", "2")
    )
    assert rc == 0 and digests(tmp_path / "two") == reference
    for part in (2, 0, 1):  # any order; the last one merges
        rc, out, _ = preprocess(
            capsys,
            *arrhythmia_args(
                shared_data, tmp_path / "parts", "--records-per-shard", "16", "--part", str(part), "--num-parts", "3"
            ),
        )
        assert rc == 0
        assert ("= found 200" in out) == (part == 1)
        assert ((tmp_path / "parts" / "index.csv").exists()) == (part == 1)
    assert digests(tmp_path / "parts") == reference
    rc, out, _ = preprocess(capsys, "--check", "--out", str(tmp_path / "parts"))
    assert rc == 0 and "stored 200 + skipped 0 = found 200" in out


def test_check_names_missing_chunks_and_settings_are_guarded(shared_data, tmp_path, capsys):
    out_dir = tmp_path / "set"
    rc, out, _ = preprocess(
        capsys, *arrhythmia_args(shared_data, out_dir, "--records-per-shard", "50", "--part", "0", "--num-parts", "2")
    )
    assert rc == 0 and "2 chunks of other parts pending" in out
    rc, _, err = preprocess(capsys, "--check", "--out", str(out_dir))
    assert rc == 2 and "2 of 4 chunks not done yet (chunk 1, 3)" in err and len(err.strip().splitlines()) == 1
    rc, _, err = preprocess(capsys, *arrhythmia_args(shared_data, out_dir, "--records-per-shard", "40"))
    assert rc == 2 and "records_per_shard: 50 != 40" in err
    # a set begun by an earlier version, which neither recorded nor applied a setting: no option fits it
    plan = out_dir / "chunks" / "plan.json"
    saved = plan.read_text()
    older = json.loads(saved)
    del older["settings"]["keep_lead_mismatch"]
    plan.write_text(json.dumps(older))
    rc, _, err = preprocess(capsys, *arrhythmia_args(shared_data, out_dir, "--records-per-shard", "50"))
    assert rc == 2 and err.strip().splitlines() == [
        f"ecgpos preprocess: error: {out_dir} holds a preprocessing run of an earlier ecgpos, made without the "
        f"settings keep_lead_mismatch: no option resumes it; use a new --out (or remove {out_dir})"
    ], err
    plan.write_text(saved)
    rc, out, _ = preprocess(capsys, *arrhythmia_args(shared_data, out_dir, "--records-per-shard", "50"))
    assert rc == 0 and "stored 200 + skipped 0 = found 200" in out
    before = {p: p.stat().st_mtime_ns for p in out_dir.rglob("*")}
    rc, out, _ = preprocess(capsys, *arrhythmia_args(shared_data, out_dir, "--records-per-shard", "50"))
    assert rc == 0 and "already complete" in out and "stored 200 + skipped 0 = found 200" in out
    assert {p: p.stat().st_mtime_ns for p in out_dir.rglob("*")} == before  # a finished set is left untouched
    rc, _, err = preprocess(
        capsys, *arrhythmia_args(shared_data, out_dir, "--records-per-shard", "50", "--dtype", "float32")
    )
    assert rc == 2 and "dtype" in err


def _start_preprocess(*args: object) -> subprocess.Popen:
    """`ecgpos preprocess ARGS` in a process group of its own (as a terminal runs it), stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "ecgpos.cli", "preprocess", *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_until(done: Callable[[], bool], proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)


@pytest.fixture(scope="module")
def by_eights(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Digests of an uninterrupted run in chunks of 8 records (25 chunks)."""
    out = tmp_path_factory.mktemp("by-eights") / "set"
    assert main(["preprocess", *arrhythmia_args(shared_data, out, "--records-per-shard", "8")]) == 0
    return digests(out)


def test_resume_after_kill_9(shared_data, tmp_path, capsys, by_eights):
    args = arrhythmia_args(shared_data, tmp_path / "killed", "--records-per-shard", "8")
    proc = _start_preprocess(*args)
    chunks = tmp_path / "killed" / "chunks"
    _wait_until(lambda: len(list(chunks.glob("chunk-*.json"))) >= 3, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    done = len(list(chunks.glob("chunk-*.json")))
    assert 3 <= done < 25 and not (tmp_path / "killed" / "preprocess.json").exists()
    rc, out, _ = preprocess(capsys, *args)
    assert rc == 0 and "stored 200 + skipped 0 = found 200" in out
    assert digests(tmp_path / "killed") == by_eights  # no duplicates, no losses, no temporary files left behind
    ids = [row["record_id"] for row in read_rows(tmp_path / "killed" / "index.csv")]
    assert len(ids) == len(set(ids)) == 200


def _running_in_group(pgid: int) -> list[int]:
    """Processes of a process group that still run (zombies aside: a container's init may never reap them)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                pids.append(int(stat.parent.name))
    return pids


# (signal, what to wait for, then seconds more, --workers); the plan is written just before the workers start
STOPS = [
    (signal.SIGINT, "chunks/chunk-00000.json", 0.0, 2),
    *((signal.SIGTERM, "chunks/plan.json", delay, 2) for delay in (0.0, 0.3)),
    (signal.SIGTERM, "chunks/chunk-00000.json", 0.0, 2),
    (signal.SIGTERM, "chunks/chunk-00000.json", 0.0, 1),
]


@pytest.mark.skipif(sys.platform != "linux", reason="reads process groups from /proc")
@pytest.mark.parametrize(("sig", "after", "delay", "workers"), STOPS)
def test_ctrl_c_or_sigterm_to_the_process_group_is_one_line_and_the_rerun_completes(
    shared_data, tmp_path, capsys, by_eights, sig, after, delay, workers
):
    """Ctrl-C reaches the terminal's whole process group, and SIGTERM (scancel, preemption, a time limit)
    every process of a Slurm job: the spawned workers too, even those still starting up. One line says
    what is kept (exit 130; 143 for SIGTERM, which used to kill preprocess without a word), no worker
    prints a traceback or outlives the command, and the rerun writes the bytes of an uninterrupted run."""
    out = tmp_path / "out"
    args = arrhythmia_args(shared_data, out, "--records-per-shard", "8", "--workers", str(workers))
    proc = _start_preprocess(*args)
    _wait_until((out / after).exists, proc)
    time.sleep(delay)
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=60)
    code, said = (143, "terminated") if sig == signal.SIGTERM else (130, "interrupted")
    assert proc.returncode == code, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err
    done = len(list((out / "chunks").glob("chunk-*.json")))
    assert err.splitlines()[-1] == (
        f"ecgpos preprocess: {said}: {done} of 25 chunks are saved in {out}; the same command continues with the others"
    )
    deadline = time.monotonic() + 5  # the resource tracker ends when its parent has
    while _running_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _running_in_group(proc.pid) == []
    assert not [p.name for p in out.rglob(".*")]  # no temporary files left behind
    rc, printed, _ = preprocess(capsys, *args[:-2], "--workers", "1")  # quicker; the bytes do not depend on it
    assert rc == 0 and "stored 200 + skipped 0 = found 200" in printed
    assert digests(out) == by_eights  # no record repeated or lost


def test_progress_is_a_bar_on_a_terminal_and_lines_otherwise():
    import io

    from ecgpos.preprocessing.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, bar in ((Terminal(), True), (io.StringIO(), False)):
        progress = Progress(4, stream)
        for _ in range(4):
            progress.update()
        progress.chunk_done(0, 3, 1)
        progress.close()
        text = stream.getvalue()
        assert ("4/4" in text and "\r" in text) == bar
        assert ("chunk 0: stored 3, skipped 1 (4/4 records" in text) == (not bar)


def test_a_later_run_removes_temporary_files_of_killed_merges_on_this_host_only(shared_data, tmp_path, capsys):
    """A run killed while merging left `.index.csv.PID.tmp` behind for good; a pid alone cannot tell a
    dead writer on this node from a live one on another node merging into the same folder."""
    from ecgpos.files import atomic_path, host_tag

    with atomic_path(tmp_path / "x.csv") as tmp:  # the temporary name says which host and process write it
        assert tmp.name == f".x.csv.{host_tag()}.{os.getpid()}.tmp"
        tmp.write_text("")
    if Path("/proc/self/ns/pid").exists():  # containers sharing a host name do not share pids
        assert host_tag().endswith(f"-pidns{os.stat('/proc/self/ns/pid').st_ino}")
    out_dir = tmp_path / "set"
    args = ["--records-per-shard", "50", "--num-parts", "2"]
    rc, out, _ = preprocess(capsys, *arrhythmia_args(shared_data, out_dir, *args, "--part", "0"))
    assert rc == 0 and "2 chunks of other parts pending" in out
    finished = subprocess.Popen(["true"])
    finished.wait()  # its pid no longer runs
    dead = out_dir / f".index.csv.{host_tag()}.{finished.pid}.tmp"
    dead_json = out_dir / f".preprocess.json.{host_tag()}.{finished.pid}.tmp"
    other_host = out_dir / f".skipped.csv.{host_tag()}-other-node.{finished.pid}.tmp"
    running = subprocess.Popen(["sleep", "60"])  # a writer of this host still at work
    alive = out_dir / f".skipped.csv.{host_tag()}.{running.pid}.tmp"
    for path in (dead, dead_json, other_host, alive):
        path.write_text("half a file\n")
    try:
        rc, out, err = preprocess(capsys, *arrhythmia_args(shared_data, out_dir, *args, "--part", "1"))
        assert rc == 0 and "stored 200 + skipped 0 = found 200" in out
        assert f"removed 2 temporary file(s) that killed runs on this host left in {out_dir}" in err
        assert not dead.exists() and not dead_json.exists() and other_host.exists() and alive.exists()
        rc, out, err = preprocess(capsys, "--check", "--out", str(out_dir))
        assert rc == 0 and "removed" not in err and other_host.exists() and alive.exists()
    finally:
        running.kill()
        running.wait()
