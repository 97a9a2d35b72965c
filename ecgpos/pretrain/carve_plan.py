"""`ecgpos carve`'s decision and its record: whether to carve another level, and carve.json / carve.md / carve.png.

The decision after level l (0-based), with c_l the calibrated carving criterion of the level's deciding
perturbation family, measured on the pool's validation records (ecgpos.objectives.calibrated), checked in
this order:
    c_l < stop_below                          -> stop: the level already holds its range (criterion low)
    l >= 1 and c_{l-1} - c_l < min_drop       -> stop: the last level did not lower the criterion enough
    l + 1 >= max_levels                       -> stop: the depth budget is spent
    otherwise                                 -> carve level l + 1
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ecgpos.files import atomic_path, atomic_write_text

STOP_BELOW = "below"
STOP_DROP = "min-drop"
STOP_MAX = "max-levels"
CONTINUE = "continue"


@dataclass
class Decision:
    stop: bool
    rule: str  # STOP_BELOW, STOP_DROP, STOP_MAX or CONTINUE
    reason: str


def decide(criteria: list[float], max_levels: int, stop_below: float, min_drop: float) -> Decision:
    """The decision after the last level of `criteria` (the criterion of levels 0..l, in order)."""
    level, value = len(criteria) - 1, criteria[-1]
    if value < stop_below:
        return Decision(True, STOP_BELOW, f"criterion {value:.4f} is below --stop-below {stop_below:g}")
    if level >= 1:
        drop = criteria[-2] - value
        if drop < min_drop:
            return Decision(
                True,
                STOP_DROP,
                f"criterion fell by {drop:+.4f} since level {level - 1} ({criteria[-2]:.4f} -> {value:.4f}), "
                f"less than --min-drop {min_drop:g}",
            )
    if level + 1 >= max_levels:
        return Decision(True, STOP_MAX, f"reached --max-levels {max_levels} with the criterion at {value:.4f}")
    gone = f", fell by {criteria[-2] - value:+.4f}" if level >= 1 else ""
    return Decision(
        False, CONTINUE, f"criterion {value:.4f} >= --stop-below {stop_below:g}{gone}: carve level {level + 1}"
    )


@dataclass
class LevelRecord:
    """One carved level in carve.json. `criterion` is the calibrated criterion of the deciding family
    `perturbation` (ecgpos.objectives.calibrated), the stop rules' input; `criterion_literal` the fixed-size
    reading of ecgpos.objectives.criterion (the trainer's val_push_violation)."""

    level: int
    run_dir: str
    steps: int
    val_loss: float | None
    clean_error: float
    perturbation_over_error: float
    criterion: float
    criterion_ci: tuple[float, float]
    criterion_literal: float
    pass_through: float
    pass_through_ci: tuple[float, float]
    perturbation: str
    records: int
    decision: dict
    map: str = "masked"
    families: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> its criterion, pass_through
    probe_auroc: float | None = None
    probe_interval: tuple[float, float] | None = None
    geometry: dict[str, float] = field(default_factory=dict)  # metric -> Delta % against level l-1


def write_carve(out: Path, settings: dict, levels: list[LevelRecord], measured_above: Sequence[dict] = ()) -> None:
    """carve.json, carve.md and carve.png in `out`, each written whole. `measured_above`: earlier measurements
    of levels above the last decided one, kept in carve.json (not in carve.md) for a resumed carving to reuse."""
    data = {"settings": settings, "levels": [asdict(r) for r in levels]}
    if measured_above:
        data["measured_above"] = list(measured_above)
    atomic_write_text(out / "carve.json", json.dumps(data, indent=2) + "\n", sync=False)
    atomic_write_text(out / "carve.md", carve_markdown(settings, levels), sync=False)
    plot_carve(levels, out / "carve.png")


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(interval: Sequence[float] | None) -> str:
    return f"[{interval[0]:.4f}, {interval[1]:.4f}]" if interval else "-"


def carve_markdown(settings: dict, levels: list[LevelRecord]) -> str:
    """The per-level table and the decision, as carve.md."""
    probe = settings.get("probe_task")
    task = str(probe).removeprefix("custom:").rstrip("/").rsplit("/", 1)[-1] if probe else None
    metrics = list(dict.fromkeys(m for r in levels for m in r.geometry))  # in geometry's order
    head = ["level", "run", "steps", "val loss", "clean error", "delta / eps", "criterion", "95 % CI"]
    head += ["pass-through", "95 % CI", "literal", "perturbation", "map", "records"]
    head += [f"probe AUROC ({task})", "95 % CI"] if probe else []
    head += [f"Delta {m} %" for m in metrics]
    head += ["decision"]
    lines = [
        "# Carving to depth",
        "",
        "Criterion (calibrated): the fraction of the pool's validation records whose perturbed input x~, at "
        "kappa times the level's clean reconstruction error eps from the clean x, is reconstructed nearer x~ "
        "than x is, d(x^, x~) < d(x~, x), through the map the level trained as; pass-through: "
        "d(P(x~), P(x)) / d(x~, x), 0 when the level removes the perturbation, 1 when it reproduces it; "
        "95 % percentile bootstrap intervals over records; literal: the push margin at the fixed push-pull "
        'size (docs/configs.md, "The carving criterion"). The decisions use the calibrated criterion of '
        f"the named perturbation. Stop rules: below {settings['stop_below']:g}, a drop of less than "
        f"{settings['min_drop']:g}, or {settings['max_levels']} levels.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in levels:
        row = [str(r.level), f"`{r.run_dir}`", str(r.steps), _fmt(r.val_loss), _fmt(r.clean_error, 3)]
        row += [_fmt(r.perturbation_over_error, 2), _fmt(r.criterion), _ci(r.criterion_ci)]
        row += [_fmt(r.pass_through), _ci(r.pass_through_ci), _fmt(r.criterion_literal), r.perturbation, r.map]
        row += [str(r.records)]
        if probe:
            row += [_fmt(r.probe_auroc), _ci(r.probe_interval)]
        row += [f"{r.geometry[m]:+.2f}" if m in r.geometry else "-" for m in metrics]
        row += [r.decision["rule"]]
        lines.append("| " + " | ".join(row) + " |")
    others = [(r.level, f, v) for r in levels for f, v in r.families.items() if f != r.perturbation]
    if others:
        lines += ["", "The other perturbation families (not deciding):", ""]
        lines += ["| level | perturbation | criterion | pass-through | delta / eps |", "|---|---|---|---|---|"]
        for level, family, v in others:
            lines.append(
                f"| {level} | {family} | {_fmt(v.get('criterion'))} | {_fmt(v.get('pass_through'))} | "
                f"{_fmt(v.get('perturbation_over_error'), 2)} |"
            )
    if levels:
        last = levels[-1]
        verdict = "stopped" if last.decision["stop"] else "carving on"
        lines += ["", f"Decision after level {last.level}: {verdict}, {last.decision['reason']}."]
    if probe:
        lines += [
            "",
            "Read the criterion next to the probe: the paper's open question is whether the criterion falls "
            "where the probe stops improving, so that depth can be chosen without labels.",
        ]
    return "\n".join(lines) + "\n"


def plot_carve(levels: list[LevelRecord], path: Path) -> None:
    """The calibrated criterion and pass-through (with their intervals), the literal criterion and, when
    measured, the probe AUROC against depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    depth = [r.level for r in levels]
    for name, ci, color, label in (
        ("criterion", "criterion_ci", "tab:red", "criterion (calibrated)"),
        ("pass_through", "pass_through_ci", "tab:orange", "pass-through rho"),
    ):
        values = [getattr(r, name) for r in levels]
        bounds = [getattr(r, ci) for r in levels]
        err = [[max(v - b[0], 0) for v, b in zip(values, bounds)], [max(b[1] - v, 0) for v, b in zip(values, bounds)]]
        ax.errorbar(depth, values, yerr=err, marker="o", capsize=4, color=color, label=label)
    ax.plot(depth, [r.criterion_literal for r in levels], "x--", color="tab:gray", label="criterion (literal)")
    ax.set_xlabel("level")
    ax.set_ylabel("fraction of records / rho")
    ax.set_xticks(depth)
    ax.legend(fontsize=7, loc="upper right")
    probed = [r for r in levels if r.probe_auroc is not None]
    if probed:
        twin = ax.twinx()
        twin.plot([r.level for r in probed], [r.probe_auroc for r in probed], marker="s", color="tab:blue")
        twin.set_ylabel("probe macro AUROC", color="tab:blue")
    ax.set_title("carving criterion through depth")
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)


def read_carve(out: Path) -> tuple[dict, list[dict]]:
    """The settings and measured levels (decided ones, then those measured above them) of an earlier carve.json
    in `out` (({}, []) when none)."""
    path = out / "carve.json"
    if not path.is_file():
        return {}, []
    data = json.loads(path.read_text())
    return data.get("settings", {}), data.get("levels", []) + data.get("measured_above", [])
