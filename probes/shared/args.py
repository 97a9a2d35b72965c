"""What the command lines of `ecgpos probe` and `ecgpos finetune` share: --fractions in percent, the
--bootstrap option and its check, and text flags left empty."""

from __future__ import annotations

import argparse

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.bootstrap import DEFAULT_RESAMPLES, MAX_RESAMPLES


def fractions_from_percent(text: str) -> list[str]:
    """--fractions 1,10,100 (percent) as the config's fractions: ['0.01', '0.1', '1']."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise EcgposError(f"--fractions expects percentages like 1,10,100, got {text!r}") from None
    if not values or any(not 0 < v <= 100 for v in values):
        raise EcgposError(f"--fractions must be percentages in (0, 100], got {text!r}")
    return [f"{v / 100:g}" for v in values]


def add_bootstrap_option(parser: argparse.ArgumentParser) -> None:
    """--bootstrap N: the resamples of every 95 % interval."""
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_RESAMPLES,
        metavar="N",
        help=f"stratified bootstrap resamples of the 95 %% intervals (default {DEFAULT_RESAMPLES}; 0: off; "
        f"at most {MAX_RESAMPLES})",
    )


def check_bootstrap(resamples: int) -> None:
    """--bootstrap in 0..MAX_RESAMPLES: the resamples' row indices are drawn at once, so a larger count
    failed in numpy after every probe had trained."""
    if not 0 <= resamples <= MAX_RESAMPLES:
        raise EcgposError(
            f"--bootstrap must be 0 (off) or a number of resamples up to {MAX_RESAMPLES}, got {resamples}"
        )


def check_text_flags(args: argparse.Namespace) -> None:
    """An empty --name/--reference/--fractions/--device (an unset shell variable) is an error, not the default."""
    for flag in ("name", "reference", "fractions", "device"):
        value = getattr(args, flag, None)
        if value is not None and not value.strip():
            raise EcgposError(f"--{flag} is empty; leave the flag out for its default")
