"""The encoder under probe: resolved through ecgpos.inference.resolve, plus a random-init twin for the baseline."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.models.factory import random_init


@dataclass
class ProbeEncoder:
    """What probes need of an encoder: a frozen module with forward_features, its spec, a label."""

    module: nn.Module
    spec: PreprocessSpec
    arch: dict  # ecgpos.models.factory arch: what a random-init twin is built from
    label: str
    source: str
    info: dict = field(default_factory=dict)


def _label(path: str) -> str:
    if path.startswith("random:"):
        config = Path(path.split(":", 1)[1])
        return f"random-init ({config.parent.name}/{config.stem})"
    return Path(path).resolve().name


def load_probe_encoder(path: str, level: int | None = None) -> ProbeEncoder:
    """Run folder, export folder or 'random:<config.yaml>' -> ProbeEncoder, cut to its levels 0..level
    when given (labelled so); EcgposError when unloadable."""
    from ecgpos.inference.resolve import resolve_encoder

    try:
        loaded = resolve_encoder(path, level)
    except EcgposError:
        raise
    except Exception as err:  # a broken folder must not surface as a traceback
        raise EcgposError(f"cannot load encoder {path}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    label = _label(path) if level is None else f"{_label(path)} level {level}"
    return ProbeEncoder(loaded.module.eval(), loaded.spec, loaded.arch, label, loaded.source, dict(loaded.info))


def random_twin(enc: ProbeEncoder, seed: int = 0) -> ProbeEncoder:
    """The random-init baseline: same architecture and spec, weights drawn from `seed`."""
    module = random_init(enc.arch, seed)
    return ProbeEncoder(module, enc.spec, enc.arch, f"random-init ({enc.label})", f"random-twin:{enc.source}")
