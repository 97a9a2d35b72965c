"""What a pretraining run is, for everything that writes or reads one.

run_config (RunConfig: the YAML config of a run), run_folder (the name of every file in a run folder,
its checkpoints, reading its model back) and levels (the training model of each level). The trainer
(ecgpos.pretrain) writes run folders; the resolver (ecgpos.inference) and export read them.
"""
