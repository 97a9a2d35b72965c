"""A recording and how it becomes model input; numpy and scipy only, no torch.

leads (the one lead order), spec (the preprocessing spec that travels with shards, runs and
exports), signal (pure transforms), wfdb_io / wfdb_fast (reading WFDB records), shards (the HDF5
shard format).
"""
