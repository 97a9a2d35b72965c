"""Models: ST-MEM encoder + MAE (level 0), latent MAE + nested encoder (level 1), push-pull, factory."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ecgpos.errors import ConfigError, EcgposError
from ecgpos.models import (
    DecoderConfig,
    EncoderConfig,
    LatentEncoder,
    STMEMEncoder,
    build_nested,
    encoder_arch,
    encoder_from_state,
    num_kept,
    patchify,
    random_masking,
    unpatchify,
)
from ecgpos.models.masking import gather_tokens, unshuffle_with_mask_tokens
from ecgpos.objectives import LatentMaskedAutoencoder, MaskedECGAutoencoder, PushPullConfig, perturb, push_pull_loss
from ecgpos.pretrain.optim import param_groups

torch.set_num_threads(1)

SMALL = dict(width=32, depth=1, heads=4)
SMALL_DEC = DecoderConfig(width=32, depth=1, heads=4)


def smooth_batch(batch: int = 2, seed: int = 0) -> torch.Tensor:
    """(B, 12, 2250) sums of three sinusoids per lead: predictable from context, unlike white noise."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(2250) / 250.0
    harmonics = torch.tensor([1.0, 3.0, 7.0])[None, None, :, None]
    freq = 0.8 + 1.5 * torch.rand(batch, 12, 3, 1, generator=g)
    phase = 2 * math.pi * torch.rand(batch, 12, 3, 1, generator=g)
    amp = torch.rand(batch, 12, 3, 1, generator=g)
    return (amp * torch.sin(2 * math.pi * freq * harmonics * t + phase)).sum(2)


def small_encoder(seed: int = 0, **kw) -> STMEMEncoder:
    torch.manual_seed(seed)
    return STMEMEncoder(EncoderConfig(**{**SMALL, **kw}))


# -- level 0 -----------------------------------------------------------------------------------


def test_patchify_round_trip():
    x = torch.randn(2, 12, 2250)
    p = patchify(x, 75)
    assert p.shape == (2, 12, 30, 75)
    assert torch.equal(p[1, 4, 7], x[1, 4, 7 * 75 : 8 * 75])
    assert torch.equal(unpatchify(p), x)


def test_mask_counts_per_lead_and_generator():
    assert num_kept(30, 0.75) == 7 and num_kept(30, 0.5) == 15
    ids_keep, mask, ids_restore = random_masking(4, 12, 30, 0.75, generator=torch.Generator().manual_seed(1))
    assert mask.dtype == torch.bool and mask.shape == (4, 12, 30)
    assert (mask.sum(-1) == 23).all()  # every lead on its own
    assert not torch.gather(mask, -1, ids_keep).any()  # kept ids are the unmasked ones
    assert not all(torch.equal(mask[0, 0], mask[0, lead]) for lead in range(1, 12))  # independent leads
    again = random_masking(4, 12, 30, 0.75, generator=torch.Generator().manual_seed(1))[1]
    assert torch.equal(mask, again)
    assert torch.equal(torch.argsort(ids_restore, -1)[..., :7], ids_keep)


def test_sep_tokens_never_masked():
    enc = small_encoder()
    x = torch.randn(3, 12, 2250)
    tokens, mask, _ = enc.embed_masked(x, 0.75, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, 12, 7 + 2, 32)
    sep = (enc.sep_token + enc.lead_embed)[None].expand(3, -1, -1)
    assert torch.allclose(tokens[:, :, 0], sep) and torch.allclose(tokens[:, :, -1], sep)
    patches, _ = enc.embed(x)
    visible = patches[~mask].reshape(3, 12, 7, 32)  # time order, per lead
    kept_sorted = torch.sort(tokens[:, :, 1:-1], dim=2).values
    assert torch.allclose(kept_sorted, torch.sort(visible, dim=2).values)


def test_config_validation():
    with pytest.raises(ConfigError, match="multiple"):
        EncoderConfig(seq_len=2251)
    with pytest.raises(ConfigError, match="divisible"):
        EncoderConfig(width=30, heads=4)
    with pytest.raises(ConfigError):
        DecoderConfig(width=30, heads=4)
    for ratio in (0.0, 1.0, 0.99):
        with pytest.raises(ConfigError, match="mask_ratio"):
            MaskedECGAutoencoder(small_encoder(), SMALL_DEC, mask_ratio=ratio)
    with pytest.raises(ConfigError, match="perturbation"):
        PushPullConfig(perturbation="blur")
    with pytest.raises(EcgposError, match="expected ECG input"):
        small_encoder().forward_features(torch.randn(2, 12, 1500))


def test_encoder_shapes_and_eval_determinism():
    enc = small_encoder().eval()
    x = torch.randn(3, 12, 2250)
    assert enc.num_patches == 30 and enc.tokens_per_lead == 32
    assert enc.forward_tokens(x).shape == (3, 384, 32)
    feats = enc.forward_features(x)
    assert feats.shape == (3, 32)
    assert torch.equal(feats, enc.forward_features(x))
    # No leakage across the batch: a sample's features do not depend on its neighbours.
    assert torch.allclose(enc.forward_features(x[1:2])[0], feats[1], atol=1e-5)
    assert not torch.allclose(feats[0], feats[1])


def test_mae_loss_counts_masked_patches_only():
    torch.manual_seed(0)
    model = MaskedECGAutoencoder(small_encoder(), SMALL_DEC)
    x = torch.randn(2, 12, 2250)
    out = model(x, generator=torch.Generator().manual_seed(0))
    assert out["pred"].shape == out["target"].shape == (2, 12, 30, 75)
    assert out["mask"].shape == (2, 12, 30) and (out["mask"].sum(-1) == 23).all()
    target = out["target"]
    assert torch.allclose(target.mean(-1), torch.zeros(()), atol=1e-5)
    assert torch.allclose(target.var(-1, unbiased=False), torch.ones(()), atol=1e-3)
    wrong_where_visible = torch.where(out["mask"][..., None], target, target + 5.0)
    loss, _ = model.forward_loss(x, wrong_where_visible, out["mask"])
    assert loss.item() < 1e-10
    loss, _ = model.forward_loss(x, torch.where(out["mask"][..., None], target + 1.0, target), out["mask"])
    assert loss.item() == pytest.approx(1.0, rel=1e-5)
    assert torch.allclose(model.in_patch_units(x, target), patchify(x, 75), atol=1e-4)
    raw = MaskedECGAutoencoder(model.encoder, SMALL_DEC, norm_target=False)
    assert torch.equal(raw.target(x), patchify(x, 75))


def test_tiny_mae_overfits_fixed_batch():
    torch.manual_seed(0)
    model = MaskedECGAutoencoder(
        STMEMEncoder(EncoderConfig(width=64, depth=2, heads=4)), DecoderConfig(width=64, depth=1, heads=4)
    )
    x = smooth_batch()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(200):
        out = model(x, generator=torch.Generator().manual_seed(0))  # fixed batch, fixed mask
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    # 1.0 is what predicting the mean of the normalised targets gives; memorising goes well below.
    assert losses[-1] < 0.5 and losses[-1] < 0.3 * losses[0], losses[::20]


def test_unshuffle_puts_kept_and_mask_tokens_at_their_time_positions():
    """gather(kept) -> unshuffle is the identity on visible patches and puts the mask token exactly
    on the masked ones, per sample and per lead (the decoder relies on this for its positions)."""
    x = torch.randn(3, 12, 30, 8)
    ids_keep, mask, ids_restore = random_masking(3, 12, 30, 0.75, generator=torch.Generator().manual_seed(3))
    assert not torch.equal(mask[0], mask[1])  # masks differ across the batch
    full = unshuffle_with_mask_tokens(gather_tokens(x, ids_keep), torch.full((8,), -99.0), ids_restore)
    assert torch.equal(full[~mask], x[~mask])
    assert (full[mask] == -99.0).all()


def test_mae_learns_predictable_signal_with_random_masks():
    """A fresh random mask every step on a perfectly predictable signal: lead k = sin(2 pi 0.3 n + phi
    + k pi / 6) at patch time n, with a random global phase phi per sample, so every masked patch
    follows from any visible patch, its time offset and the lead. A correct MAE leaves the trivial
    normalised-target loss (1.0 = predicting each patch's mean) far behind within a few hundred steps
    (~0.26 here); wrong decoder positions do not: unshuffling with ids_shuffle instead of ids_restore
    ends near 0.43, a decoder without its position embedding near 0.95."""
    leads, patch, n = 4, 40, 10
    torch.manual_seed(0)
    model = MaskedECGAutoencoder(
        STMEMEncoder(
            EncoderConfig(
                num_leads=leads, seq_len=n * patch, patch_size=patch, width=32, depth=1, heads=2, mlp_ratio=2.0
            )
        ),
        DecoderConfig(width=32, depth=1, heads=2, mlp_ratio=2.0),
        mask_ratio=0.7,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    g = torch.Generator().manual_seed(0)
    t = torch.arange(n * patch) / patch  # time in patches
    lead_phase = torch.arange(leads).view(1, leads, 1) * math.pi / 6
    losses = []
    for _ in range(500):
        phase = 2 * math.pi * torch.rand(16, 1, 1, generator=g)
        x = torch.sin(2 * math.pi * 0.3 * t + phase + lead_phase)
        out = model(x, generator=g)  # new masks every step
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["loss"].item())
    late = sum(losses[-50:]) / 50
    assert late < 0.35, [round(sum(losses[i : i + 50]) / 50, 3) for i in range(0, 500, 50)]


# -- level 1 -----------------------------------------------------------------------------------


def small_level1(push_pull: PushPullConfig | None = None, norm_target: bool = False) -> LatentMaskedAutoencoder:
    level0 = small_encoder(seed=1)
    torch.manual_seed(2)
    return LatentMaskedAutoencoder(
        level0,
        LatentEncoder(EncoderConfig(**SMALL)),
        SMALL_DEC,
        mask_ratio=0.75,
        norm_target=norm_target,
        push_pull=push_pull,
    )


def test_level0_frozen_during_level1_training():
    model = small_level1(PushPullConfig(enabled=True))
    before = {k: v.clone() for k, v in model.base.state_dict().items()}
    # Deliberately hand *all* parameters to AdamW (with weight decay): frozen ones must still not move.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    model.train()
    assert not model.base.training and model.encoder.training
    x = smooth_batch()
    level1_before = model.encoder.blocks[0].attn.qkv.weight.clone()
    for step in range(3):
        out = model(x, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        out["loss"].backward()
        assert all(p.grad is None for p in model.base.parameters())
        opt.step()
    after = model.base.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not torch.equal(level1_before, model.encoder.blocks[0].attn.qkv.weight)
    assert not any(p.requires_grad for p in model.base.parameters())
    trained = {id(p) for group in param_groups(model, 0.05) for p in group["params"]}  # what the trainer optimises
    assert trained and trained.isdisjoint(id(p) for p in model.base.parameters())
    # Even if someone re-enables gradients on level 0, its forward keeps no graph (torch.no_grad).
    model.base.requires_grad_(True)
    assert model.latent_tokens(x).grad_fn is None


def check_frozen_level0_precision(device: str) -> None:
    """Outside autocast the level-0 tokens are level 0's fp32 forward exactly (an fp32 run trains on
    fp32 tokens, as probes and exports compute them); inside the caller's bf16 autocast they follow it.
    On a GPU this runs in tests/cuda_checks.py (the suite hides CUDA)."""
    model = small_level1().to(device)
    x = smooth_batch().to(device)
    with torch.no_grad():
        fp32 = model.base.forward_tokens(x)
    assert torch.equal(model.latent_tokens(x), fp32)
    with torch.autocast(device, dtype=torch.bfloat16):
        bf16 = model.latent_tokens(x)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16, fp32)


def test_frozen_level0_pass_runs_in_the_callers_precision():
    check_frozen_level0_precision("cpu")


def test_latent_recon_loss_falls():
    model = small_level1(norm_target=True)
    x = smooth_batch()
    out = model(x, generator=torch.Generator().manual_seed(0))
    assert out["pred"].shape == out["target"].shape == (2, 12, 30, 32)
    assert (out["mask"].sum(-1) == 23).all()
    opt = torch.optim.AdamW(param_groups(model, 0.0), lr=1e-3)
    losses = []
    for _ in range(60):
        out = model(x, generator=torch.Generator().manual_seed(0))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(out["log"]["recon_loss"].item())
    assert losses[-1] < 0.6 * losses[0], losses[::10]


def test_level1_push_pull_terms_enter_the_loss():
    pp = PushPullConfig(enabled=True, alpha=1.0, lambda_pp=0.3, lambda_sp=0.2, perturbation="mask", scale=0.25)
    out = small_level1(pp)(smooth_batch(), generator=torch.Generator().manual_seed(0))
    log = out["log"]
    assert 0.0 <= log["push_active"].item() <= 1.0
    expected = log["recon_loss"] + 0.3 * log["pp_loss"] + 0.2 * log["sp_loss"]
    assert torch.allclose(out["loss"], expected)
    plain = small_level1()(smooth_batch())
    assert set(plain) == {"loss", "log", "pred", "target", "mask"} and set(plain["log"]) == {"recon_loss"}


def test_level1_width_mismatch():
    with pytest.raises(ConfigError, match="width"):
        LatentMaskedAutoencoder(small_encoder(), LatentEncoder(EncoderConfig(width=64, depth=1, heads=4)), SMALL_DEC)


def test_nested_encoder_features_shape_and_determinism():
    nested = small_level1().nested_encoder().eval()
    x = torch.randn(2, 12, 2250)
    feats = nested.forward_features(x)
    assert feats.shape == (2, nested.width) == (2, 32)
    assert nested.forward_tokens(x).shape == (2, 384, 32)
    assert torch.equal(feats, nested.forward_features(x))
    # The level-1 encoder really is applied on top of level 0.
    assert not torch.allclose(feats, nested.levels[0].forward_features(x))


# -- push-pull ---------------------------------------------------------------------------------


def test_push_pull_alpha_zero_is_pull():
    g = torch.Generator().manual_seed(0)
    x, x_tilde, x_hat = (torch.randn(5, 3, 4, generator=g) for _ in range(3))
    loss, active = push_pull_loss(x, x_tilde, x_hat, alpha=0.0)
    pull = (x_hat - x).flatten(1).norm(dim=1).mean()
    assert torch.allclose(loss, pull) and active.item() == 0.0


def test_push_pull_hinge_zero_when_far_enough():
    x = torch.zeros(2, 6)
    e = torch.tensor([[3.0, 4.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 0]])
    x_tilde = x + e
    x_hat = x - e  # d(x^, x~) = 2 |e| >= alpha * delta for alpha <= 2
    for alpha in (1.0, 2.0):
        loss, active = push_pull_loss(x, x_tilde, x_hat, alpha)
        assert torch.allclose(loss, torch.tensor(3.0)) and active.item() == 0.0  # pull only: (5 + 1) / 2
    loss, active = push_pull_loss(x, x_tilde, x_tilde.clone(), 1.0)  # x^ = x~: hinge = delta
    assert torch.allclose(loss, torch.tensor(6.0)) and active.item() == 1.0  # (5 + 5 + 1 + 1) / 2


def _step(x_hat0: torch.Tensor, alpha: float, lr: float = 0.01) -> torch.Tensor:
    x, x_tilde = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]])
    x_hat = x_hat0.clone().requires_grad_(True)
    loss, _ = push_pull_loss(x, x_tilde, x_hat, alpha)
    loss.backward()
    return (x_hat - lr * x_hat.grad).detach()


def test_push_pull_gradient_moves_reconstruction_away_from_perturbation():
    x, x_tilde = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]])
    x_hat = torch.tensor([[1.05, 0.05]])  # just past x~: pulling toward x alone passes x~
    assert push_pull_loss(x, x_tilde, x_hat, 1.0)[1].item() == 1.0
    dist = lambda a, b: (a - b).norm().item()  # noqa: E731
    pushed = _step(x_hat, alpha=1.0)
    assert dist(pushed, x_tilde) > dist(x_hat, x_tilde)  # the hinge pushes x^ off x~
    assert dist(pushed, x) < dist(x_hat, x)  # while still pulling toward x
    pulled_only = _step(x_hat, alpha=0.0)
    assert dist(pulled_only, x_tilde) < dist(x_hat, x_tilde)  # without push it drifts onto x~


def test_perturb_gaussian_and_mask():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 50, 2, generator=g) * torch.tensor([1.0, 10.0])
    noisy = perturb(x, "gaussian", 0.1, torch.Generator().manual_seed(1))
    ratio = (noisy - x).flatten(0, 1).std(0) / x.flatten(0, 1).std(0)
    assert torch.allclose(ratio, torch.full((2,), 0.1), rtol=0.15)  # per-dimension scaling
    assert torch.equal(noisy, perturb(x, "gaussian", 0.1, torch.Generator().manual_seed(1)))
    masked = perturb(x, "mask", 0.3, torch.Generator().manual_seed(2))
    zeroed = (masked == 0).all(-1)
    assert 0.2 < zeroed.float().mean().item() < 0.4
    assert torch.equal(masked[~zeroed], x[~zeroed])
    with pytest.raises(ConfigError):
        perturb(x, "blur", 0.1)


# -- factory -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["level0", "nested"])
def test_factory_round_trip(kind: str):
    torch.manual_seed(3)
    module = small_encoder() if kind == "level0" else build_nested([EncoderConfig(**SMALL), EncoderConfig(**SMALL)])
    module.eval()
    arch = json.loads(json.dumps(encoder_arch(module)))
    assert arch["kind"] == kind
    loaded = encoder_from_state(arch, {k: v.clone() for k, v in module.state_dict().items()})
    assert type(loaded) is type(module) and not loaded.training
    x = torch.randn(2, 12, 2250)
    assert torch.equal(loaded.forward_features(x), module.forward_features(x))
    assert encoder_arch(loaded) == arch


def test_factory_rejects_mismatched_state():
    module = small_encoder()
    arch, state = encoder_arch(module), module.state_dict()
    with pytest.raises(EcgposError, match="missing"):
        encoder_from_state(arch, {k: v for k, v in state.items() if k != "sep_token"})
    with pytest.raises(EcgposError, match="unexpected"):
        encoder_from_state(arch, {**state, "extra.weight": torch.zeros(1)})
    wider = {"kind": "level0", "encoder": {**arch["encoder"], "width": 64}}
    with pytest.raises(EcgposError, match="shape mismatch"):
        encoder_from_state(wider, state)
    with pytest.raises(EcgposError, match="kind"):
        encoder_from_state({"kind": "level9"}, state)
    with pytest.raises(ConfigError, match=r"unknown config key\(s\): encoder\.depht"):
        encoder_from_state({"kind": "level0", "encoder": {**arch["encoder"], "depht": 2}}, state)
