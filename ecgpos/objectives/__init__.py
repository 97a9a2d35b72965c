"""What pretraining minimises, each objective wrapped around an encoder from ecgpos.models.

LevelObjective (level.py): the declared interface of one level's objective, which both below fill in.
MaskedECGAutoencoder (level 0): masked reconstruction of signal patches.
LatentMaskedAutoencoder (level l >= 1): masked reconstruction of the frozen levels' tokens, optionally with
Dynamic Push and Pull (push_pull.py). Each returns a dict with "loss" (what is minimised) and "log"
(the scalar terms the trainer records in metrics.jsonl), so a new term is a one-file change.
"""

from ecgpos.objectives.latent_mae import LatentMaskedAutoencoder
from ecgpos.objectives.level import LevelObjective
from ecgpos.objectives.level0_mae import MaskedECGAutoencoder, masked_mse, normalise_tokens
from ecgpos.objectives.push_pull import PushPullConfig, perturb, push_pull_loss

__all__ = [
    "LatentMaskedAutoencoder",
    "LevelObjective",
    "MaskedECGAutoencoder",
    "PushPullConfig",
    "masked_mse",
    "normalise_tokens",
    "perturb",
    "push_pull_loss",
]
