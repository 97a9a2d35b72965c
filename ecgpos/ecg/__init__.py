"""A recording and how it becomes model input; numpy and scipy only, no torch.

leads (the one lead order), spec (the preprocessing spec that travels with shards, runs and
exports), signal (pure transforms), rates (sampling-rate parsing), screening (why a record is
skipped), wfdb_io / wfdb_fast (reading WFDB records), shards (the HDF5 shard format), fingerprint
(the leakage guard's record fingerprints).
"""
