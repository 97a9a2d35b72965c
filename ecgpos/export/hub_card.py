"""The Hugging Face Hub metadata that opens every model card (YAML between `---` lines).

An export folder uploaded as it is (`huggingface-cli upload ORG/NAME EXPORT_DIR .`) then shows its
library, tags, licence and pipeline on the Hub, and its probe or fine-tune results as `model-index`
entries (https://huggingface.co/docs/hub/model-cards).
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

LIBRARY = "ecgpos"
TAGS = ["ecg", "electrocardiogram", "self-supervised", "time-series", "medical", "ecgpos"]
DEFAULT_LICENSE = "other"  # the weights' terms follow the training data's; the exporter states them (--license)


def _result(dataset: str, metric_name: str, value: float) -> dict[str, Any]:
    return {
        "task": {"type": "ecg-classification", "name": "ECG classification"},
        "dataset": {"name": dataset, "type": dataset, "split": "test"},
        "metrics": [{"type": "roc_auc", "value": round(float(value), 4), "name": metric_name}],
    }


def front_matter(
    name: str, pipeline_tag: str, results: list[dict[str, Any]], license_id: str = DEFAULT_LICENSE, extra_tags=()
) -> str:
    """`---\\nYAML\\n---\\n\\n`: library_name, tags, license, pipeline_tag and model-index (when results)."""
    meta: dict[str, Any] = {
        "library_name": LIBRARY,
        "license": license_id or DEFAULT_LICENSE,
        "pipeline_tag": pipeline_tag,
        "tags": [*TAGS, *extra_tags],
    }
    if results:
        meta["model-index"] = [{"name": name, "results": results}]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True) + "---\n\n"


def _weights_of(folder: Path) -> dict[str, str] | None:
    """Row label -> the weights hash of its encoder, from a probe folder's probe.json (None without one)."""
    try:
        sources = json.loads((folder / "probe.json").read_text()).get("sources")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(sources, dict):
        return None
    out = {}
    for label, key in sources.items():
        try:
            out[label] = json.loads(key)["encoder"]
        except (TypeError, ValueError, KeyError):
            continue
    return out


def probe_index_results(folder: str | Path | None, weights_sha256: str) -> list[dict[str, Any]]:
    """model-index results of a probe or fine-tune results folder: the seed-mean test macro-AUROC of each
    (row label, task, fraction) of this encoder (all rows when the folder does not record its encoders)."""
    if folder is None or not (Path(folder) / "results.csv").is_file():
        return []
    folder = Path(folder)
    weights = _weights_of(folder)
    cells: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    with (folder / "results.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            label = row.get("encoder", "")
            if weights is not None and weights.get(label) not in (None, weights_sha256):
                continue  # another encoder's row (a baseline probed beside it)
            try:
                value = float(row.get("test_auroc") or row.get("macro_auroc") or "nan")
            except ValueError:
                continue
            if math.isfinite(value):
                cells[(label, row.get("protocol") or "linear", row.get("task", ""), row.get("fraction", ""))].append(
                    value
                )
    return [
        _result(
            task,
            f"macro AUROC, {protocol}, {_percent(fraction)} of labels" + (f" ({label})" if label else ""),
            sum(v) / len(v),
        )
        for (label, protocol, task, fraction), v in sorted(cells.items())
    ]


def _percent(fraction: str) -> str:
    try:
        return f"{100 * float(fraction):g} %"
    except ValueError:
        return fraction


def classifier_results(config: dict[str, Any]) -> list[dict[str, Any]]:
    """model-index results of a classifier export: its test macro-AUROC and each label's AUROC."""
    test, task = config.get("test") or {}, str(config.get("training", {}).get("task", "task"))
    out = []
    if test.get("macro_auroc") is not None:
        out.append(_result(task, "macro AUROC", test["macro_auroc"]))
    for label, cell in (test.get("per_label") or {}).items():
        if cell.get("auroc") is not None:
            out.append(_result(task, f"AUROC {label}", cell["auroc"]))
    return out
