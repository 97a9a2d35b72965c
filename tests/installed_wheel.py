"""A wheel built from the checkout, and the environment of a Python that sees it installed and no checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run first by every Python started with this folder on PYTHONPATH: it drops the import finder of an
# editable install (`pip install -e` of a checkout), so that only the installed wheel provides modules.
NO_CHECKOUT = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
"""


def build_wheel(scratch: Path) -> Path:
    """A wheel of the checkout's pyproject.toml, built in `scratch` (no network: build isolation off)."""
    src = scratch / "src" / "ecgpos"
    # a copy, so that the build's own build/ and *.egg-info never touch the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__"))
    out = scratch / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("ecgpos-*.whl")
    return found


def installed_env(wheel: Path, scratch: Path) -> dict[str, str]:
    """The environment of a Python that sees `wheel` installed with `pip install --target`, and no checkout."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(scratch / "site"), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (scratch / "no-checkout").mkdir()
    (scratch / "no-checkout" / "sitecustomize.py").write_text(NO_CHECKOUT)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "COV_"))}
    return env | {"PYTHONPATH": f"{scratch / 'site'}{os.pathsep}{scratch / 'no-checkout'}"}
