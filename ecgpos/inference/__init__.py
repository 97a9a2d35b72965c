"""Frozen encoders in use: the one resolver (run folder | export | random init), embed's inputs,
reconstruction-based anomaly scores, and the two-channel flags calibrated on them."""
