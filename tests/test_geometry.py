"""The appendix's metrics on constructed point clouds with known answers, against a plain reading."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest

from ecgpos.probes.geometry.dynamics import EPS, METRICS, geometry, plot_geometry


def reference(
    x: np.ndarray, x_hat: np.ndarray, labels: list[str], nominal: list[str], anomalous: list[str]
) -> dict[str, tuple[float, float, float]]:
    """The appendix's formulas, written out with plain loops, for comparison."""
    dims = x.shape[1]
    nominal_rows = [i for i, lab in enumerate(labels) if lab in nominal]
    mean = [sum(x[i, j] for i in nominal_rows) / len(nominal_rows) for j in range(dims)]
    std = [
        math.sqrt(sum((x[i, j] - mean[j]) ** 2 for i in nominal_rows) / len(nominal_rows)) + EPS for j in range(dims)
    ]

    def metrics(space: np.ndarray) -> dict[str, float]:
        z = [[(space[i, j] - mean[j]) / std[j] for j in range(dims)] for i in range(len(labels))]
        dist = lambda a, b: math.sqrt(sum((p - q) ** 2 for p, q in zip(a, b)))  # noqa: E731
        mu, radius = {}, {}
        for c in nominal:
            members = [z[i] for i, lab in enumerate(labels) if lab == c]
            mu[c] = [sum(m[j] for m in members) / len(members) for j in range(dims)]
            radius[c] = sum(dist(m, mu[c]) for m in members) / len(members)
        pairs = list(itertools.combinations(nominal, 2))
        d_inter = sum(dist(mu[a], mu[b]) for a, b in pairs) / len(pairs)
        r_mean = sum(radius.values()) / len(nominal)
        d, ratio, by_class = [], [], {b: [] for b in anomalous}
        for i, lab in enumerate(labels):
            if lab not in anomalous:
                continue
            best = min(nominal, key=lambda c: dist(z[i], mu[c]))
            d.append(dist(z[i], mu[best]))
            ratio.append(d[-1] / (radius[best] + EPS))
            by_class[lab].append(d[-1])
        pool = [float(np.median(v)) for v in by_class.values() if v]
        return {
            "D_inter": d_inter,
            "R": r_mean,
            "S": d_inter / (r_mean + EPS),
            "rho": float(np.median(ratio)),
            "d_samp": float(np.median(d)),
            "d_pool": float(np.median(pool)),
            "IC": float(np.median([v / (d_inter + EPS) for v in d])),
        }

    mx, mh = metrics(x), metrics(x_hat)
    return {m: (mx[m], mh[m], 100 * (mh[m] - mx[m]) / (mx[m] + EPS)) for m in METRICS}


def clouds(seed: int = 0, dims: int = 5, per_class: int = 30) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Three nominal clusters (A, B, C) with anisotropic spread and offsets, two anomaly classes."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 6, size=(3, dims))
    scale = rng.uniform(0.5, 3.0, size=dims)
    rows, labels = [], []
    for c, name in enumerate("ABC"):
        rows.append(centres[c] + rng.normal(size=(per_class, dims)) * scale * (c + 1) / 2)
        labels += [name] * per_class
    rows.append(rng.normal(0, 8, size=(7, dims)) + 3)
    labels += ["X"] * 7
    rows.append(rng.normal(0, 8, size=(4, dims)) - 2)
    labels += ["Y"] * 4
    return np.concatenate(rows) * scale + 10, labels, centres


def test_contracted_in_place_by_k() -> None:
    x, labels, _ = clouds()
    lab = np.array(labels)
    k = 0.6
    x_hat = x.copy()
    for c in "ABC":
        mu = x[lab == c].mean(axis=0)
        x_hat[lab == c] = mu + k * (x[lab == c] - mu)
    res = geometry(x, x_hat, labels, ["A", "B", "C"], ["X", "Y"])
    assert res.delta_pct["R"] == pytest.approx(-100 * (1 - k), abs=1e-6)
    assert res.delta_pct["D_inter"] == pytest.approx(0.0, abs=1e-6)
    assert res.delta_pct["S"] == pytest.approx(100 * (1 / k - 1), abs=1e-5)
    # anomalies did not move: their distances are unchanged, rho grows as the radii shrink
    assert res.delta_pct["d_samp"] == pytest.approx(0.0, abs=1e-6)
    assert res.delta_pct["IC"] == pytest.approx(0.0, abs=1e-6)
    assert res.delta_pct["rho"] > 0


def test_anomaly_moved_halfway_to_its_centre() -> None:
    x, labels, _ = clouds(seed=3)
    lab = np.array(labels)
    x_hat = x.copy()
    mus = {c: x[lab == c].mean(axis=0) for c in "ABC"}
    scale = x[np.isin(lab, list("ABC"))].std(axis=0) + EPS  # the standardisation's per-dimension scale
    for i in np.flatnonzero(np.isin(lab, ["X", "Y"])):
        nearest = min(mus, key=lambda c: np.linalg.norm((x[i] - mus[c]) / scale))
        x_hat[i] = x[i] + 0.5 * (mus[nearest] - x[i])
    res = geometry(x, x_hat, labels, ["A", "B", "C"], ["X", "Y"])
    # the standardisation uses nominal x only, so nearest centres are found in that space
    for m in ("d_samp", "d_pool", "IC", "rho"):
        assert res.delta_pct[m] == pytest.approx(-50.0, abs=1e-6), m
    for m in ("D_inter", "R", "S"):
        assert res.delta_pct[m] == pytest.approx(0.0, abs=1e-6), m
    assert all(holds for m, _, _, holds in res.predictions() if m != "S")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_plain_reading(seed: int) -> None:
    x, labels, _ = clouds(seed=seed, dims=4, per_class=12)
    rng = np.random.default_rng(seed + 10)
    x_hat = x * rng.uniform(0.5, 1.5, size=x.shape[1]) + rng.normal(0, 1, size=x.shape)
    want = reference(x, x_hat, labels, ["A", "B", "C"], ["X", "Y"])
    res = geometry(x, x_hat, labels, ["A", "B", "C"], ["X", "Y"])
    for m in METRICS:
        assert res.x[m] == pytest.approx(want[m][0], rel=1e-9), m
        assert res.x_hat[m] == pytest.approx(want[m][1], rel=1e-9), m
        assert res.delta_pct[m] == pytest.approx(want[m][2], rel=1e-7, abs=1e-9), m


def test_standardisation_uses_nominal_x_only() -> None:
    """Moving only the anomalies of x must not change the map applied to x_hat's nominal points."""
    x, labels, _ = clouds(seed=5)
    lab = np.array(labels)
    shifted = x.copy()
    shifted[lab == "X"] += 100.0
    a = geometry(x, x, labels, ["A", "B", "C"], ["X", "Y"])
    b = geometry(shifted, x, labels, ["A", "B", "C"], ["X", "Y"])
    assert b.x_hat["R"] == pytest.approx(a.x_hat["R"], rel=1e-12)
    assert b.x_hat["D_inter"] == pytest.approx(a.x_hat["D_inter"], rel=1e-12)
    nominal = np.isin(lab, list("ABC"))
    assert np.allclose(a.z_x[nominal].mean(axis=0), 0, atol=1e-9)
    assert np.allclose(a.z_x[nominal].std(axis=0), 1, atol=1e-6)


def test_d_pool_weights_classes_equally() -> None:
    """d_samp follows the big anomaly class; d_pool is the median of class medians."""
    x = np.array(
        [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [10.0, 0.0], [11.0, 0.0], [10.0, 1.0], [11.0, 1.0]]
        + [[0.5, 20.0]] * 5
        + [[0.5, 2.0]] * 1
        + [[0.5, 3.0]] * 1
    )
    labels = ["A"] * 4 + ["B"] * 4 + ["X"] * 5 + ["Y"] + ["Z"]
    res = geometry(x, x, labels, ["A", "B"], ["X", "Y", "Z"])
    want = reference(x, x, labels, ["A", "B"], ["X", "Y", "Z"])
    assert res.x["d_samp"] == pytest.approx(want["d_samp"][0])
    assert res.x["d_pool"] == pytest.approx(want["d_pool"][0])
    assert res.x["d_pool"] < res.x["d_samp"]


def test_refusals() -> None:
    x, labels, _ = clouds()
    with pytest.raises(ValueError, match="two nominal classes"):
        geometry(x, x, labels, ["A"], ["X"])
    with pytest.raises(ValueError, match="two nominal classes"):
        geometry(x, x, labels, ["A", "Q"], ["X"])
    with pytest.raises(ValueError, match="anomalous record"):
        geometry(x, x, labels, ["A", "B"], ["Q"])


def test_figure(tmp_path) -> None:
    x, labels, _ = clouds()
    res = geometry(x, x * 0.9, labels, ["A", "B", "C"], ["X", "Y"])
    path = plot_geometry(res, labels, ["A", "B", "C"], tmp_path / "g.png")
    assert path.stat().st_size > 10_000


def _degenerate(case: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Clouds where the appendix's epsilon alone would carry a ratio or a relative change."""
    x, labels, _ = clouds(seed=4)
    lab = np.array(labels)
    x_hat = x * 0.9
    if case == "same centres":  # B and C moved onto A's centre: D_inter 0, IC = d / 1e-8
        for c in "BC":
            x[lab == c] += x[lab == "A"].mean(axis=0) - x[lab == c].mean(axis=0)
    elif case == "anomalies on a centre":  # d_samp, d_pool, rho and IC 0 in x: Delta = Q_xhat / 1e-8
        x[np.isin(lab, ["X", "Y"])] = x[lab == "A"].mean(axis=0)
    elif case == "dead dimension":  # constant over the nominal x, varying in x_hat: x_hat / 1e-8 there
        x[:, 1] = 0.25
        x_hat[:, 1] += np.linspace(0, 1, len(x))
    return x, x_hat, labels


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("same centres", "the nominal classes A, B, C have the same x centre (D_inter 0)"),
        ("anomalies on a centre", "rho, d_samp, d_pool, IC are 0 in x (the median anomaly lies on a nominal centre)"),
        ("dead dimension", "1 of 5 feature dimensions are constant over the nominal records' x features"),
    ],
)
def test_ratios_that_epsilon_alone_would_carry_are_refused(case: str, message: str) -> None:
    """These gave IC 1.6e9, Delta d_samp 7e10 % or Delta R 8e9 % with no word of why."""
    x, x_hat, labels = _degenerate(case)
    with pytest.raises(ValueError, match=re.escape(message)):
        geometry(x, x_hat, labels, ["A", "B", "C"], ["X", "Y"])


def test_a_dimension_constant_everywhere_is_harmless() -> None:
    """A feature that is one value for every record in both levels adds 0 to every distance."""
    x, labels, _ = clouds(seed=4)
    x_hat = x * 0.9
    x[:, 1] = x_hat[:, 1] = 0.25
    want = reference(np.delete(x, 1, axis=1), np.delete(x_hat, 1, axis=1), labels, ["A", "B", "C"], ["X", "Y"])
    res = geometry(x, x_hat, labels, ["A", "B", "C"], ["X", "Y"])
    for m in METRICS:
        assert res.delta_pct[m] == pytest.approx(want[m][2], rel=1e-9), m


def test_mismatched_inputs_are_one_line() -> None:
    """x and x_hat of different widths, a label list of another length, or 1-D features raised
    numpy's broadcast, IndexError or AxisError tracebacks."""
    x, labels, _ = clouds()
    cases = [
        ((x, x[:, :3], labels), "x and x_hat must be (records, dimensions) arrays of one shape"),
        ((x, x, labels[:-1]), f"{len(labels) - 1} labels for {len(labels)} records"),
        ((x[:, 0], x[:, 0], labels), "got (101,) and (101,)"),
    ]
    for (a, b, lab), message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            geometry(a, b, lab, ["A", "B", "C"], ["X", "Y"])


def test_nan_features_and_single_records_are_refused_in_the_api() -> None:
    x, labels, _ = clouds()
    broken = x.copy()
    broken[-1, 0] = np.nan
    with pytest.raises(ValueError, match="x_hat features of 1 of 101 records are NaN or inf"):
        geometry(x, broken, labels, ["A", "B", "C"], ["X", "Y"])
    one = [lab if i != 0 else "A" for i, lab in enumerate(labels)]
    keep = [i for i, lab in enumerate(one) if lab != "A" or i == 0]
    with pytest.raises(ValueError, match="nominal class A has a single record"):
        geometry(x[keep], x[keep], [one[i] for i in keep], ["A", "B", "C"], ["X", "Y"])
