"""The installed package works like a checkout; the preprocessing spec is chosen in one place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import h5py
import pytest
from installed_wheel import ROOT, build_wheel, installed_env
from tiny_runs import cli

from ecgpos.ecg.spec import DEFAULT_SPEC, PreprocessSpec
from ecgpos.errors import ConfigError
from ecgpos.resources import config_dir, config_path, shipped_configs
from ecgpos.runs.run_config import load_run_config

SHIPPED = {"finetune", "level0", "level1", "stmem12", "tiny/level0", "tiny/level1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_the_configs_and_every_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in SHIPPED:
        assert f"ecgpos/configs/{name}.yaml" in names
    # preprocessing/ and probes/ ship as ecgpos/preprocessing and ecgpos/probes (the links to them)
    packages = {
        p.parent.relative_to(ROOT).as_posix()
        for p in ROOT.glob("*/**/__init__.py")
        if p.parts[len(ROOT.parts)] in ("ecgpos", "preprocessing", "probes")
    }
    inside = {package if package.startswith("ecgpos") else f"ecgpos/{package}" for package in packages}
    assert {"ecgpos/probes/linear", "ecgpos/preprocessing"} <= inside
    assert all(f"{package}/__init__.py" in names for package in inside)
    reference = [p.relative_to(ROOT).as_posix() for p in (ROOT / "probes" / "shared" / "reference").glob("*.csv")]
    assert reference and all(f"ecgpos/{path}" in names for path in reference)


def test_wheel_installs_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"ecgpos"}
    top_level = [name for name in names if name.endswith(".dist-info/top_level.txt")]
    assert all(zipfile.ZipFile(wheel).read(name).decode().split() == ["ecgpos"] for name in top_level)


def test_installed_wheel_resolves_shipped_configs_outside_the_checkout(
    installed: dict[str, str], tmp_path: Path
) -> None:
    site = installed["PYTHONPATH"].split(os.pathsep)[0]
    code = (
        "import json, ecgpos, ecgpos.resources as r; from ecgpos.runs.run_config import load_run_config;"
        "print(json.dumps({'module': ecgpos.__file__, 'dir': str(r.config_dir()), 'names': r.shipped_configs(),"
        "'width': load_run_config('level0').encoder.width}))"
    )
    # the installed copy alone provides ecgpos, and the checkout is not the working folder
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=installed, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["module"].startswith(site) and found["dir"].startswith(site)
    assert set(found["names"]) == SHIPPED and found["width"] == 768


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return installed_env(wheel, tmp_path_factory.mktemp("installed"))


def test_installed_wheel_has_no_top_level_probes_or_preprocessing(installed: dict[str, str], tmp_path: Path) -> None:
    code = """
import json
found = {}
for name in ("probes", "preprocessing", "ecgpos.probes.linear.cli", "ecgpos.preprocessing.cli"):
    try:
        found[name] = __import__(name, fromlist=["_"]).__file__
    except ModuleNotFoundError as err:
        found[name] = f"ModuleNotFoundError: {err.name}"
print(json.dumps(found))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=installed, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    site = installed["PYTHONPATH"].split(os.pathsep)[0]
    assert found["probes"] == "ModuleNotFoundError: probes"
    assert found["preprocessing"] == "ModuleNotFoundError: preprocessing"
    assert found["ecgpos.probes.linear.cli"] == str(Path(site, "ecgpos", "probes", "linear", "cli.py"))
    assert found["ecgpos.preprocessing.cli"] == str(Path(site, "ecgpos", "preprocessing", "cli.py"))


def test_config_by_name_or_path() -> None:
    assert set(shipped_configs()) == SHIPPED
    assert config_path("level0") == config_path("level0.yaml") == config_dir() / "level0.yaml"
    assert load_run_config("tiny/level1").level == 1
    assert load_run_config(config_dir() / "tiny" / "level0.yaml").level == 0
    with pytest.raises(ConfigError, match="neither a file nor a shipped config"):
        config_path("level7")


def test_spec_from_file_and_overrides(tmp_path: Path) -> None:
    assert PreprocessSpec.load() == DEFAULT_SPEC
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("lowpass_hz: 45\nfilter_order: 2\n")
    spec = PreprocessSpec.load(spec_file, ["preprocess.dtype=float32"])
    assert (spec.lowpass_hz, spec.filter_order, spec.dtype, spec.highpass_hz) == (45.0, 2, "float32", 0.67)
    # a run config's preprocess section is the spec that run expects
    assert PreprocessSpec.load(config_path("level0")) == load_run_config("level0").preprocess
    with pytest.raises(ConfigError, match="lowpas_hz"):
        PreprocessSpec.load(None, ["lowpas_hz=45"])
    with pytest.raises(ConfigError, match="highpass_hz < lowpass_hz"):
        PreprocessSpec.load(None, ["lowpass_hz=0.5"])


def test_preprocess_set_travels_with_shards_and_a_run_refuses_other_shards(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    src.mkdir(parents=True)
    for record in sorted((shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010").glob("JS0000[1-4].*")):
        shutil.copy(record, src)
    out = tmp_path / "shards"
    assert (
        cli(
            "preprocess",
            "ecg-arrhythmia",
            "--src",
            tmp_path / "src",
            "--subset",
            "all",
            "--out",
            out,
            "--set",
            "lowpass_hz=45",
            "--set",
            "filter_order=2",
        )
        == 0
    )
    (shard,) = out.glob("shard-*.h5")
    with h5py.File(shard) as handle:
        stored = PreprocessSpec.from_h5_attrs(handle.attrs)
    assert (stored.lowpass_hz, stored.filter_order) == (45.0, 2)
    assert json.loads((out / "preprocess.json").read_text())["settings"]["spec"]["lowpass_hz"] == 45.0
    capsys.readouterr()
    rc = cli("pretrain", "--level", "0", "--config", "tiny/level0", "--shards", out, "--run-dir", tmp_path / "run")
    assert rc == 2
    err = capsys.readouterr().err
    assert "lowpass_hz: 40.0 != 45.0" in err and not (tmp_path / "run").exists()


def test_one_citation() -> None:
    from ecgpos.export.card import BIBTEX

    assert BIBTEX in (ROOT / "README.md").read_text()
