"""The model card (README.md) of a classifier export: labels, thresholds and how they were chosen,
the test AUROC of each label with its interval, and how to apply it."""

from __future__ import annotations

from typing import Any

from ecgpos.export.card import BIBTEX, PAPER_AUTHORS, PAPER_TITLE, _describe_arch
from ecgpos.export.hub_card import classifier_results, front_matter


def _percent(fraction: object) -> str:
    """A label fraction (0.01) as the percentage `finetune --fractions` and `export --fraction` give (1 %)."""
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool):
        return f"{fraction * 100:g} %"
    return "?"


def _fmt(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _label_table(config: dict[str, Any]) -> str:
    test = config.get("test") or {}
    cells = test.get("per_label") or {}
    thresholds = config["thresholds"]
    lines = [
        "| label | test AUROC | 95 % interval | test positives | threshold | validation F1 |",
        "|---|---|---|---|---|---|",
    ]
    for label in config["labels"]:
        cell = cells.get(label, {})
        lines.append(
            f"| {label} | {_fmt(cell.get('auroc'))} | {_fmt(cell.get('low'))}-{_fmt(cell.get('high'))} "
            f"| {cell.get('positives', '?')} | {thresholds['values'][label]:.4f} "
            f"| {_fmt(thresholds.get('validation_f1', {}).get(label))} |"
        )
    return "\n".join(lines)


def render_classifier_card(config: dict[str, Any], license_id: str = "other") -> str:
    """README.md text for a classifier export whose config.json is `config`."""
    spec, training, test = config["preprocess"], config.get("training", {}), config.get("test") or {}
    task = training.get("task", "?")
    name = f"ecgpos {task} classifier ({training.get('protocol', 'fine-tuned')})"
    onnx = config.get("onnx")
    onnx_line = (
        f"- `{onnx['file']}`: ONNX opset {onnx['opset']}, input `{onnx['input']}` (batch, 12, {spec['window']}) "
        f"float32 preprocessed windows, output `{onnx['output']}` (batch, {len(config['labels'])}); checked against "
        "PyTorch with onnxruntime.\n"
        if onnx
        else ""
    )
    source = training.get("encoder_source")
    source_text = source.get("source") or source.get("path") if isinstance(source, dict) else source
    header = front_matter(name, "other", classifier_results(config), license_id, extra_tags=("classification",))
    return (
        header
        + f"""# {name}

A 12-lead ECG classifier from **ecgpos** {config.get("ecgpos_version", "")}: {_describe_arch(config["arch"])},
fine-tuned ({training.get("protocol", "?")}) with a linear head on the task `{task}`
({_percent(training.get("fraction"))} of its training labels, seed {training.get("seed", "?")}). It gives each of
{len(config["labels"])} labels a probability (sigmoid of the head's output) and a flag (probability >= the
label's threshold).

## Intended use
Research only: studies of ECG classification on cohorts the researcher has the right to analyse.
**This is not a medical device and not a diagnostic tool**; its outputs must not be used to make or
support clinical decisions.

## How to apply it
```bash
ecgpos predict --model path/to/this/folder --input RECORDS --out predictions.csv
```
```python
import ecgpos
model = ecgpos.load_classifier("path/to/this/folder")            # eval mode, weights checked
probabilities = model.predict_proba(signal_mV, fs=500, leads=lead_names)
flags = model.flags(probabilities)                             # in the order of model.labels
```
Uploaded to the Hugging Face Hub as it is (`huggingface-cli upload ORG/NAME DIR .`), the folder loads as
`hf://ORG/NAME` wherever a path is taken (`--model`, `ecgpos.load_classifier`), hash-checked as here.
Records are screened and preprocessed exactly as `ecgpos embed` does (band-pass
{spec["highpass_hz"]}-{spec["lowpass_hz"]} Hz, per-{spec["standardise"]} z-score, {spec["fs"]} Hz, windows of
{spec["window"]} samples); a record's probabilities come from the mean over its windows
({config.get("windows", 1)} by default, as in evaluation). `ecgpos verify DIR` checks an installation.

## Labels, thresholds and test results
Thresholds: {config["thresholds"]["rule"]}, on {config["thresholds"].get("n_validation", "?")} validation
records; the test split was used for nothing but the figures below. Test AUROC on {test.get("n_test", "?")}
records with {round(100 * test.get("level", 0.95))} % percentile bootstrap intervals ({test.get("bootstrap", "?")}
resamples of the {test.get("bootstrap_unit", "record")}s); macro AUROC {_fmt(test.get("macro_auroc"))}.

{_label_table(config)}

## Training
- Task: {task}; fraction of training labels: {_percent(training.get("fraction"))}; seed: {training.get("seed", "?")}
- Protocol: {training.get("protocol", "?")}; checkpoint selected on validation macro-AUROC
  ({_fmt(training.get("val_macro_auroc"))}) at epoch {training.get("selected_epoch", "?")}
- Pretrained encoder: {source_text or "?"}

## Files
- `model.safetensors`: the encoder's weights and the head's (`head.weight`, `head.bias`); sha256 of the tensors
  `{config["weights_sha256"]}`.
- `config.json`: architecture, preprocessing, labels, head, thresholds, test results.
- `test_vectors.npz`: deterministic inputs with expected features and probabilities.
{onnx_line}
## Limitations
- The thresholds were chosen for the label prevalence of the validation split; another cohort's
  prevalence changes what they mean. Recalibrate on your own validation data before relying on flags.
- Performance on other populations, devices, paediatric ECGs or paced rhythms is unknown; needs all 12
  standard leads and at least {spec["window"] / spec["fs"]:g} s of signal.

## Citation
{PAPER_AUTHORS}. *{PAPER_TITLE}*. Submitted to ICLR 2027 (under review).

```bibtex
{BIBTEX}
```
"""
    )
