"""`ecgpos demo`: the whole method on a synthetic corpus, end to end, on a laptop CPU.

Simulated 12-lead ECGs (neurokit2) are written in the real on-disk layouts (ecg-arrhythmia WFDB
tree, CODE-15 exams.csv + HDF5), so the real readers run; then preprocess -> `ecgpos carve` to three
levels (two with --quick): level 0, then each level on the frozen ones below, and after each the
calibrated carving criterion on held-out records (carve's default stop rules decide; where they stop early the
demo carves on to its depth to show every level), a linear probe (the real protocol) and PoS geometry between
it and the level below (rhythm classes nominal, noisy recordings anomalous) -> a random-init probe for
comparison -> per-level reconstruction anomaly scores, of noisy records and of join records (mixes of two
rhythm classes) -> export + verify. It prints the per-level table (carve.md): criterion, probe AUROC with its
interval, geometry deltas, and the criterion beside the join-anomaly AUROC per level.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ecgpos.cli import run_command
from ecgpos.ecg.spec import DEFAULT_SPEC
from ecgpos.errors import EcgposError, Interrupted
from ecgpos.files import make_output_folder, user_path
from ecgpos.resources import config_path


@dataclass(frozen=True)
class DemoSize:
    """How much of everything: the quick mode must finish in under 3 minutes on 2 CPU cores."""

    wfdb_records: int
    code15_exams: int
    probe_per_class: int
    level0_steps: int
    latent_steps: int  # every level >= 1
    levels: int
    probe_epochs: int
    probe_seeds: int
    finetune_epochs: int = 0  # 0: no fine-tuned row


PROBE_TASK = "synthetic-rhythm"  # folder name = column name in the probe table
GEOMETRY_TASK = "synthetic-geometry"  # the probe set relabelled: clean rhythm classes vs noisy

QUICK = DemoSize(
    wfdb_records=24,
    code15_exams=12,
    probe_per_class=24,
    level0_steps=150,
    latent_steps=100,
    levels=2,
    probe_epochs=30,
    probe_seeds=2,
)
FULL = DemoSize(
    wfdb_records=96,
    code15_exams=48,
    probe_per_class=60,
    level0_steps=1500,
    latent_steps=1000,
    levels=3,
    probe_epochs=100,
    probe_seeds=5,
    finetune_epochs=10,
)


class Steps:
    """Numbered progress lines with elapsed time, flushed at once (the demo's progress display)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.monotonic()

    def __call__(self, text: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {text}  (t={time.monotonic() - self.start:.0f}s)", flush=True)


def _run(name: str, *argv: object) -> None:
    """Run an ecgpos command in-process; a failing step stops the demo with its message.

    Each step is the command a user types (the README's pipeline), run through run_command so that its
    errors and interrupts read as that command's; an interrupted step returns 130/143 and the demo says
    that the same demo command continues it. What the demo reads back are the steps' documents
    (summary.md, carve.json), the record a rerun continues from."""
    code = run_command(name, [str(a) for a in argv])
    if code in (130, 143):  # Ctrl-C, SIGTERM: the step has said what it kept, and a rerun picks up from there
        raise Interrupted(f"the same `ecgpos demo` command continues from its `{name}` step")
    if code != 0:
        raise EcgposError(f"demo step `ecgpos {name}` failed with exit code {code}")


def _carve(runs: Path, levels: int, *argv: object) -> str:
    """The carving step: `ecgpos carve` with its default stop rules into `runs`; when they stop before
    `levels` levels, carving goes on to `levels` with the rules off so that the demo shows every level.
    Returns the default rules' verdict. A level stopped by SIGUSR1/SIGTERM checkpoints and exits 0 (a
    scheduler requeues it), so the demo checks that every level was measured before it builds on them."""

    def carved() -> list[dict]:
        return json.loads((runs / "carve.json").read_text())["levels"] if (runs / "carve.json").is_file() else []

    _run("carve", *argv, "--run-dir", runs, "--max-levels", levels)
    done = carved()
    if not done or not done[-1]["decision"]["stop"]:
        raise Interrupted(f"carving stopped at level {len(done)}; the same `ecgpos demo` command continues it")
    last = done[-1]
    verdict = f"carve's default stop rules stopped after level {last['level']}: {last['decision']['reason']}."
    if len(done) < levels:
        verdict += f" The demo carves on to level {levels - 1} (--stop-below 0 --min-drop -1) to show every level."
        _run("carve", *argv, "--run-dir", runs, "--max-levels", levels, "--stop-below", 0, "--min-drop", -1)
        if len(carved()) < levels:
            raise Interrupted(f"carving stopped at level {len(carved())}; the same `ecgpos demo` command continues it")
    return verdict


def build_corpora(out: Path, size: DemoSize, seed: int) -> None:
    """Simulate and write the pretraining corpora and the labelled probe set (cached in out/raw)."""
    from ecgpos.demo import synthetic

    done = out / "raw" / ".complete"
    if done.exists() and json.loads(done.read_text()) == size.__dict__ | {"seed": seed}:
        return
    shutil.rmtree(out / "raw", ignore_errors=True)
    pretrain = synthetic.random_params(size.wfdb_records + size.code15_exams, seed)
    probe = synthetic.probe_params(size.probe_per_class, seed + 1)
    signals = synthetic.simulate_many(pretrain + probe)
    wfdb_signals = signals[: size.wfdb_records]
    code15_signals = signals[size.wfdb_records : len(pretrain)]
    synthetic.write_arrhythmia_tree(out / "raw" / "ecg-arrhythmia", wfdb_signals, seed=seed)
    synthetic.write_code15(
        out / "raw" / "code15",
        [synthetic.to_code15_trace(x, 500) for x in code15_signals],
        seed=seed,
        heart_rates=[p.heart_rate for p in pretrain[size.wfdb_records :]],
    )
    synthetic.write_probe_set(out / "raw" / PROBE_TASK, probe, signals[len(pretrain) :], seed=seed)
    done.write_text(json.dumps(size.__dict__ | {"seed": seed}))


def write_geometry_task(probe_root: Path, root: Path) -> Path:
    """The probe set as a geometry task: a clean recording keeps its rhythm class (nominal), a noisy
    one is labelled `noisy` only (anomalous), so every record carries exactly one chosen label.
    Also writes root/labels.csv (record_id,label) for `ecgpos score --labels`."""
    import pandas as pd

    from ecgpos.demo.synthetic import RHYTHM_CLASSES

    root.mkdir(parents=True, exist_ok=True)
    labels = []
    for split in ("train", "val", "test"):
        frame = pd.read_csv(probe_root / f"{split}.csv")
        frame["record"] = [str((probe_root / r).resolve()) for r in frame["record"]]
        frame.loc[frame["noisy"] == 1, list(RHYTHM_CLASSES)] = 0
        frame.to_csv(root / f"{split}.csv", index=False)
        for _, row in frame.iterrows():
            label = "noisy" if row["noisy"] else next(c for c in RHYTHM_CLASSES if row[c])
            labels.append((Path(row["record"]).name, label))
    pd.DataFrame(labels, columns=["record_id", "label"]).to_csv(root / "labels.csv", index=False)
    return root


def run_demo(out: Path, size: DemoSize, seed: int = 0) -> Path:
    """Run every step of the demo into `out`; returns the path of the probe summary."""
    step = Steps(8 if size.finetune_epochs else 7)
    out.mkdir(parents=True, exist_ok=True)
    step(
        f"simulating {size.wfdb_records} Ningbo-layout + {size.code15_exams} CODE-15-layout recordings "
        f"and a {3 * size.probe_per_class}-record labelled probe set (neurokit2 multi-lead ECGSYN)"
    )
    build_corpora(out, size, seed)
    shards = out / "shards"
    step(f"preprocessing both corpora into HDF5 shards ({DEFAULT_SPEC.describe()})")
    _run(
        "preprocess",
        "ecg-arrhythmia",
        "--src",
        out / "raw" / "ecg-arrhythmia",
        "--subset",
        "ningbo",
        "--out",
        shards / "ningbo",
        "--records-per-shard",
        64,
    )
    _run("preprocess", "code15", "--src", out / "raw" / "code15", "--out", shards / "code15", "--records-per-shard", 64)
    pool = [shards / "ningbo", shards / "code15"]
    runs = out / "runs"
    from ecgpos.demo.synthetic import RHYTHM_CLASSES

    probe_args = f"--fractions 100 --seeds {size.probe_seeds} --epochs {size.probe_epochs}"
    probe_args += f" --cache-dir {out / 'feature-cache'}"
    probe_task = f"custom:{out / 'raw' / PROBE_TASK}"
    geometry_task = write_geometry_task(out / "raw" / PROBE_TASK, out / "raw" / GEOMETRY_TASK)
    step(
        f"carving {size.levels} levels: level 0 ({size.level0_steps} steps), then each level on the frozen ones below "
        f"({size.latent_steps} steps); after each, the push-margin criterion on held-out records, a linear probe "
        "(brady/normal/tachy + noisy) and PoS geometry (rhythm classes nominal, noisy anomalous)"
    )
    verdict = _carve(
        runs,
        size.levels,
        "--config",
        config_path("tiny/level0"),
        "--latent-config",
        config_path("tiny/level1"),
        "--shards",
        *pool,
        "--set",
        "train.num_workers=0",
        "--set",
        f"optim.steps={size.level0_steps}",
        "--set",
        f"optim.warmup_steps={size.level0_steps // 10}",
        "--latent-set",
        f"optim.steps={size.latent_steps}",
        "--latent-set",
        f"optim.warmup_steps={size.latent_steps // 10}",
        "--probe-task",
        probe_task,
        "--probe-args",
        probe_args,
        "--geometry-task",
        f"custom:{geometry_task}",
        "--nominal",
        ",".join(RHYTHM_CLASSES),
        "--anomalous",
        "noisy",
        "--geometry-args",
        "--split all --device cpu",
    )
    top = runs / f"level{size.levels - 1}"
    step("linear probe of a random-init encoder, merged with every level's probe")
    _run(
        "probe",
        "--encoder",
        f"random:{config_path('tiny/level0')}",
        "--name",
        "random-init",
        "--out",
        out / "probes" / "random-init",
        "--task",
        probe_task,
        *probe_args.split(),
    )
    levels = [runs / "probes" / f"level{level}" for level in range(size.levels)]
    rows = [out / "probes" / "random-init", *levels]
    if size.finetune_epochs:  # the top level fine-tuned on the same task, one seed, beside its linear probe
        step(f"fine-tuning levels 0..{size.levels - 1} on the same task (one seed)")
        tuned = out / "probes" / "finetune"
        name = f"level{size.levels - 1} (finetune-full)"
        ft_args = ["--task", probe_task, "--fractions", 100, "--seeds", 1, "--epochs", size.finetune_epochs]
        _run("finetune", "--encoder", top, "--name", name, *ft_args, "--out", tuned)
        rows.append(tuned)
    else:
        print("--quick: fine-tuning skipped (`ecgpos demo` without --quick adds the fine-tuned row)")
    _run("probe", "--compare", *rows, "--out", out / "probes" / "summary")
    step("reconstruction anomaly scores per level: AUROC of noisy (off the union) and of join records vs clean")
    _run(
        "score",
        "--run",
        top,
        "--input",
        out / "raw" / PROBE_TASK / "records",
        "--out",
        out / "scores" / "scores.csv",
        "--labels",
        geometry_task / "labels.csv",
        "--nominal",
        ",".join(RHYTHM_CLASSES),
        "--anomalous",
        "noisy",
        "--no-progress",
    )
    from ecgpos.demo.joins import carving_table, join_aurocs, write_join_records

    joins = write_join_records(out / "raw" / PROBE_TASK, out / "raw" / "join", size.probe_per_class)
    _run("score", "--run", top, "--input", joins, "--out", out / "scores" / "join.csv", "--no-progress")
    aurocs = join_aurocs(
        out / "scores" / "scores.csv", geometry_task / "labels.csv", out / "scores" / "join.csv", list(RHYTHM_CLASSES)
    )
    (out / "scores" / "carving.md").write_text(carving_table(runs / "carve.json", aurocs, verdict))
    step(f"exporting the nested encoder (levels 0..{size.levels - 1})")
    export = out / "export" / "nested-encoder"
    _run("export", "--run-dir", top, "--out", export, "--probe-results", levels[-1])
    step("verifying the export against its test vectors")
    _run("verify", export)
    return out / "probes" / "summary"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecgpos demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=user_path, default=Path("demo-out"), help="output folder (default ./demo-out)")
    parser.add_argument(
        "--quick", action="store_true", help="smaller corpus and fewer steps, no fine-tuning (under 3 min)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpora (0 or more)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seed < 0:  # numpy's generators take no negative seed: a traceback after --out was made
        raise EcgposError(f"--seed must be 0 or more, got {args.seed}")
    make_output_folder(args.out)
    started = time.monotonic()
    summary = run_demo(args.out, QUICK if args.quick else FULL, args.seed)
    table = (args.out / "runs" / "carve.md").read_text()
    print()
    size = QUICK if args.quick else FULL
    print((summary / "summary.md").read_text())
    print((args.out / "runs" / "geometry" / f"level{size.levels - 1}" / "summary.md").read_text())
    print((args.out / "scores" / "scores.summary.md").read_text())
    print(table)
    print((args.out / "scores" / "carving.md").read_text())
    figures = sorted((args.out / "runs").glob("level*/figures/*.png"))
    print("Figures:")
    carved = [args.out / "runs" / "carve.png", *sorted((args.out / "runs" / "geometry").glob("level*/depth.png"))]
    for path in [*figures[-4:], *sorted(summary.glob("*.png")), *carved]:
        print(f"  {path}")
    print(f"Exported encoder: {args.out / 'export' / 'nested-encoder'}  (ecgpos.load_encoder(PATH))")
    print(f"demo finished in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0
