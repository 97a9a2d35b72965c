"""The signal pipeline against scipy references and analytic signals."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import signal as sps

from ecgpos.ecg.leads import CANONICAL_LEADS, to_canonical_order
from ecgpos.ecg.signal import (
    bandpass,
    bandpass_sos,
    check_finite,
    dead_leads,
    preprocess_signal,
    resample,
    resample_factors,
    resampled_length,
    standardise,
)
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.errors import SignalError

RATES = (500, 400, 1000, 100)


def tone(freq: float, fs: float, seconds: float = 10.0) -> np.ndarray:
    t = np.arange(int(seconds * fs)) / fs
    return np.sin(2 * np.pi * freq * t).astype(np.float32)


def middle(x: np.ndarray) -> np.ndarray:
    """The central half: away from the filter's edge transients."""
    n = x.shape[-1]
    return x[..., n // 4 : 3 * n // 4]


@pytest.mark.parametrize("fs", RATES)
def test_bandpass_equals_scipy_sosfiltfilt(fs):
    x = np.random.default_rng(fs).normal(size=(12, 10 * fs)).astype(np.float32)
    lowpass = min(40.0, fs / 2)
    sos = bandpass_sos(float(fs), 0.67, lowpass, 4)
    reference = sps.sosfiltfilt(sos, x.astype(np.float64), axis=-1).astype(np.float32)
    np.testing.assert_array_equal(bandpass(x, fs, 0.67, lowpass, 4), reference)
    assert bandpass(x[3], fs, 0.67, lowpass, 4).shape == (10 * fs,)  # 1-D in, 1-D out


@pytest.mark.parametrize("fs", RATES)
def test_ten_hz_passes_and_drift_is_removed(fs):
    lowpass = min(40.0, fs / 2)
    passed = middle(bandpass(tone(10, fs), fs, 0.67, lowpass))
    assert np.sqrt(2) * passed.std() == pytest.approx(1.0, abs=0.02)
    drift = middle(bandpass(2.0 * tone(0.1, fs, seconds=20), fs, 0.67, lowpass))
    assert np.abs(drift).max() < 0.02 * 2.0  # > 34 dB down


@pytest.mark.parametrize("fs", (500, 400, 1000))
def test_sixty_hz_is_attenuated(fs):
    out = middle(bandpass(tone(60, fs), fs))
    # order-4 Butterworth at 40 Hz, applied forward and backward: |H(60)|^2 = 1 / (1 + 1.5**8) = 0.038
    assert np.sqrt(2) * out.std() < 0.05
    assert np.sqrt(2) * out.std() > 0.02  # and it is the Butterworth response, not a wall


@pytest.mark.parametrize("fs", RATES)
def test_resample_equals_resample_poly_and_lengths_are_exact(fs):
    x = np.random.default_rng(fs).normal(size=(12, 10 * fs)).astype(np.float32)
    up, down = resample_factors(fs, 250)
    np.testing.assert_array_equal(resample(x, fs, 250), sps.resample_poly(x, up, down, axis=-1))
    assert resample(x, fs, 250).shape == (12, 2500)
    for n in (10 * fs - 1, 7 * fs, 7 * fs + 3):
        assert resample(x[:, :n], fs, 250).shape[-1] == resampled_length(n, fs, 250)


def test_resample_keeps_a_low_tone():
    y = resample(tone(5, 400)[None], 400, 250)[0]
    np.testing.assert_allclose(middle(y), middle(tone(5, 250)), atol=1e-3)


def test_irrational_rate_is_refused():
    with pytest.raises(SignalError) as err:
        resample_factors(333.3333, 250)
    assert err.value.reason == "sampling_rate"


def test_standardise_modes_and_flat_lead():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(12, 1000)) * np.arange(1, 13)[:, None] + 5).astype(np.float32)
    x[4] = 3.0  # flat
    y = standardise(x, "lead")
    assert np.isfinite(y).all()
    assert np.all(y[4] == 0)
    live = np.delete(np.arange(12), 4)
    np.testing.assert_allclose(y[live].mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(y[live].std(axis=1), 1, atol=1e-4)
    r = standardise(x, "record")
    assert r.mean() == pytest.approx(0, abs=1e-5) and r.std() == pytest.approx(1, abs=1e-4)
    assert np.isfinite(standardise(np.zeros((12, 100), np.float32), "record")).all()


def test_check_finite():
    x = np.ones((12, 100), np.float32)
    check_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[3, 7] = bad
        with pytest.raises(SignalError) as err:
            check_finite(y)
        assert err.value.reason == "non_finite"


@pytest.mark.parametrize("fs", RATES)
def test_preprocess_signal_shapes_dead_leads_and_lead_order(fs):
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(12, 10 * fs)) + 2 * tone(1.3, fs)).astype(np.float32)
    x[2] = 0.0  # an all-zero (dead) lead
    x[7] = 0.5 + 0.001 * rng.normal(size=10 * fs)  # constant offset with sub-10-uV noise: dead too
    assert list(np.flatnonzero(dead_leads(x))) == [2, 7]
    y = preprocess_signal(x, fs, CANONICAL_LEADS, DEFAULT_SPEC)
    assert y.dtype == np.float32 and y.shape == (12, 2500)
    assert np.isfinite(y).all()
    assert np.all(y[2] == 0) and np.all(y[7] == 0)
    live = [i for i in range(12) if i not in (2, 7)]
    assert np.all(np.abs(y[live].std(axis=1) - 1) < 0.05)
    # Upper-case names in another order give the same result.
    order = rng.permutation(12)
    names = [CANONICAL_LEADS[i].upper() for i in order]
    np.testing.assert_array_equal(preprocess_signal(x[order], fs, names, DEFAULT_SPEC), y)


@pytest.mark.parametrize("mode", ["lead", "record"])
def test_batch_is_bit_identical_to_one_record_at_a_time(shared_data, mode):
    """Shard building filters/resamples records in batches: each row must equal the lone-record result."""
    from dataclasses import replace
    from pathlib import Path

    from ecgpos.ecg.signal import preprocess_batch, screen
    from ecgpos.ecg.wfdb_fast import read_fast

    spec = replace(DEFAULT_SPEC, standardise=mode)
    paths = sorted(Path(shared_data, "ecg-arrhythmia").rglob("JS*.hea"))
    records = [read_fast(p.with_suffix("")) for p in paths]
    for start in range(0, len(records), 50):
        batch = records[start : start + 50]
        x = np.stack([r.signal for r in batch])
        dead = screen(x)
        y = preprocess_batch(x, batch[0].fs, spec, dead)
        assert y.dtype == np.float32 and y.shape == (len(batch), 12, 2500)
        for row, r in zip(y, batch):
            np.testing.assert_array_equal(row, preprocess_signal(r.signal, r.fs, r.leads, spec))


def test_screen_equals_check_finite_then_dead_leads():
    from ecgpos.ecg.signal import screen

    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 12, 1000)).astype(np.float32)
    x[0, 4] = 0.25
    x[2, 1] = 0.0
    np.testing.assert_array_equal(screen(x), dead_leads(x))
    assert screen(np.zeros((12, 0), np.float32)).shape == (12,)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[1, 5, 17] = bad
        with pytest.raises(SignalError) as err:
            screen(y)
        assert err.value.reason == "non_finite"


def test_extra_leads_beside_the_twelve_are_left_out_and_misspelt_ones_still_refused():
    rng = np.random.default_rng(0)
    twelve = rng.standard_normal((12, 50))
    extra = rng.standard_normal((3, 50))
    # PTB's 15-lead layout: the standard 12 in its spelling, then the Frank leads
    names = ["i", "ii", "iii", "avr", "avl", "avf", "v1", "v2", "v3", "v4", "v5", "v6", "vx", "vy", "vz"]
    order = [14, 3, 0, 12, 7, 1, 2, 13, 4, 5, 6, 8, 9, 10, 11]  # shuffled rows, Frank leads among them
    rows = np.concatenate([twelve, extra])[order]
    np.testing.assert_array_equal(to_canonical_order(rows, [names[i] for i in order]), twelve)
    reasons = {
        "unknown_lead": list(CANONICAL_LEADS[:11]) + ["V7"],  # V6 misspelt, or absent: never guessed
        "duplicate_lead": list(CANONICAL_LEADS) + ["v1"],
        "missing_lead": list(CANONICAL_LEADS[:11]),
    }
    for reason, leads in reasons.items():
        with pytest.raises(SignalError) as err:
            to_canonical_order(rng.standard_normal((len(leads), 50)), leads)
        assert err.value.reason == reason
