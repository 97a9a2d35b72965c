"""The demo's join anomalies and its carving table.

A join anomaly lies between the nominal components rather than off their union: here a normalised mix
of two clean probe recordings of different rhythm classes. Carving is meant to make a level blind to
what lies on the joins of the nominal union, so the join-anomaly AUROC of each level's score is the
label-based reading the criterion's depth is compared with.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from ecgpos.models.nested import parse_level_name


def write_join_records(probe_root: Path, root: Path, count: int) -> Path:
    """`count` WFDB records under root/records, each the mix (a + b) / sqrt(2) of two clean probe
    recordings of different rhythm classes (mV, the probe set's rate); returns the records folder."""
    import wfdb

    from ecgpos.demo.synthetic import RHYTHM_CLASSES
    from ecgpos.ecg.leads import CANONICAL_LEADS

    records = root / "records"
    if records.is_dir() and len(list(records.glob("*.hea"))) == count:
        return records
    records.mkdir(parents=True, exist_ok=True)
    by_class: dict[str, list[str]] = {c: [] for c in RHYTHM_CLASSES}
    for split in ("train", "val", "test"):
        for row in csv.DictReader((probe_root / f"{split}.csv").read_text().splitlines()):
            if row["noisy"] == "0":
                by_class[next(c for c in RHYTHM_CLASSES if row[c] == "1")].append(row["record"])
    for k in range(count):
        first, second = RHYTHM_CLASSES[k % 3], RHYTHM_CLASSES[(k + 1) % 3]
        a, fields = wfdb.rdsamp(str(probe_root / by_class[first][k // 3 % len(by_class[first])]))
        b, _ = wfdb.rdsamp(str(probe_root / by_class[second][k // 3 % len(by_class[second])]))
        mix = (a + b) / np.sqrt(2.0)
        wfdb.wrsamp(
            f"join{k:05d}",
            fs=fields["fs"],
            units=["mV"] * 12,
            sig_name=list(CANONICAL_LEADS),
            p_signal=mix.astype(np.float64),
            fmt=["16"] * 12,
            adc_gain=[1000.0] * 12,
            baseline=[0] * 12,
            write_dir=str(records),
        )
    return records


def join_aurocs(scores_csv: Path, labels_csv: Path, join_csv: Path, nominal: list[str]) -> dict[int, float]:
    """Level -> AUROC of the join records' scores against the clean nominal records' scores."""
    from ecgpos.metrics import auroc_columns

    labels = {r["record_id"]: r["label"] for r in csv.DictReader(labels_csv.read_text().splitlines())}
    nominal_rows = [
        r for r in csv.DictReader(scores_csv.read_text().splitlines()) if labels.get(r["record_id"]) in nominal
    ]
    join_rows = list(csv.DictReader(join_csv.read_text().splitlines()))
    out = {}
    for column in [c for c in join_rows[0] if c.endswith("_score")]:
        values = np.array([float(r[column]) for r in nominal_rows + join_rows])
        y = np.r_[np.zeros(len(nominal_rows)), np.ones(len(join_rows))]
        out[parse_level_name(column.removesuffix("_score"))] = float(auroc_columns(values[:, None], y[:, None])[0])
    return out


def carving_table(carve_json: Path, aurocs: dict[int, float], stopped: str) -> str:
    """The demo's carving table: per level the calibrated criterion, pass-through, the literal reading
    and the join-anomaly AUROC, and what `ecgpos carve`'s default stop rules decided."""
    levels = json.loads(carve_json.read_text())["levels"]
    lines = [
        "## Carving: the criterion beside the join-anomaly AUROC",
        "",
        "| level | criterion (calibrated) | 95 % CI | pass-through | literal | perturbation | join AUROC |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in levels:
        lo, hi = r["criterion_ci"]
        auroc = aurocs.get(r["level"])
        lines.append(
            f"| {r['level']} | {r['criterion']:.3f} | [{lo:.3f}, {hi:.3f}] | {r['pass_through']:.3f} | "
            f"{r['criterion_literal']:.3f} | {r['perturbation']} | {'-' if auroc is None else f'{auroc:.3f}'} |"
        )
    return "\n".join([*lines, "", stopped]) + "\n"
