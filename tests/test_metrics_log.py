"""metrics.jsonl on resume: records after the checkpoint's step are dropped, and so is every line that is
no record (a half-written line, or valid JSON that is not a record)."""

from __future__ import annotations

import json
from pathlib import Path

from ecgpos.pretrain.metrics_log import MetricsLog, truncate_metrics

RECORDS = [json.dumps({"step": s, "loss": 1 / s}) for s in (1, 2, 3)]
NOT_RECORDS = ["[1, 2]", "3", "null", '"step"', '{"step": "x"}', '{"step": null}', '{"step": [1]}', '{"step": 1e999}']


def test_truncate_keeps_the_records_up_to_the_step_and_drops_lines_that_are_no_record(tmp_path: Path) -> None:
    """A line of valid JSON but no object (e.g. `[1, 2]`) was an AttributeError traceback of
    `pretrain --resume auto`; a step that is no number a ValueError or TypeError."""
    path = tmp_path / "metrics.jsonl"
    no_step = '{"val_loss": 0.5}'  # no step: counts as step 0, as records always have
    lines = [RECORDS[0], *NOT_RECORDS, RECORDS[1], no_step, RECORDS[2]]
    path.write_bytes(("\n".join(lines) + "\n").encode() + b'\xff\xfe{"step": 1}\n{"step": 2, "lo')
    truncate_metrics(path, 2)
    assert path.read_text().splitlines() == [RECORDS[0], RECORDS[1], no_step]


def test_a_resumed_log_drops_them_too(tmp_path: Path) -> None:
    """The resume path itself: MetricsLog of a run resumed at step 2."""
    (tmp_path / "metrics.jsonl").write_text("\n".join([RECORDS[0], "[1, 2]", *RECORDS[1:]]) + "\n")
    log = MetricsLog(tmp_path, is_main=True, start_step=2, resume=True)
    log.close()
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == RECORDS[:2]
