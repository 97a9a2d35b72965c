"""Reconstruction-based anomaly scores per record and per level (the preprint's use of these models).

Level 0: mean masked-patch reconstruction error in the level-0 loss's target space (per-patch
normalised signal patches when norm_target). Level 1: the same for the level-0 latent tokens through
the level-1 decoder. Each is averaged over `masks` fixed masks (mask m is drawn from seed m, the same
for every record and batch) and over the record's windows, so a record always gets the same score.
The preprint's Stage-1 score (our level 1) is instead the input-space error of the complete reconstruction, decoded
back through the level-0 decoder; the level-1 score here is the counterpart of its latent error e_sub,
on masked tokens as in the loss.

With two levels or more, `flags_by_label` applies the appendix's OR rule over every level's channel
(ecgpos.inference.flags): thresholds calibrated on held-out nominal records, and each label's decomposition
of the flags by the first level that fired.

Level l's score is the same error of level l's decoder on the tokens of levels 0..l-1. The decoders come
from run folders (a run of level l finds the lower levels' decoders through the chain of bases it was
trained on) or from an export written with `ecgpos export --with-decoders`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.inference.flags import (
    Calibration,
    FirstLevel,
    calibrate_levels,
    check_fit_size,
    decompose_levels,
    level_flags,
)
from ecgpos.inference.inputs import Source, finite_outputs, source_windows
from ecgpos.models.features import record_means
from ecgpos.models.masking import expand_masking, score_maskings
from ecgpos.models.nested import level_name, level_names, parse_level_name

# Every mask is built up front and run on every window: far more than the default 8 only multiplies the
# work (a huge count exhausted memory in a traceback).
MAX_MASKS = 1_000


@dataclass
class ReconModels:
    """The objective modules that can reconstruct, per level (absent levels are missing keys)."""

    levels: dict[str, nn.Module]
    spec: PreprocessSpec
    source: str
    notes: list[str] = field(default_factory=list)  # why a level is missing, for the user
    depth: int = 0  # the encoder's number of levels


def _level_below(info: dict, level: int) -> tuple[dict[str, nn.Module], dict | None, str | None]:
    """The objectives of levels 0..level-1 reachable from a level-`level` run's base (run_info `info`):
    ({"level<l>": model}, the base run's info to walk on from or None, why the walk stops or None)."""
    from ecgpos.export.decoders import load_decoders
    from ecgpos.export.format import is_export_dir, weights_hash
    from ecgpos.export.load import read_export_config
    from ecgpos.runs.run_folder import base_source, is_run_dir, load_run_model, run_chain

    below = level_name(level - 1)
    source = base_source(info)
    chain = {int(e.get("level", -1)): e.get("weights_sha256") for e in run_chain(info)}
    if not source or not Path(source).exists():
        return {}, None, f"{below} scores unavailable: the base {source!r} of this run is not reachable"
    path = Path(source)
    if is_export_dir(path):
        config = read_export_config(path)
        found = (
            {k: v for k, v in load_decoders(path, config).items() if k in level_names(level)}
            if config.get("decoders")
            else {}
        )
        if below not in found:
            return {}, None, f"{below} scores unavailable: level {level} was trained on the encoder-only export {path}"
        models = found
        nxt = None
    elif is_run_dir(path):
        model, _, _, base_info = load_run_model(path)
        models, nxt = {below: model}, base_info
    else:
        return {}, None, f"{below} scores unavailable: {path} is neither a run nor an export folder"
    for name, model in models.items():
        want = chain.get(parse_level_name(name))
        if want and weights_hash(model.encoder) != want:
            return (
                {},
                None,
                f"{name} scores unavailable: {path} now holds other weights than level {level} was trained on",
            )
    return models, nxt, None


def load_recon_models(path: str | Path) -> ReconModels:
    """Run folder (any level) or export with decoders -> the reconstructing levels, frozen. A run of
    level N finds levels N-1, ..., 0 through the base runs (or the export with decoders) it was trained on."""
    from ecgpos.export.decoders import load_decoders
    from ecgpos.export.format import is_export_dir
    from ecgpos.export.hub import resolve_model_path
    from ecgpos.export.load import read_export_config
    from ecgpos.models.factory import arch_depth
    from ecgpos.runs.run_folder import is_run_dir, load_run_model

    path = resolve_model_path(path)  # hf://ORG/NAME: the snapshot folder in the Hub cache
    if not path.exists():
        raise EcgposError(f"{path} does not exist (expected a run folder or an export with decoders)")
    notes: list[str] = []
    if is_export_dir(path):
        config = read_export_config(path)
        levels = load_decoders(path, config)
        spec = PreprocessSpec.from_dict(config["preprocess"])
        depth = arch_depth(config["arch"])
        missing = [name for name in level_names(depth) if name not in levels]
        if missing:
            notes.append(f"{', '.join(missing)} scores unavailable: the export carries no decoder for them")
    elif is_run_dir(path):
        model, cfg, _, info = load_run_model(path)
        spec, depth = cfg.preprocess, cfg.level + 1
        levels = {level_name(cfg.level): model}
        level = cfg.level
        while level > 0 and info is not None:  # walk down the chain of bases
            found, info, note = _level_below(info, level)
            if note:
                notes.append(note)
                break
            levels.update(found)
            level = min(parse_level_name(k) for k in levels)
    else:
        raise EcgposError(f"{path} is neither a training run folder nor an export folder")
    for model in levels.values():
        model.requires_grad_(False)
        model.float().eval()
    return ReconModels({k: levels[k] for k in level_names(depth) if k in levels}, spec, str(path), notes, depth)


def _encoder_of(model: nn.Module) -> nn.Module:
    return model.encoder


@torch.no_grad()
def window_scores(
    models: ReconModels, windows: np.ndarray, masks: int, device: str | torch.device = "cpu", batch_size: int = 64
) -> dict[str, np.ndarray]:
    """Per-window scores (N,) per level: masked error averaged over `masks` fixed masks."""
    out: dict[str, np.ndarray] = {}
    for level, model in models.levels.items():
        model.to(device)
        enc = _encoder_of(model)
        fixed = score_maskings(enc.num_leads, enc.num_patches, model.mask_ratio, masks)
        parts = []
        for start in range(0, len(windows), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(windows[start : start + batch_size], dtype=np.float32)).to(device)
            errors = model.masked_errors(x, [expand_masking(m, len(x), device) for m in fixed])
            parts.append(errors.mean(dim=0).cpu().numpy())
        out[level] = np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)
    return out


@dataclass
class ScoreResult:
    ids: list[str] = field(default_factory=list)
    scores: dict[str, list[float]] = field(default_factory=dict)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)  # (record id, reason, detail)
    long: list[tuple[str, str, str, str]] = field(default_factory=list)  # (id, duration_s, used_from_s, used_to_s)


def score_records(
    models: ReconModels,
    source: Source,
    masks: int = 8,
    num_windows: int = 1,
    batch_size: int = 64,
    device: str | torch.device = "cpu",
    progress: bool = True,
    prog: str = "ecgpos score",
) -> ScoreResult:
    """Scores of every good record of an `ecgpos embed` source; bad records are reported on stderr
    with their reason and skipped."""
    result = ScoreResult(scores={level: [] for level in models.levels})
    records = source_windows(source, models.spec.window, num_windows, result.skipped, prog, progress, result.long)

    def scores(windows: np.ndarray) -> dict[str, np.ndarray]:
        return window_scores(models, windows, masks, device, batch_size)

    for record_id, means in record_means(records, scores, batch_size):
        if not finite_outputs(record_id, means, result.skipped, prog, "scores"):
            continue
        result.ids.append(record_id)
        for level, value in means.items():
            result.scores[level].append(float(value))
    return result


MIN_CLASS_RECORDS = 2


def auroc_by_level(
    ids: Sequence[str],
    scores: dict[str, Sequence[float]],
    labels: dict[str, str],
    nominal: Sequence[str],
    anomalous: Sequence[str],
) -> tuple[dict[str, float], dict[str, int]]:
    """AUROC of anomalous (positive) vs nominal records per level, and the record counts used;
    EcgposError for a label both nominal and anomalous or a side without scored records."""
    from ecgpos.metrics import auroc_columns  # sklearn's roc_auc_score, without needing scikit-learn

    both = sorted(set(nominal) & set(anomalous))
    if both:  # its records would count as anomalous only
        raise EcgposError(f"labels both nominal and anomalous: {', '.join(both)}")
    y, rows = [], []
    for row, record_id in enumerate(ids):
        label = labels.get(record_id)
        if label in nominal or label in anomalous:
            y.append(int(label in anomalous))
            rows.append(row)
    counts = {"nominal": y.count(0), "anomalous": y.count(1), "unlabelled": len(ids) - len(y)}
    if min(counts["nominal"], counts["anomalous"]) < MIN_CLASS_RECORDS:
        raise EcgposError(
            f"--labels give {counts['nominal']} nominal and {counts['anomalous']} anomalous scored "
            f"records; an AUROC needs at least {MIN_CLASS_RECORDS} of each (with one, it is 0 or 1 by chance)"
        )
    labels_column = np.asarray(y)[:, None]
    aurocs = {
        level: float(auroc_columns(np.asarray(values, dtype=np.float64)[rows][:, None], labels_column)[0])
        for level, values in scores.items()
    }
    broken = [level for level, value in aurocs.items() if not 0 <= value <= 1]
    if broken:  # scores are finite (score_records skips the others): a NaN here is a bug, never a result
        raise EcgposError(f"the AUROC of {', '.join(broken)} is not a number in [0, 1]; no summary written")
    return aurocs, counts


@dataclass
class FlagReport:
    """The OR rule over every level, calibrated on D_fit and applied to every scored record (rows in the
    order of the ids)."""

    calibration: Calibration
    levels: list[str]
    flags: np.ndarray  # (n, L) bool: level l's channel fired
    first: dict[str, FirstLevel]  # per nominal label, then per anomalous label: the first level that fired
    nominal_first: FirstLevel  # the nominal evaluation records together: their false-positive rate


def flags_by_label(
    ids: Sequence[str],
    scores: dict[str, Sequence[float]],
    labels: dict[str, str],
    fit_labels: Sequence[str],
    nominal: Sequence[str],
    anomalous: Sequence[str],
    target: float,
) -> FlagReport:
    """Thresholds from the records labelled `fit_labels` (D_fit), then the flags of every record and
    the decomposition per nominal and anomalous label; EcgposError for NaN scores, a missing level or
    too small a D_fit."""
    levels = level_names(len(scores))
    if list(scores) != levels or len(levels) < 2:
        raise EcgposError(
            f"the flag decomposition needs the scores of every level of a nested encoder (at least levels "
            f"level0, level1), not {', '.join(scores) or 'none'}"
        )
    values = [np.asarray(scores[level], dtype=np.float64) for level in levels]
    for level, column in zip(levels, values):
        nan = np.flatnonzero(np.isnan(column))
        if nan.size:
            raise EcgposError(
                f"NaN {level} score for {nan.size} of {len(ids)} records (the first: {ids[nan[0]]!r}); "
                "no flag can be decided on it"
            )
    group = [labels.get(record_id, "") for record_id in ids]

    def rows(names: Sequence[str]) -> np.ndarray:
        return np.array([label in names for label in group], dtype=bool)

    fit = rows(fit_labels)
    check_fit_size(int(fit.sum()), target, f"the scored set of --calibration {','.join(fit_labels)}")
    cal = calibrate_levels([v[fit] for v in values], target)
    flags = level_flags(values, cal)
    labelled = [*nominal, *anomalous]
    is_nominal = rows(nominal)
    return FlagReport(
        cal,
        levels,
        flags,
        {label: decompose_levels(flags[rows([label])]) for label in labelled},
        decompose_levels(flags[is_nominal]),
    )
