"""The preprint's definitions against plain hand computations: the push-pull loss, what level 1 reads
from the frozen level 0, the push-pull perturbation of that input, and the 12-block nested encoder."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ecgpos.models import DecoderConfig, EncoderConfig, LatentEncoder, STMEMEncoder
from ecgpos.objectives import LatentMaskedAutoencoder, PushPullConfig, push_pull_loss
from ecgpos.objectives.criterion import window_violations

torch.set_num_threads(1)

SMALL = dict(width=32, heads=4)


def plain_push_pull(x: np.ndarray, x_tilde: np.ndarray, x_hat: np.ndarray, alpha: float) -> tuple[float, float]:
    """Eq. push-pull-loss with d the Euclidean distance over every value of a sample, batch mean."""
    dist = lambda a, b: math.sqrt(sum((p - q) ** 2 for p, q in zip(a.ravel(), b.ravel())))  # noqa: E731
    losses, active = [], 0
    for s, s_tilde, s_hat in zip(x, x_tilde, x_hat):
        delta = dist(s_tilde, s)
        hinge = alpha * delta - dist(s_hat, s_tilde)
        losses.append(dist(s_hat, s) + max(hinge, 0.0))
        active += hinge > 0
    return sum(losses) / len(losses), active / len(x)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0, 2.5])
def test_push_pull_loss_matches_plain_loops(alpha: float) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 2, 3, 4, generator=g)
    x_tilde = x + 0.8 * torch.randn(x.shape, generator=g)
    # Some reconstructions near x (hinge active), some far from x~ (hinge off).
    x_hat = x + torch.linspace(0.1, 3.0, 6)[:, None, None, None] * torch.randn(x.shape, generator=g)
    loss, active = push_pull_loss(x, x_tilde, x_hat, alpha)
    want_loss, want_active = plain_push_pull(x.numpy(), x_tilde.numpy(), x_hat.numpy(), alpha)
    assert loss.item() == pytest.approx(want_loss, rel=1e-5)
    assert active.item() == pytest.approx(want_active)
    if alpha == 2.5:
        assert 0 < want_active < 1  # the example exercises both sides of the hinge


def level1(push_pull: PushPullConfig | None = None, depth: int = 1) -> LatentMaskedAutoencoder:
    torch.manual_seed(1)
    level0 = STMEMEncoder(EncoderConfig(depth=depth, **SMALL))
    torch.manual_seed(2)
    encoder = LatentEncoder(EncoderConfig(depth=depth, **SMALL))
    return LatentMaskedAutoencoder(level0, encoder, DecoderConfig(width=32, depth=1, heads=4), push_pull=push_pull)


def level1_inputs(model: LatentMaskedAutoencoder) -> tuple[list[torch.Tensor], object]:
    """Every token tensor (B, L, N + 2, W) the level-1 encoder embeds, in call order."""
    seen: list[torch.Tensor] = []
    handle = model.encoder.token_embed.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    return seen, handle


def test_level1_reads_level0_unmasked_eval_tokens_without_gradient() -> None:
    model = level1(PushPullConfig(enabled=True, perturbation="gaussian", scale=0.3))
    model.train()
    assert not model.base.training and model.encoder.training
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # what level 0 gives on its own, unmasked
        want = model.base.forward_tokens(x).reshape(2, 12, 32, 32)
    seen, handle = level1_inputs(model)
    out = model(x, generator=torch.Generator().manual_seed(3))
    handle.remove()
    assert len(seen) == 2  # the masked reconstruction pass and the push-pull pass
    assert torch.equal(seen[0], want)  # every token of the frozen pass (no masking inside level 0)
    out["loss"].backward()
    assert all(p.grad is None for p in model.base.parameters())


@pytest.mark.parametrize("perturbation,scale", [("gaussian", 0.3), ("mask", 0.4)])
@pytest.mark.parametrize("where", ["training", "criterion"])
def test_push_pull_perturbs_only_what_delta_measures(perturbation: str, scale: float, where: str) -> None:
    """P's input must be x~ = x + e with delta = d(x~, x) = |e|: the SEP outputs, which P reads but does
    not reconstruct, stay clean, so delta measures all of the perturbation P sees."""
    model = level1(PushPullConfig(enabled=True, perturbation=perturbation, scale=scale))
    x = torch.randn(3, 12, 2250, generator=torch.Generator().manual_seed(1))
    clean = model.latent_tokens(x).reshape(3, 12, 32, 32)
    seen, handle = level1_inputs(model)
    g = torch.Generator().manual_seed(4)
    if where == "training":
        model(x, generator=g)
        tilde = seen[1]
    else:  # the carving criterion perturbs through the same map, each window from its own generator
        window_violations(model, x, [("r", k) for k in range(len(x))])
        tilde = seen[0]
    handle.remove()
    assert torch.equal(tilde[:, :, [0, -1]], clean[:, :, [0, -1]])  # SEP outputs unperturbed
    assert not torch.equal(tilde[:, :, 1:-1], clean[:, :, 1:-1])
    delta = (model.target(tilde.flatten(1, 2)) - model.target(clean.flatten(1, 2))).flatten(1).norm(dim=1)
    assert torch.allclose(delta, (tilde - clean).flatten(1).norm(dim=1))


def test_nested_features_are_level0_then_level1_by_hand() -> None:
    """The 12-block nested encoder (6 + 6) against the two levels written out step by step."""
    model = level1(depth=6)
    nested = model.nested_encoder().eval()
    assert len(nested.levels[0].blocks) + len(nested.levels[1].blocks) == 12
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(5))
    s0, s1 = model.base, model.encoder
    with torch.no_grad():
        # Level 0: per lead [SEP, 30 embedded patches, SEP], all 384 tokens through the blocks, final norm.
        patches = s0.patch_embed(x.reshape(2, 12, 30, 75)) + s0.pos_embed + s0.lead_embed[:, None]
        sep = (s0.sep_token + s0.lead_embed)[None, :, None].expand(2, 12, 1, 32)
        h = torch.cat([sep, patches, sep], dim=2).reshape(2, 384, 32)
        for block in s0.blocks:
            h = block(h)
        tokens = s0.norm(h).reshape(2, 12, 32, 32)
        # Level 1: token embedding; positions on the patch tokens, lead embedding on all; blocks.
        e = s1.token_embed(tokens) + s1.lead_embed[:, None]
        e = torch.cat([e[:, :, :1], e[:, :, 1:-1] + s1.pos_embed, e[:, :, -1:]], dim=2).reshape(2, 384, 32)
        for block in s1.blocks:
            e = block(e)
        # Features: mean over the 360 patch tokens (SEPs left out), then level 1's final norm.
        want = s1.norm(e.reshape(2, 12, 32, 32)[:, :, 1:-1].mean(dim=(1, 2)))
        got = nested.forward_features(x)
        assert torch.allclose(got, want, atol=1e-5)
        assert torch.allclose(nested(x), want, atol=1e-5)
        # and the composition level 1 was trained on: its input is exactly level 0's output tokens
        assert torch.equal(got, model.encoder.forward_features(model.latent_tokens(x)))
