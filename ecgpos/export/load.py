"""Loading an export folder: safetensors weights checked against config.json, never unpickled.

`load_encoder(DIR)` rebuilds the architecture from config.json's `arch`, loads the weights strictly
and refuses anything that does not match (missing/extra keys, shapes, dtypes, the weights hash):
an export either loads exactly what was exported or fails with one line, never random weights.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from numbers import Integral
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ecgpos.ecg.screening import DEFAULT_POLICY, Screened, ScreenPolicy, as_samples, screen_record
from ecgpos.ecg.signal import MAX_WHOLE_SECONDS, record_span
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError, SignalError
from ecgpos.export.format import (
    CLASSIFIER_FORMAT,
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    WEIGHTS_FILE,
    config_sha256,
    hash_fields,
    is_export_dir,
    json_sha256,
    state_sha256,
)
from ecgpos.export.hub import resolve_model_path
from ecgpos.files import read_safetensors
from ecgpos.models.features import DEFAULT_NUM_WINDOWS, embed_signal, resolve_device
from ecgpos.models.nested import NestedEncoder, legacy_state
from ecgpos.runs.run_folder import is_run_dir


def export_folder(path: str | Path) -> Path:
    """`path` as a local folder Path: `~` expanded (Python does not expand it, unlike the shell), a
    `hf://ORG/NAME[@REVISION]` reference downloaded to the Hub cache (`ecgpos.export.hub`)."""
    return resolve_model_path(path)


def _run_hint(path: Path) -> str:
    """For a training run folder, one of its checkpoints or a checkpoint's weights: how to export it."""
    if not path.exists():
        return ""
    # up to three levels: RUN/checkpoints/step-N/model.safetensors
    run = next((p for p in (path, *list(path.parents)[:3]) if is_run_dir(p)), None)
    if run is None:
        return ""
    where = "a training run folder" if run == path else f"in the training run folder {run}"
    return f": it is {where}; export the run first with `ecgpos export --run-dir {run} --out DIR`"


def read_export_config(path: str | Path, formats: Sequence[str] = (FORMAT,)) -> dict[str, Any]:
    """config.json of an export folder of one of `formats`, validated; EcgposError (one line) for anything else."""
    folder = export_folder(path)
    if folder.is_file() and is_export_dir(folder.parent):  # model.safetensors, config.json, ...
        raise EcgposError(f"{folder} is a file of an export; pass its folder, {folder.parent}")
    if not folder.is_dir():
        raise EcgposError(f"{folder} is not a folder (expected an ecgpos export folder){_run_hint(folder)}")
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise EcgposError(f"{folder} is not an ecgpos export folder (no {CONFIG_FILE}){_run_hint(folder)}")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise EcgposError(f"{config_path} is not valid JSON: {err}") from None
    if isinstance(config, dict) and config.get("format") == CLASSIFIER_FORMAT and CLASSIFIER_FORMAT not in formats:
        raise EcgposError(
            f"{folder} is a classifier export: apply it with `ecgpos predict --model` or ecgpos.load_classifier"
        )
    if isinstance(config, dict) and config.get("format") == FORMAT and FORMAT not in formats:
        raise EcgposError(
            f"{folder} is an encoder export, not a classifier export (`ecgpos export --classifier`): "
            "its features come from `ecgpos embed --encoder`"
        )
    if not isinstance(config, dict) or config.get("format") not in formats:
        raise EcgposError(f"{folder} is not an ecgpos export folder ({CONFIG_FILE} has no format {formats[0]!r})")
    if config.get("version") != FORMAT_VERSION:
        raise EcgposError(
            f"{config_path}: export format version {config.get('version')!r} is not supported "
            f"(this ecgpos reads version {FORMAT_VERSION})"
        )
    missing = [key for key in ("arch", "preprocess", "weights_sha256") if key not in config]
    if missing:
        raise EcgposError(f"{config_path} lacks {', '.join(missing)}")
    # `training` and `io` are descriptive (not in config_sha256) but read as objects by the loader and card
    for key in ("arch", "preprocess", "training", "io"):
        if not isinstance(config.get(key, {}), dict):
            raise EcgposError(f"{config_path}: {key} must be a JSON object ({{...}}), got {config[key]!r:.60}")
    return config


def build_from_state(arch: dict[str, Any], state: Mapping[str, torch.Tensor], what: str) -> nn.Module:
    """Rebuild the encoder from `arch` and load `state` strictly; every mismatch is an EcgposError."""
    from ecgpos.models.factory import encoder_from_state

    try:
        module = encoder_from_state(arch, dict(state))
    except EcgposError as err:
        raise EcgposError(f"{what}: {err}") from None
    except (RuntimeError, KeyError, TypeError, ValueError) as err:
        # torch's strict-load message spans lines (missing/unexpected/size mismatch): keep it, on one line
        text = " ".join(str(err).split())
        raise EcgposError(
            f"{what} does not fit the architecture in {CONFIG_FILE}: {text[:400]}{'...' if len(text) > 400 else ''}"
        ) from None
    # The module must now hold exactly these tensors (the factory compared keys, shapes and dtypes).
    loaded = module.state_dict()
    state = legacy_state(state) if isinstance(module, NestedEncoder) else state  # two-level weight names
    for name, tensor in state.items():
        if not torch.equal(loaded[name].cpu(), tensor):
            raise EcgposError(f"{what}: tensor {name} was not loaded into the rebuilt encoder")
    return module


def check_raw_record(
    signal: np.ndarray,
    fs: float,
    leads: Sequence[str],
    spec: PreprocessSpec,
    policy: ScreenPolicy = DEFAULT_POLICY,
    total: int = -1,
    uncalibrated: Sequence[str] = (),
) -> Screened:
    """The record screening of preprocessing (`ecgpos.ecg.screening.screen_record`), before filtering.

    Every bad record gets its own reason (SignalError): lead names, rate, empty, NaN/inf, all-zero,
    flat, too many dead leads, shorter than one window. `total`, `uncalibrated`: as in `screen_record`.
    """
    return screen_record(signal, fs, leads, spec, policy, total, uncalibrated)


class ExportedEncoder(nn.Module):
    """A frozen, eval-mode encoder plus the preprocessing it was trained with and where it came from:
    the one loaded-encoder type, whether read from an export folder (`load_encoder`), a training run or
    a random init (ecgpos.inference.resolve).

    forward(x) = forward_features(x): (B, 12, window) float32 preprocessed windows -> (B, width);
    forward_tokens(x) -> (B, 12 * tokens_per_lead, width); embed(raw, fs, leads) -> (width,) numpy.
    `encoder` (also read as `module`) is the bare STMEMEncoder or NestedEncoder, without the input
    checks; `arch` its ecgpos.models.factory arch; `info` the training summary (an export's
    config.json `training`, a run's step and checkpoint, a random init's seed); `source` where it was read.
    """

    def __init__(
        self,
        encoder: nn.Module,
        spec: PreprocessSpec,
        arch: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        source: str = "",
        info: dict[str, Any] | None = None,
    ) -> None:
        from ecgpos.models.factory import encoder_arch

        super().__init__()
        self.encoder = encoder
        self.spec = spec
        self.arch = dict(arch) if arch is not None else encoder_arch(encoder)
        self.config = config if config is not None else {}
        self.source = source
        self.info = dict(info) if info is not None else dict(self.config.get("training", {}))
        self.width = int(encoder.width)
        self.requires_grad_(False)
        self.eval()

    @property
    def module(self) -> nn.Module:
        """The bare encoder (STMEMEncoder or NestedEncoder): `encoder`."""
        return self.encoder

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def cut(self, level: int | None) -> ExportedEncoder:
        """Levels 0..level (sharing the weights; None or the top level: itself), with the same
        preprocessing, input checks and source; `info` gains the level and the source's depth. A level
        the encoder does not have is an EcgposError (ecgpos.models.nested.cut_encoder)."""
        from ecgpos.models.factory import depth_of, encoder_arch
        from ecgpos.models.nested import cut_encoder

        encoder = cut_encoder(self.encoder, level)
        if encoder is self.encoder:
            return self
        info = {**self.info, "level": level, "levels_of_source": depth_of(self.encoder)}
        return ExportedEncoder(encoder, self.spec, encoder_arch(encoder), self.config, self.source, info)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 12, window) preprocessed float32 -> (B, width) pooled features."""
        return self.encoder.forward_features(self._check_input(x))

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 12, window) preprocessed float32 -> (B, 12 * tokens_per_lead, width) token features."""
        return self.encoder.forward_tokens(self._check_input(x))

    def _check_input(self, x: torch.Tensor) -> torch.Tensor:
        """One EcgposError line for an input the weights cannot take (torch's own errors name matmul
        internals); the shape is checked by the encoder itself."""
        weight = next(self.parameters())
        if not isinstance(x, torch.Tensor):
            raise EcgposError(
                f"expected a torch.Tensor (B, 12, {self.spec.window}), got {type(x).__name__}; "
                "use torch.from_numpy(x).float(), or embed() for raw records"
            )
        if x.dtype != weight.dtype or x.device != weight.device:
            raise EcgposError(
                f"expected a {str(weight.dtype).replace('torch.', '')} tensor on {weight.device}, got "
                f"{str(x.dtype).replace('torch.', '')} on {x.device}; convert with x.to({str(weight.device)!r}, "
                f"{weight.dtype})"
            )
        return x

    def embed(  # no torch.no_grad (window_features has it), so the warning below names the caller's line
        self, signal: np.ndarray, fs: float, leads: Sequence[str], num_windows: int = DEFAULT_NUM_WINDOWS
    ) -> np.ndarray:
        """Raw (leads, time) mV at any rate, any lead order/naming -> (width,) float32 features.

        Screens the record as preprocessing does (`check_raw_record`), applies the exported
        preprocessing (filter, standardise, resample, canonical lead order), cuts up to
        `num_windows` windows spread over the record (1 = the centre window) and averages their
        features. A record longer than 300 s at its own rate (a Holter recording) is screened,
        filtered and standardised on its centre 300 s span alone (`ecgpos.ecg.signal.record_span`)
        and its windows are spread over that span, so memory stays bounded; records up to 300 s are
        processed whole. Such a record warns (a UserWarning, which Python shows once per calling line
        unless the warnings filters say otherwise). Raises SignalError for records that cannot
        be preprocessed.
        """
        if isinstance(leads, str) or not isinstance(leads, Sequence):
            # one line: the repr of an array of names (a numpy array, a pandas Index) spans several
            shown = " ".join(repr(leads).split())
            raise EcgposError(
                f"leads must be a list of lead names, one per row of signal, got {type(leads).__name__} "
                f"{shown[:80]}{'...' if len(shown) > 80 else ''}; pass list(names)"
            )
        if isinstance(num_windows, bool) or not isinstance(num_windows, Integral) or num_windows < 1:
            raise EcgposError(f"num_windows must be an integer >= 1, got {num_windows!r}")
        signal = as_samples(signal)
        features = embed_signal(self, signal, fs, list(leads), self.spec, num_windows=num_windows, device=self.device)
        if not np.isfinite(features).all():  # never handed out as a result, as `ecgpos embed` skips it
            raise SignalError("non_finite", "the record's features are not finite")
        if record_span(signal.shape[-1], fs) != (0, signal.shape[-1]):  # screening passed: a (leads, time) array
            # one message for every record, so the default filter shows it once per calling line
            warnings.warn(
                f"a record longer than {MAX_WHOLE_SECONDS:g} s is embedded on its centre {MAX_WHOLE_SECONDS:g} s "
                "only (ecgpos.ecg.signal.record_span); to describe all of it, cut it into segments and embed each",
                UserWarning,
                stacklevel=2,
            )
        return features


_warned_unbound: set[str] = set()


def export_spec(folder: Path, config: Mapping[str, Any]) -> PreprocessSpec:
    """The preprocessing spec config.json states (one line when it is not a valid spec)."""
    try:
        return PreprocessSpec.from_dict(config["preprocess"])
    except (EcgposError, TypeError) as err:
        raise EcgposError(f"{folder / CONFIG_FILE}: invalid preprocess spec: {err}") from None


def checked_weights(folder: Path, config: Mapping[str, Any], what: str) -> dict[str, torch.Tensor]:
    """The folder's model.safetensors, refused in one line unless its sha256 is config.json's weights_sha256."""
    weights_path = folder / WEIGHTS_FILE
    state = read_safetensors(weights_path, what)
    digest = state_sha256(state)
    if digest != config["weights_sha256"]:
        raise EcgposError(
            f"{weights_path} does not match {CONFIG_FILE}: weights sha256 {digest[:12]}... != "
            f"{str(config['weights_sha256'])[:12]}... (file modified or from another export)"
        )
    return state


def check_config_binding(folder: Path, config: dict[str, Any]) -> None:
    """Refuse a config.json whose feature-affecting fields were edited after export (config_sha256).

    Exports written before config_sha256 existed still load: their architecture is then checked
    only against the weights' names and shapes (build_from_state), and a warning says so once.
    """
    if "config_sha256" in config:
        digest = config_sha256(config)
        if (
            digest != config["config_sha256"]
            and json_sha256({key: config.get(key) for key in hash_fields(config) if key != "windows"})
            == config["config_sha256"]
            and config.get("format") == CLASSIFIER_FORMAT
        ):
            raise EcgposError(
                f"{folder / CONFIG_FILE} was written before config_sha256 bound `windows`, which decides the "
                "outputs: re-export it (`ecgpos export --classifier`)"
            )
        if digest != config["config_sha256"]:
            fields = ", ".join(key for key in hash_fields(config) if key != "weights_sha256")
            raise EcgposError(
                f"{folder / CONFIG_FILE} was edited after export: one of the fields config_sha256 binds ({fields}) "
                f"no longer matches it ({digest[:12]}... != "
                f"{str(config['config_sha256'])[:12]}...); re-export the run instead"
            )
        return
    key = str(folder.resolve())
    if key not in _warned_unbound:
        _warned_unbound.add(key)
        print(
            f"ecgpos: warning: {folder / CONFIG_FILE} has no config_sha256 (an older export): its architecture "
            "is checked against the weights' shapes only, its preprocess and pooling cannot be checked; "
            "re-export to bind them",
            file=sys.stderr,
        )


def load_encoder(path: str | Path, device: str | torch.device = "cpu") -> ExportedEncoder:
    """Load an export folder (model.safetensors + config.json) as an eval-mode ExportedEncoder.

    Raises EcgposError with one line when the folder is not an export, the weights hash differs
    from config.json, or the weights do not fit the architecture.
    """
    folder = export_folder(path)
    device = resolve_device(device)
    config = read_export_config(folder)
    spec = export_spec(folder, config)
    weights_path = folder / WEIGHTS_FILE
    state = checked_weights(folder, config, "weights in the export folder")
    encoder = build_from_state(config["arch"], state, str(weights_path))  # names the structural mismatch first
    check_config_binding(folder, config)
    exported = ExportedEncoder(encoder.float(), spec, config["arch"], config, source=str(folder.resolve()))
    return exported.to(device)
