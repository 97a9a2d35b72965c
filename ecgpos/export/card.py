"""The model card (README.md of an export): what the encoder is, how it was trained, how to use it."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ecgpos.errors import EcgposError
from ecgpos.export.hub_card import DEFAULT_LICENSE, front_matter, probe_index_results
from ecgpos.export.probe_scores import check_probe_results, read_result_rows
from ecgpos.models.factory import arch_levels
from ecgpos.models.nested import parse_level_name, recorded_level

PAPER_TITLE = (
    "When Does Unsupervised Learning Succeed or Fail? A PoS Perspective on Reconstruction-Based Anomaly Detection"
)
PAPER_AUTHORS = "Mehmet Yamaç, Yagmur Mustu, Muhammad Numan Yousaf, Lei Xu, Marcel van Gerven"
BIBTEX = """@misc{yamac2026pos,
  title  = {When Does Unsupervised Learning Succeed or Fail? A PoS Perspective on
            Reconstruction-Based Anomaly Detection},
  author = {Yama{\\c{c}}, Mehmet and Mustu, Yagmur and Yousaf, Muhammad Numan and Xu, Lei and
            van Gerven, Marcel},
  note   = {Submitted to ICLR 2027, under review},
  year   = {2026}
}"""
MAX_TABLE_ROWS = 60


def _describe_arch(arch: dict[str, Any]) -> str:
    def one(cfg: dict[str, Any]) -> str:
        keys = ("width", "depth", "heads", "patch_size", "seq_len")
        return ", ".join(f"{k} {cfg[k]}" for k in keys if k in cfg)

    if arch.get("kind") == "nested":
        levels = arch_levels(arch)
        latent = "; ".join(f"level {i} ({one(cfg)})" for i, cfg in enumerate(levels[1:], start=1))
        return (
            f"nested encoder of {len(levels)} levels: Level 0 ST-MEM-style transformer ({one(levels[0])}) "
            f"followed by latent transformers, {latent}, each trained by nested manifold carving on the "
            "frozen tokens of the levels below"
        )
    return f"level 0 ST-MEM-style masked ECG transformer ({one(arch.get('encoder', {}))})"


def _table(rows: list[dict[str, str]]) -> str:
    """A markdown table of csv rows (first MAX_TABLE_ROWS)."""
    if not rows:
        return "_(empty results file)_"
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows[:MAX_TABLE_ROWS]:
        lines.append("| " + " | ".join(str(row.get(col, "")).replace("|", "/") for col in header) + " |")
    if len(rows) > MAX_TABLE_ROWS:
        lines.append(f"\n_{len(rows) - MAX_TABLE_ROWS} more rows in results.csv._")
    return "\n".join(lines)


def _rows(folder: Path, results: Path) -> list[dict[str, str]]:
    try:
        return read_result_rows(results)
    except EcgposError as err:
        raise EcgposError(f"--probe-results {folder}: not a probe results folder ({err})") from None


def probe_section(folder: str | Path) -> str:
    """Markdown for a probe results folder: its summary.md if present, else results.csv as a table."""
    folder = Path(folder)
    summary, results = folder / "summary.md", folder / "results.csv"
    try:
        if results.is_file():  # the summary is made from these rows: they must match the stored scores
            check_probe_results(folder, _rows(folder, results))
        if summary.is_file():
            body = summary.read_text().strip()
            # demote headings so the summary nests under the card's own section
            return "\n".join("##" + line if line.startswith("#") else line for line in body.splitlines())
        if results.is_file():
            return _table(_rows(folder, results))
    except (UnicodeDecodeError, csv.Error) as err:
        raise EcgposError(f"--probe-results {folder}: not a probe results folder ({err})") from None
    raise EcgposError(f"--probe-results {folder}: no summary.md or results.csv there (run `ecgpos probe` first)")


def probed_weights(folder: str | Path) -> set[str] | None:
    """The weights hashes (`weights_hash`) of the encoders a probe folder's rows come from, from its
    probe.json (`sources`: each row label's feature key); None when the folder does not record them
    (a results.csv written by hand or by another tool)."""
    try:
        sources = json.loads((Path(folder) / "probe.json").read_text()).get("sources")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(sources, dict):
        return None
    found = set()
    for key in sources.values():
        try:
            found.add(json.loads(key)["encoder"])
        except (TypeError, ValueError, KeyError):
            continue  # a baseline without weights (the raw signal)
    return found


def check_probed_encoder(folder: str | Path, weights_sha256: str, what: str) -> str | None:
    """Refuse a probe folder whose rows are all of other encoders than the one exported (EcgposError);
    a warning line when the folder cannot tell which encoders it probed, else None."""
    found = probed_weights(folder)
    if found is None:
        return f"--probe-results {folder} does not record which encoder it probed (no probe.json): not checked"
    if weights_sha256 not in found:
        raise EcgposError(
            f"--probe-results {folder} probed other weights than {what}: its rows would describe another "
            "encoder in this model card; probe this run or its export (`ecgpos probe --encoder ...`) and pass "
            "that folder"
        )
    return None


def _training_lines(training: dict[str, Any]) -> list[str]:
    lines = []
    level = recorded_level(training)
    if level is not None:
        below = (
            f" (level {level} on top of the frozen levels 0..{level - 1})" if isinstance(level, int) and level else ""
        )
        lines.append(f"- Level: {level}{below}")
    if training.get("exported_levels") is not None:
        cut = (
            f"cut from the nest of {training['cut_from']}"
            if training.get("cut_from")
            else "the export cuts the run's nest"
        )
        lines.append(f"- Levels in this export: {training['exported_levels']} ({cut})")
    if training.get("step") is not None:
        total = training.get("steps")
        finished = training.get("finished")
        lines.append(
            f"- Optimiser steps: {training['step']}"
            + (f" of {total}" if total else "")
            + ("" if finished is None else (" (finished)" if finished else " (stopped early)"))
        )
    for key, label in (
        ("batch_size", "Global batch size"),
        ("lr", "Peak learning rate"),
        ("mask_ratio", "Mask ratio"),
        ("push_pull", "Dynamic Push and Pull"),
        ("data", "Pretraining data"),
        ("records", "Pretraining records"),
        ("checkpoint", "Checkpoint"),
    ):
        if training.get(key) not in (None, "", {}):
            lines.append(f"- {label}: {training[key]}")
    return lines or ["- (the run folder recorded no training details)"]


def render_card(
    config: dict[str, Any], probe_results: str | Path | None = None, license_id: str = DEFAULT_LICENSE
) -> str:
    """README.md text for an export whose config.json is `config`, opening with the Hub's metadata."""
    spec = config["preprocess"]
    io = config.get("io", {})
    training = config.get("training", {})
    probe = (
        probe_section(probe_results)
        if probe_results
        else ("No probe results were attached to this export (`ecgpos export --probe-results DIR`).")
    )
    onnx = config.get("onnx")
    onnx_line = (
        (
            f"- `encoder.onnx`: ONNX opset {onnx['opset']}, input `{onnx['input']}` (batch, 12, "
            f"{spec['window']}) float32 preprocessed windows, output `{onnx['output']}` (batch, "
            f"{io.get('features', '?')}); checked against PyTorch with onnxruntime.\n"
        )
        if onnx
        else ""
    )
    decoders = config.get("decoders")
    named = [k for k in decoders if parse_level_name(k) is not None] if isinstance(decoders, dict) else []
    decoder_levels = ", ".join(named)
    decoders_line = (
        f"- `{decoders.get('file', 'decoders.safetensors')}`: the reconstruction decoders of levels "
        f"{decoder_levels}, for `ecgpos score` (sha256 in config.json).\n"
        if isinstance(decoders, dict)
        else ""
    )
    name = f"ecgpos ECG encoder ({training.get('name', config['arch'].get('kind', 'encoder'))})"
    results = probe_index_results(probe_results, config["weights_sha256"])
    return (
        front_matter(name, "feature-extraction", results, license_id)
        + f"""# {name}

A frozen self-supervised 12-lead ECG encoder from **ecgpos** {config.get("ecgpos_version", "")}:
{_describe_arch(config["arch"])}.
It turns a 12-lead ECG into a {io.get("features", "?")}-dimensional feature vector ({config.get("pooling", "")}).

## Intended use
Research only: feature extraction for ECG representation learning, linear probes, retrieval and
similar studies. **This is not a medical device and not a diagnostic tool**; it must not be used
to make or support clinical decisions. It has no classification head and outputs no diagnoses.

## How to load
```python
import ecgpos
encoder = ecgpos.load_encoder("path/to/this/folder")          # eval mode, weights checked
features = encoder.embed(signal_mV, fs=500, leads=lead_names)   # (leads, time) -> ({io.get("features", "?")},)
```
This needs ecgpos installed (`pip install .` in its source tree) and reads only this folder: no
training run, checkpoint or training code. From the shell: `ecgpos embed --encoder DIR --input
RECORDS --out feats.csv`, and `ecgpos verify DIR` checks an installation against `test_vectors.npz`.

## Preprocessing (applied by `embed`; apply it yourself before `forward_features`)
- Input: raw signal in {spec["units"]}, any sampling rate above {2 * spec["lowpass_hz"]:g} Hz (twice the low-pass
  cut-off) and up to 10 kHz with a small rational ratio to {spec["fs"]} Hz,
  the 12 standard leads in any order and common spellings (AVR/aVR, DI/I); other leads beside them
  (e.g. Frank vx/vy/vz) are left out. `embed` refuses uV or
  ADC counts (median lead peak-to-peak above 100 mV).
- Dead leads (raw peak-to-peak below 10 uV, at most 2 per record) are set to exact zeros after
  preprocessing, instead of z-scoring their noise.
- Zero-phase Butterworth band-pass {spec["highpass_hz"]}-{spec["lowpass_hz"]} Hz (order {spec["filter_order"]}) at
  the source rate, per-{spec["standardise"]} z-score, resampling to {spec["fs"]} Hz.
- Lead order: {", ".join(spec["leads"])}.
- Window: {spec["window"]} samples ({spec["window"] / spec["fs"]:g} s); `embed` uses the centre window
  (or `num_windows` windows spread over the record, averaged). Records shorter than the window are refused
  (`too_short`; `ecgpos embed --pad-short` zero-pads them).
- Records longer than 300 s at their own rate (Holter recordings) are read, screened, filtered and
  z-scored on their centre 300 s span alone (`ecgpos.ecg.signal.record_span`), and their windows are
  spread over that span: the standardisation covers the span, not the whole recording. Shorter
  records are processed whole.

## Training
{chr(10).join(_training_lines(training))}

## Probe results
{probe}

## Files
- `model.safetensors`: weights (safetensors, no pickle); sha256 of the tensors `{config["weights_sha256"]}`.
- `config.json`: architecture, preprocessing, pooling, versions, training summary.
- `test_vectors.npz`: deterministic inputs with expected features.
{onnx_line}{decoders_line}
## Limitations
- Trained on the corpora listed above only; performance on other populations, devices, paediatric
  ECGs, paced rhythms or recordings with other filtering is unknown.
- Needs all 12 standard leads and at least {spec["window"] / spec["fs"]:g} s of signal; reduced-lead ECGs
  are not supported.
- Features are averaged over time and may miss short or intermittent events outside the window used.
- Self-supervised features can encode acquisition artefacts (device, site, noise); check for confounding.

## Citation
{PAPER_AUTHORS}. *{PAPER_TITLE}*. Submitted to ICLR 2027 (under review).

```bibtex
{BIBTEX}
```
"""
    )
