"""`ecgpos carve`'s decision and its record: whether to carve another level, and carve.json / carve.md / carve.png.

The decision after level l (0-based), with c_l the carving criterion measured on the pool's
validation records (ecgpos.objectives.criterion), checked in this order:
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
    """One carved level in carve.json."""

    level: int
    run_dir: str
    steps: int
    val_loss: float | None
    criterion: float
    interval: tuple[float, float]
    records: int
    decision: dict
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


def carve_markdown(settings: dict, levels: list[LevelRecord]) -> str:
    """The per-level table and the decision, as carve.md."""
    probe = settings.get("probe_task")
    task = str(probe).removeprefix("custom:").rstrip("/").rsplit("/", 1)[-1] if probe else None
    metrics = list(dict.fromkeys(m for r in levels for m in r.geometry))  # in geometry's order
    head = ["level", "run", "steps", "val loss", "criterion", "95 % CI", "records"]
    head += [f"probe AUROC ({task})", "95 % CI"] if probe else []
    head += [f"Delta {m} %" for m in metrics]
    head += ["decision"]
    lines = [
        "# Carving to depth",
        "",
        "Criterion: the fraction of the pool's validation records whose perturbed input's reconstruction at "
        "that level still violates the Push margin, alpha d(x~, x) > d(x^, x~) (configs/README.md, "
        '"The carving criterion"); 95 % percentile bootstrap interval over records. '
        f"Stop rules: below {settings['stop_below']:g}, a drop of less than {settings['min_drop']:g}, "
        f"or {settings['max_levels']} levels.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in levels:
        row = [str(r.level), f"`{r.run_dir}`", str(r.steps), _fmt(r.val_loss), _fmt(r.criterion)]
        row += [f"[{r.interval[0]:.4f}, {r.interval[1]:.4f}]", str(r.records)]
        if probe:
            ci = r.probe_interval
            row += [_fmt(r.probe_auroc), f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "-"]
        row += [f"{r.geometry[m]:+.2f}" if m in r.geometry else "-" for m in metrics]
        row += [r.decision["rule"]]
        lines.append("| " + " | ".join(row) + " |")
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
    """The criterion (with its interval) and, when measured, the probe AUROC against depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    depth = [r.level for r in levels]
    crit = [r.criterion for r in levels]
    err = [[c - r.interval[0] for c, r in zip(crit, levels)], [r.interval[1] - c for c, r in zip(crit, levels)]]
    ax.errorbar(depth, crit, yerr=err, marker="o", capsize=4, color="tab:red", label="push-margin violation")
    ax.set_xlabel("level")
    ax.set_ylabel("criterion (fraction of records)", color="tab:red")
    ax.set_xticks(depth)
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
