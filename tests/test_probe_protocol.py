"""The linear-probe protocol on features: AUROC, label fractions, lr schedule, selection, seeds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import train_test_split

from ecgpos.probes.linear.train import (
    ProtocolConfig,
    epoch_permutations,
    lr_at_epoch,
    reference_run,
    train_probe,
    train_probe_groups,
)
from ecgpos.probes.shared.metrics import auroc_columns, macro_auroc_sklearn
from ecgpos.probes.shared.task_data import TaskData, fraction_rows, label_fraction_rows
from ecgpos.probes.shared.tasks import TASKS


def _data(seed: int, n: int = 48, dim: int = 12, classes: int = 3, n_val: int = 40):
    """Labels driven by two features plus noise; few rows and many features, so probes overfit."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(dim, classes)) * (np.arange(dim) < 2)[:, None]

    def make(m):
        x = rng.normal(size=(m, dim)).astype(np.float32)
        return x, ((x @ w + rng.normal(size=(m, classes))) > 0.3).astype(np.float32)

    return (*make(n), *make(n_val), *make(n_val))


@pytest.mark.parametrize("tied", [False, True])
def test_auroc_columns_equals_sklearn_with_ties_and_degenerate_columns(tied):
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(300, 6)).astype(np.float32)
    if tied:
        scores = np.round(scores, 1)  # many ties: the tie-averaged ranks path
    else:
        assert len(np.unique(scores)) == scores.size  # the plain-sort path
    labels = (rng.random((300, 6)) < [0.5, 0.1, 0.02, 0.9, 0.3, 0.0]).astype(int)
    labels[:, 3] = 1 - labels[:, 2]
    fast = auroc_columns(scores, labels)
    for c in range(6):
        if 0 < labels[:, c].sum() < len(labels):
            assert fast[c] == pytest.approx(roc_auc_score(labels[:, c], scores[:, c]), abs=1e-12)
        else:
            assert np.isnan(fast[c])
    assert np.isnan(fast[5])  # no positive: left out, not 0.5


def test_macro_auroc_leaves_out_unscorable_classes():
    labels = np.array([[1, 0, 1], [0, 0, 1], [1, 0, 1], [0, 0, 1]])
    scores = np.array([[0.9, 0.1, 0.3], [0.2, 0.5, 0.1], [0.4, 0.2, 0.8], [0.5, 0.3, 0.2]])
    macro, per_class = macro_auroc_sklearn(labels, scores, ["a", "b", "c"])
    assert list(per_class) == ["a"]
    assert macro == pytest.approx(roc_auc_score(labels[:, 0], scores[:, 0]))


@pytest.mark.parametrize("n,fraction", [(17084, 0.01), (17084, 0.1), (4950, 0.01), (7197, 0.1)])
def test_label_fraction_rows_equal_sklearn_split(n, fraction):
    expected, _ = train_test_split(np.arange(n), train_size=fraction, random_state=42)
    got = label_fraction_rows(n, fraction)
    assert np.array_equal(got, expected)
    assert len(got) == int(np.floor(n * fraction)) or len(got) == int(np.ceil(n * fraction))
    assert np.array_equal(label_fraction_rows(n, 1.0), np.arange(n))


def test_fraction_subset_of_partially_present_train_split_keeps_merl_rows():
    n_full = 500
    present = np.setdiff1d(np.arange(n_full), np.arange(0, n_full, 3))  # every third record missing
    task = TASKS["ptbxl-super"]
    data = TaskData(task, {"train": np.arange(len(present), dtype=np.float32)[:, None]}, {}, present, n_full, {}, {})
    rows = fraction_rows(data, 0.1)
    expected, _ = train_test_split(np.arange(n_full), train_size=0.1, random_state=42)
    assert list(present[rows]) == [p for p in expected if p % 3 != 0]


def test_lr_is_multiplied_by_0_1_from_epoch_40_per_epoch():
    cfg = ProtocolConfig()
    assert [lr_at_epoch(cfg, e) for e in (0, 39, 40, 99)] == pytest.approx([1e-3, 1e-3, 1e-4, 1e-4])


def test_batched_seeds_equal_plain_pytorch_loop_across_the_lr_drop():
    x, y, xv, yv, xt, yt = _data(0)
    cfg = ProtocolConfig(epochs=43)
    out = train_probe(x, y, xv, yv, xt, yt, [0, 1], ["a", "b", "c"], cfg)
    assert out.lrs[39] == pytest.approx(1e-3) and out.lrs[40] == pytest.approx(1e-4)
    for i, seed in enumerate([0, 1]):
        layer, curve, lrs = reference_run(x, y, xv, yv, seed, cfg)
        assert lrs == pytest.approx(out.lrs)
        got_w, got_b = out.last_params[i, :-1].T, out.last_params[i, -1]
        torch.testing.assert_close(got_w, layer.weight.detach(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got_b, layer.bias.detach(), rtol=1e-4, atol=1e-5)
        assert np.allclose(out.seeds[i].val_curve, curve, atol=1e-9)
    # the comparison is sensitive to the schedule: dropping one epoch later gives other weights
    late, _, _ = reference_run(x, y, xv, yv, 0, dataclasses.replace(cfg, lr_drop_epochs=(41,)))
    assert not torch.allclose(late.weight, out.last_params[0, :-1].T, rtol=1e-4, atol=1e-5)


def test_best_validation_epoch_is_selected_and_its_test_auroc_reported():
    x, y, xv, yv, xt, yt = _data(0, n=24, dim=80)
    cfg = ProtocolConfig(epochs=60, lr=1e-2, lr_drop_epochs=(40,))
    out = train_probe(x, y, xv, yv, xt, yt, [5], ["a", "b", "c"], cfg)
    _, curve, _ = reference_run(x, y, xv, yv, 5, cfg)
    best = int(np.argmax(curve))  # first epoch with the highest validation macro-AUROC
    assert 0 < best < cfg.epochs - 1, "hand-made data should peak in the middle of training"
    assert max(curve) > curve[-1]
    assert out.seeds[0].best_epoch == best
    assert out.seeds[0].val_auroc == pytest.approx(curve[best])
    # the test number is the selected epoch's model, scored with sklearn
    layer, _, _ = reference_run(
        x, y, xv, yv, 5, dataclasses.replace(cfg, epochs=best + 1), permutations=epoch_permutations(5, len(x), best + 1)
    )
    with torch.no_grad():
        scores = layer(torch.as_tensor(xt)).double().numpy()
    expected = np.mean([roc_auc_score(yt[:, c], scores[:, c]) for c in range(3)])
    assert out.seeds[0].test_auroc == pytest.approx(expected, abs=1e-6)
    last_scores = xt @ out.last_params[0, :-1].numpy() + out.last_params[0, -1].numpy()
    last = np.mean([roc_auc_score(yt[:, c], last_scores[:, c]) for c in range(3)])
    assert out.seeds[0].test_auroc != pytest.approx(last, abs=1e-9)


def test_seeds_are_reproducible_and_independent_of_their_batch_mates():
    x, y, xv, yv, xt, yt = _data(2)
    cfg = ProtocolConfig(epochs=5)
    a = train_probe(x, y, xv, yv, xt, yt, [3, 4], ["a", "b", "c"], cfg)
    b = train_probe(x, y, xv, yv, xt, yt, [3, 4], ["a", "b", "c"], cfg)
    alone = train_probe(x, y, xv, yv, xt, yt, [4], ["a", "b", "c"], cfg)
    assert torch.equal(a.last_params, b.last_params)
    assert [s.test_auroc for s in a.seeds] == [s.test_auroc for s in b.seeds]
    torch.testing.assert_close(alone.last_params[0], a.last_params[1], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(a.last_params[0], a.last_params[1])  # own init, own shuffling


def test_classes_without_positives_are_left_out_and_named():
    x, y, xv, yv, xt, yt = _data(3)
    yv[:, 1] = 0
    yt[:, 2] = 1
    out = train_probe(x, y, xv, yv, xt, yt, [0], ["a", "b", "c"], ProtocolConfig(epochs=2))
    assert out.excluded_val == ["b"] and out.excluded_test == ["c"]
    assert set(out.seeds[0].test_per_class) == {"a", "b"}


def test_tasks_sharing_rows_trained_as_one_layer_equal_separate_runs():
    x, y, xv, yv, xt, yt = _data(4, classes=5)
    cfg = ProtocolConfig(epochs=8, lr_drop_epochs=(4,))
    first, second = train_probe_groups(x, y, xv, yv, xt, yt, [0, 1], [["a", "b"], ["c", "d", "e"]], cfg)
    for merged, cols, names in ((first, slice(0, 2), ["a", "b"]), (second, slice(2, 5), ["c", "d", "e"])):
        alone = train_probe(x, y[:, cols], xv, yv[:, cols], xt, yt[:, cols], [0, 1], names, cfg)
        torch.testing.assert_close(merged.last_params, alone.last_params, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(merged.best_params, alone.best_params, rtol=1e-4, atol=1e-6)
        assert [s.best_epoch for s in merged.seeds] == [s.best_epoch for s in alone.seeds]
        assert [s.test_auroc for s in merged.seeds] == pytest.approx([s.test_auroc for s in alone.seeds], abs=1e-6)
