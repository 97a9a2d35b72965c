"""What every protocol writes and `--compare` merges: results.csv (one row per seed), summary.md (the paper's
table, the sections a protocol adds, what became of every split row), a bar chart."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ecgpos.errors import EcgposError
from ecgpos.export.probe_scores import check_probe_results, read_result_rows
from ecgpos.files import atomic_path, atomic_write_text
from ecgpos.probes.shared.intervals import INTERVAL_COLUMNS
from ecgpos.probes.shared.task_data import RECORD_COUNTS
from ecgpos.probes.shared.tasks import TASKS, read_table, task_label

LINEAR = "linear"  # the `protocol` of a linear-probe row
RESULT_COLUMNS = [
    "encoder",
    "protocol",
    "task",
    "fraction",
    "seed",
    "best_epoch",
    "val_auroc",
    "test_auroc",
    *INTERVAL_COLUMNS,
    "n_train",
    "n_val",
    "n_test",
    "excluded_val",
    "excluded_test",
    "test_auroc_per_class",
    "note",
]


def write_results(rows: Sequence[dict], out: Path) -> pd.DataFrame:
    """results.csv: encoder, task, fraction, seed, best_epoch (1-based), val/test macro-AUROC, the 95 %
    bootstrap interval of this seed's test AUROC and of the seed mean (the same in every seed's row),
    resamples (0: no bootstrap), split sizes, classes left out of val/test AUROC, per-class test AUROC
    (JSON {class: AUROC}). `protocol` says how the row's classifier was trained: `linear` (a probe on frozen
    features, the default of a row that names none) or `finetune-<mode>` (`ecgpos finetune`)."""
    frame = pd.DataFrame(list(rows), columns=RESULT_COLUMNS)
    frame["protocol"] = frame["protocol"].astype(object).fillna(LINEAR)
    with atomic_path(out / "results.csv") as tmp:
        frame.to_csv(tmp, index=False)
    return frame


def read_results(folder: Path) -> pd.DataFrame:
    """A probe folder's results.csv, refused when a row disagrees with the folder's stored test scores."""
    path = Path(folder) / "results.csv"
    if not path.is_file():
        raise EcgposError(f"{folder}: no results.csv (not a probe output folder)")
    _check_named_seeds(folder, read_result_rows(path))  # rows whole, seeds, fractions, AUROCs: one line otherwise
    frame = read_table(path, keep_default_na=True)
    text = [c for c in ("excluded_val", "excluded_test", "note") if c in frame.columns]
    frame[text] = frame[text].astype(object).fillna("")  # an all-empty column reads as float NaN
    if "protocol" not in frame.columns:  # written before fine-tuning rows existed: every row is a linear probe
        frame.insert(1, "protocol", LINEAR)
    frame["protocol"] = frame["protocol"].astype(object).fillna(LINEAR)
    missing = [c for c in ("encoder", "task", "fraction", "seed", "test_auroc") if c not in frame.columns]
    if missing:
        raise EcgposError(f"{path}: missing column(s) {', '.join(missing)}")
    check_probe_results(folder, frame.to_dict("records"))
    return frame


def _check_named_seeds(folder: Path, rows: Sequence[dict]) -> None:
    """Refuse a results.csv row whose seed is not one of those its folder's probe.json names (`config.seeds`
    N: seeds 0..N-1): rows pasted from another run would be averaged as this one's."""
    try:
        count = json.loads((Path(folder) / "probe.json").read_text())["config"]["seeds"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # no probe.json of a probe run (a --compare output, a hand-made folder): nothing names them
    if not isinstance(count, int) or isinstance(count, bool):
        return
    for line, row in enumerate(rows, start=2):
        seed = row.get("seed", "")
        if str(seed).strip() and float(seed) not in range(count):
            raise EcgposError(
                f"{Path(folder) / 'results.csv'} line {line}: seed {seed} is not one of the {count} seeds "
                f"(0 to {count - 1}) its probe.json names"
            )


def _fraction_label(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def mean_interval(cell: pd.DataFrame) -> tuple[float, float]:
    """The seed-mean bootstrap interval of one (encoder, task, fraction)'s rows, NaN when absent."""
    if "mean_auroc_low" not in cell.columns or not len(cell):
        return float("nan"), float("nan")
    low, high = cell["mean_auroc_low"].astype(float), cell["mean_auroc_high"].astype(float)
    return (float(low.iloc[0]), float(high.iloc[0])) if low.notna().any() else (float("nan"), float("nan"))


def summary_tables(frame: pd.DataFrame) -> dict[float, pd.DataFrame]:
    """fraction -> table (rows = encoders in order of appearance, columns = tasks) of 'mean ± std [low, high]'.

    std is the population std over seeds (0 for one seed); [low, high] is the 95 % bootstrap interval of
    the seed mean (absent without a bootstrap); a cell with no finite AUROC is '—'.
    """
    tasks = [t for t in TASKS if t in set(frame["task"])] + sorted(set(frame["task"]) - set(TASKS))
    encoders = list(dict.fromkeys(frame["encoder"]))
    tables = {}
    for fraction in sorted(set(frame["fraction"])):
        part = frame[frame["fraction"] == fraction]
        cells = {}
        for enc in encoders:
            row = {}
            for task in tasks:
                cell = part[(part["encoder"] == enc) & (part["task"] == task)]
                vals = cell["test_auroc"].astype(float).to_numpy()
                vals = vals[np.isfinite(vals)]
                text = f"{vals.mean():.4f} ± {vals.std():.4f}" if len(vals) else "—"
                low, high = mean_interval(cell)
                row[task_label(task)] = text + (f" [{low:.4f}, {high:.4f}]" if len(vals) and np.isfinite(low) else "")
            cells[enc] = row
        tables[fraction] = pd.DataFrame.from_dict(cells, orient="index")
    return tables


def _markdown(table: pd.DataFrame) -> str:
    head = "| Encoder | " + " | ".join(table.columns) + " |"
    rule = "|---|" + "---|" * len(table.columns)
    body = ["| " + " | ".join([str(idx), *map(str, row)]) + " |" for idx, row in zip(table.index, table.to_numpy())]
    return "\n".join([head, rule, *body])


def _uneven_test_sets(frame: pd.DataFrame) -> list[str]:
    """One line per (task, fraction) whose encoders were tested on different numbers of records."""
    lines = []
    for (task, fraction), group in frame.groupby(["task", "fraction"], sort=False):
        sizes = group.groupby("encoder", sort=False)["n_test"].max().dropna().astype(int)  # hand-made rows: none
        if sizes.nunique() > 1:
            each = ", ".join(f"{enc} {n}" for enc, n in sizes.items())
            lines.append(f"- {task}, {_fraction_label(fraction)} labels: test records {each}")
    return lines


def _resampled(rows: pd.DataFrame) -> str:
    """What the intervals of `rows` resample, from their bootstrap_unit ("record" where not written)."""
    units = set(rows["bootstrap_unit"].fillna("record").replace("", "record")) if "bootstrap_unit" in rows else set()
    by_task = sorted(set(rows.loc[rows["bootstrap_unit"] == "patient", "task"])) if "patient" in units else []
    if not by_task:
        return "the test records"
    patients = "the test patients (each drawn with all of their test records)"
    if units == {"patient"}:
        return patients
    return f"{patients} on {', '.join(task_label(t) for t in by_task)}, else of the test records"


def summary_markdown(frame: pd.DataFrame, notes: Sequence[str] = (), sections: Sequence[str] = ()) -> str:
    """summary.md: one table per label fraction, extra `sections` (markdown), then which classes were left
    out and other notes."""
    seeds = frame.groupby(["encoder", "task", "fraction"])["seed"].nunique()
    span = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    kinds = set(frame["protocol"].astype(str) == LINEAR) if "protocol" in frame.columns else {True}
    title = {frozenset({True}): "Linear-probe", frozenset({False}): "Fine-tuning"}.get(frozenset(kinds))
    parts = [
        f"# {title or 'Fine-tuning and linear-probe'} test macro-AUROC",
        "",
        f"Mean ± population std (ddof 0) over {span} seed(s) "
        "of the test macro-AUROC at the epoch with the best validation macro-AUROC.",
    ]
    if "mean_auroc_low" in frame.columns and frame["mean_auroc_low"].astype(float).notna().any():
        # resamples behind the intervals shown: fewer than asked for where some were dropped (named in the notes)
        shown = frame.loc[frame["mean_auroc_low"].astype(float).notna()]
        counts = shown["bootstrap"].astype(float)
        low, high = int(counts.min()), int(counts.max())
        resamples = str(low) if low == high else f"{low}-{high}"
        parts[-1] += (
            f" [low, high]: 95 % stratified bootstrap interval of the seed mean ({resamples} "
            f"resamples of {_resampled(shown)} within each label pattern, rare patterns pooled; "
            "each resample's AUROC is averaged over the seeds). Per-seed intervals are in results.csv."
        )
    parts.append("")
    for fraction, table in summary_tables(frame).items():
        parts += [f"## {_fraction_label(fraction)} of the training labels", "", _markdown(table), ""]
    uneven = _uneven_test_sets(frame)
    if uneven:
        parts += [
            "**Rows over different test sets** (records missing from a split, or `--exclude-overlap`): their "
            "numbers are not directly comparable; the paired differences use only the records both scored.",
            "",
            *uneven,
            "",
        ]
    for section in sections:
        parts += [section.rstrip(), ""]
    # which classes a split cannot score depends on the labels, not the encoder: listed once
    left_out: dict[str, list[str]] = {}
    for (task, fraction), group in frame.groupby(["task", "fraction"], sort=False):
        for column, what in (("excluded_val", "val"), ("excluded_test", "test"), ("note", "")):
            for value in dict.fromkeys(str(v).strip() for v in group[column].fillna("")):
                if value and value != "nan":
                    text = f"{what}: {value}" if what else value
                    left_out.setdefault(f"{task}, {text}", []).append(_fraction_label(fraction))
    if left_out:
        parts += [
            "## Classes left out of the macro-AUROC (no positive or no negative in that split) and other "
            "notes per task",
            "",
            *[f"- {key} ({', '.join(fr)} labels)" for key, fr in left_out.items()],
            "",
        ]
    if notes:
        parts += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(parts)


_COUNT_TITLES = ("listed", "not found", "unreadable or refused", "pretraining overlap", "copy across splits", "probed")


def records_markdown(counts: dict[str, dict[str, dict[str, dict[str, int]]]], frame: pd.DataFrame) -> str:
    """summary.md section: what became of every row of every split file, per task (and per encoder where
    encoders differ); counts: encoder -> task -> split -> RECORD_COUNTS; frame: results.csv (train rows
    of each label fraction)."""
    lines = [
        "## Records",
        "",
        "Every row of a split file is in one of the last five columns. Not found: not under --data-root; "
        "unreadable or refused: failed to read, refused by the screening, or non-finite features (reasons "
        "under Notes); pretraining overlap: dropped by --exclude-overlap; copy across splits: a val or test "
        "record whose recording an earlier split holds under another file, dropped by --exclude-overlap.",
        "",
        "| Task | Split | " + " | ".join(_COUNT_TITLES) + " |",
        "|---|---|" + "---|" * len(_COUNT_TITLES),
    ]
    tasks = list(dict.fromkeys(t for per_task in counts.values() for t in per_task))
    for task in tasks:
        by_encoder = {enc: per_task[task] for enc, per_task in counts.items() if task in per_task}
        same = len({repr(v) for v in by_encoder.values()}) == 1
        for enc, splits in by_encoder.items():
            name = task if same else f"{task} ({enc})"
            for split, c in splits.items():
                cells = [str(c.get(k, 0)) for k in RECORD_COUNTS]  # probe.json before split_copy: none dropped
                if split == "train":
                    part = frame[(frame["task"] == task) & (frame["encoder"] == enc) & (frame["fraction"] < 1)]
                    sizes = part.groupby("fraction")["n_train"].max()
                    if len(sizes):
                        cells[-1] += " (" + ", ".join(f"{_fraction_label(f)}: {int(n)}" for f, n in sizes.items()) + ")"
                lines.append(f"| {name} | {split} | " + " | ".join(cells) + " |")
            if same:
                break
    return "\n".join(lines)


def write_chart(frame: pd.DataFrame, path: Path) -> None:
    """Grouped bars: tasks on x, one bar per encoder, one panel per fraction. Error bars: the seed mean's
    95 % bootstrap interval (std over seeds when there was no bootstrap)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = sorted(set(frame["fraction"]))
    encoders = list(dict.fromkeys(frame["encoder"]))
    tasks = [t for t in TASKS if t in set(frame["task"])] + sorted(set(frame["task"]) - set(TASKS))
    fig, axes = plt.subplots(1, len(fractions), figsize=(max(6, 1.6 * len(tasks) * len(fractions)), 4), squeeze=False)
    width = 0.8 / max(1, len(encoders))
    for ax, fraction in zip(axes[0], fractions):
        part = frame[frame["fraction"] == fraction]
        for k, enc in enumerate(encoders):
            cells = [part[(part["encoder"] == enc) & (part["task"] == t)] for t in tasks]
            stats = [c["test_auroc"].astype(float) for c in cells]
            means = [s.mean() if s.notna().any() else 0.0 for s in stats]
            errs = np.zeros((2, len(tasks)))
            for i, (cell, s) in enumerate(zip(cells, stats)):
                low, high = mean_interval(cell)
                if np.isfinite(low) and s.notna().any():  # the seed-mean bootstrap interval
                    errs[:, i] = max(0.0, means[i] - low), max(0.0, high - means[i])
                elif s.notna().sum() > 1:
                    errs[:, i] = s.std(ddof=0)
            ax.bar(
                np.arange(len(tasks)) + (k - (len(encoders) - 1) / 2) * width,
                means,
                width,
                yerr=errs,
                label=enc,
                capsize=2,
            )
        ax.set_xticks(np.arange(len(tasks)), [task_label(t) for t in tasks], rotation=30)
        finite = part["test_auroc"].astype(float)
        ax.set_ylim(min(0.4, float(np.nanmin(finite)) - 0.05) if finite.notna().any() else 0.4, 1.0)
        ax.axhline(0.5, color="grey", lw=0.5, ls="--")
        ax.set_title(f"{_fraction_label(fraction)} labels")
        ax.set_ylabel("test macro-AUROC")
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def write_outputs(frame: pd.DataFrame, out: Path, notes: Sequence[str] = (), sections: Sequence[str] = ()) -> str:
    """summary.md + summary.png in `out`; returns the summary text."""
    out.mkdir(parents=True, exist_ok=True)
    text = summary_markdown(frame, notes, sections)
    atomic_write_text(out / "summary.md", text, sync=False)
    write_chart(frame, out / "summary.png")
    return text


def _free_label(enc: str, folder: Path, keys: set[tuple], taken: set[tuple]) -> str:
    """`enc [folder]` (then `enc [parent/folder]`, `enc [folder] 2`, ...): the first label none of `keys` uses."""
    candidates = [f"{enc} [{folder.name}]", f"{enc} [{folder.parent.name}/{folder.name}]"]
    k = 2
    while True:
        for label in candidates:
            if not any((label, task, fraction) in taken for _, task, fraction in keys):
                return label
        candidates, k = [f"{enc} [{folder.name}] {k}"], k + 1


def merge_results(
    folders: Sequence[Path],
    notes: list[str] | None = None,
    renamed: dict[Path, dict[str, str]] | None = None,
    identities: dict[Path, dict[str, str]] | None = None,
) -> pd.DataFrame:
    """Concatenate several results.csv (a folder given twice is read once).

    An encoder's rows keep their label unless an earlier folder already has that (encoder, task, fraction),
    or `identities` (folder -> label -> weights hash) shows the same label naming other weights: then that
    folder's rows of the encoder get the folder name added (one note per rename is appended to `notes`;
    `renamed` receives folder -> {old: new label}). So one encoder probed task by task into several
    folders stays one row of the table, and two encoders under one name stay two rows.
    """
    frames = []
    taken: set[tuple] = set()
    weights: dict[str, str] = {}  # label -> identity of the first folder that used it
    for folder in dict.fromkeys(Path(f).resolve() for f in folders):
        frame = read_results(folder)
        renames = {}
        for enc, part in frame.groupby("encoder", sort=False):
            keys = set(zip(part["encoder"], part["task"], part["fraction"]))
            identity = (identities or {}).get(folder, {}).get(str(enc))
            other = identity is not None and weights.get(str(enc), identity) != identity
            if keys & taken or other:
                renames[enc] = _free_label(str(enc), folder, keys, taken | {(enc, t, fr) for _, t, fr in keys})
                clash = sorted({f"{t} {_fraction_label(fr)}" for _, t, fr in keys & taken})
                why = (
                    "an earlier folder uses that label for other encoder weights"
                    if other
                    else f"an earlier folder has the same encoder label for {', '.join(clash)}"
                )
                if notes is not None:
                    notes.append(
                        f"{renames[enc]}: rows of {folder / 'results.csv'} labelled {enc!r}, renamed because {why}"
                    )
            label = renames.get(enc, enc)
            taken |= {(label, task, fraction) for _, task, fraction in keys}
            if identity is not None:
                weights.setdefault(str(label), identity)
        frames.append(frame.replace({"encoder": renames}))
        if renamed is not None:
            renamed[folder] = renames
    return pd.concat(frames, ignore_index=True)
