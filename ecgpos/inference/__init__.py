"""Frozen encoders in use: the one resolver (run folder | export | random init), embed's inputs, and
reconstruction-based anomaly scores."""
