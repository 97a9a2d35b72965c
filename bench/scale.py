"""Benchmark: the paper's pretraining corpus simulated; each cost per record at several corpus sizes.

For each N of --sizes, writes a synthetic corpus of N records in the shard format `ecgpos preprocess`
leaves (shards, index.csv with fingerprints, preprocess.json; through the preprocessing's own shard
and manifest writers, generated 10 s 250 Hz signals instead of read and filtered ones) and measures:

- `ecgpos pretrain` (tiny level 0, fresh process) from launch to its first step's log line, and a
  resume from its checkpoint to the first step after it;
- the trainer's and each loader worker's peak RSS over --steps steps at 6 workers;
- the loader at 6 workers (bench/loader.py's measurement): its workers' start-up to the first batch, and
  its samples/s with the corpus in the page cache (the project's cost) and dropped from it (the disk's);
- the leakage guard: loading the N pretraining fingerprints as `ecgpos probe --pretraining-index`
  does at start-up (`ecgpos.probes.shared.leakage.load_pretraining`), then matching the fingerprints of a
  --probe-set-record probe set (CSN's size by default) against them as `task_overlap` does (random
  probe fingerprints, 1 % of them near-copies of pretraining records, which must all be found);

and once, on a --probe-records probe layout (PTB-XL's size by default: a `custom:` task of WFDB records
with split tables), `ecgpos geometry` and `ecgpos score` of a tiny two-level encoder. Prints one table of
each cost per record at each N; the last line is the worst growth of a per-record cost of the project
(the disk's random reads and the bench's own writing left out) from the smallest to the largest N.
Corpora are removed unless --keep.

    python bench/scale.py [--sizes 1000,10000,165000] [--work DIR] [--keep] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psutil  # noqa: E402
from loader import loader_costs  # noqa: E402

from ecgpos.ecg.fingerprint import fingerprint  # noqa: E402
from ecgpos.ecg.shards import shard_name, write_shard  # noqa: E402
from ecgpos.ecg.spec import PreprocessSpec  # noqa: E402
from ecgpos.errors import EcgposError  # noqa: E402
from ecgpos.preprocessing import ecg_arrhythmia, manifest  # noqa: E402
from ecgpos.preprocessing.build import BuildRequest  # noqa: E402
from ecgpos.preprocessing.records import RecordRef  # noqa: E402

CONFIG = ROOT / "configs" / "tiny" / "level0.yaml"
LENGTH = 2500  # samples: a 10 s record at the spec's 250 Hz
WORKERS = 6


# --- the synthetic corpus ------------------------------------------------------------------------------


def _signals(rng: np.random.Generator, n: int, spec: PreprocessSpec, length: int = LENGTH) -> np.ndarray:
    """(n, 12, length) standardised signals: a random walk's 50-sample wander plus noise, every lead
    distinct, so that fingerprints differ as those of different recordings do."""
    base = rng.standard_normal((n, len(spec.leads), length // 50), dtype=np.float32)
    x = np.repeat(base, 50, axis=-1) + 0.3 * rng.standard_normal((n, len(spec.leads), length), dtype=np.float32)
    x -= x.mean(axis=-1, keepdims=True)
    x /= x.std(axis=-1, keepdims=True)
    return x.astype(spec.dtype)


def write_corpus(out: Path, records: int, per_shard: int = 1000, seed: int = 0, prefix: str = "SIM") -> float:
    """A finished shard set of `records` synthetic records in `out`; returns the seconds it took."""
    started = time.perf_counter()
    spec = PreprocessSpec()
    req = BuildRequest(
        ecg_arrhythmia.NAME, Path(f"/simulated/{prefix}"), out, spec, records_per_shard=per_shard, max_dead_leads=2
    )
    refs = [RecordRef(f"{prefix}{i:07d}", f"{prefix}/{prefix}{i:07d}") for i in range(records)]
    chunks = [refs[i : i + per_shard] for i in range(0, records, per_shard)]
    out.mkdir(parents=True, exist_ok=True)
    plan = manifest.write_or_check_plan(out, req.settings(), refs, len(chunks), {}, req.sources())
    rng = np.random.default_rng(seed)
    for k, chunk in enumerate(chunks):
        x = _signals(rng, len(chunk), spec)
        rows = [
            {
                "shard": shard_name(k),
                "row": row,
                "source": ecg_arrhythmia.NAME,
                "record_id": ref.record_id,
                "patient_id": "",
                "age": "",
                "sex": "",
                "length": LENGTH,
                "dead_leads": "",
                "fingerprint": fingerprint(x[row], spec.fs, spec.window, spec.dtype),
                "duration_s": "10",
                "dx": "",
            }
            for row, ref in enumerate(chunk)
        ]
        ids = [ref.record_id for ref in chunk]
        write_shard(out / shard_name(k), list(x), ids, spec, attrs={"source": ecg_arrhythmia.NAME, "chunk": k})
        sidecar = {"chunk": k, "shard": shard_name(k), "found": len(chunk), "index": rows, "skipped": []}
        manifest.write_json(manifest.sidecar_path(out, k), {**sidecar, "long_records": 0}, compact=True)
    manifest.merge(out, plan, ecg_arrhythmia.INDEX_COLUMNS)
    return time.perf_counter() - started


# --- the probe layout: geometry and score -------------------------------------------------------------------

PROBE_FS, PROBE_SECONDS = 500, 10  # PTB-XL's records500


def _write_wfdb(folder: Path, name: str, digital: np.ndarray, leads: tuple[str, ...]) -> None:
    """One WFDB record (format 16, 1000 adu/mV) of digital samples (12, T), header checksums included:
    what `wfdb.wrsamp` writes, ~50x faster (its per-record overhead would take the bench 20 minutes)."""
    frames = np.ascontiguousarray(digital.T, dtype="<i2")
    frames.tofile(folder / f"{name}.dat")
    sums = frames.sum(axis=0, dtype=np.int64) & 0xFFFF
    lines = [f"{name} {len(leads)} {PROBE_FS} {frames.shape[0]}"] + [
        f"{name}.dat 16 1000.0(0)/mV 16 0 {frames[0, k]} {sums[k]} 0 {lead}" for k, lead in enumerate(leads)
    ]
    (folder / f"{name}.hea").write_text("\n".join(lines) + "\n")


def write_probe_layout(root: Path, records: int, seed: int = 2) -> float:
    """A `custom:<root>` probe task of `records` WFDB records (500 Hz, 10 s, 12 leads, limb leads derived
    from I and II as a recorder derives them) and its split tables (`write_probe_tables`, the demo's
    probe set writer; random rhythm classes, every second record noisy). Returns the seconds it took."""
    from ecgpos.demo.synthetic import RHYTHM_CLASSES, write_probe_tables
    from ecgpos.ecg.leads import CANONICAL_LEADS
    from ecgpos.ecg.limbs import derived_limb_leads

    started = time.perf_counter()
    folder = root / "records"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for first in range(0, records, 500):
        block = _signals(rng, min(500, records - first), PreprocessSpec(), PROBE_FS * PROBE_SECONDS).astype(np.float32)
        block[:, 2:6] = np.moveaxis(derived_limb_leads(block[:, 0], block[:, 1]), 0, 1)
        for k, x in enumerate(np.rint(block * 500).astype(np.int16)):  # about 0.5 mV per standard deviation
            name = f"probe{first + k:06d}"
            _write_wfdb(folder, name, x, CANONICAL_LEADS)
            rhythm = RHYTHM_CLASSES[int(rng.integers(len(RHYTHM_CLASSES)))]
            rows.append({"record": f"records/{name}", **{c: int(c == rhythm) for c in RHYTHM_CLASSES}, "noisy": k % 2})
    write_probe_tables(root, rows, [{"record": row["record"]} for row in rows], seed)
    return time.perf_counter() - started


def probe_costs(work: Path, records: int) -> dict[str, float]:
    """Seconds to write a `records`-record probe layout, and of `ecgpos geometry` and `ecgpos score` on all
    of it with a tiny two-level encoder (a few steps of the tiny configs: the bench measures cost, not quality)."""
    write_corpus(work / "encoder-corpus", 256, per_shard=128, prefix="ENC")
    runs = work / "encoder-runs"
    for level in (0, 1):
        cmd = [
            sys.executable, "-m", "ecgpos", "pretrain", "--level", str(level), "--config", f"tiny/level{level}",
            "--shards", str(work / "encoder-corpus"), "--run-dir", str(runs / f"level{level}"),
            "--set", "optim.steps=4", "--set", "train.num_workers=0", "--set", "train.figure_every=4",
        ] + (["--base", str(runs / "level0")] if level else [])  # fmt: skip
        _timed(cmd)
    got = {"probe_write": write_probe_layout(work / "probe", records)}
    print(f"probe layout of {records} records written", file=sys.stderr, flush=True)
    got["geometry"] = _timed(
        [sys.executable, "-m", "ecgpos", "geometry", "--encoder", str(runs / "level1"), "--task",
         f"custom:{work / 'probe'}", "--nominal", "normal,brady", "--anomalous", "tachy", "--split", "all",
         "--device", "cpu", "--out", str(work / "geometry")]
    )  # fmt: skip
    got["score"] = _timed(
        [sys.executable, "-m", "ecgpos", "score", "--run", str(runs / "level1"), "--input",
         str(work / "probe" / "records"), "--out", str(work / "scores.csv"), "--device", "cpu", "--no-progress"]
    )  # fmt: skip
    with open(work / "scores.csv") as handle:
        scored = sum(1 for _ in handle) - 1
    if scored != records:
        raise EcgposError(f"ecgpos score scored {scored} of the {records} probe records")
    return got


# --- pretraining: start-up, resume, memory ---------------------------------------------------------------


class PeakRss(threading.Thread):
    """Peak RSS of a process and of each of its descendants, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.peak: dict[int, int] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), proc.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass


def _pretrain(shards: Path, run_dir: Path, steps: int, until: int, resume: bool) -> tuple[float, float, dict]:
    """Run `ecgpos pretrain`; after the log line of step `until` ask it to checkpoint and stop (USR1).
    Returns (seconds to the first step's log line, seconds to step `until`'s, peak RSS by pid)."""
    cmd = [
        sys.executable, "-m", "ecgpos", "pretrain", "--level", "0", "--config", str(CONFIG),
        "--shards", str(shards), "--run-dir", str(run_dir), "--resume", "auto",
        "--set", f"optim.steps={steps}", "--set", "train.log_every=1", "--set", f"train.num_workers={WORKERS}",
        "--set", f"train.checkpoint_every={steps}", "--set", f"train.figure_every={steps}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    rss = PeakRss(proc.pid)
    rss.start()
    first = last = None
    tail: list[str] = []
    for line in proc.stdout:
        tail = [*tail[-20:], line]
        if line.startswith("step "):
            if first is None:
                first = time.perf_counter() - started
            if int(line.split()[1].split("/")[0]) >= until and last is None:
                last = time.perf_counter() - started
                proc.send_signal(signal.SIGUSR1)
    proc.wait()
    rss.done.set()
    rss.join()
    if proc.returncode != 0 or first is None or last is None:
        raise EcgposError(f"ecgpos pretrain failed ({proc.returncode}): {''.join(tail)[-2000:]}")
    if resume:
        return first, last, {}
    return first, last, {pid: value for pid, value in rss.peak.items() if pid != proc.pid} | {0: rss.peak[proc.pid]}


# --- the leakage guard ------------------------------------------------------------------------------------


def guard_costs(shards: Path, probe_records: int, seed: int = 1) -> tuple[float, float]:
    """(seconds to load the pretraining fingerprints, seconds to match the probe set against them)."""
    from ecgpos.probes.shared.leakage import load_pretraining

    loaded = float("inf")
    for _ in range(2):  # the faster of two loads: one run on this shared machine is noisy
        started = time.perf_counter()
        index = load_pretraining([shards], log=lambda _: None)
        loaded = min(loaded, time.perf_counter() - started)
    (prints,) = index.by_spec.values()
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, (probe_records, len(prints.prints[0]) * 4), dtype=np.uint8)
    copies = rng.choice(len(prints), size=max(1, probe_records // 100), replace=False)
    for k, source in enumerate(copies):  # a copy: its pretraining record with a few bits flipped
        bits[k] = np.unpackbits(np.frombuffer(bytes.fromhex(prints.prints[source]), dtype=np.uint8))
        bits[k, rng.choice(bits.shape[1] - 4, 5, replace=False)] ^= 1
    hexes = [np.packbits(row).tobytes().hex() for row in bits]
    started = time.perf_counter()
    found = [k for k, hex_print in enumerate(hexes) if prints.match(hex_print)]
    matched = time.perf_counter() - started
    if found != list(range(len(copies))):
        raise EcgposError(f"leakage guard found {len(found)} matches, {len(copies)} copies were planted")
    return loaded, matched


def _timed(cmd: list[str]) -> float:
    """Seconds a command takes, with one torch thread as the pretraining runs have (on this shared 2-core
    machine two threads made `ecgpos score` 4-5x slower than one)."""
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise EcgposError(f"{' '.join(cmd[2:5])} failed: {proc.stderr.strip()[-2000:]}")
    return time.perf_counter() - started


# --- the table ----------------------------------------------------------------------------------------------

# (row label, unit, per record or for the whole N)
ROWS = {
    "write": ("synthetic corpus written", "ms/record"),
    "startup": ("pretrain start-up to first step", "ms/record"),
    "resume": ("resume to first step", "ms/record"),
    "rss_trainer": ("trainer peak RSS", "kB/record"),
    "rss_worker": ("loader worker peak RSS (max)", "kB/record"),
    "first_batch": ("loader: 6 workers started, first batch", "ms/record"),
    "loader_spread": ("loader at 6 workers, 1,000 records spread over the corpus", "samples/s"),
    "loader_cpu": ("  its CPU time (workers + trainer)", "ms/sample"),
    "loader": ("loader at 6 workers, all N records, in the page cache", "samples/s"),
    "loader_all_cpu": ("  its CPU time (workers + trainer)", "ms/sample"),
    "loader_disk": ("loader at 6 workers, all N records, from the disk", "samples/s"),
    "guard_load": ("guard: load N fingerprints (probe start-up)", "us/record"),
    "guard_match": ("guard: match the probe set", "us/(probe x N/1000)"),
}
SCALE = {
    "write": 1e3, "startup": 1e3, "resume": 1e3, "rss_trainer": 1e-3, "rss_worker": 1e-3, "first_batch": 1e3,
    "guard_load": 1e6,
}  # fmt: skip
RATES = ("loader_spread", "loader", "loader_disk")  # samples/s: their growth is a slowdown
CPU_PER_SAMPLE = ("loader_cpu", "loader_all_cpu")
# the bench's own writing; data spread over N records, whose reads cost what the memory or disk makes them
NOT_THE_PROJECT = ("write", "loader", "loader_all_cpu", "loader_disk")


def measure(n: int, work: Path, steps: int, probe_records: int, loader_batches: int, keep: bool) -> dict[str, float]:
    corpus, run_dir = work / f"corpus-{n}", work / f"run-{n}"
    shutil.rmtree(run_dir, ignore_errors=True)
    got = {"write": write_corpus(corpus, n)} if not (corpus / "preprocess.json").is_file() else {"write": float("nan")}
    print(f"N={n}: corpus written", file=sys.stderr, flush=True)
    got["startup"], _, rss = _pretrain(corpus, run_dir, 2 * steps, steps, resume=False)
    got["resume"], _, _ = _pretrain(corpus, run_dir, 2 * steps, steps + 1, resume=True)
    got["rss_trainer"] = rss.pop(0)
    got["rss_worker"] = max(rss.values(), default=0)
    got["rss_trainer_mb"], got["rss_worker_mb"] = got["rss_trainer"] / 2**20, got["rss_worker"] / 2**20
    print(f"N={n}: pretrain measured", file=sys.stderr, flush=True)
    got.update(loader_costs(corpus, n, loader_batches, WORKERS, PreprocessSpec().window))
    got["guard_load"], got["guard_match"] = guard_costs(corpus, probe_records)
    got["startup_s"], got["resume_s"], got["guard_s"] = (
        got["startup"],
        got["resume"],
        got["guard_load"] + got["guard_match"],
    )
    if not keep:
        shutil.rmtree(corpus)
    return got


def per_record(name: str, value: float, n: int, probe_records: int) -> float:
    if name in RATES:
        return value
    if name in CPU_PER_SAMPLE:
        return value * 1e3
    if name == "guard_match":  # each probe record is compared with the N pretraining ones
        return value * 1e6 / probe_records / (n / 1000)
    return value * SCALE[name] / n


def table(results: dict[int, dict[str, float]], probe_records: int) -> tuple[list[str], float, str]:
    sizes = sorted(results)
    lines = [
        "| cost | unit | " + " | ".join(f"N={n:,}" for n in sizes) + " | growth |",
        "|---|---|" + "---|" * (len(sizes) + 1),
    ]
    worst, worst_name = 0.0, ""
    for name, (label, unit) in ROWS.items():
        values = [per_record(name, results[n][name], n, probe_records) for n in sizes]
        if not np.isfinite(values).any():  # not measured in this run (a corpus kept from an earlier one)
            continue
        growth = values[-1] / values[0] if values[0] > 0 else float("nan")
        if name in RATES:
            growth = values[0] / values[-1] if values[-1] > 0 else float("nan")
        if name not in NOT_THE_PROJECT and np.isfinite(growth) and growth > worst:
            worst, worst_name = growth, label
        lines.append(f"| {label} | {unit} | " + " | ".join(f"{v:.4g}" for v in values) + f" | {growth:.2f}x |")
    return lines, worst, worst_name


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,165000", help="corpus sizes N, comma-separated")
    parser.add_argument("--records", type=int, help="only write a corpus of this many records to --work and exit")
    parser.add_argument("--work", type=Path, help="folder for corpora and runs (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora (and runs)")
    parser.add_argument("--steps", type=int, default=200, help="tiny level-0 steps before memory is read")
    parser.add_argument("--probe-set-records", type=int, default=45_000, help="leakage guard probe set (CSN)")
    parser.add_argument("--loader-batches", type=int, default=100, help="loader batches timed after its warm-up")
    parser.add_argument(
        "--probe-records", type=int, default=20_000, help="records of the probe layout for geometry and score (PTB-XL)"
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if not sizes or sizes[0] < 64:
        raise EcgposError(f"--sizes must list corpus sizes of at least 64 records, got {args.sizes!r}")
    work = args.work or Path(tempfile.mkdtemp(prefix="ecgpos-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.records:
        seconds = write_corpus(work / f"corpus-{args.records}", args.records)
        print(f"wrote {args.records} records to {work / f'corpus-{args.records}'} in {seconds:.1f} s")
        return
    load = os.getloadavg()[0]
    try:
        results = {
            n: measure(n, work, args.steps, args.probe_set_records, args.loader_batches, args.keep) for n in sizes
        }
        probe = probe_costs(work, args.probe_records)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    lines, worst, worst_name = table(results, args.probe_set_records)
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
        f"tiny level 0, {args.steps} steps"
    )
    print("\n".join(lines))
    for n in sizes:
        r = results[n]
        print(
            f"N={n}: start-up {r['startup_s']:.1f} s, resume {r['resume_s']:.1f} s, trainer RSS "
            f"{r['rss_trainer_mb']:.0f} MB, worker RSS {r['rss_worker_mb']:.0f} MB, leakage guard "
            f"{r['guard_s']:.1f} s ({args.probe_set_records} x {n}); loader {r['loader']:.0f} samples/s with "
            f"{100 * r['cached_share']:.0f} % of the corpus cached, {r['loader_disk']:.0f} with "
            f"{100 * r['uncached_share']:.0f} %"
        )
    m, geometry_s, score_s = args.probe_records, probe["geometry"], probe["score"]
    print(
        f"probe layout, {m} records (500 Hz, 10 s): written in {probe['probe_write']:.1f} s; "
        f"ecgpos geometry (2 levels) {geometry_s:.1f} s ({geometry_s / m * 1e3:.2f} ms/record); "
        f"ecgpos score (2 levels, 8 masks) {score_s:.1f} s ({score_s / m * 1e3:.2f} ms/record)"
    )
    print(f"worst growth {sizes[0]} -> {sizes[-1]} records: {worst:.2f}x ({worst_name})")


if __name__ == "__main__":
    try:
        main()
    except EcgposError as err:
        sys.exit(str(err))
