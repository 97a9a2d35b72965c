"""What one `ecgpos probe` run returns to a caller in Python (carve, the demo): its output folder and
the rows of its results.csv as typed scores, so that no caller reads the CSV back."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ProbeScore:
    """One row of results.csv: an encoder's probe on one task, label fraction and seed. `mean_interval`
    is the 95 % bootstrap interval of the mean over seeds (the same in every seed's row; None without
    a bootstrap)."""

    encoder: str
    task: str
    fraction: float
    seed: int
    test_auroc: float
    mean_interval: tuple[float, float] | None


@dataclasses.dataclass(frozen=True)
class ProbeRun:
    """A finished probe run: the folder it wrote (results.csv, summary.md, ...) and its scores."""

    out: Path
    scores: tuple[ProbeScore, ...]

    def mean_test_auroc(self) -> float:
        """Test macro-AUROC averaged over every row (over seeds, for one task and fraction)."""
        return sum(score.test_auroc for score in self.scores) / len(self.scores)

    def mean_interval(self) -> tuple[float, float] | None:
        """The first row's interval of the seed mean (carve probes one task at one fraction)."""
        return self.scores[0].mean_interval if self.scores else None


def _number(value: object) -> float | None:
    number = float(value) if value not in (None, "") else math.nan  # type: ignore[arg-type]
    return None if math.isnan(number) else number


def probe_run(out: Path, rows: Sequence[Mapping[str, object]]) -> ProbeRun:
    """A ProbeRun from the rows written to `out`/results.csv (ecgpos.probes.shared.results.write_results)."""
    scores = []
    for row in rows:
        low, high = _number(row.get("mean_auroc_low")), _number(row.get("mean_auroc_high"))
        scores.append(
            ProbeScore(
                encoder=str(row["encoder"]),
                task=str(row["task"]),
                fraction=float(row["fraction"]),  # type: ignore[arg-type]
                seed=int(row["seed"]),  # type: ignore[call-overload]
                test_auroc=float(row["test_auroc"]),  # type: ignore[arg-type]
                mean_interval=(low, high) if low is not None and high is not None else None,
            )
        )
    return ProbeRun(out, tuple(scores))
