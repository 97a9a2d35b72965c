"""FingerprintIndex.extend (a corpus's fingerprints at once) builds exactly what `add` one by one builds."""

from __future__ import annotations

import numpy as np
import pytest

from ecgpos.ecg.fingerprint import FingerprintIndex


def _prints(rng: np.random.Generator, n: int, bits: int = 540) -> list[str]:
    rows = rng.integers(0, 2, (n, bits), dtype=np.uint8)
    rows[0, :45] = 0  # a dead lead: a constant band is no key
    rows[1, 45:90] = 1
    rows[2:4] = rows[1]  # equal prints share every band
    return [np.packbits(row).tobytes().hex() for row in rows]


@pytest.mark.parametrize("bits", [540, 96])
def test_extend_builds_what_add_builds(bits: int) -> None:
    rng = np.random.default_rng(0)
    prints = _prints(rng, 300, bits)
    names = [f"r{i}" for i in range(len(prints))]
    one, many = FingerprintIndex(), FingerprintIndex()
    many.add("first", prints[5])  # extend appends after what the index holds
    one.add("first", prints[5])
    for name, hex_print in zip(names, prints):
        one.add(name, hex_print)
    many.extend(zip(names, prints))
    assert many.names == one.names and many.prints == one.prints
    assert many._bands == one._bands
    assert all(np.array_equal(a, b) for a, b in zip(many._bitrows, one._bitrows))
    for hex_print in prints[:20]:
        assert many.match(hex_print) == one.match(hex_print)


def test_extend_of_mixed_or_malformed_prints_behaves_as_add() -> None:
    # a fingerprint of another length than the index's would match nothing: refused, one by one or together
    with pytest.raises(ValueError, match="bits"):
        FingerprintIndex().extend([("a", "ff" * 68), ("b", "0f" * 10)])
    index = FingerprintIndex()
    index.add("a", "ff" * 68)
    with pytest.raises(ValueError, match="bits"):
        index.extend([("b", "0f" * 10), ("c", "f0" * 10)])
    with pytest.raises(ValueError):
        FingerprintIndex().extend([("a", "abc"), ("b", "def")])
    with pytest.raises(ValueError):
        FingerprintIndex().add("a", "abc")
