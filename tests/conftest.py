"""Shared fixtures: the real sample data (one place), and artefacts built once per session."""

from __future__ import annotations

import os

# The suite runs on the CPU, as CI does, also on a machine with a GPU: its exact comparisons (resume,
# processes, accumulation) rely on CPU determinism and fp32. CUDA is hidden here, before anything
# imports torch; tests/test_train_cuda.py runs its checks in subprocesses that see the real devices.
os.environ.setdefault("ECGPOS_TEST_CUDA_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "all"))
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import shutil  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from ecgpos.resources import DATA_ENV_VAR, sample_data_root  # noqa: E402

# Tests never use more threads than the 2-core CI machine has: one each, so that the two pytest-xdist
# workers of `make test` do not fight over its two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# `make test` runs the suite on pytest-xdist workers with `--dist loadfile`: each test module stays on one
# worker, so that its module-scoped fixtures (tiny runs, shards) are built once, as in a serial run. The
# modules tests/test_slurm*.py are one unit, run one after another on one worker, so that no two Slurm
# clusters (and their jobs, timed against requeue and preemption deadlines) share the machine; every test
# marked `slurm` lives there. The units are handed out in the order set below, the longest first (the Slurm
# unit, then modules with `slow` tests, then the rest in file order), so that no long module starts last
# while the other worker is idle.
SLURM_MODULES = "test_slurm"


def _unit(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return "slurm" if Path(module).name.startswith(SLURM_MODULES) else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlurmTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return SlurmTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    strays = [item.nodeid for item in items if item.get_closest_marker("slurm") and _unit(item.nodeid) != "slurm"]
    if strays:
        raise pytest.UsageError(f"tests marked `slurm` belong in tests/{SLURM_MODULES}*.py: {', '.join(strays)}")
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)

    def rank(unit: str) -> int:
        if unit == "slurm":
            return 0
        return 1 if any(item.get_closest_marker("slow") for item in units[unit]) else 2

    items[:] = [item for unit in sorted(units, key=rank) for item in units[unit]]


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]) -> Path:
    """`build(folder)` for a session fixture; its result is shared by all pytest-xdist workers.

    In a serial run `folder` is a fresh temporary folder. Under xdist the first worker to ask builds into a
    folder beside the workers' own temporary folders, under a file lock; the others wait for it and take
    the result. The fixtures built this way are read, never changed, by the tests that use them.
    """
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp().parent
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed to build it left this
            folder.mkdir(mode=0o700)  # owner-only, as pytest's own temporary folders
            done.write_text(str(build(folder)))
    return Path(done.read_text())


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """Accelerate keeps one process-wide state; a test that builds an Accelerator of its own (another
    precision, another device) must not decide the next test's, so each test ends with it cleared."""
    yield
    if "accelerate.state" in sys.modules:
        sys.modules["accelerate.state"].AcceleratorState._reset_state(True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Root of the real sample records ($ECGPOS_SAMPLE_DATA, default ../shared/data).

    Absent data skips the real-data tests, except under CI=true where it is a failure.
    """
    root = sample_data_root()
    if not (root / "ecg-arrhythmia").is_dir():
        message = f"real sample data not found at {root} (set {DATA_ENV_VAR})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return root


@pytest.fixture(scope="session")
def arrhythmia_shards(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards of all 200 real ecg-arrhythmia sample records, built once per session."""
    from ecgpos.cli import main

    def build(out: Path) -> Path:
        argv = ["preprocess", "ecg-arrhythmia", "--src", str(shared_data / "ecg-arrhythmia"), "--subset", "all"]
        assert main([*argv, "--out", str(out), "--records-per-shard", "64"]) == 0
        return out

    return built_once(tmp_path_factory, "arrhythmia-shards", build)


# Refusal tests (test_refusals*.py): a real record, tiny shards, a tiny run and its export.
@pytest.fixture(scope="module")
def real_record(shared_data) -> Path:
    return shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory) -> Path:
    from shard_fixtures import write_tiny_shards

    return write_tiny_shards(tmp_path_factory.mktemp("refusal-shards") / "shards", n_records=24, records_per_shard=12)


@pytest.fixture(scope="module")
def tiny_run(tiny_shards, tmp_path_factory) -> Path:
    """A 4-step level-0 run with checkpoints at steps 2 and 4."""
    from tiny_runs import pretrain_tiny

    out = tmp_path_factory.mktemp("refusal-run") / "run"
    steps = ["optim.steps=4", "train.batch_size=4", "train.num_workers=0", "train.checkpoint_every=2"]
    return pretrain_tiny(0, tiny_shards, out, *(arg for s in steps for arg in ("--set", s)))


@pytest.fixture(scope="module")
def export(tiny_run, tmp_path_factory) -> Path:
    from ecgpos.cli import main

    out = tmp_path_factory.mktemp("refusal-export") / "enc"
    assert main(["export", "--run-dir", str(tiny_run), "--out", str(out)]) == 0
    return out


# Pretraining tests (test_train_runs.py, test_train_stops.py, test_pretrain_refusals.py): 48 tiny records
# and a 40-step level-0 run.
@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shard_fixtures import write_tiny_shards

    return write_tiny_shards(tmp_path_factory.mktemp("tiny") / "shards", n_records=48, records_per_shard=20)


@pytest.fixture(scope="module")
def run0(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pretrain_helpers import RUN0, pretrain

    run = tmp_path_factory.mktemp("runs") / "level0"
    assert pretrain(0, shards, run, *RUN0) == 0
    return run


# Export and embed tests (test_export.py, test_embed.py): tiny runs of every level on the real
# ecg-arrhythmia samples and their exports, built once per session.
EXPORT_FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]


@pytest.fixture(scope="session")
def level0_run(arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import pretrain_tiny

    def build(folder: Path) -> Path:
        return pretrain_tiny(0, arrhythmia_shards, folder / "run", *EXPORT_FAST)

    return built_once(tmp_path_factory, "export-level0", build)


@pytest.fixture(scope="session")
def level1_run(level0_run: Path, arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import pretrain_tiny

    def build(folder: Path) -> Path:
        return pretrain_tiny(1, arrhythmia_shards, folder / "run", *EXPORT_FAST, base=level0_run)

    return built_once(tmp_path_factory, "export-level1", build)


@pytest.fixture(scope="session")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A probe-results folder as `ecgpos probe` writes it (results.csv only: the card must tabulate it)."""
    folder = tmp_path_factory.mktemp("probe-results")
    (folder / "results.csv").write_text("task,fraction,macro_auroc\nptbxl_super,0.01,0.6123\n")
    return folder


@pytest.fixture(scope="session")
def export0(level0_run: Path, probe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import cli

    def build(folder: Path) -> Path:
        out = folder / "level0"
        assert cli("export", "--run-dir", level0_run, "--out", out, "--onnx", "--probe-results", probe_dir) == 0
        return out

    return built_once(tmp_path_factory, "export0", build)


@pytest.fixture(scope="session")
def export1(level1_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_runs import cli

    def build(folder: Path) -> Path:
        out = folder / "level1"
        assert cli("export", "--run-dir", level1_run, "--out", out) == 0
        return out

    return built_once(tmp_path_factory, "export1", build)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running one-node Slurm cluster for one test module (tests/slurm_jobs.py)."""
    from slurm_jobs import running_cluster

    yield from running_cluster()
