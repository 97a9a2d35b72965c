"""Content fingerprints of preprocessed ECG windows: the same recording under any id or file format.

A fingerprint is the first window (spec.window samples at spec.fs, zero-padded when shorter) of a
preprocessed record, block-averaged to 0.2 s blocks and quantised to one bit per block: above or not
above its lead's median block. 12 leads x 45 blocks = 540 bits, stored as 135 hex digits.

Why not a cryptographic hash of the window: copies of one recording in other releases are not
bit-identical (CPSC2018's original float64 mV vs the CinC copies rounded to 1 uV; float16 shards vs
float32 probe signals), and any exact hash of thousands of quantised samples flips when one sample
crosses a quantisation step. Block means average that noise away and a median split puts few
blocks near the threshold, so copies differ in a few bits while different recordings differ in
roughly half of them. Matching is by Hamming distance (`MAX_DISTANCE` of 540 bits, the same
fraction of the bits for other windows: `max_distance`), found through per-lead exact bands (a copy
keeps at least one lead's 45 bits intact), then verified on all bits. A window shorter than
`MIN_BLOCKS` blocks has no fingerprint (""): so few bits cannot tell recordings apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

BLOCK_SECONDS = 0.2
# bits out of 540. Measured on the sample records: copies (other id, other format, 1 uV rounding) 0-6,
# PTB-XL's 100 Hz vs 500 Hz release of one recording 0-38; different recordings (80,000 pairs of
# PTB-XL and ecg-arrhythmia samples) at least 84, median 270.
MAX_DISTANCE = 40
DEFAULT_BITS = 540  # 12 leads x 45 blocks: the 2250-sample window at 250 Hz that MAX_DISTANCE was measured on
MIN_BLOCKS = 10  # per lead (2 s)


def blocks_per_lead(fs: float, window: int) -> int:
    """Fingerprint bits per lead of a `window`-sample window at `fs` Hz."""
    return window // max(1, int(round(BLOCK_SECONDS * fs)))


def max_distance(fs: float, window: int, leads: int = 12) -> int:
    """The match threshold for fingerprints of this window: MAX_DISTANCE's fraction of the bits."""
    return int(round(MAX_DISTANCE * leads * blocks_per_lead(fs, window) / DEFAULT_BITS))


def hex_length(fs: float, window: int, leads: int = 12) -> int:
    """Hex digits of a fingerprint of this window (0: too short to have one)."""
    blocks = blocks_per_lead(fs, window)
    return 0 if blocks < MIN_BLOCKS else 2 * -(-leads * blocks // 8)


def fingerprint_problem(text: object, fs: float, window: int, leads: int = 12) -> str:
    """Why `text` cannot be a fingerprint of this window ('' when it can): the wrong length or not hex.
    A fingerprint a few digits short splits into other per-lead bands and matches nothing, which would
    read as "no overlap"; one too long or not hex cannot be compared at all."""
    want = hex_length(fs, window, leads)
    if not isinstance(text, str) or len(text) != want:
        got = len(text) if isinstance(text, str) else type(text).__name__
        return f"fingerprint of {got} hex digits, not the {want} of a {window}-sample window at {fs:g} Hz"
    if want and not all(c in "0123456789abcdefABCDEF" for c in text):
        return "fingerprint is not hexadecimal"
    return ""


def fingerprint(signal: np.ndarray, fs: float, window: int, dtype: str = "float16") -> str:
    """Hex fingerprint of a preprocessed (leads, T) record (the stored precision `dtype` applied first);
    "" when the window is shorter than MIN_BLOCKS blocks."""
    if blocks_per_lead(fs, window) < MIN_BLOCKS:
        return ""
    x = np.asarray(signal).astype(dtype).astype(np.float32)[:, :window]
    if x.shape[1] < window:
        x = np.pad(x, ((0, 0), (0, window - x.shape[1])))
    block = max(1, int(round(BLOCK_SECONDS * fs)))
    usable = window // block * block
    means = x[:, :usable].reshape(x.shape[0], -1, block).mean(axis=2)  # (leads, blocks)
    bits = means > np.median(means, axis=1, keepdims=True)
    return np.packbits(bits.reshape(-1)).tobytes().hex()


def _bits(hex_text: str) -> np.ndarray:
    return np.unpackbits(np.frombuffer(bytes.fromhex(hex_text), dtype=np.uint8))


def distance(a: str, b: str) -> int:
    """Hamming distance between two fingerprints (bits that differ)."""
    return int(np.count_nonzero(_bits(a) != _bits(b)))


@dataclass
class FingerprintIndex:
    """Fingerprints of a corpus (e.g. pretraining shards) with fast near-duplicate lookup."""

    leads: int = 12
    max_distance: int = MAX_DISTANCE  # the default threshold of `match`
    names: list[str] = field(default_factory=list)
    prints: list[str] = field(default_factory=list)
    _bands: dict[tuple[int, bytes], list[int]] = field(default_factory=dict)
    _bitrows: list[np.ndarray] = field(default_factory=list)

    def add(self, name: str, hex_print: str) -> None:
        bits = _bits(hex_print)
        if self._bitrows and len(bits) != len(self._bitrows[0]):  # would match nothing, silently
            raise ValueError(f"fingerprint of {name} has {len(bits)} bits, the index {len(self._bitrows[0])}")
        i = len(self.names)
        self.names.append(name)
        self.prints.append(hex_print)
        self._bitrows.append(bits)
        for key in self._band_keys(bits):
            self._bands.setdefault(key, []).append(i)

    def _band_keys(self, bits: np.ndarray) -> list[tuple[int, bytes]]:
        # a constant band (a dead lead stored as zeros) is shared by unrelated records: not a key
        return [
            (lead, np.packbits(band).tobytes())
            for lead, band in enumerate(np.array_split(bits, self.leads))
            if 0 < band.sum() < len(band)
        ]

    def extend(self, pairs: Iterable[tuple[str, str]]) -> None:
        """`add` each pair; fingerprints of one length are decoded and banded together (a whole corpus's
        in a few array operations: per record, `add` spends ~0.3 ms in numpy's per-call overhead)."""
        pairs = list(pairs)
        lengths = {len(hex_print) for _, hex_print in pairs}
        if len(lengths) != 1 or lengths.pop() % 2:  # mixed or odd lengths: each on its own (and its own error)
            for name, hex_print in pairs:
                self.add(name, hex_print)
            return
        self._add_same_length([name for name, _ in pairs], [hex_print for _, hex_print in pairs])

    def _add_same_length(self, names: list[str], prints: list[str]) -> None:
        """`add` for fingerprints of one length: the same names, bit rows and band keys, in the same order."""
        packed = np.frombuffer(bytes.fromhex("".join(prints)), dtype=np.uint8).reshape(len(prints), -1)
        bits = np.unpackbits(packed, axis=1)
        if self._bitrows and bits.shape[1] != len(self._bitrows[0]):  # as `add`: would match nothing, silently
            raise ValueError(f"fingerprints of {bits.shape[1]} bits added to an index of {len(self._bitrows[0])}")
        first = len(self.names)
        self.names.extend(names)
        self.prints.extend(prints)
        self._bitrows.extend(bits)
        for lead, columns in enumerate(np.array_split(np.arange(bits.shape[1]), self.leads)):
            band = bits[:, columns]
            ones = band.sum(axis=1)
            keys = np.packbits(band, axis=1)
            width = keys.shape[1]
            flat = keys.tobytes()
            for row in np.flatnonzero((ones > 0) & (ones < len(columns))):  # as _band_keys: no constant band
                self._bands.setdefault((lead, flat[row * width : (row + 1) * width]), []).append(first + int(row))

    def __len__(self) -> int:
        return len(self.names)

    def match(self, hex_print: str, max_distance: int | None = None) -> list[tuple[str, int]]:
        """(name, distance) of every indexed fingerprint within `max_distance` bits (default: the
        index's), nearest first."""
        max_distance = self.max_distance if max_distance is None else max_distance
        bits = _bits(hex_print)
        if self._bitrows and len(bits) != len(self._bitrows[0]):
            raise ValueError(f"a fingerprint of {len(bits)} bits looked up in an index of {len(self._bitrows[0])}")
        candidates: set[int] = set()
        for key in self._band_keys(bits):
            candidates.update(self._bands.get(key, ()))
        found = [(self.names[i], int(np.count_nonzero(self._bitrows[i] != bits))) for i in candidates]
        return sorted([f for f in found if f[1] <= max_distance], key=lambda f: f[1])
