"""Fine-tuning compiles as pretraining does (`compile`, default "auto"): a compiled tiny classifier
(full and LoRA) follows the eager one, leaves as a plain module, and a setting that cannot compile is
one line ("auto": trained eagerly and said so; an explicit mode: refused)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ecgpos.errors import EcgposError
from ecgpos.models.factory import build_nested
from ecgpos.probes.finetune.config import AugmentConfig, Mode, OptimConfig
from ecgpos.probes.finetune.train import Split, Trained, train_classifier

TINY = {"width": 32, "depth": 2, "heads": 2, "mlp_ratio": 2.0}
# fp32 on the CPU: Inductor reorders sums, so two epochs of logits agree to float rounding only
LOGIT_TOLERANCE = 1e-3


def split(n: int, rng: np.random.Generator) -> Split:
    signals = np.empty(n, dtype=object)
    signals[:] = [rng.standard_normal((12, 2500)).astype(np.float32) for _ in range(n)]
    labels = np.stack([np.arange(n) % 2, (np.arange(n) // 2) % 2], axis=1)
    return Split(signals, labels, [f"r{i}" for i in range(n)])


def finetune(mode: str, compile: bool | str) -> Trained:
    """Two epochs of a tiny level-0 classifier on 16 random records (batches of 8), drop path on."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    rng = np.random.default_rng(0)
    splits = {"train": split(16, rng), "val": split(8, rng), "test": split(8, rng)}
    torch.manual_seed(0)
    encoder = build_nested([TINY])
    optim = OptimConfig(epochs=2, warmup_epochs=1, batch_size=8)
    kind, _, k = mode.partition(":")
    try:
        return train_classifier(
            encoder, 2, Mode(kind, int(k or 0)), splits, optim, AugmentConfig(), 250.0, 2250, 1, 0,
            Accelerator(cpu=True), eval_batch=8, compile=compile,
        )  # fmt: skip
    finally:
        AcceleratorState._reset_state(True)


@pytest.mark.parametrize("mode", ["full", "lora:4"])
def test_a_compiled_finetune_follows_the_eager_one(mode: str) -> None:
    """Inductor draws its own random numbers (drop path) unless told to fall back to torch's: with
    fallback_random the compiled and eager runs see the same ones."""
    import torch._inductor.config as inductor

    eager = finetune(mode, False)
    with inductor.patch(fallback_random=True):
        compiled = finetune(mode, True)
    assert (eager.compiled, compiled.compiled) == ("eager", "default")
    np.testing.assert_allclose(compiled.test_scores, eager.test_scores, rtol=LOGIT_TOLERANCE, atol=LOGIT_TOLERANCE)
    assert not np.allclose(eager.test_scores, 0)  # the head trained: a comparison of two zero arrays proves nothing
    assert compiled.model._compiled_call_impl is None  # the kept classifier is a plain module


@pytest.fixture
def without_a_cxx_compiler():
    """Inductor's C++ back-end without a compiler: a real compile failure, as on a node without g++."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    with inductor.patch({"cpp.cxx": (None, "ecgpos-test-no-such-cxx")}):
        yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("without_a_cxx_compiler")
def test_a_finetune_that_cannot_compile_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    with pytest.raises(EcgposError, match=r"compile=True cannot compile the fine-tuning step \(.*InvalidCxxCompiler"):
        finetune("full", True)
    import ecgpos.probes.finetune.train as train

    # "auto" compiles on one GPU only; made to compile here, it falls back to the eager run
    monkeypatch.setattr(train, "resolve_compile", lambda mode, *args: True if mode == "auto" else mode)
    fallen = finetune("full", "auto")
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "compile=auto could not compile" in warnings[0] and fallen.compiled == "eager"
    np.testing.assert_array_equal(fallen.test_scores, finetune("full", False).test_scores)
