"""`ecgpos pretrain` / `accelerate launch -m ecgpos.pretrain`: every level on Accelerate.

plan (every input validated before training), data, trainer, optim, schedule, guard (non-finite
steps), checkpoint, metrics_log, figures, stop (signals), run_lock. The run config, the run folder's
files and each level's training model live in ecgpos.runs.
"""
