"""What the defaults run on a GPU (bf16 autocast and a compiled step) also runs on the CPU, for level 0,
a latent level on it, and fine-tuning. The CPU takes bf16 and Inductor only when asked, so these ask."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_checks import losses, trainer  # noqa: E402

BF16_COMPILED = ["--set", "optim.steps=4", "--set", "train.mixed_precision=bf16", "--set", "train.compile=true"]


@pytest.mark.slow
def test_level_0_and_a_latent_level_train_compiled_in_bf16(tmp_path: Path) -> None:
    assert trainer(tmp_path, "level0", *BF16_COMPILED).run() == 0
    assert trainer(tmp_path, "level1", *BF16_COMPILED, level=1, base=tmp_path / "level0").run() == 0
    for name in ("level0", "level1"):
        info = json.loads((tmp_path / name / "run_info.json").read_text())
        assert info["finished"] and info["mixed_precision"] == "bf16" and info["compile"] not in ("eager", False), info
        curve = losses(tmp_path / name)
        assert len(curve) == 4 and all(math.isfinite(loss) for loss in curve), curve


@pytest.mark.slow
def test_finetuning_trains_compiled_in_bf16() -> None:
    from accelerate import Accelerator

    from ecgpos.models.factory import build_nested
    from ecgpos.probes.finetune.config import AugmentConfig, Mode, OptimConfig
    from ecgpos.probes.finetune.train import Split, train_classifier

    rng = np.random.default_rng(0)

    def split(n: int) -> Split:
        signals = np.empty(n, dtype=object)
        signals[:] = [rng.standard_normal((12, 2500)).astype(np.float32) for _ in range(n)]
        return Split(signals, np.stack([np.arange(n) % 2, (np.arange(n) // 2) % 2], axis=1), [str(i) for i in range(n)])

    acc = Accelerator(mixed_precision="bf16", cpu=True)
    encoder = build_nested([{"width": 64, "depth": 2, "heads": 4, "mlp_ratio": 2.0}] * 2)  # a latent level on level 0
    trained = train_classifier(
        encoder, 2, Mode("full"), {"train": split(32), "val": split(16), "test": split(16)},
        OptimConfig(epochs=2, warmup_epochs=1, batch_size=16), AugmentConfig(), 250.0, 2250, 1, 0, acc,
        eval_batch=16, compile="default",
    )  # fmt: skip
    assert acc.mixed_precision == "bf16" and trained.compiled not in ("eager", False, None), trained.compiled
    assert np.isfinite(trained.test_scores).all()
