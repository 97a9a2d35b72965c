"""What `ecgpos score --labels` says about the labelled records its AUROC leaves out.

An AUROC over what is left after records are skipped, or after labelled ids match no record at all
(a typo, another naming scheme), reads like one over every labelled record; so each of the two groups
is named, on stderr and in the summary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def _listed(ids: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(ids[:limit])
    return shown + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def label_coverage(
    labels: Mapping[str, str], scored: Sequence[str], skipped: Sequence[tuple[str, str, str]], source: Path
) -> list[str]:
    """Lines naming the labelled ids that match no record of the input and the labelled records that
    were skipped (with their reasons); [] when every labelled id was scored."""
    scored_set = set(scored)
    reasons = {record_id: reason for record_id, reason, _ in skipped}
    dropped = [f"{rid} ({reasons[rid]})" for rid in labels if rid not in scored_set and rid in reasons]
    unmatched = [rid for rid in labels if rid not in scored_set and rid not in reasons]
    lines = []
    if dropped:
        lines.append(
            f"{len(dropped)} labelled record(s) of --labels {source} were skipped and are in no AUROC: "
            f"{_listed(dropped)}"
        )
    if unmatched:
        lines.append(
            f"{len(unmatched)} labelled id(s) of --labels {source} match no record of the input and are in no AUROC: "
            f"{_listed(unmatched)}"
        )
    return lines
