"""The linear probe's Protocol section of summary.md: from a run's settings, or restated once for the folders
`--compare` merges when they were all probed alike."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from ecgpos.config import from_dict
from ecgpos.errors import EcgposError
from ecgpos.probes.linear.run import ProbeConfig
from ecgpos.probes.shared.provenance import RUN_ONLY
from ecgpos.probes.shared.task_data import task_windows
from ecgpos.probes.shared.tasks import TASKS


def protocol_markdown(
    cfg: ProbeConfig, tasks: Sequence[str], window: int, fs: float, raw_baseline: bool = False
) -> str:
    """summary.md section: the probe protocol of these task names as a reviewer needs it, from the run's
    settings; `window` samples at `fs` Hz is the encoder's input window; raw_baseline: a "raw signal"
    row is in the tables."""
    p = cfg.protocol
    datasets = [TASKS[t].dataset if t in TASKS else "custom" for t in tasks]
    drops = ", ".join(str(e + 1) for e in p.lr_drop_epochs if e < p.epochs)  # a drop after the last epoch is none
    subsets = [f for f in cfg.fractions if f < 1]
    seconds = f"{window / fs:g} s"
    pooling = {
        "ptbxl": f"PTB-XL (10 s records) {task_windows(cfg, 'ptbxl')} centred window(s)",
        "cpsc2018": f"CPSC2018 (6-60 s records) up to {task_windows(cfg, 'cpsc2018')} windows spread evenly, "
        "at least half a window apart (MERL itself embeds the first 5 s, zero-padded)",
        "csn": f"CSN (10 s records) {task_windows(cfg, 'csn')} centred window(s)",
        "custom": f"custom tasks up to {task_windows(cfg, 'custom')} window(s)",
    }
    text = [
        "## Protocol",
        "",
        f"- Features: the frozen encoder's features averaged over each record's windows of {window} samples "
        f"({seconds}): " + "; ".join(pooling[d] for d in dict.fromkeys(datasets) if d in pooling) + ". A record "
        "shorter than one window is zero-padded at the end.",
        *(
            [
                f"- Raw-signal baseline: the centre window only, on every dataset (averaging raw windows "
                f"would blur beats that do not line up), block-averaged to {cfg.raw_fs:g} Hz and flattened "
                f"({12 * (window // max(1, round(fs / cfg.raw_fs)))} features)."
            ]
            if raw_baseline
            else []
        ),
        f"- Probe: one linear layer, binary cross-entropy, Adam (lr {p.lr:g}, weight decay {p.weight_decay:g}), "
        f"batch {p.batch_size}, {p.epochs} epochs, "
        + (f"lr x {p.lr_drop_factor:g} from epoch {drops} on (epochs counted from 1)" if drops else "constant lr")
        + ". Each seed keeps its epoch with the highest validation macro-AUROC (the first "
        "if tied); the test split is scored at that epoch only.",
        "- Macro-AUROC: the unweighted mean of the per-class AUROCs over the classes that have at least one "
        "positive and one negative in the split scored; classes left out are listed below.",
        f"- Seed{f's 0-{cfg.seeds - 1}' if cfg.seeds > 1 else ' 0'}: a seed draws the layer's initialisation "
        "and the batch order."
        + (
            f" The {', '.join(f'{f * 100:g} %' for f in subsets)} training subsets are MERL's (scikit-learn "
            "train_test_split of the train file's rows, random_state=42): the same records for every seed; "
            "records not probed are then left out of them."
            if subsets
            else ""
        ),
        "- Labels: the class columns of the split files, matched by name, not by position"
        + (
            " (MERL's sub-class files list ISC, AVB and RAO/RAE in another order in val and test than in train)."
            if "ptbxl-sub" in tasks
            else "."
        ),
    ]
    return "\n".join(text)


def shared_protocol(infos: Mapping[Path, Mapping | None]) -> str:
    """summary.md's Protocol section for merged folders: stated once when every folder was probed with
    the same settings and encoder window ('' otherwise: the differences section names what differs)."""
    runs = [i for i in infos.values() if i is not None and "config" in i]
    if not runs or len(runs) < len(infos):
        return ""
    stated = [
        [
            {k: v for k, v in i["config"].items() if k not in RUN_ONLY},
            i.get("spec", {}).get("window"),
            i.get("spec", {}).get("fs"),
        ]
        for i in runs
    ]
    if len({json.dumps(s, sort_keys=True) for s in stated}) > 1:
        return ""
    try:
        cfg = from_dict(ProbeConfig, runs[0]["config"])
        window, fs = int(runs[0]["spec"]["window"]), float(runs[0]["spec"]["fs"])
    except (EcgposError, KeyError, TypeError, ValueError):  # written by another version: not restated
        return ""
    tasks = list(dict.fromkeys(t for i in runs for t in i.get("tasks", [])))
    # a raw-signal row's feature key (ecgpos.probes.linear.features.raw_source) is {"raw": {...}}
    raw = any(str(key).startswith('{"raw":') for i in runs for key in dict(i.get("sources") or {}).values())
    return protocol_markdown(cfg, tasks, window, fs, raw)
