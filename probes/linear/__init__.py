"""`ecgpos probe`: linear probes on frozen features (MERL's splits and protocol), and `--compare`: the command
(`cli`), its flags (`args`), the feature cache (`features`), one run's jobs (`run`), the batched training of
every seed (`train`) and its Protocol section of summary.md (`report`)."""
