"""What a probe or fine-tuning folder holds (RUN_FILES), what it was run under (its probe.json), and the
differences `--compare` flags.

Numbers probed with other epochs, seeds, windows, preprocessing, bootstrap resamples, data, splits or
custom task folders are not the same measurement; `--compare` still merges them (a protocol sweep is
a legitimate comparison), but names every setting that differs in summary.md so the table is not
read as one protocol. A folder without a readable probe.json (missing, damaged, hand-made or older)
is named as unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path

from ecgpos.export.probe_scores import PROBE_SCORES_FILE
from ecgpos.probes.shared.leakage import SPLIT_COPIES

INFO_FILE = "probe.json"
MIXED = "mixed"
# ProbeConfig keys that change how a probe runs, not its numbers (never a protocol difference)
RUN_ONLY = ("workers", "device", "extract_batch_size")
TASK_FOLDER = "folder of "  # protocol key prefix: the folder a custom task was read from
FINETUNE_KEY = "fine-tuning"  # the protocol key a fine-tuning folder records (its mode) and a linear probe lacks


def _text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def protocol(info: Mapping) -> dict[str, str]:
    """The settings of a probe run that change its numbers, flattened to short strings."""
    if "protocol" in info:  # a --compare output records what its inputs had in common
        return dict(info["protocol"])
    cfg = info.get("config", {})
    out = {k: _text(v) for k, v in cfg.get("protocol", {}).items()}
    out["seeds"] = _text(cfg.get("seeds"))
    out |= {k: _text(v) for k, v in cfg.items() if k.startswith("windows_") or k in ("ptbxl_records", "raw_fs")}
    out |= {f"spec.{k}": _text(v) for k, v in info.get("spec", {}).items()}
    for key in ("bootstrap", "data_root", "splits", "exclude_overlap"):
        out[key] = _text(info.get(key, "not recorded"))
    # a custom task is named by its folder's name alone: two folders of one name are two data sets
    out |= {f"{TASK_FOLDER}{name}": folder for name, folder in info.get("task_folders", {}).items()}
    return out


def _values(protocols: Mapping[Path, Mapping[str, str]], key: str) -> dict[Path, str]:
    """Each folder's value of a setting; a custom task's folder only where that task was probed."""
    if key.startswith(TASK_FOLDER):
        return {f: p[key] for f, p in protocols.items() if key in p}
    return {f: p.get(key, "not recorded") for f, p in protocols.items()}


# What --compare reads of a probe.json, by key (any may be absent): a JSON type; [type]: an array of
# such items; a dict: an object whose keys have those shapes ("*": every value).
_INFO_SHAPE: dict = {
    "protocol": {"*": str},
    "config": {"protocol": dict},
    "spec": dict,
    "task_folders": {"*": str},
    "sources": dict,
    "kinds": {"*": str},
    "tasks": [str],
    "records": {"*": {"*": {"*": dict}}},  # encoder -> task -> split -> counts
    "pretraining_overlap": {"*": dict},
    "split_copies": {"*": dict},
    "guard": {"*": {"pretraining_overlap": {"*": dict}, "split_copies": {"*": dict}}},
}


def _fits(value: object, shape: object) -> bool:
    if isinstance(shape, type):
        return isinstance(value, shape)
    if isinstance(shape, list):
        return isinstance(value, list) and all(_fits(item, shape[0]) for item in value)
    if not isinstance(value, dict):
        return False
    for key, inner in shape.items():
        values = value.values() if key == "*" else [value[key]] if key in value else []
        if not all(_fits(v, inner) for v in values):
            return False
    return True


def read_info(folder: Path) -> dict | None:
    """A probe folder's probe.json, None when absent, unreadable, or not of the shape --compare reads
    (valid JSON of another structure): such a folder is merged as one whose protocol cannot be checked."""
    try:
        info = json.loads((Path(folder) / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if _fits(info, _INFO_SHAPE) else None


def sources(info: Mapping | None) -> dict[str, str]:
    """Row label -> what identifies its features (weights hash, raw settings); empty when not recorded."""
    return dict((info or {}).get("sources", {}))


def common_protocol(protocols: Mapping[Path, Mapping[str, str]]) -> dict[str, str]:
    """Each setting's value where every folder agrees, else MIXED (so a later --compare flags it)."""
    keys = dict.fromkeys(k for p in protocols.values() for k in p)
    out = {}
    for key in keys:
        values = set(_values(protocols, key).values())
        out[key] = values.pop() if len(values) == 1 else MIXED
    return out


def _kind(settings: Mapping[str, str]) -> str:
    """Which protocol a folder's settings describe: 'linear', 'fine-tuning', or MIXED (a --compare of both)."""
    return {None: "linear", MIXED: MIXED}.get(settings.get(FINETUNE_KEY), FINETUNE_KEY)


def protocol_section(infos: Mapping[Path, Mapping | None]) -> str:
    """summary.md section naming every setting that differs between the merged folders ('' if none).

    A setting that only one protocol has (the linear probe's epochs, fine-tuning's optimiser) is compared
    between the folders of that protocol: beside the other protocol it does not apply, rather than differ."""
    if len(infos) < 2:
        return ""
    known = {f: protocol(i) for f, i in infos.items() if i is not None}
    lines = []
    for key in dict.fromkeys(k for p in known.values() for k in p):
        holders = {_kind(p) for p in known.values() if key in p} | {MIXED}
        values = {f: v for f, v in _values(known, key).items() if _kind(known[f]) in holders}
        if len(set(values.values())) > 1 or MIXED in values.values():
            lines.append(f"- **{key}**: " + "; ".join(f"{f.name}: {v}" for f, v in values.items()))
    lines += [
        f"- **{f.name}**: no readable {INFO_FILE} (missing, damaged, or a hand-made or older folder): "
        "its protocol cannot be checked"
        for f, i in infos.items()
        if i is None
    ]
    if not lines:
        return ""
    head = [
        "## Protocol differences between the merged folders",
        "",
        "These folders were not probed under one protocol: rows from different folders are different "
        "measurements, not only different encoders. A setting of one protocol only (the linear probe's "
        "optimiser, fine-tuning's) is compared between the folders of that protocol.",
        "",
    ]
    return "\n".join(head + lines)


def merged_records(
    infos: Mapping[Path, Mapping | None], renamed: Mapping[Path, Mapping[str, str]]
) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """Every folder's record counts (probe.json `records`: encoder -> task -> split -> counts) under the
    encoder labels of the merged table."""
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for folder, info in infos.items():
        for encoder, per_task in ((info or {}).get("records") or {}).items():
            label = renamed.get(folder, {}).get(encoder, encoder)
            out.setdefault(label, {}).update(per_task)
    return out


def merged_guard(infos: Mapping[Path, Mapping | None]) -> dict[str, dict]:
    """Each merged folder's leakage-guard counts (folder name -> exclude_overlap, pretraining_overlap:
    task -> split -> records, split_copies: task -> split pair -> records), carried over from a merged
    folder's own `guard`; {} for a folder whose probe ran without the guard."""
    out: dict[str, dict] = {}
    names = [f.name for f in infos]
    for folder, info in infos.items():
        if info is None:
            continue
        if "guard" in info:  # a --compare output: what its own inputs recorded
            for name, counts in info["guard"].items():  # a name already taken keeps its own counts
                out[name if name not in out else f"{name} (in {folder})"] = counts
            continue
        ran = bool(info.get("pretraining_overlap"))  # one entry per task whenever the guard ran
        # folders are named as in the table's renames: by name, by path where two share a name
        out[folder.name if names.count(folder.name) == 1 else str(folder)] = (
            {
                "exclude_overlap": bool(info.get("exclude_overlap")),
                "pretraining_overlap": info.get("pretraining_overlap", {}),
                "split_copies": info.get("split_copies", {}),
            }
            if ran
            else {}
        )
    return out


def guard_markdown(guard: Mapping[str, Mapping]) -> str:
    """summary.md section of a --compare: the leakage guard's counts as each merged folder recorded
    them (its own summary.md has the details and examples)."""
    lines = ["## Pretraining overlap and copies across splits (leakage guard), per merged folder", ""]
    for name, counts in guard.items():
        if not counts:
            lines.append(f"- **{name}**: the guard did not run (no pretraining shards known): nothing was checked")
            continue
        verdict = "dropped (--exclude-overlap)" if counts.get("exclude_overlap") else "kept"
        for task, splits in counts.get("pretraining_overlap", {}).items():
            overlap = ", ".join(f"{split} {n}" for split, n in splits.items())
            copies = ", ".join(f"{pair} {n}" for pair, n in counts.get("split_copies", {}).get(task, {}).items())
            lines.append(
                f"- **{name}**, {task}: records matching pretraining records: {overlap}; val/test copies of an "
                f"earlier split: {copies or 'not recorded'}; {verdict}"
            )
    return "\n".join(lines)


DIFFERENCES_FILE = "differences.csv"
RUN_FILES = (
    INFO_FILE,
    "summary.md",
    "summary.png",
    "results.csv",
    PROBE_SCORES_FILE,
    "overlap.csv",
    SPLIT_COPIES,
    DIFFERENCES_FILE,
)
"""What a probe run or a --compare writes into --out (a probe no differences.csv, a compare no
overlap.csv or split_copies.csv); probe.json, written last, marks a whole folder."""
INPUT_FILES = frozenset(RUN_FILES) - {"summary.md", "summary.png", DIFFERENCES_FILE}
"""The files of a --compare input folder that a --compare into that folder keeps (it writes only the rest)."""


def clear_outputs(out: Path, keep: Collection[str] = ()) -> None:
    """Delete an earlier run's files in `out` (all of RUN_FILES but `keep`), probe.json first, before this
    run writes its own: an interrupted write then leaves some of this run's files, never beside an earlier
    run's summary, results or probe.json that readers (`--compare`, `export --probe-results`) would take
    for this run's."""
    for name in RUN_FILES:
        if name not in keep:
            (out / name).unlink(missing_ok=True)
