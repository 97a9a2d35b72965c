"""Frozen encoders in use: the one resolver (run folder | export | random init) and embed's inputs."""
