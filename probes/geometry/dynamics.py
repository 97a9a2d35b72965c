"""The preprint's representation-dynamics metrics (appendix "Metrics") between two levels x and x_hat.

Both spaces are standardised per dimension with the mean and the population standard deviation
of the nominal x samples (EPS added to the std), the same map for x and x_hat. In each space z:
    mu_c, R_c   centre and mean distance to the centre of nominal class c
    D_inter     mean distance between the centres of all pairs of nominal classes
    R           mean of the R_c
    S           D_inter / (R + EPS)                                   (separation ratio)
    d(a)        distance of anomaly a to its nearest nominal centre mu_{c*}
    rho         median over anomalies of d(a) / (R_{c*} + EPS)       (proximity ratio)
    d_samp      median of d(a) over all anomalies
    d_pool      median over anomaly classes of the per-class median of d(a)
    IC          median over anomalies of d(a) / (D_inter + EPS)
and for every scalar Q the relative change Delta Q = 100 (Q_xhat - Q_x) / (Q_x + EPS) [%].
PoS predicts Delta S > 0 and Delta rho, Delta IC, Delta d_samp, Delta d_pool < 0.

Readings taken where the appendix leaves a choice: the std is the population one (divide by N); the
nearest centre c* of an anomaly is found anew in each space; anomaly classes without records do not
enter d_pool. Where EPS alone would carry a ratio (a nominal class of radius 0, coinciding nominal
centres, a feature dimension constant over the nominal x on which other records differ, a Q_x of 0
under Delta Q) the number would measure EPS, not the encoder: geometry() refuses those inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ecgpos.files import atomic_path

EPS = 1e-8
ZERO_RADIUS = 1e-6  # a class radius below this, in standardised units, is a point: its ratios are undefined
FLAT_LIMIT = 1e3  # |z| above this on a dimension constant over the nominal x comes from dividing by EPS
METRICS = ("D_inter", "R", "S", "rho", "d_samp", "d_pool", "IC")
# metric -> (predicted sign of Delta, the prediction in words); D_inter and R are reported without one
PREDICTIONS: dict[str, tuple[int, str]] = {
    "S": (+1, "nominal classes separate relative to their size (Delta S > 0)"),
    "rho": (-1, "anomalies approach their nearest nominal class faster than it shrinks (Delta rho < 0)"),
    "IC": (-1, "anomalies approach the nominal classes faster than the space contracts (Delta IC < 0)"),
    "d_samp": (-1, "anomalies move toward their nearest nominal centre (Delta d_samp < 0)"),
    "d_pool": (-1, "the same with every anomaly class weighted equally (Delta d_pool < 0)"),
}


def standardise(x: np.ndarray, x_hat: np.ndarray, nominal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, x_hat) mapped by (v - mean) / (std + EPS), mean and population std of x[nominal] per dimension."""
    ref = np.asarray(x, np.float64)[nominal]
    mean, std = ref.mean(axis=0), ref.std(axis=0) + EPS
    return (np.asarray(x, np.float64) - mean) / std, (np.asarray(x_hat, np.float64) - mean) / std


def centres_radii(z: np.ndarray, labels: np.ndarray, classes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Centres mu_c (K, D) and mean radii R_c (K,) of the nominal classes, in the order given."""
    mus, radii = [], []
    for c in classes:
        points = z[labels == c]
        mu = points.mean(axis=0)
        mus.append(mu)
        radii.append(np.linalg.norm(points - mu, axis=1).mean())
    return np.stack(mus), np.asarray(radii)


def mean_pairwise_distance(mus: np.ndarray) -> float:
    """Mean Euclidean distance over the K(K-1)/2 unordered pairs of centres."""
    i, j = np.triu_indices(len(mus), k=1)
    return float(np.linalg.norm(mus[i] - mus[j], axis=1).mean())


def level_metrics(
    z: np.ndarray, labels: np.ndarray, nominal: Sequence[str], anomalous: Sequence[str]
) -> dict[str, float]:
    """The seven metrics of one (already standardised) space z (N, D); labels (N,) class names."""
    labels = np.asarray(labels)
    mus, radii = centres_radii(z, labels, nominal)
    d_inter, r_mean = mean_pairwise_distance(mus), float(radii.mean())
    is_anomaly = np.isin(labels, list(anomalous))
    a = z[is_anomaly]
    distances = np.linalg.norm(a[:, None, :] - mus[None, :, :], axis=2)  # (A, K)
    nearest = distances.argmin(axis=1)
    d = distances[np.arange(len(a)), nearest]
    a_labels = labels[is_anomaly]
    per_class = [np.median(d[a_labels == b]) for b in anomalous if np.any(a_labels == b)]
    return {
        "D_inter": d_inter,
        "R": r_mean,
        "S": d_inter / (r_mean + EPS),
        "rho": float(np.median(d / (radii[nearest] + EPS))),
        "d_samp": float(np.median(d)),
        "d_pool": float(np.median(per_class)),
        "IC": float(np.median(d / (d_inter + EPS))),
    }


def relative_change(q_x: float, q_x_hat: float) -> float:
    """Delta Q = 100 (Q_xhat - Q_x) / (Q_x + EPS), in percent."""
    return 100.0 * (q_x_hat - q_x) / (q_x + EPS)


@dataclass
class GeometryResult:
    """Metrics of both spaces and their relative changes, plus the standardised points."""

    x: dict[str, float]
    x_hat: dict[str, float]
    delta_pct: dict[str, float]
    z_x: np.ndarray
    z_x_hat: np.ndarray

    def rows(self) -> list[dict[str, float | str]]:
        """metrics.csv rows: metric, x, x_hat, delta_pct."""
        return [{"metric": m, "x": self.x[m], "x_hat": self.x_hat[m], "delta_pct": self.delta_pct[m]} for m in METRICS]

    def predictions(self) -> list[tuple[str, str, float, bool]]:
        """(metric, prediction, Delta %, holds) for each PoS prediction."""
        return [
            (m, text, self.delta_pct[m], bool(np.sign(self.delta_pct[m]) == sign))
            for m, (sign, text) in PREDICTIONS.items()
        ]


def check_classes(labels: np.ndarray, nominal: Sequence[str], anomalous: Sequence[str]) -> str | None:
    """Why the metrics cannot be computed (None when they can): the separation terms need two
    nominal classes with records, the proximity terms at least one anomalous record."""
    present = [c for c in nominal if np.any(labels == c)]
    if len(present) < 2:
        return (
            f"needs at least two nominal classes with records, found {len(present)} "
            f"({', '.join(f'{c}: {int(np.sum(labels == c))}' for c in nominal)})"
        )
    if not np.any(np.isin(labels, list(anomalous))):
        return f"needs at least one anomalous record ({', '.join(anomalous)}: none found)"
    single = [c for c in present if np.sum(labels == c) == 1]
    if single:
        return (
            f"nominal class {', '.join(single)} {'has' if len(single) == 1 else 'each have'} a single record: "
            "its radius R_c is 0, so S and rho would divide by zero; give each nominal class at least 2 "
            "records, or leave it out of the nominal classes"
        )
    return None


def check_spread(
    x: np.ndarray,
    x_hat: np.ndarray,
    labels: np.ndarray,
    nominal: Sequence[str],
    names: tuple[str, str] = ("x", "x_hat"),
) -> str | None:
    """Why the metrics would be meaningless (None when they are not): NaN/inf features; a nominal
    class whose records all have the same features in a level (radius 0, so S and rho divide by EPS
    alone and come out near 1e8 or 0 whatever the encoder does); a dimension constant over the
    nominal x on which other records differ (the standardisation divides it by EPS alone, so it
    swamps every distance); or nominal centres that coincide in a level (D_inter 0, IC divides by EPS)."""
    labels = np.asarray(labels, dtype=str)
    for name, v in zip(names, (x, x_hat)):
        bad = ~np.isfinite(np.asarray(v, np.float64)).all(axis=1)
        if bad.any():
            return f"{name} features of {int(bad.sum())} of {len(bad)} records are NaN or inf"
    present = [c for c in nominal if np.any(labels == c)]
    is_nominal = np.isin(labels, present)
    z_x, z_x_hat = standardise(x, x_hat, is_nominal)
    for name, z in zip(names, (z_x, z_x_hat)):
        _, radii = centres_radii(z, labels, present)
        flat = [c for c, r in zip(present, radii) if r < ZERO_RADIUS]
        if flat:
            return (
                f"the records of nominal class {', '.join(flat)} have identical {name} features (radius 0), so "
                "S and rho would divide by zero (duplicated records, or features that do not depend on the input)"
            )
    constant = np.asarray(x, np.float64)[is_nominal].std(axis=0) < EPS
    swamped = constant & (np.abs(np.concatenate([z_x, z_x_hat])) > FLAT_LIMIT).any(axis=0)
    if swamped.any():
        return (
            f"{int(swamped.sum())} of {len(swamped)} feature dimensions are constant over the nominal records' "
            f"{names[0]} features but differ in other records or in {names[1]}: the standardisation divides them "
            "by 1e-8 alone and they would swamp every distance (features that do not depend on the input)"
        )
    for name, z in zip(names, (z_x, z_x_hat)):
        mus, _ = centres_radii(z, labels, present)
        if mean_pairwise_distance(mus) < ZERO_RADIUS:
            return (
                f"the nominal classes {', '.join(present)} have the same {name} centre (D_inter 0), so S is 0 "
                "and IC would divide by zero whatever the encoder does"
            )
    return None


def check_shapes(x: np.ndarray, x_hat: np.ndarray, labels: np.ndarray) -> str | None:
    """Why x, x_hat and labels do not describe the same records (None when they do)."""
    x, x_hat = np.asarray(x), np.asarray(x_hat)
    if x.ndim != 2 or x.shape != x_hat.shape:
        return f"x and x_hat must be (records, dimensions) arrays of one shape, got {x.shape} and {x_hat.shape}"
    if len(labels) != len(x):
        return f"{len(labels)} labels for {len(x)} records"
    return None


def check_relative(q_x: dict[str, float], name: str = "x") -> str | None:
    """Why a relative change Delta Q would measure EPS alone (None when none would): a Q_x of 0."""
    zero = [m for m in METRICS if abs(q_x[m]) < ZERO_RADIUS]
    if zero:
        return (
            f"{', '.join(zero)} {'is' if len(zero) == 1 else 'are'} 0 in {name} (the median anomaly lies on a "
            f"nominal centre), so {'its relative change' if len(zero) == 1 else 'their relative changes'} "
            "would divide by zero"
        )
    return None


class UnmeasurableError(ValueError):
    """Records on which the metrics are undefined; the message says why, in one line."""


def geometry(
    x: np.ndarray,
    x_hat: np.ndarray,
    labels: Sequence[str],
    nominal: Sequence[str],
    anomalous: Sequence[str],
    names: tuple[str, str] = ("x", "x_hat"),
) -> GeometryResult:
    """Standardise both levels on nominal x, compute the metrics in each and their relative change.

    Nominal classes without records are dropped (their centre is undefined); raises UnmeasurableError
    (a ValueError) when x, x_hat and labels disagree in shape, fewer than two nominal classes or no
    anomaly remain, a nominal class has a single record or identical features (radius 0), the nominal
    centres coincide (D_inter 0), a dimension constant over the nominal x varies elsewhere, features
    are not finite, or a metric is 0 in x (its Delta undefined); `names` name the two levels in that message.
    """
    labels = np.asarray(labels, dtype=str)
    problem = (
        check_shapes(x, x_hat, labels)
        or check_classes(labels, nominal, anomalous)
        or check_spread(x, x_hat, labels, nominal, names)
    )
    if problem:
        raise UnmeasurableError(problem)
    nominal = [c for c in nominal if np.any(labels == c)]
    z_x, z_x_hat = standardise(x, x_hat, np.isin(labels, nominal))
    mx = level_metrics(z_x, labels, nominal, anomalous)
    mh = level_metrics(z_x_hat, labels, nominal, anomalous)
    problem = check_relative(mx, names[0])
    if problem:
        raise UnmeasurableError(problem)
    return GeometryResult(mx, mh, {m: relative_change(mx[m], mh[m]) for m in METRICS}, z_x, z_x_hat)


def plot_geometry(
    result: GeometryResult,
    labels: Sequence[str],
    nominal: Sequence[str],
    path: Path,
    titles: tuple[str, str] = ("x", "x_hat"),
) -> Path:
    """Both standardised spaces side by side on one 2-D PCA projection fitted on the nominal x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.decomposition import PCA

    labels = np.asarray(labels, dtype=str)
    is_nominal = np.isin(labels, list(nominal))
    pca = PCA(n_components=2).fit(result.z_x[is_nominal])
    panels = [pca.transform(result.z_x), pca.transform(result.z_x_hat)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharex=True, sharey=True)
    colours = plt.get_cmap("tab10")
    for ax, points, title in zip(axes, panels, titles):
        for k, c in enumerate(nominal):
            sel = labels == c
            ax.scatter(points[sel, 0], points[sel, 1], s=10, alpha=0.6, color=colours(k % 10), label=c)
        for k, b in enumerate(sorted(set(labels[~is_nominal]))):
            sel = labels == b
            ax.scatter(
                points[sel, 0],
                points[sel, 1],
                s=28,
                marker="x",
                color=f"C{(k + len(nominal)) % 10}",
                label=f"{b} (anomalous)",
            )
        ax.set_title(title)
        ax.set_xlabel("PC 1 (fitted on nominal x)")
    axes[0].set_ylabel("PC 2")
    axes[1].legend(fontsize=8, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path
