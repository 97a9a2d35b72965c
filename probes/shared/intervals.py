"""Bootstrap intervals for probe results, from the seeds' test scores, and paired differences.

A probe folder keeps every seed's test logits in `test_scores.npz` (with the test record keys and
labels; the file is ecgpos.export.probe_scores's), so `--compare` can redo the bootstrap on the same
resamples for two encoders: the paired difference of their seed-mean macro-AUROC and its interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ecgpos.errors import EcgposError
from ecgpos.export.probe_scores import ScoreSet
from ecgpos.probes.shared.bootstrap import LEVEL, MAX_REDRAWS, SEED, bootstrap_unit, paired_difference, seed_intervals

DIFFERENCE_COLUMNS = [
    "encoder",
    "baseline",
    "task",
    "fraction",
    "difference",
    "low",
    "high",
    "n_test",
    "left_out",
    "bootstrap",
    "bootstrap_unit",
]
# bootstrap: resamples the interval rests on; bootstrap_unit: what they resample, "patient" or "record"
INTERVAL_COLUMNS = [
    "test_auroc_low",
    "test_auroc_high",
    "mean_auroc_low",
    "mean_auroc_high",
    "bootstrap",
    "bootstrap_unit",
]


def collect_scores(
    rows: list[dict], tests: dict[tuple[str, str], tuple[list[str], np.ndarray, list[str] | None]]
) -> list[ScoreSet]:
    """Take the per-seed `scores` out of result rows into one ScoreSet per (encoder, task, fraction).

    tests: (encoder, task) -> (test record keys, test labels, their patients or None) in the order that
    encoder's probes scored them (per encoder: a record one encoder could not embed is missing from its
    test set only).
    """
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        scores = row.pop("scores", None)
        if scores is not None:
            groups.setdefault((row["encoder"], row["task"], row["fraction"]), []).append({**row, "scores": scores})
    out = []
    for (encoder, task, fraction), part in groups.items():
        part.sort(key=lambda r: r["seed"])
        keys, labels, patients = tests[(encoder, task)]
        out.append(
            ScoreSet(
                encoder,
                task,
                float(fraction),
                [int(r["seed"]) for r in part],
                list(keys),
                np.asarray(labels, dtype=np.uint8),
                np.stack([r["scores"] for r in part]),
                None if patients is None else list(patients),
            )
        )
    return out


def kept_note(kept: int, n_boot: int) -> str:
    """The note of an interval that rests on fewer resamples than asked for ('' when it rests on all)."""
    if kept >= n_boot:
        return ""
    return (
        f"bootstrap: {kept} of {n_boot} resamples kept (the others left a class the test split scores "
        f"without a positive or a negative after {MAX_REDRAWS} draws)"
    )


def add_intervals(rows: list[dict], sets: Sequence[ScoreSet], n_boot: int, level: float = LEVEL) -> None:
    """Fill the interval columns of `rows` in place: the seed's own interval and the seed-mean interval.
    `bootstrap` is the number of resamples the interval rests on; fewer than `n_boot` is also a note;
    `bootstrap_unit` what they resample (empty without an interval)."""
    found = {}
    if n_boot > 0:
        for s in sets:
            intervals = seed_intervals(s.scores, s.labels, n_boot, SEED, level, s.patients)
            found[(s.encoder, s.task, s.fraction)] = (s.seeds, intervals, bootstrap_unit(s.patients))
    for row in rows:
        hit = found.get((row["encoder"], row["task"], float(row["fraction"])))
        low = high = mlow = mhigh = float("nan")
        kept, unit = n_boot, ""
        if hit and int(row["seed"]) in hit[0]:
            low, high = hit[1].seeds[hit[0].index(int(row["seed"]))]
            mlow, mhigh = hit[1].mean
            kept, unit = hit[1].resamples.shape[1], hit[2]
            row["note"] = "; ".join(n for n in (row.get("note", ""), kept_note(kept, n_boot)) if n)
        row.update(
            test_auroc_low=low,
            test_auroc_high=high,
            mean_auroc_low=mlow,
            mean_auroc_high=mhigh,
            bootstrap=kept,
            bootstrap_unit=unit,
        )


def _aligned(a: ScoreSet, b: ScoreSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str] | None] | None:
    """Both sets' scores on the test records they share (a's order), and those records' labels and
    patients (None when neither folder stored patients).

    A shared record labelled differently on the two sides means the folders were probed on different
    splits: their scores answer different questions, so no difference is computed (EcgposError)."""
    where_b = {k: i for i, k in enumerate(b.keys)}
    rows_a = [i for i, k in enumerate(a.keys) if k in where_b]
    if not rows_a:
        return None
    rows_b = [where_b[a.keys[i]] for i in rows_a]
    if a.labels.shape[1] != b.labels.shape[1]:  # the label rows cannot even be compared
        raise EcgposError(
            f"--compare: {a.encoder!r} and {b.encoder!r} score {a.labels.shape[1]} and {b.labels.shape[1]} "
            f"classes of task {a.task}: they were probed on different splits, so no paired difference"
        )
    disagree = int((a.labels[rows_a] != b.labels[rows_b]).any(axis=1).sum())
    if disagree:
        raise EcgposError(
            f"--compare: {a.encoder!r} and {b.encoder!r} label {disagree} of the {len(rows_a)} {a.task} test "
            "records they share differently: they were probed on different splits, so no paired difference"
        )
    if a.patients is not None:
        patients = [a.patients[i] for i in rows_a]
    else:
        patients = None if b.patients is None else [b.patients[i] for i in rows_b]
    return a.scores[:, rows_a], b.scores[:, rows_b], a.labels[rows_a], patients


def paired_differences(
    sets: Sequence[ScoreSet], encoders: Sequence[str], n_boot: int, level: float = LEVEL
) -> pd.DataFrame:
    """For each pair of encoders (later minus earlier, in `encoders` order) and each (task, fraction)
    both have: the seed-mean macro-AUROC difference and its paired bootstrap interval, over the test
    records both scored (n_test); left_out counts the records only one of them scored, bootstrap the
    resamples the interval rests on (`ecgpos.probes.shared.bootstrap.stratified_indices` may keep fewer than n_boot)."""
    by_key = {(s.encoder, s.task, s.fraction): s for s in sets}
    rows = []
    for i, first in enumerate(encoders):
        for second in encoders[i + 1 :]:
            for (enc, task, fraction), a in by_key.items():
                b = by_key.get((first, task, fraction))
                if enc != second or b is None:
                    continue
                aligned = _aligned(a, b)
                if aligned is None:
                    continue
                *scores, labels, patients = aligned
                diff, low, high, kept = paired_difference(*scores, labels, n_boot, SEED, level, patients)
                shared = len(aligned[2])
                rows.append(
                    {
                        "encoder": second,
                        "baseline": first,
                        "task": task,
                        "fraction": fraction,
                        "difference": diff,
                        "low": low,
                        "high": high,
                        "n_test": shared,
                        "left_out": len(set(a.keys) | set(b.keys)) - shared,
                        "bootstrap": kept,
                        "bootstrap_unit": bootstrap_unit(patients) if n_boot else "",
                    }
                )
    return pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS)


def _fraction_text(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def differences_markdown(diffs: pd.DataFrame, n_boot: int) -> str:
    """summary.md section: per fraction, one row per encoder pair, 'difference [low, high]' per task
    ('difference' alone without a bootstrap, n_boot 0)."""
    from ecgpos.probes.shared.tasks import TASKS, task_label

    how = (
        f"Both encoders scored on the same {n_boot} bootstrap resamples of the test records they share (by "
        "patient where the split files name patients with several recordings; `bootstrap_unit`): an "
        "interval that excludes 0 is a difference the test set supports at the 95 % level."
        if n_boot
        else "No intervals: --bootstrap 0."
    )
    lines = [
        "## Paired differences (seed-mean test macro-AUROC, later encoder minus earlier)",
        "",
        how + ' A cell "on N of M records" leaves out the records only one of the two folders scored.',
        "",
    ]
    if diffs.empty:
        return "\n".join(lines + ["No pair of encoders has stored test scores on a common task (test_scores.npz)."])
    tasks = [t for t in TASKS if t in set(diffs["task"])] + sorted(set(diffs["task"]) - set(TASKS))
    flagged: list[str] = []
    for fraction in sorted(set(diffs["fraction"])):
        part = diffs[diffs["fraction"] == fraction]
        lines += [
            f"### {_fraction_text(fraction)} of the training labels",
            "",
            "| Pair | " + " | ".join(task_label(t) for t in tasks) + " |",
            "|---|" + "---|" * len(tasks),
        ]
        for (enc, base), pair in part.groupby(["encoder", "baseline"], sort=False):
            cells = []
            for t in tasks:
                hit = pair[pair["task"] == t]
                if hit.empty:
                    cells.append("—")
                    continue
                h = hit.iloc[0]
                cell = f"{h['difference']:+.4f}" + (f" [{h['low']:+.4f}, {h['high']:+.4f}]" if n_boot else "")
                if n_boot and 0 < int(h["bootstrap"]) < n_boot:
                    flagged.append(
                        f"- {enc} − {base}, {task_label(t)}, {_fraction_text(fraction)}: "
                        + kept_note(int(h["bootstrap"]), n_boot)
                    )
                left = int(h.get("left_out", 0) or 0)
                if left:  # the rows above are over more records than this difference
                    shared = int(h["n_test"])
                    cell += f" (on {shared} of {shared + left} records)"
                    if left >= shared:
                        flagged.append(
                            f"- **{enc} − {base}, {task_label(t)}: {left} of the "
                            f"{shared + left} test records are scored by only one of the two and are left out**; "
                            "the difference is over fewer test records than the rows of the table."
                        )
                cells.append(cell)
            lines.append(f"| {enc} − {base} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines + flagged)
