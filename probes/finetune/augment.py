"""Training crops and ECG augmentations: pure functions of a batch and a torch.Generator.

Each augmentation acts per record with its own probability, on standardised (B, leads, T) windows;
none changes a label (a shift, an amplitude change, wander, noise or a missing lead leave the rhythm
and the morphology classes as they are).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ecgpos.probes.finetune.config import AugmentConfig

WANDER_HZ = (0.05, 0.5)  # respiration and electrode-motion baseline wander


def random_crop(record: np.ndarray, window: int, rng: np.random.Generator) -> np.ndarray:
    """A random `window`-sample span of a (leads, T) record; a shorter record is zero-padded at the end
    (as the probes pad it)."""
    length = record.shape[-1]
    if length <= window:
        out = np.zeros((record.shape[0], window), np.float32)
        out[:, :length] = record
        return out
    start = int(rng.integers(0, length - window + 1))
    return np.ascontiguousarray(record[:, start : start + window], dtype=np.float32)


def _chosen(p: float, b: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """(B, 1, 1) float mask: 1 for the records an augmentation of probability p applies to."""
    return (torch.rand(b, 1, 1, generator=g, device=device) < p).float()


def time_shift(x: torch.Tensor, p: float, strength: float, g: torch.Generator) -> torch.Tensor:
    """Circular shift by up to `strength` x T samples either way."""
    b, _, t = x.shape
    limit = int(strength * t)
    if p <= 0 or limit < 1:
        return x
    shifts = torch.randint(-limit, limit + 1, (b,), generator=g, device=x.device)
    shifts = shifts * (torch.rand(b, generator=g, device=x.device) < p)
    index = (torch.arange(t, device=x.device)[None] - shifts[:, None]) % t
    return torch.gather(x, 2, index[:, None].expand_as(x))


def amplitude_scale(x: torch.Tensor, p: float, strength: float, g: torch.Generator) -> torch.Tensor:
    """Each lead times U(1 - strength, 1 + strength)."""
    b, l, _ = x.shape
    factor = 1 + strength * (2 * torch.rand(b, l, 1, generator=g, device=x.device) - 1)
    chosen = _chosen(p, b, g, x.device)
    return x * (chosen * factor + (1 - chosen))


def baseline_wander(x: torch.Tensor, p: float, strength: float, fs: float, g: torch.Generator) -> torch.Tensor:
    """A slow sine (WANDER_HZ) of amplitude `strength` with a random phase, the same on every lead."""
    b, _, t = x.shape
    lo, hi = WANDER_HZ
    freq = lo + (hi - lo) * torch.rand(b, 1, 1, generator=g, device=x.device)
    phase = 2 * math.pi * torch.rand(b, 1, 1, generator=g, device=x.device)
    time = torch.arange(t, device=x.device, dtype=x.dtype)[None, None] / fs
    return x + _chosen(p, b, g, x.device) * strength * torch.sin(2 * math.pi * freq * time + phase)


def gaussian_noise(x: torch.Tensor, p: float, strength: float, g: torch.Generator) -> torch.Tensor:
    """Additive white noise of std `strength`."""
    noise = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)
    return x + _chosen(p, x.shape[0], g, x.device) * strength * noise


def lead_dropout(x: torch.Tensor, p: float, strength: float, g: torch.Generator) -> torch.Tensor:
    """Each lead zeroed with probability `strength` (as a dead lead is zeroed in preprocessing)."""
    b, l, _ = x.shape
    dropped = (torch.rand(b, l, 1, generator=g, device=x.device) < strength).float() * _chosen(p, b, g, x.device)
    return x * (1 - dropped)


def augment(x: torch.Tensor, cfg: AugmentConfig, fs: float, g: torch.Generator) -> torch.Tensor:
    """All five augmentations in a fixed order; a new tensor, `x` is left as it was."""
    x = time_shift(x, cfg.p_shift, cfg.shift, g)
    x = amplitude_scale(x, cfg.p_scale, cfg.scale, g)
    x = baseline_wander(x, cfg.p_wander, cfg.wander, fs, g)
    x = gaussian_noise(x, cfg.p_noise, cfg.noise, g)
    return lead_dropout(x, cfg.p_dropout, cfg.dropout, g)
