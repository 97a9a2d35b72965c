"""Reconstruction-based anomaly scores per record and per level (the preprint's use of these models).

Stage 0: mean masked-patch reconstruction error in the Stage-0 loss's target space (per-patch
normalised signal patches when norm_target). Stage 1: the same for the Stage-0 latent tokens through
the Stage-1 decoder. Each is averaged over `masks` fixed masks (mask m is drawn from seed m, the same
for every record and batch) and over the record's windows, so a record always gets the same score.
The preprint's Stage-1 score is instead the input-space error of the complete reconstruction, decoded
back through the Stage-0 decoder; the Stage-1 score here is the counterpart of its latent error e_sub,
on masked tokens as in the loss.

With both levels, `flags_by_label` applies the appendix's two-channel OR rule (ecgpos.inference.flags):
thresholds calibrated on held-out nominal records, and each label's decomposition of the flags.

The decoders come from run folders (a Stage-1 run finds the Stage-0 decoder through the Stage-0 run it
was trained on) or from an export written with `ecgpos export --with-decoders`.
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
from ecgpos.inference.flags import Calibration, Decomposition, calibrate, channel_flags, check_fit_size, decompose
from ecgpos.inference.inputs import Source, source_windows
from ecgpos.models.features import record_means
from ecgpos.models.masking import expand_masking, fixed_masking

LEVELS = ("stage0", "stage1")
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


def _stage0_decoder_of_stage1_run(info: dict, want_hash: str | None) -> tuple[nn.Module | None, str | None]:
    """The Stage-0 objective of the Stage-0 run (or export with decoders) a Stage-1 run was trained on."""
    from ecgpos.export.decoders import load_decoders
    from ecgpos.export.format import is_export_dir, weights_hash
    from ecgpos.export.load import read_export_config
    from ecgpos.runs.run_folder import is_run_dir, load_run_model

    source = info.get("stage0")
    if not source or not Path(source).exists():
        return None, f"Stage-0 scores unavailable: the Stage-0 source {source!r} of this run is not reachable"
    path = Path(source)
    if is_export_dir(path):
        config = read_export_config(path)
        if "stage0" not in (config.get("decoders") or {}):
            return None, f"Stage-0 scores unavailable: Stage 1 was trained on the encoder-only export {path}"
        model = load_decoders(path, config)["stage0"]
    elif is_run_dir(path):
        model = load_run_model(path)[0]
    else:
        return None, f"Stage-0 scores unavailable: {path} is neither a run nor an export folder"
    if want_hash and weights_hash(model.encoder) != want_hash:
        return None, f"Stage-0 scores unavailable: {path} now holds other weights than Stage 1 was trained on"
    return model, None


def load_recon_models(path: str | Path) -> ReconModels:
    """Run folder (Stage 0 or Stage 1) or export with decoders -> the reconstructing levels, frozen."""
    from ecgpos.export.decoders import load_decoders
    from ecgpos.export.format import is_export_dir
    from ecgpos.export.hub import resolve_model_path
    from ecgpos.export.load import read_export_config
    from ecgpos.runs.run_folder import is_run_dir, load_run_model

    path = resolve_model_path(path)  # hf://ORG/NAME: the snapshot folder in the Hub cache
    if not path.exists():
        raise EcgposError(f"{path} does not exist (expected a run folder or an export with decoders)")
    notes: list[str] = []
    if is_export_dir(path):
        config = read_export_config(path)
        levels = load_decoders(path, config)
        spec = PreprocessSpec.from_dict(config["preprocess"])
        if config["arch"].get("kind") == "nested" and "stage0" not in levels:
            notes.append("Stage-0 scores unavailable: the export carries no Stage-0 decoder")
    elif is_run_dir(path):
        model, cfg, _, info = load_run_model(path)
        spec = cfg.preprocess
        if cfg.stage == 0:
            levels = {"stage0": model}
        else:
            levels = {"stage1": model}
            stage0, note = _stage0_decoder_of_stage1_run(info, info.get("stage0_weights_sha256"))
            if stage0 is not None:
                levels = {"stage0": stage0, "stage1": model}
            else:
                notes.append(note or "")
    else:
        raise EcgposError(f"{path} is neither a training run folder nor an export folder")
    for model in levels.values():
        model.requires_grad_(False)
        model.float().eval()
    return ReconModels({k: levels[k] for k in LEVELS if k in levels}, spec, str(path), notes)


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
        fixed = [fixed_masking(enc.num_leads, enc.num_patches, model.mask_ratio, seed) for seed in range(masks)]
        parts = []
        for start in range(0, len(windows), batch_size):
            x = torch.from_numpy(np.ascontiguousarray(windows[start : start + batch_size], dtype=np.float32)).to(device)
            errors = [model.masked_errors(x, expand_masking(m, len(x), device)) for m in fixed]
            parts.append(torch.stack(errors).mean(dim=0).cpu().numpy())
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
        result.ids.append(record_id)
        for level, value in means.items():
            result.scores[level].append(float(value))
    return result


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
    if not counts["nominal"] or not counts["anomalous"]:
        raise EcgposError(
            f"--labels give {counts['nominal']} nominal and {counts['anomalous']} anomalous scored "
            "records; AUROC needs both"
        )
    labels_column = np.asarray(y)[:, None]
    aurocs = {
        level: float(auroc_columns(np.asarray(values, dtype=np.float64)[rows][:, None], labels_column)[0])
        for level, values in scores.items()
    }
    return aurocs, counts


@dataclass
class FlagReport:
    """The OR rule calibrated on D_fit, applied to every scored record (A, B in the order of the ids)."""

    calibration: Calibration
    groups: dict[str, Decomposition]  # per nominal label, then per anomalous label
    nominal: Decomposition  # the nominal evaluation records together: their false-positive rate
    a: np.ndarray
    b: np.ndarray


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
    the decomposition per nominal and anomalous label; EcgposError for NaN scores or too small a D_fit."""
    if set(scores) != set(LEVELS):
        raise EcgposError(f"the flag decomposition needs both levels' scores, not {', '.join(scores) or 'none'}")
    rec, sub = (np.asarray(scores[level], dtype=np.float64) for level in LEVELS)
    for level, values in zip(LEVELS, (rec, sub)):
        nan = np.flatnonzero(np.isnan(values))
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
    cal = calibrate(rec[fit], sub[fit], target)
    a, b = channel_flags(rec, sub, cal)
    groups = {}
    for label in [*nominal, *anomalous]:
        mine = rows([label])
        groups[label] = decompose(a[mine], b[mine])
    is_nominal = rows(nominal)
    return FlagReport(cal, groups, decompose(a[is_nominal], b[is_nominal]), a, b)
