"""The geometry metrics against an independent transcription of the appendix "Metrics" (separation
ratio, proximity ratio, d_samp, d_pool, IC, relative change), on random clouds and on the features
a tiny trained nested encoder gives real PTB-XL records through `ecgpos geometry`."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
from tiny_runs import cli, pretrain_tiny

from ecgpos.probes.geometry.dynamics import geometry

EPSILON = 1e-8  # the appendix's epsilon, "used everywhere"
NAMES = ("D_inter", "R", "S", "rho", "d_samp", "d_pool", "IC")
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
PTBXL = "ptbxl/records500/00000"


def _median(values: list[float]) -> float:
    """The median of a list: the middle value, or the mean of the two middle ones."""
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _norm(u: list[float], w: list[float]) -> float:
    return math.sqrt(sum((a - b) ** 2 for a, b in zip(u, w)))


def appendix(x: np.ndarray, x_hat: np.ndarray, labels: list[str], normal: list[str], anomalous: list[str]) -> dict:
    """Q^x, Q^x_hat and Delta Q of each metric, read off the appendix equation by equation.

    "both spaces are standardised per dimension using the mean and the standard deviation of the
    normal x samples (with epsilon added to the standard deviation)"; then eq. center-radius
    (mu_c, R_c), eq. separation-ratio (D_inter over the binom(K, 2) pairs c < c', R = mean of R_c,
    S = D_inter / (R + eps)), the proximity ratio rho = med_a d(a) / (R_c* + eps) with
    c* = argmin_c ||a - mu_c||, d_samp = med_a d(a), d_pool = med_b med_{a in A_b} d(a),
    IC = med_a d(a) / (D_inter + eps), and Delta Q = 100 (Q_xhat - Q_x) / (Q_x + eps).
    """
    rows, dims = len(labels), x.shape[1]
    normal_idx = [i for i in range(rows) if labels[i] in normal]
    mean = [sum(float(x[i, j]) for i in normal_idx) / len(normal_idx) for j in range(dims)]
    sd = [math.sqrt(sum((float(x[i, j]) - mean[j]) ** 2 for i in normal_idx) / len(normal_idx)) for j in range(dims)]

    def space(values: np.ndarray) -> dict[str, float]:
        z = [[(float(values[i, j]) - mean[j]) / (sd[j] + EPSILON) for j in range(dims)] for i in range(rows)]
        mu, radius = {}, {}
        for c in normal:
            h_c = [i for i in range(rows) if labels[i] == c]
            mu[c] = [sum(z[i][j] for i in h_c) / len(h_c) for j in range(dims)]
            radius[c] = sum(_norm(z[i], mu[c]) for i in h_c) / len(h_c)
        k = len(normal)
        total = sum(_norm(mu[normal[p]], mu[normal[q]]) for p in range(k) for q in range(p + 1, k))
        d_inter = total / math.comb(k, 2)
        r_bar = sum(radius.values()) / k
        d, ratio, by_class = [], [], {}
        for i in range(rows):
            if labels[i] not in anomalous:
                continue
            star = normal[0]
            for c in normal[1:]:
                if _norm(z[i], mu[c]) < _norm(z[i], mu[star]):
                    star = c
            d.append(_norm(z[i], mu[star]))
            ratio.append(d[-1] / (radius[star] + EPSILON))
            by_class.setdefault(labels[i], []).append(d[-1])
        return {
            "D_inter": d_inter,
            "R": r_bar,
            "S": d_inter / (r_bar + EPSILON),
            "rho": _median(ratio),
            "d_samp": _median(d),
            "d_pool": _median([_median(v) for v in by_class.values()]),
            "IC": _median([v / (d_inter + EPSILON) for v in d]),
        }

    qx, qh = space(x), space(x_hat)
    return {m: (qx[m], qh[m], 100 * (qh[m] - qx[m]) / (qx[m] + EPSILON)) for m in NAMES}


def _gaps(res, want: dict) -> dict[str, float]:
    """Largest relative difference per metric over (x, x_hat, Delta)."""
    got = {m: (res.x[m], res.x_hat[m], res.delta_pct[m]) for m in NAMES}
    return {m: max(abs(g - w) / max(1.0, abs(w)) for g, w in zip(got[m], want[m])) for m in NAMES}


def _cloud(rng: np.random.Generator, dims: int, sizes: dict[str, int]) -> tuple[np.ndarray, list[str]]:
    """Anisotropic, unequal classes on a raw (unstandardised) scale."""
    rows, labels = [], []
    scale = rng.uniform(0.1, 20.0, size=dims)
    for name, n in sizes.items():
        rows.append((rng.normal(0, 3, size=dims) + rng.normal(size=(n, dims)) * rng.uniform(0.3, 2.0)) * scale - 7)
        labels += [name] * n
    return np.concatenate(rows), labels


@pytest.mark.parametrize("seed", range(6))
def test_random_clouds_match_the_appendix(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dims = int(rng.integers(1, 9))
    sizes = {"N1": int(rng.integers(2, 15)), "N2": int(rng.integers(2, 15)), "N3": int(rng.integers(2, 6))}
    sizes |= {"A1": int(rng.integers(1, 12)), "A2": int(rng.integers(1, 4)), "A3": 1}
    x, labels = _cloud(rng, dims, sizes)
    x_hat = x * rng.uniform(0.6, 1.4, size=dims) + rng.normal(0, x.std(axis=0) * 0.3, size=x.shape)
    normal, anomalous = ["N1", "N2", "N3"][: 2 + seed % 2], ["A1", "A2", "A3"]
    used = [i for i, lab in enumerate(labels) if lab in normal + anomalous]
    x, x_hat, labels = x[used], x_hat[used], [labels[i] for i in used]
    res = geometry(x, x_hat, labels, normal, anomalous)
    gaps = _gaps(res, appendix(x, x_hat, labels, normal, anomalous))
    assert max(gaps.values()) < 1e-9, gaps


def test_an_anomaly_class_with_one_record_and_one_nominal_pair() -> None:
    """K = 2 (a single pair in D_inter) and M = 2 (d_pool the mean of two class medians)."""
    rng = np.random.default_rng(7)
    x, labels = _cloud(rng, 3, {"N1": 3, "N2": 2, "A1": 1, "A2": 4})
    x_hat = x + rng.normal(size=x.shape)
    res = geometry(x, x_hat, labels, ["N1", "N2"], ["A1", "A2"])
    gaps = _gaps(res, appendix(x, x_hat, labels, ["N1", "N2"], ["A1", "A2"]))
    assert max(gaps.values()) < 1e-9, gaps


@pytest.fixture(scope="module")
def nested_run(tiny_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("geometry-paper-runs")
    pretrain_tiny(0, tiny_shards, root / "s0", *FAST)
    return pretrain_tiny(1, tiny_shards, root / "s1", *FAST, base=root / "s0")


def _task(shared_data: Path, task: Path) -> tuple[Path, dict[int, str]]:
    """A custom task of 12 real PTB-XL records in its test split: nominal A, B (four each), anomalous X, Y
    (two each: d_pool, the mean of two class medians, then differs from d_samp)."""
    labels = {n: "A" for n in (1, 2, 3, 4)} | {n: "B" for n in (5, 6, 7, 8)}
    labels |= {n: "X" for n in (9, 10)} | {n: "Y" for n in (11, 12)}
    rows = ["record,A,B,X,Y"] + [
        f"{shared_data / PTBXL / f'{n:05d}_hr'}," + ",".join(str(int(c == lab)) for c in "ABXY")
        for n, lab in labels.items()
    ]
    task.mkdir()
    (task / "test.csv").write_text("\n".join(rows) + "\n")
    for split in ("train", "val"):
        (task / f"{split}.csv").write_text(rows[0] + "\n")
    return task, labels


@pytest.mark.parametrize("space", ["features", "reconstruction"])
def test_a_tiny_nested_encoder_on_real_records_matches_the_appendix(nested_run, shared_data, tmp_path, space):
    """metrics.csv of `ecgpos geometry` against the appendix computed from its own features.npz; the
    summary says what its numbers are (standardised distances, ratios of them, % change)."""
    task, labels = _task(shared_data, tmp_path / "task")
    out = tmp_path / "g"
    args = ["--nominal", "A,B", "--anomalous", "X,Y", "--space", space, "--out", out, "--device", "cpu"]
    assert cli("geometry", "--encoder", nested_run, "--task", f"custom:{task}", *args) == 0
    data = np.load(out / "features.npz")
    assert list(data["labels"]) == list(labels.values())
    want = appendix(data["x"], data["x_hat"], list(data["labels"]), ["A", "B"], ["X", "Y"])
    with (out / "metrics.csv").open() as handle:
        got = {r["metric"]: (float(r["x"]), float(r["x_hat"]), float(r["delta_pct"])) for r in csv.DictReader(handle)}
    assert list(got) == list(NAMES)
    gaps = {m: max(abs(g - w) / max(1.0, abs(w)) for g, w in zip(got[m], want[m])) for m in NAMES}
    assert max(gaps.values()) < 1e-9, gaps
    assert got["d_pool"][0] != pytest.approx(got["d_samp"][0])
    for level in (0, 1):  # the ratio S is D_inter over R of the same level
        assert got["S"][level] == pytest.approx(got["D_inter"][level] / got["R"][level], rel=1e-7)
    summary = (out / "summary.md").read_text()
    assert "Euclidean distances in the standardised space" in summary
    assert "S, rho and IC are ratios of them" in summary
    assert f"| S | {got['S'][0]:.4g} | {got['S'][1]:.4g} | {got['S'][2]:+.2f} |" in summary
    # the carving fraction is over the nominal records' perturbed inputs, records weighted equally
    assert "the fraction of the held-out nominal records whose perturbed input's reconstruction" in summary
    assert "(each record's windows averaged, records weighted equally" in summary
    assert re.search(r"^\| 1 \| [0-9.]+ \| 8 \| ", summary, re.M), summary  # over the 8 nominal records


def test_geometry_reruns_into_its_own_folder_and_a_probe_there_is_refused(nested_run, shared_data, tmp_path, capsys):
    """A second geometry replaces its own files; a probe into a geometry folder is one line, the folder untouched."""
    from refusal_helpers import one_line_error, run

    task, _ = _task(shared_data, tmp_path / "task")
    out = tmp_path / "g"
    args = ["geometry", "--encoder", nested_run, "--task", f"custom:{task}", "--nominal", "A,B", "--anomalous", "X,Y"]
    for _ in range(2):
        rc, _, err = run(capsys, *args, "--out", out, "--device", "cpu")
        assert rc == 0, err
    assert sorted(p.name for p in out.iterdir()) == [
        "depth.png",
        "features.npz",
        "geometry.png",
        "metrics.csv",
        "summary.md",
    ]
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, _, err = run(capsys, "probe", "--encoder", nested_run, "--task", f"custom:{task}", "--out", out)
    one_line_error(rc, err, "probe", f"--out {out} holds the results of `ecgpos geometry` (metrics.csv)")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_geometry_called_from_python_returns_what_metrics_csv_holds(nested_run, shared_data, tmp_path) -> None:
    from ecgpos.probes.geometry.cli import measure

    task, _ = _task(shared_data, tmp_path / "task")
    out = tmp_path / "g"
    args = ["--nominal", "A,B", "--anomalous", "X,Y", "--out", str(out), "--device", "cpu"]
    done = measure(["--encoder", str(nested_run), "--task", f"custom:{task}", *args])
    with (out / "metrics.csv").open() as handle:
        written = {r["metric"]: float(r["delta_pct"]) for r in csv.DictReader(handle) if r["level"] == "1"}
    assert done.out == out and list(done.results) == [1]
    assert list(done.deltas(1)) == list(NAMES) and done.deltas(1) == pytest.approx(written, rel=1e-12)
