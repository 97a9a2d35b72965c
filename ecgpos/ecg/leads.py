"""The one canonical 12-lead order, and mapping any lead naming onto it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ecgpos.errors import SignalError

CANONICAL_LEADS: tuple[str, ...] = (
    "I",
    "II",
    "III",
    "aVR",
    "aVL",
    "aVF",
    "V1",
    "V2",
    "V3",
    "V4",
    "V5",
    "V6",
)

# Aliases seen in the wild (CODE-15 uses DI/DII/DIII; PTB-XL upper-cases aVR/aVL/aVF).
_ALIASES = {
    "di": "i",
    "dii": "ii",
    "diii": "iii",
    "d1": "i",
    "d2": "ii",
    "d3": "iii",
    "lead i": "i",
    "lead ii": "ii",
    "lead iii": "iii",
}
_BY_KEY = {name.lower(): name for name in CANONICAL_LEADS}


def canonical_lead_name(name: str) -> str:
    """Map a lead name ('AVR', 'DII', 'v1', ...) to its canonical spelling; raise on unknown names."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in _BY_KEY:
        raise SignalError("unknown_lead", f"lead name {name!r} is not one of the 12 standard leads")
    return _BY_KEY[key]


def lead_permutation(leads: Sequence[str]) -> list[int]:
    """Row index in `leads` of each canonical lead, in canonical order.

    Other leads beside all 12 (PTB's Frank leads vx/vy/vz, V7-V9, right-sided leads) are left out.
    While a standard lead is missing, a name outside them is reported as unknown_lead: it is most
    likely the missing lead misspelt. Raises SignalError('duplicate_lead' | 'missing_lead' | 'unknown_lead').
    """
    seen: dict[str, int] = {}
    unknown: list[SignalError] = []
    for row, lead in enumerate(leads):
        try:
            name = canonical_lead_name(lead)
        except SignalError as err:
            unknown.append(err)
            continue
        if name in seen:
            raise SignalError("duplicate_lead", f"lead {name} appears more than once")
        seen[name] = row
    missing = [name for name in CANONICAL_LEADS if name not in seen]
    if missing and unknown:
        raise unknown[0]
    if missing:
        raise SignalError("missing_lead", f"missing lead(s) {', '.join(missing)}")
    return [seen[name] for name in CANONICAL_LEADS]


def to_canonical_order(signal: np.ndarray, leads: Sequence[str]) -> np.ndarray:
    """The 12 canonical rows of a (leads, time) array, in CANONICAL_LEADS order (no copy when it
    already is exactly that)."""
    if signal.ndim != 2 or signal.shape[0] != len(leads):
        raise SignalError("shape", f"signal shape {signal.shape} does not match {len(leads)} lead names")
    perm = lead_permutation(leads)
    return signal if perm == list(range(signal.shape[0])) else signal[perm]
