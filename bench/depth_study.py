"""Does the carving criterion find the right depth? Asked on a synthetic corpus where the answer is known.

    python bench/depth_study.py [--out DIR] [--quick] [--seeds 3] [--levels 5]

Corpus (bench/depth_corpus.py, the demo's simulator): nominal data is a union of three components, rhythm
classes each with its own rate range and morphology. Held-out anomalies of two kinds: join (between the
components: one class's morphology at another's rate, a normalised mix of two classes) and off-union
(strong white noise, a swapped lead pair).

For each setting (push-pull off; on, with the paper's alpha 1 and scale 0.1) and seed, `ecgpos carve` trains
levels 0..L-1 to a fixed depth (`--stop-below 0 --min-drop -1`), measuring each as it always does. Per level:
the label-free readings (calibrated and literal criterion, pass-through rho, from carve.json; RankMe of the
level's features; the level's own validation-loss drop) and the label-based ones (`ecgpos score`'s masked
error, AUROC against held-out nominal records per anomaly kind, with a bootstrap interval; `ecgpos probe`'s
linear probe of the rhythm class on the level's features; `ecgpos geometry`'s Delta % from the level above).

Depths:
- right depth (labels): the shallowest level after which the join-anomaly AUROC no longer rises above that
  level's 95 % interval;
- criterion depth: where `ecgpos carve` stops with its default rules (below 0.05, a drop under 0.01);
- RankMe depth: the shallowest level after which the effective rank (Garrido et al., ICML 2023) no longer
  grows by 1 %; validation-loss depth: the shallowest level after which a level's validation loss falls by
  less than 10 % over its training.
The last line: `right depth ...; criterion depth ...` with the agreement counts.
"""

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # the package, and depth_corpus beside this script

from depth_corpus import CLASSES, record_classes, simulate_corpus, write_pool  # noqa: E402

RANKME_GAIN, LOSS_DROP = 0.01, 0.10
STOP_BELOW, MIN_DROP = 0.05, 0.01  # `ecgpos carve`'s defaults


@dataclass(frozen=True)
class Size:
    pool_per_class: int  # nominal pretraining records per class (a fifth held out for the criterion)
    eval_per_class: int  # held-out nominal records per class for the AUROCs
    anomalies: int  # records per anomaly sub-kind
    levels: int
    seeds: int
    level0_steps: int
    latent_steps: int


DEFAULT = Size(pool_per_class=40, eval_per_class=8, anomalies=8, levels=5, seeds=3, level0_steps=800, latent_steps=300)
QUICK = Size(pool_per_class=8, eval_per_class=3, anomalies=3, levels=2, seeds=1, level0_steps=10, latent_steps=10)


def auroc_ci(nominal: np.ndarray, anomalous: np.ndarray, resamples: int = 1000) -> tuple[float, float, float]:
    """AUROC (anomalous positive) and its 95 % percentile bootstrap interval over records."""
    from ecgpos.metrics import auroc_columns

    scores = np.concatenate([nominal, anomalous])
    labels = np.r_[np.zeros(len(nominal)), np.ones(len(anomalous))]
    point = float(auroc_columns(scores[:, None], labels[:, None])[0])
    rng = np.random.default_rng(0)
    draws = []
    for _ in range(resamples):
        a = rng.integers(0, len(nominal), len(nominal))
        b = rng.integers(0, len(anomalous), len(anomalous))
        s = np.concatenate([nominal[a], anomalous[b]])
        draws.append(float(auroc_columns(s[:, None], labels[:, None])[0]))
    return point, float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))


def rankme(features: np.ndarray) -> float:
    """exp(entropy) of the normalised singular values of a (records, width) feature matrix (RankMe)."""
    s = np.linalg.svd(features, compute_uv=False)
    p = s / s.sum() + 1e-12
    return float(np.exp(-(p * np.log(p)).sum()))


def level_features(encoder, level: int, windows: list[np.ndarray]) -> np.ndarray:
    """forward_features of levels 0..level of the nested encoder, one row per window."""
    import torch

    from ecgpos.models.nested import cut_encoder

    with torch.no_grad():
        return cut_encoder(encoder, level).forward_features(torch.from_numpy(np.stack(windows))).float().numpy()


def probe_auroc(pool: np.ndarray, pool_class: np.ndarray, test: np.ndarray, test_class: np.ndarray) -> float:
    """Test macro AUROC of the rhythm class by `ecgpos probe`'s linear probe (the paper's protocol, one
    seed): trained on four fifths of the pool, selected on the last fifth, tested on the held-out nominal
    records; features standardised with the training part's statistics."""
    from ecgpos.probes.linear.train import train_probe

    one_hot = np.eye(len(CLASSES), dtype=np.float32)
    held = np.arange(len(pool)) % 5 == 4
    mean, std = pool[~held].mean(0), pool[~held].std(0) + 1e-6
    z = [(a - mean) / std for a in (pool[~held], pool[held], test)]
    y = [one_hot[c] for c in (pool_class[~held], pool_class[held], test_class)]
    outcome = train_probe(z[0], y[0], z[1], y[1], z[2], y[2], [0], CLASSES)
    return float(outcome.seeds[0].test_auroc)


def geometry_deltas(before: dict[str, np.ndarray], after: dict[str, np.ndarray], nominal_class: np.ndarray) -> dict:
    """`ecgpos geometry`'s Delta % from one level's features to the next (features space), nominal
    classes the rhythm classes, anomaly classes join and off; {} where the pair cannot be measured."""
    from ecgpos.probes.geometry.dynamics import UnmeasurableError, geometry

    labels = [CLASSES[c] for c in nominal_class] + ["join"] * len(before["join"]) + ["off"] * len(before["off"])
    x, x_hat = (np.concatenate([f["nominal"], f["join"], f["off"]]) for f in (before, after))
    try:
        return dict(geometry(x, x_hat, labels, CLASSES, ["join", "off"]).delta_pct)
    except UnmeasurableError:
        return {}


def label_readings(runs: Path, size: Size, groups: dict[str, list[np.ndarray]]) -> list[dict]:
    """Per level: AUROC per anomaly kind of `ecgpos score`'s masked error, RankMe of its features, the
    linear probe's rhythm-class AUROC and geometry's Delta % from the level above."""
    from ecgpos.inference.scoring import load_recon_models, window_scores
    from ecgpos.runs.run_folder import load_run_model

    levels = size.levels
    models = load_recon_models(runs / f"level{levels - 1}")
    names = ["nominal", "join", "off"]
    scores = {g: window_scores(models, np.stack(groups[g]), 8) for g in names}
    encoder = load_run_model(runs / f"level{levels - 1}")[0].eval().nested_encoder()
    pool_class, nominal_class = (record_classes(size, g) for g in ("pool", "nominal"))
    out, above = [], None
    for level in range(levels):
        key = f"level{level}"
        feats = {g: level_features(encoder, level, groups[g]) for g in ("pool", *names)}
        row: dict = {f"auroc_{kind}": auroc_ci(scores["nominal"][key], scores[kind][key]) for kind in ("join", "off")}
        row["rankme"] = rankme(feats["nominal"])
        row["probe_auroc"] = probe_auroc(feats["pool"], pool_class, feats["nominal"], nominal_class)
        row["geometry"] = geometry_deltas(above, feats, nominal_class) if above else {}
        out.append(row)
        above = feats
    return out


def right_depth(aurocs: list[tuple[float, float, float]]) -> int:
    """The shallowest level after which the AUROC never rises above that level's interval."""
    for level, (_, _, hi) in enumerate(aurocs):
        if all(a <= hi for a, _, _ in aurocs[level + 1 :]):
            return level
    return len(aurocs) - 1


def criterion_depth(criteria: list[float], levels: int) -> int:
    """Where `ecgpos carve` stops with its default rules."""
    from ecgpos.pretrain.carve_plan import decide

    for level in range(levels):
        if decide(criteria[: level + 1], levels, STOP_BELOW, MIN_DROP).stop:
            return level
    return levels - 1


def gain_depth(values: list[float], improves) -> int:
    """The shallowest level after which the next level does not improve `values` (a label-free rule)."""
    for level in range(len(values) - 1):
        if not improves(values[level], values[level + 1]):
            return level
    return len(values) - 1


def loss_drop(run: Path) -> float:
    """The relative fall of a level's validation loss from its first to its last validation."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return (val[0] - val[-1]) / abs(val[0]) if len(val) >= 2 and val[0] else 0.0


def _steps(n: int) -> list[str]:
    return [f"optim.steps={n}", f"optim.warmup_steps={max(1, n // 10)}", f"train.val_every={max(1, n // 4)}"]


def run_setting(out: Path, pool: Path, size: Size, setting: str, seed: int, groups: dict) -> dict:
    from ecgpos.cli import main as ecgpos

    runs = out / f"{setting}-seed{seed}"
    argv = ["carve", "--config", "tiny/level0", "--latent-config", "tiny/level1", "--shards", str(pool)]
    argv += ["--run-dir", str(runs), "--max-levels", str(size.levels), "--stop-below", "0", "--min-drop", "-1"]
    argv += ["--val-fraction", "0.2"]
    sets = ["train.num_workers=0", f"train.seed={seed}", "train.log_every=1000", "train.figure_every=100000"]
    sets += _steps(size.level0_steps)
    if setting == "push-pull":
        sets += ["push_pull.enabled=true", "push_pull.alpha=1.0", "push_pull.scale=0.1"]
    for s in sets:
        argv += ["--set", s]
    for s in _steps(size.latent_steps):
        argv += ["--latent-set", s]
    if ecgpos(argv) != 0:
        raise SystemExit(f"carve failed for {setting} seed {seed}")
    carved = json.loads((runs / "carve.json").read_text())["levels"]
    labels = label_readings(runs, size, groups)
    keep = ("level", "clean_error", "perturbation_over_error", "criterion", "criterion_ci", "criterion_literal")
    keep += ("pass_through", "pass_through_ci", "perturbation", "families")
    rows = [
        {**{k: r[k] for k in keep}, "loss_drop": loss_drop(Path(r["run_dir"])), **lab} for r, lab in zip(carved, labels)
    ]
    join = [tuple(r["auroc_join"]) for r in rows]
    depths = {
        "right": right_depth(join),
        "criterion": criterion_depth([r["criterion"] for r in rows], size.levels),
        "literal": criterion_depth([r["criterion_literal"] for r in rows], size.levels),
        "rankme": gain_depth([r["rankme"] for r in rows], lambda a, b: b > a * (1 + RANKME_GAIN)),
        # carve on while the next level still learns: its validation loss falls by LOSS_DROP or more
        "val_loss": next(
            (lv for lv in range(size.levels - 1) if rows[lv + 1]["loss_drop"] < LOSS_DROP), size.levels - 1
        ),
    }
    return {"setting": setting, "seed": seed, "levels": rows, "depths": depths}


def _mean(values: list[float], digits: int = 3) -> str:
    return f"{np.mean(values):.{digits}f}" if values else "-"


def report(results: list[dict], size: Size, machine: str, seconds: float) -> str:
    """The table (mean over seeds per setting and level) and the depths per setting and seed, as Markdown."""
    lines = [
        f"Depth study: {size.levels} levels, {size.seeds} seed(s), level 0 {size.level0_steps} steps, "
        f"latent levels {size.latent_steps} steps, tiny configs; {machine}; {seconds / 60:.1f} min.",
        "",
        "| setting | level | criterion | literal | rho | delta / eps | AUROC join | AUROC off | probe AUROC "
        "| Delta S % | Delta rho % | RankMe | val-loss drop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting in dict.fromkeys(r["setting"] for r in results):
        runs = [r for r in results if r["setting"] == setting]
        for level in range(size.levels):
            rows = [r["levels"][level] for r in runs]
            cells = [_mean([x[k] for x in rows]) for k in ("criterion", "criterion_literal", "pass_through")]
            cells += [_mean([x["perturbation_over_error"] for x in rows])]
            cells += [_mean([x[k][0] for x in rows]) for k in ("auroc_join", "auroc_off")]
            cells += [_mean([x["probe_auroc"] for x in rows])]
            cells += [_mean([x["geometry"][m] for x in rows if m in x["geometry"]], 1) for m in ("S", "rho")]
            cells += [_mean([x["rankme"] for x in rows]), _mean([x["loss_drop"] for x in rows])]
            lines.append(f"| {setting} | {level} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| setting | seed | right depth | criterion | literal | RankMe | val loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        d = r["depths"]
        lines.append(
            f"| {r['setting']} | {r['seed']} | {d['right']} | {d['criterion']} | {d['literal']} | {d['rankme']} | "
            f"{d['val_loss']} |"
        )
    n = len(results)
    agree = {
        k: sum(r["depths"][k] == r["depths"]["right"] for r in results)
        for k in ("criterion", "literal", "rankme", "val_loss")
    }
    lines += ["", "Agreement with the right depth: " + ", ".join(f"{k} {v}/{n}" for k, v in agree.items()) + "."]
    return "\n".join(lines) + "\n"


def plot(results: list[dict], size: Size, path: Path) -> None:
    """Criterion, rho and join AUROC against depth, one panel per setting (seeds as thin lines)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in results))
    fig, axes = plt.subplots(1, len(settings), figsize=(5 * len(settings), 3.6), squeeze=False)
    depth = list(range(size.levels))
    for ax, setting in zip(axes[0], settings):
        for r in (r for r in results if r["setting"] == setting):
            lv = r["levels"]
            ax.plot(depth, [x["criterion"] for x in lv], "o-", color="tab:red", alpha=0.7)
            ax.plot(depth, [x["pass_through"] for x in lv], "s-", color="tab:orange", alpha=0.7)
            ax.plot(depth, [x["auroc_join"][0] for x in lv], "^-", color="tab:blue", alpha=0.7)
            ax.axvline(r["depths"]["right"], color="tab:blue", ls=":", alpha=0.5)
            ax.axvline(r["depths"]["criterion"], color="tab:red", ls=":", alpha=0.5)
        ax.set_title(setting)
        ax.set_xlabel("level")
        ax.set_xticks(depth)
        ax.set_ylim(-0.05, 1.05)
    labels = ["criterion (calibrated)", "pass-through rho", "AUROC join (score)"]
    fig.legend(labels, fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))  # room for the legend below the panels
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/depth_study.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench-out" / "depth-study", help="output folder")
    p.add_argument("--quick", action="store_true", help="two levels, one seed, a tiny corpus (a few minutes)")
    p.add_argument("--seeds", type=int, help="seeds per setting (default 3; 1 with --quick)")
    p.add_argument("--levels", type=int, help="levels 0..L-1 (default 5; 2 with --quick)")
    p.add_argument(
        "--report-only", action="store_true", help="train nothing: the table and figure of --out's results.json so far"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import os

    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    size = QUICK if args.quick else DEFAULT
    size = Size(**{**asdict(size), **{k: v for k, v in (("seeds", args.seeds), ("levels", args.levels)) if v}})
    start = time.monotonic()
    if args.report_only:
        results = json.loads((args.out / "results.json").read_text())
        done = Size(**{**asdict(size), "seeds": len({r["seed"] for r in results})})
        return finish(args.out, results, done, "partial run: " + describe_machine(), 0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / f"corpus-{size.pool_per_class}-{size.eval_per_class}-{size.anomalies}.npz"
    if cache.is_file():  # a rerun into the same --out reuses the corpus (and carve resumes the finished levels)
        with np.load(cache) as data:
            groups = {k: list(data[k]) for k in data.files}
    else:
        groups = simulate_corpus(size)
        np.savez(cache, **{k: np.stack(v) for k, v in groups.items()})
    print(
        f"corpus: {', '.join(f'{k} {len(v)}' for k, v in groups.items())} ({time.monotonic() - start:.0f} s)",
        flush=True,
    )
    pool = write_pool(groups["pool"], args.out / "shards")
    results = []
    for seed in range(size.seeds):  # seed by seed, so that a partial run covers both settings
        for setting in ("off", "push-pull"):
            results.append(run_setting(args.out, pool, size, setting, seed, groups))
            (args.out / "results.json").write_text(json.dumps(results, indent=1))
            print(
                f"{setting} seed {seed}: depths {results[-1]['depths']} ({time.monotonic() - start:.0f} s)", flush=True
            )
    return finish(args.out, results, size, describe_machine(), time.monotonic() - start)


def describe_machine() -> str:
    import os

    import torch

    return f"{os.cpu_count()}-core CPU, {torch.get_num_threads()} torch threads"


def finish(out: Path, results: list[dict], size: Size, machine: str, seconds: float) -> int:
    """table.md and depth.png in `out`; prints the table and, last, both depths per setting and seed."""
    text = report(results, size, machine, seconds)
    (out / "table.md").write_text(text)
    plot(results, size, out / "depth.png")
    print(text)
    pairs = [(r["depths"]["right"], r["depths"]["criterion"]) for r in results]
    agree = sum(a == b for a, b in pairs)
    print(
        "right depth "
        + ",".join(str(a) for a, _ in pairs)
        + "; criterion depth "
        + ",".join(str(b) for _, b in pairs)
        + f"; agree {agree}/{len(pairs)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
