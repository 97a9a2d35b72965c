"""Features of whole records: preprocess, cut windows, run the encoder, average over windows.

Used by probes (several windows per CPSC record) and by exported encoders' `embed`, so a
record gets the same features whichever path it takes. A record longer than 300 s is preprocessed
on its centre 300 s span (`ecgpos.ecg.signal.record_span`), and its windows spread over that span.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import numpy as np
import torch

from ecgpos.ecg.screening import DEFAULT_POLICY, ScreenPolicy, screen_record
from ecgpos.ecg.signal import preprocess_batch, window_starts
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError

K = TypeVar("K")
DEFAULT_NUM_WINDOWS = 1  # centre window; probes may ask for more on long records


def resolve_device(name: str | torch.device) -> torch.device:
    """The torch device of a `--device` value ('auto': cuda when available, else cpu).

    A name torch does not know, a device this machine lacks (cuda without a GPU, cuda:7 on two) or
    the data-less 'meta' device is one EcgposError line, before any model is moved there.
    """
    if isinstance(name, str) and name.strip() == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name.strip() if isinstance(name, str) else name)
    except (RuntimeError, TypeError) as err:
        raise EcgposError(f"device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1): {err}") from None
    if device.type == "meta":
        raise EcgposError("device 'meta' holds no data; use cpu or cuda")
    try:
        torch.empty(1, device=device)  # the one check that covers every backend: can it hold a tensor?
    except (RuntimeError, AssertionError, AttributeError) as err:  # AssertionError: torch built without CUDA
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise EcgposError(f"device {str(device)!r} is not available on this machine: {detail}") from None
    return device


def record_windows(x: np.ndarray, window: int, num_windows: int = DEFAULT_NUM_WINDOWS) -> np.ndarray:
    """Windows (n, leads, window) of a preprocessed record (leads, time), spread evenly.

    A record of length L yields min(num_windows, 1 + (L - window) // (window // 2)) windows,
    so short records are not embedded many times over; raises SignalError('too_short').
    """
    length = x.shape[-1]
    count = max(1, min(num_windows, 1 + max(0, length - window) // max(1, window // 2)))
    return np.stack([x[:, s : s + window] for s in window_starts(length, window, count)])


@torch.no_grad()
def window_features(
    module: torch.nn.Module, windows: np.ndarray, batch_size: int = 128, device: str | torch.device = "cpu"
) -> np.ndarray:
    """forward_features over (N, 12, window) float32 windows, in batches -> (N, D) float32."""
    out = []
    for start in range(0, len(windows), batch_size):
        batch = torch.from_numpy(np.ascontiguousarray(windows[start : start + batch_size], dtype=np.float32))
        out.append(module.forward_features(batch.to(device)).float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0), np.float32)


def record_means(
    records: Iterable[tuple[K, np.ndarray]], window_fn: Callable[[np.ndarray], dict[str, np.ndarray]], batch_size: int
) -> Iterator[tuple[K, dict[str, np.ndarray]]]:
    """Per record, the mean over its windows of each output of `window_fn`, in input order.

    records: (key, windows (n_i, leads, window)). The windows of consecutive records are handed to
    `window_fn` together, about `batch_size` at a time, so records of one window share forward
    passes; window_fn maps (N, leads, window) to named arrays whose first dimension is N.
    """
    pending: list[tuple[K, np.ndarray]] = []

    def flush() -> Iterator[tuple[K, dict[str, np.ndarray]]]:
        outputs = window_fn(np.concatenate([w for _, w in pending]))
        bounds = np.cumsum([0] + [len(w) for _, w in pending])
        for k, (key, _) in enumerate(pending):
            yield key, {name: values[bounds[k] : bounds[k + 1]].mean(axis=0) for name, values in outputs.items()}
        pending.clear()

    for key, windows in records:
        pending.append((key, windows))
        if sum(len(w) for _, w in pending) >= batch_size:
            yield from flush()
    if pending:
        yield from flush()


def embed_signal(
    module: torch.nn.Module,
    signal: np.ndarray,
    fs: float,
    leads: Sequence[str],
    spec: PreprocessSpec,
    num_windows: int = DEFAULT_NUM_WINDOWS,
    device: str | torch.device = "cpu",
    policy: ScreenPolicy = DEFAULT_POLICY,
) -> np.ndarray:
    """Raw (leads, time) mV record -> (D,) feature: mean of forward_features over its windows.

    The record goes through preprocessing's screening (`screen_record`, raising SignalError), so a
    record longer than 300 s is preprocessed on its centre span (`ecgpos.ecg.signal.record_span`)
    and its windows are spread over that span; shorter records are processed whole.
    """
    ok = screen_record(signal, fs, leads, spec, policy)
    x = preprocess_batch(ok.signal[None], ok.fs, spec, ok.dead[None])[0]
    return window_features(module, record_windows(x, spec.window, num_windows), device=device).mean(axis=0)
