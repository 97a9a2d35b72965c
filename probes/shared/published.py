"""Published results beside ours: `--reference paper` (or a CSV of the same form).

A reference file (probes/shared/reference/paper.csv) starts with `#` lines naming its source, then one row
per published model: `model` and one column per task (full-label test macro-AUROC). Published rows
are labelled "(published)" everywhere they appear, so nobody mistakes them for runs of this project.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.tasks import TASKS, read_table

REFERENCES = {"paper": Path(__file__).with_name("reference") / "paper.csv"}
# The paper's rows are named after its "Stage 0" and "Stage 1", our level 0 and level 1.
COUNTERPART = "Stage 1"  # what an encoder matched by neither name nor architecture is compared with
# an encoder's architecture kind (ecgpos.models.factory; "stage0" its other spelling) -> the published row
KIND_ROWS = {"level0": "Stage 0", "stage0": "Stage 0", "nested": "Stage 1"}
# an encoder named after a level (a run folder level0, level1) -> the published row of that level
LEVEL_ROWS = {"level0": "Stage 0", "level1": "Stage 1"}
# Records in MERL's test split file of each task: the test set behind the published numbers.
PUBLISHED_TEST_RECORDS = {
    "ptbxl-super": 2158,
    "ptbxl-sub": 2158,
    "ptbxl-form": 880,
    "ptbxl-rhythm": 2098,
    "cpsc2018": 1376,
}


def read_reference(name: str) -> tuple[pd.DataFrame, str]:
    """(table indexed by model, columns = task names; source text) of `paper` or a CSV path."""
    path = REFERENCES.get(name, Path(name))
    if not path.is_file():
        raise EcgposError(f"--reference {name}: not a known reference ({', '.join(REFERENCES)}) or a CSV file")
    table = read_table(path, comment="#")
    lines = path.read_text().splitlines()  # read_table has shown it is text
    source = " ".join(line.lstrip("# ").strip() for line in lines if line.startswith("#"))
    try:
        table = table.set_index("model")
    except (ValueError, KeyError) as err:
        raise EcgposError(f"{path}: not a reference table (model column + one column per task): {err}") from None
    unknown = [c for c in table.columns if c not in TASKS]
    if unknown:
        raise EcgposError(f"{path}: unknown task column(s) {', '.join(unknown)}")
    if table.empty:
        raise EcgposError(f"{path}: no published rows")
    repeated = sorted({str(m) for m in table.index[table.index.duplicated()]})
    if repeated:  # which of the two rows a difference is taken to would be arbitrary
        raise EcgposError(f"{path}: model(s) {', '.join(repeated)} listed more than once")
    numbers = table.apply(pd.to_numeric, errors="coerce")
    bad = [c for c in table.columns if (numbers[c].isna() & table[c].notna()).any()]
    if bad:
        raise EcgposError(f"{path}: column(s) {', '.join(bad)} hold values that are not numbers")
    out_of_range = [
        f"{model} {column} {value:g}"
        for model, row in numbers.iterrows()
        for column, value in row.items()
        if pd.notna(value) and not 0 <= value <= 1
    ]
    if out_of_range:  # a percentage or a typo would be compared with AUROCs as if it were one
        raise EcgposError(f"{path}: {out_of_range[0]} is not an AUROC (a finite number in [0, 1])")
    return numbers.astype(float), source


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def counterpart(encoder: str, models: list[str], kind: str | None = None) -> str:
    """The published row an encoder is compared with: the one of the same name (level1 ~ 'Stage 1',
    st-mem ~ 'ST-MEM'), else the row of its architecture (a level-0 encoder ~ 'Stage 0', a nested
    one ~ 'Stage 1'), else the paper's 'Stage 1'."""
    for model in models:
        if _norm(model) in (_norm(encoder), _norm(LEVEL_ROWS.get(_norm(encoder), ""))):
            return model
    if KIND_ROWS.get(kind or "") in models:
        return KIND_ROWS[str(kind)]
    return COUNTERPART if COUNTERPART in models else models[-1]


def reference_markdown(
    frame: pd.DataFrame, reference: pd.DataFrame, source: str, kinds: dict[str, str] | None = None
) -> str:
    """Published rows, our full-label rows (mean [interval]) and our minus published, one table;
    kinds: encoder label -> architecture kind, where known (`counterpart`)."""
    ours = frame[frame["fraction"].astype(float) == 1.0]
    tasks = [t for t in TASKS if t in reference.columns]
    head = "| Encoder | " + " | ".join(TASKS[t].label for t in tasks) + " |"
    lines = [
        "## Published results beside ours (100 % of the training labels)",
        "",
        f"Rows marked (published) are copied from the paper, not run here. Source: {source}",
        "",
        head,
        "|---|" + "---|" * len(tasks),
    ]
    for model, row in reference.iterrows():
        lines.append(
            f"| {model} (published) | "
            + " | ".join(f"{row[t]:.4f}" if np.isfinite(row[t]) else "—" for t in tasks)
            + " |"
        )
    diffs, partial = [], []
    for enc in dict.fromkeys(ours["encoder"]):
        match = counterpart(str(enc), list(reference.index), (kinds or {}).get(str(enc)))
        cells, deltas = [], []
        for t in tasks:
            part = ours[(ours["encoder"] == enc) & (ours["task"] == t)]
            vals = part["test_auroc"].astype(float).dropna()
            if not len(vals):
                cells.append("—")
                deltas.append("—")
                continue
            mean = vals.mean()
            low = part["mean_auroc_low"].astype(float).iloc[0] if "mean_auroc_low" in part else np.nan
            high = part["mean_auroc_high"].astype(float).iloc[0] if "mean_auroc_high" in part else np.nan
            interval = np.isfinite(low) and np.isfinite(high)
            cells.append(f"{mean:.4f}" + (f" [{low:.4f}, {high:.4f}]" if interval else ""))
            pub = reference.loc[match, t]
            delta = f"{mean - pub:+.4f}" + (f" [{low - pub:+.4f}, {high - pub:+.4f}]" if interval else "")
            tested = part["n_test"].max() if "n_test" in part else np.nan
            if np.isfinite(pub) and tested < PUBLISHED_TEST_RECORDS.get(t, 0):  # NaN (not recorded): no claim
                delta += " †"
                partial.append(f"{enc}, {TASKS[t].label}: {int(tested)} of {PUBLISHED_TEST_RECORDS[t]}")
            deltas.append(delta if np.isfinite(pub) else "—")
        lines.append(f"| {enc} (ours) | " + " | ".join(cells) + " |")
        diffs.append(f"| {enc} − {match} (published) | " + " | ".join(deltas) + " |")
    lines += diffs
    lines += [
        "",
        "A difference row is our seed mean minus the published number, with our 95 % bootstrap interval "
        "shifted by the same amount: an interval that excludes 0 means the published number lies outside "
        "our interval. An encoder is compared with the published row of the same name (level0 ~ Stage 0, "
        "level1 ~ Stage 1), otherwise with the row of its architecture (level-0 encoder ~ Stage 0, nested "
        f"encoder ~ Stage 1), otherwise with {COUNTERPART}. Published numbers need not be selected as ours "
        "are (the test split scored once, at the best validation epoch): MERL's public fine-tuning script "
        "prints the largest test AUROC over its epochs, which leans high.",
    ]
    if partial:  # the published numbers are over the whole test split
        lines += [
            "",
            "**† Our test set is smaller than the published one** (records missing here, or removed by "
            "--exclude-overlap), so that difference compares different test sets: " + "; ".join(partial) + ".",
        ]
    return "\n".join(lines)
