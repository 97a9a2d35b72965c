"""What every evaluation protocol shares: the tasks and their splits (`tasks`), finding, screening and
preprocessing their records (`datasets`), each split row kept or counted (`task_data`), the leakage guard
(`leakage`, `guard`), bootstrap intervals and paired differences (`bootstrap`, `intervals`), results.csv,
summary.md and the chart (`results`), probe.json and what `--compare` flags (`provenance`), published
numbers (`published`), AUROC (`metrics`), loading the encoder (`encoder`) and the shared flags (`args`)."""
