"""Files ecgpos ships or looks for: the shipped run configs, and the folder of real sample records.

The top-level `configs/` folder is installed as the data-only package `ecgpos.configs`, so a
shipped config is found by name (`--config level0`, `--config tiny/level1`) from a checkout, an
editable install and a wheel alike.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

from ecgpos.errors import ConfigError

CONFIG_PACKAGE = "ecgpos.configs"
DATA_ENV_VAR = "ECGPOS_SAMPLE_DATA"
# Other spellings of the shipped level configs: stage0, tiny/stage1, .../configs/stage0.yaml
OTHER_CONFIG_NAME = re.compile(r"(^|.*/configs/|^configs/)((?:tiny/)?)stage([01])(\.yaml)?$")


def config_dir() -> Path:
    """The folder of shipped configs (level0.yaml, level1.yaml, stmem12.yaml, tiny/)."""
    try:
        spec = importlib.util.find_spec(CONFIG_PACKAGE)
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        # a checkout on PYTHONPATH, not installed: configs/ beside ecgpos/
        return Path(__file__).resolve().parents[1] / "configs"
    # a data-only (namespace) package: its one folder, in a wheel install or an editable one
    return Path(next(iter(spec.submodule_search_locations)))


def shipped_configs() -> list[str]:
    """Names of the shipped configs, e.g. ['level0', 'level1', 'stmem12', 'tiny/level0', ...]."""
    root = config_dir()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


_NOTED: set[str] = set()


def config_path(name_or_path: str | Path) -> Path:
    """An existing YAML file, or a shipped config by name ('level0', 'tiny/level1', 'level0.yaml');
    a missing stage0/stage1 config (by name or as configs/[tiny/]stage<l>.yaml) is its level<l> file."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = str(name_or_path).removesuffix(".yaml")
    shipped = config_dir() / f"{name}.yaml"
    if not path.is_absolute() and shipped.is_file():
        return shipped
    other = OTHER_CONFIG_NAME.match(str(name_or_path))
    if other:
        level = Path(re.sub(r"stage([01])(\.yaml)?$", r"level\1\2", str(name_or_path)))
        if level.is_file() or (
            not level.is_absolute() and (config_dir() / f"{other[2]}level{other[3]}.yaml").is_file()
        ):
            found = config_path(level)
            if str(name_or_path) not in _NOTED:  # once per process: carve resolves it for every level
                _NOTED.add(str(name_or_path))
                print(f"ecgpos: note: config {name_or_path} is {found}", file=sys.stderr)
            return found
    raise ConfigError(f"config {name_or_path} is neither a file nor a shipped config ({', '.join(shipped_configs())})")


def sample_data_root() -> Path:
    """The real sample records: $ECGPOS_SAMPLE_DATA, default ../shared/data beside the checkout."""
    default = Path(__file__).resolve().parents[1].parent / "shared" / "data"
    return Path(os.environ.get(DATA_ENV_VAR, default)).resolve()
