"""`ecgpos pretrain` / `accelerate launch -m ecgpos.pretrain`: both stages on Accelerate.

plan (every input validated before training), run_config, run_folder (every file of a run),
stages (the training model of each stage), data, trainer, schedule, checkpoint, metrics_log, figures.
"""
