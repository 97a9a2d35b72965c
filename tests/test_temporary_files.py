"""Every temporary file ecgpos writes beside a target carries the shared name (`.NAME.<host>.<pid>.tmp`),
so that a later run removes what a killed process of this host left, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ecgpos.files import _TEMPORARY, host_tag, remove_abandoned_temporaries

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    finished = subprocess.Popen(["true"])
    finished.wait()  # reaped: its pid no longer runs
    return finished.pid


def _killed_during(call: str) -> None:
    """Run `call` in a child whose first unlink kills it: the write test's file stays behind."""
    code = "import os, pathlib\npathlib.Path.unlink = lambda self, *a, **k: os._exit(9)\n" + call
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 9


def test_a_preprocess_write_test_that_a_kill_left_is_removed_by_the_cleanup(tmp_path):
    out = tmp_path / "set"
    _killed_during(
        f"from ecgpos.files import write_test\nwrite_test(pathlib.Path({str(out)!r}) / 'write-test', '--out')"
    )
    (left,) = [p.name for p in out.iterdir()]
    match = _TEMPORARY.match(left)
    assert match and match["host"] == host_tag(), left
    assert remove_abandoned_temporaries(out) == 1 and not any(out.iterdir())


def test_embed_and_score_remove_only_their_own_abandoned_temporaries_beside_the_output(tmp_path):
    from ecgpos.inference.outputs import check_writable

    out = tmp_path / "features.npy"
    _killed_during(f"from ecgpos.inference.outputs import check_writable\ncheck_writable(pathlib.Path({str(out)!r}))")
    (probe,) = list(tmp_path.iterdir())
    dead = _dead_pid()
    ours = [
        tmp_path / f".features.ids.txt.{host_tag()}.{dead}.tmp",
        tmp_path / f".features.npy.{host_tag()}.{dead}.tmp.npy",
    ]
    not_ours = tmp_path / f".notes.txt.{host_tag()}.{dead}.tmp"  # the folder is the user's: not a file embed writes
    for path in (*ours, not_ours):
        path.write_text("half a file\n")
    check_writable(out)
    assert sorted(tmp_path.iterdir()) == [not_ours], probe.name


def test_the_leakage_guard_writes_its_fingerprint_cache_under_the_shared_name(tmp_path, monkeypatch, shared_data):
    from ecgpos.ecg.spec import PreprocessSpec
    from ecgpos.probes.shared.datasets import RecordLocator
    from ecgpos.probes.shared.leakage import probe_fingerprints

    renamed: list[str] = []

    def killed(src, dst):
        renamed.append(Path(src).name)
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        probe_fingerprints(
            ["records500/00000/00001_hr"], RecordLocator("ptbxl", shared_data), PreprocessSpec(), cache, "ptbxl"
        )
    (name,) = renamed
    match = _TEMPORARY.match(name)
    assert match and match["host"] == host_tag() and int(match["pid"]) == os.getpid(), name
    assert not any(cache.iterdir())  # an interrupted write leaves nothing behind
