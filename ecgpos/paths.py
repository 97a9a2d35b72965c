"""Locations inside the project: the shipped configs and the default sample-data folder."""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = PROJECT_ROOT / "configs"
DATA_ENV_VAR = "ECGPOS_SAMPLE_DATA"


def sample_data_root() -> Path:
    """The real sample records: $ECGPOS_SAMPLE_DATA, default ../shared/data beside the project."""
    return Path(os.environ.get(DATA_ENV_VAR, PROJECT_ROOT.parent / "shared" / "data")).resolve()
