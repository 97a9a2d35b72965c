"""index.csv fingerprints the leakage guard reads: a damaged one is fingerprinted again from the shards
and said so, never left out (a copy behind it would read as "no overlap"), nor a traceback."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from shard_fixtures import write_tiny_shards

from ecgpos.ecg.fingerprint import fingerprint, fingerprint_problem, hex_length
from ecgpos.ecg.shards import iter_shard_records
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.errors import EcgposError
from ecgpos.probes.shared.leakage import load_pretraining

SPEC = DEFAULT_SPEC


def shards_with_prints(folder: Path, edit: dict[int, str] | None = None) -> tuple[Path, dict[str, str]]:
    """Tiny shards whose index.csv carries fingerprints, row k's replaced by edit[k]; and the true prints."""
    write_tiny_shards(folder, n_records=6, records_per_shard=6)
    true = {rid: fingerprint(x, SPEC.fs, SPEC.window, SPEC.dtype) for rid, x in iter_shard_records(folder)}
    with open(folder / "index.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for k, row in enumerate(rows):
        row["fingerprint"] = (edit or {}).get(k, true[row["record_id"]])
    with open(folder / "index.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return folder, true


def test_fingerprint_problem_names_length_and_hex():
    good = "a" * hex_length(SPEC.fs, SPEC.window)
    assert hex_length(SPEC.fs, SPEC.window) == 136 and not fingerprint_problem(good, SPEC.fs, SPEC.window)
    assert "134 hex digits" in fingerprint_problem(good[:-2], SPEC.fs, SPEC.window)
    assert "not hexadecimal" in fingerprint_problem("z" + good[1:], SPEC.fs, SPEC.window)


@pytest.mark.parametrize(
    "damage", [lambda p: p[:-2], lambda p: p[:-8], lambda p: p + "00", lambda p: "zz" + p[2:], lambda p: p.upper()[:-1]]
)
def test_a_planted_leak_behind_a_damaged_fingerprint_is_found(tmp_path, damage):
    # row 2's fingerprint damaged (one byte short, 4 short, one long, not hex, an odd digit short)
    folder = tmp_path / "shards"
    _, true = shards_with_prints(folder)
    rid = sorted(true)[2]
    shards_with_prints(folder, {2: damage(true[rid])})
    logged: list[str] = []
    index = load_pretraining([folder], log=logged.append)
    assert len(index) == 6 and index.computed == 1
    assert any("damaged fingerprint" in line and "line 4" in line and "index.csv" in line for line in logged), logged
    prints = next(iter(index.by_spec.values()))
    # the probe record that is a copy of the damaged row's record is found, at 0 bits
    assert prints.match(true[rid]) == [(f"shards:{rid}", 0)]


def test_a_damaged_fingerprint_of_a_record_the_shards_lack_is_refused_in_one_line(tmp_path):
    folder, true = shards_with_prints(tmp_path / "shards")
    with open(folder / "index.csv") as handle:
        text = handle.read()
    rid = sorted(true)[0]
    (folder / "index.csv").write_text(text.replace(rid, "GHOST").replace(true[rid], true[rid][:-2]))
    with pytest.raises(EcgposError, match=r"index.csv holds a damaged fingerprint .*GHOST \(line \d+"):
        load_pretraining([folder], log=lambda s: None)
