"""`ecgpos finetune`: the encoder trained end to end (or its top blocks, or low-rank adapters) on the probe tasks,
with the splits, label fractions, seeds, leakage guard and bootstrap intervals of `ecgpos.probes.shared`."""
