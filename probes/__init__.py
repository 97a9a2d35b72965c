"""Evaluation of ECG encoders on labelled tasks, one subpackage per protocol over what they share:

- `ecgpos.probes.shared`: tasks and splits, finding and reading records, the leakage guard, bootstrap intervals,
  results.csv and summary.md, probe.json and `--compare`, published reference numbers;
- `ecgpos.probes.linear`: `ecgpos probe`, linear probes on frozen features (MERL's protocol) and `--compare`;
- `ecgpos.probes.finetune`: `ecgpos finetune`, the encoder trained end to end, its top blocks, or adapters;
- `ecgpos.probes.geometry`: `ecgpos geometry`, the PoS representation dynamics between consecutive levels.

The protocols import `ecgpos.probes.shared`, never each other; `ecgpos.probes.shared` imports no protocol.
"""
