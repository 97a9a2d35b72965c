"""`pip install ecgpos` runs an exported encoder; commands of the train extra say what to install.

The core install is checked by running the clinical path (load_encoder, forward_features, embed,
`ecgpos embed` of a WFDB record and a .npy array, `ecgpos verify`) in a subprocess in which every
package of the extras cannot be imported, and pyproject's `dependencies` are checked against the
packages that run imports, so that the two cannot drift apart.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import numpy as np
import pytest

from ecgpos.cli import COMMANDS, NEEDS
from ecgpos.extras import OPTIONAL

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("ecgpos",)
# its source folders (ecgpos/preprocessing and ecgpos/probes are links to the last two, which rglob does not follow)
SOURCE_FOLDERS = ("ecgpos", "preprocessing", "probes")
# wfdb (core) imports pandas itself, so pandas comes with the core install and cannot be blocked;
# ecgpos's own code on the clinical path does not import it (checked below)
NOT_BLOCKED = {"pandas"}
BLOCKED = sorted(set(OPTIONAL) - NOT_BLOCKED)
LEADS = ["I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"]

# The clinical path in a fresh interpreter. argv: export folder, WFDB record, work folder, blocked
# import names (comma-separated). Prints JSON: features of each step, exit codes, and the third-party
# packages that ecgpos's own modules imported (top-level names).
CLINICAL = """
import builtins, json, sys
blocked = [name for name in sys.argv[4].split(",") if name]
for name in blocked:
    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError, as when it is not installed
first_party = ("ecgpos",)
imported = set()
real_import = builtins.__import__

def record_import(name, globals=None, locals=None, fromlist=(), level=0):
    top = name.split(".")[0]
    importer = ((globals or {}).get("__name__") or "").split(".")[0]
    if level == 0 and importer in first_party and top not in first_party and top not in sys.stdlib_module_names:
        imported.add(top)
    return real_import(name, globals, locals, fromlist, level)

builtins.__import__ = record_import
from pathlib import Path
import numpy as np
import torch
import ecgpos
from ecgpos.cli import main

export, record, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
encoder = ecgpos.load_encoder(export)
windows = np.random.default_rng(0).standard_normal((3, 12, encoder.spec.window)).astype(np.float32)
with torch.no_grad():
    forward = encoder.forward_features(torch.from_numpy(windows)).numpy()
from ecgpos.ecg.wfdb_io import read_wfdb_record
raw = read_wfdb_record(record)
signal, fs, leads = raw.signal, raw.fs, raw.leads
embedded = encoder.embed(signal, fs=fs, leads=leads)
np.save(work / "record.npy", np.asarray(signal, dtype=np.float32))
codes = [
    main(["embed", "--encoder", str(export), "--input", record, "--out", str(work / "wfdb.csv"), "--no-progress"]),
    main(["embed", "--encoder", str(export), "--input", str(work / "record.npy"), "--fs", str(fs),
          "--leads", ",".join(leads), "--out", str(work / "array.npz"), "--no-progress"]),
    main(["verify", str(export)]),
]
rows = (work / "wfdb.csv").read_text().splitlines()
print(json.dumps({
    "forward": forward.tolist(),
    "embed": np.asarray(embedded).tolist(),
    "embed_wfdb": [float(v) for v in rows[1].split(",")[1:]],
    "embed_array": np.load(work / "array.npz")["features"].tolist(),
    "codes": codes,
    "imported": sorted(imported),
    "blocked_loaded": sorted(name for name in blocked if sys.modules.get(name) is not None),
}))
"""


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), "CUDA_VISIBLE_DEVICES": ""}


def _clinical(export: Path, record: Path, work: Path, blocked: list[str]) -> dict:
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", CLINICAL, str(export), str(record), str(work), ",".join(blocked)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _distribution(import_name: str) -> str:
    return _name(packages_distributions()[import_name][0])


@pytest.fixture(scope="module")
def clinical_runs(export: Path, real_record: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The clinical path with the extras blocked, and with everything installed."""
    work = tmp_path_factory.mktemp("clinical")
    return {
        "core": _clinical(export, real_record, work / "core", BLOCKED),
        "full": _clinical(export, real_record, work / "full", []),
    }


def test_exported_encoder_runs_without_the_extras_as_with_them(clinical_runs: dict[str, dict]) -> None:
    core, full = clinical_runs["core"], clinical_runs["full"]
    assert core["codes"] == full["codes"] == [0, 0, 0]
    assert core["blocked_loaded"] == []
    for key in ("forward", "embed", "embed_wfdb", "embed_array"):
        np.testing.assert_allclose(np.asarray(core[key]), np.asarray(full[key]), rtol=1e-6, atol=1e-7)
    # the CLI's record, the array of the same record and the API agree
    np.testing.assert_allclose(np.asarray(core["embed_wfdb"]), np.asarray(core["embed"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(core["embed_array"])[0], np.asarray(core["embed"]), rtol=1e-5, atol=1e-6)


def test_core_dependencies_are_exactly_what_the_clinical_path_imports(clinical_runs: dict[str, dict]) -> None:
    core = {_name(r) for r in _pyproject()["dependencies"]}
    imported = {_distribution(name) for name in clinical_runs["core"]["imported"]}
    assert imported == core
    # nothing of the extras is imported by ecgpos on the clinical path, blocked or not
    assert not set(clinical_runs["full"]["imported"]) & set(OPTIONAL)
    # the one package of an extra left importable is there because a core dependency needs it
    assert NOT_BLOCKED <= set(OPTIONAL)
    wfdb_needs = {_name(r) for r in requires("wfdb") or [] if "extra ==" not in r}
    assert {OPTIONAL[name][0] for name in NOT_BLOCKED} <= wfdb_needs


def test_extras_table_matches_pyproject_and_every_import_is_declared() -> None:
    project = _pyproject()
    declared = {_name(r): extra for extra in ("train", "export") for r in project["optional-dependencies"][extra]}
    assert {_name(dist): extra for dist, extra in OPTIONAL.values()} == declared
    core = {_name(r) for r in project["dependencies"]}
    assert not core & set(declared)
    # what the CLI checks before a command of the train extra runs
    assert all(OPTIONAL[name][1] == "train" for needs in NEEDS.values() for name in needs)
    assert set(NEEDS) <= set(COMMANDS)
    # every third-party package the code imports is a core dependency or in an extra
    imported = set()
    for folder in SOURCE_FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                imported |= {n.split(".")[0] for n in names}
    third_party = {n for n in imported if n not in sys.stdlib_module_names and n not in FIRST_PARTY}
    assert {_distribution(n) for n in third_party} <= core | set(declared)
    # declared but not imported by an import statement: through torch (torch.utils.tensorboard,
    # torch.onnx uses onnxscript) or by name (ecgpos.export.onnx_export.require_onnx)
    unseen = {"tensorboard", "onnxscript", "onnx", "onnxruntime"}
    assert set(declared) - {_distribution(n) for n in third_party} == unseen


def _blocked_cli(argv: list[str], blocked: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`ecgpos ARGV` in a fresh interpreter in which the `blocked` packages cannot be imported."""
    code = (
        f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\nimport ecgpos.cli\nsys.exit(ecgpos.cli.main())"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, env=_env(), cwd=cwd
    )


@pytest.mark.parametrize(
    ("argv", "missing"),
    [
        (["pretrain", "--help"], "accelerate"),
        (["pretrain", "--level", "0", "--config", "tiny/level0", "--check-config"], "accelerate"),
        (["probe", "--help"], "scikit-learn"),
        (["preprocess", "--help"], "h5py"),
        (["geometry", "--help"], "matplotlib"),
        (["demo", "--quick"], "neurokit2"),
    ],
)
def test_command_of_the_train_extra_says_what_to_install(argv: list[str], missing: str, tmp_path: Path) -> None:
    done = _blocked_cli(argv, BLOCKED, tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"ecgpos {argv[0]}: error: needs ") and missing in line
    assert line.endswith("not installed: pip install 'ecgpos[train]'")
    assert list(tmp_path.iterdir()) == []


def test_optional_package_used_inside_a_command_is_one_line(export: Path, tiny_shards: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((12, 5000), dtype=np.float32))
    array = ["--input", str(tmp_path / "x.npy"), "--fs", "500", "--leads", ",".join(LEADS)]
    for args, out in ((array, "x.h5"), (["--input", str(tiny_shards)], "shards.csv")):
        argv = ["embed", "--encoder", str(export), *args, "--out", str(tmp_path / out), "--no-progress"]
        done = _blocked_cli(argv, ["h5py"], tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "ecgpos embed: error: needs h5py, which is not installed: pip install 'ecgpos[train]'"
        ]
        assert not (tmp_path / out).exists()


def test_every_install_of_the_checkout_for_tests_includes_the_train_extra() -> None:
    assert "pip install --quiet -e '.[train,dev,export,docs]'" in (ROOT / "Makefile").read_text()
