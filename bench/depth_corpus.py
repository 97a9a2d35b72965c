"""The depth study's synthetic corpus (bench/depth_study.py): a union of rhythm classes with their own
morphologies, and held-out anomalies that lie between the classes (join) or off their union.

Made with the demo's simulator (neurokit2 ECGSYN, 9 s at 250 Hz) and preprocessed as `ecgpos preprocess`
does; the pretraining pool is written as one shard in the layout `ecgpos preprocess` writes.
"""

import json
from pathlib import Path

import numpy as np

FS, SECONDS = 250, 9.0
RATES = {"brady": (42, 56), "normal": (64, 92), "tachy": (108, 148)}
CLASSES = list(RATES)


def morphology(c: int) -> np.ndarray:
    """Class c's fixed lead-mixing matrix (12, 12): identity plus a random mix, three leads sign-flipped."""
    rng = np.random.default_rng(1000 + c)
    mix = np.eye(12) + 0.6 * rng.standard_normal((12, 12)) / np.sqrt(12)
    mix[rng.choice(12, 3, replace=False)] *= -1
    return mix.astype(np.float32)


def simulate_corpus(size, seed: int = 0) -> dict[str, list[np.ndarray]]:
    """Preprocessed (12, 2250) windows by group: pool, nominal (eval), join, off; pool and nominal
    class by class in CLASSES' order (record_classes). `size`: pool_per_class, eval_per_class, anomalies."""
    from ecgpos.demo.synthetic import SEED_RANGE, SimulationParams, simulate_many
    from ecgpos.ecg.signal import preprocess_batch
    from ecgpos.ecg.spec import DEFAULT_SPEC

    rng = np.random.default_rng(seed)
    classes = CLASSES
    jobs: list[tuple[str, int, SimulationParams]] = []  # (group, morphology class, params)

    def add(group: str, morph: int, rate_class: int, n: int) -> None:
        for _ in range(n):
            sim_seed = int(rng.integers(0, SEED_RANGE))
            hr = float(rng.uniform(*RATES[classes[rate_class]]))
            jobs.append((group, morph, SimulationParams(sim_seed, hr, float(rng.uniform(0.5, 4)), 0.01, SECONDS, FS)))

    for c in range(3):
        add("pool", c, c, size.pool_per_class)
        add("nominal", c, c, size.eval_per_class)
    for k in range(size.anomalies):  # morphology of one class at the rate of another
        c = k % 3
        add("rate-swap", c, (c + 1 + k % 2) % 3, 1)
    signals = simulate_many([p for _, _, p in jobs])
    out: dict[str, list[np.ndarray]] = {}
    for (group, morph, _), x in zip(jobs, signals):
        y = preprocess_batch((morphology(morph) @ x)[None], FS, DEFAULT_SPEC)[0][:, : int(FS * SECONDS)]
        out.setdefault(group, []).append(y.astype(np.float32))
        out.setdefault(f"class-{group}", []).append(np.float32(morph))  # type: ignore[arg-type]
    nominal, by_class = out["nominal"], [int(c) for c in out["class-nominal"]]
    mixes, noisy, swapped = [], [], []
    for k in range(size.anomalies):
        a = nominal[k % len(nominal)]
        b = next(x for x, c in zip(nominal[::-1], by_class[::-1]) if c != by_class[k % len(nominal)])
        m = a + b
        mixes.append(((m - m.mean(1, keepdims=True)) / (m.std(1, keepdims=True) + 1e-6)).astype(np.float32))
        noisy.append((a + rng.standard_normal(a.shape).astype(np.float32)).astype(np.float32))
        s = a.copy()
        s[[6, 10]] = s[[10, 6]]
        swapped.append(s)
    return {
        "pool": out["pool"],
        "nominal": nominal,
        "join": out["rate-swap"] + mixes,
        "off": noisy + swapped,
    }


def write_pool(windows: list[np.ndarray], folder: Path) -> Path:
    """The pretraining pool as one shard in the layout `ecgpos preprocess` writes."""
    import csv

    from ecgpos.ecg.shards import shard_name, write_shard
    from ecgpos.ecg.spec import DEFAULT_SPEC

    folder.mkdir(parents=True, exist_ok=True)
    ids = [f"DEPTH{i:05d}" for i in range(len(windows))]
    write_shard(folder / shard_name(0), windows, ids, DEFAULT_SPEC, {"source": "depth-study", "chunk": 0})
    fields = ["shard", "row", "source", "record_id", "patient_id", "age", "sex", "length", "labels"]
    with (folder / "index.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(fields)
        writer.writerows(
            [shard_name(0), i, "depth-study", rid, rid, "", "", x.shape[1], ""]
            for i, (rid, x) in enumerate(zip(ids, windows))
        )
    meta = {
        "spec": DEFAULT_SPEC.to_dict(),
        "source": "depth-study",
        "counts": {"written": len(ids)},
        "version": "bench",
    }
    (folder / "preprocess.json").write_text(json.dumps(meta))
    return folder


def record_classes(size, group: str) -> np.ndarray:
    """The class index of each record of `group` (pool or nominal), as simulate_corpus orders them."""
    per_class = size.pool_per_class if group == "pool" else size.eval_per_class
    return np.repeat(np.arange(len(CLASSES)), per_class)
