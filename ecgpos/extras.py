"""Optional dependencies: which extra installs each package, and the one line that says so.

`pip install ecgpos` installs what an exported encoder needs (`load_encoder`, `ecgpos embed` of WFDB
records and .npy arrays, `ecgpos verify`). Preprocessing, pretraining, probes, geometry and the demo
need the `train` extra; ONNX needs the `export` extra (see pyproject.toml, whose extras
tests/test_install_extras.py checks against this table).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from ecgpos.errors import EcgposError

# import name -> (distribution, extra): every package that `pip install ecgpos` leaves out and ecgpos uses
OPTIONAL: dict[str, tuple[str, str]] = {
    "accelerate": ("accelerate", "train"),
    "h5py": ("h5py", "train"),
    "matplotlib": ("matplotlib", "train"),
    "neurokit2": ("neurokit2", "train"),
    "pandas": ("pandas", "train"),
    "sklearn": ("scikit-learn", "train"),
    "tensorboard": ("tensorboard", "train"),
    "onnx": ("onnx", "export"),
    "onnxruntime": ("onnxruntime", "export"),
    "onnxscript": ("onnxscript", "export"),
}


class MissingExtra(EcgposError):
    """A package of an optional extra is not installed; the message names it and the pip line."""


def missing_message(names: Iterable[str]) -> str:
    """The line for import names of OPTIONAL: needs X, Y and Z, which are not installed: pip install 'ecgpos[E]'."""
    names = list(dict.fromkeys(names))
    extras = sorted({OPTIONAL[name][1] for name in names})
    packages = [OPTIONAL[name][0] for name in names]
    listed = ", ".join(packages[:-1]) + " and " + packages[-1] if len(packages) > 1 else packages[0]
    verb = "is" if len(names) == 1 else "are"
    return f"needs {listed}, which {verb} not installed: pip install 'ecgpos[{','.join(extras)}]'"


def is_missing(name: str) -> bool:
    """True when import `name` cannot be found (without importing it; a None entry in sys.modules counts)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def require(*names: str) -> None:
    """Raise MissingExtra naming every package of `names` (import names of OPTIONAL) that is missing."""
    missing = [name for name in names if is_missing(name)]
    if missing:
        raise MissingExtra(missing_message(missing))


def from_import_error(err: ImportError) -> MissingExtra | None:
    """The MissingExtra for an optional package that is not installed (an import deep inside a command), else None."""
    name = (err.name or "").split(".")[0]
    if isinstance(err, ModuleNotFoundError) and name in OPTIONAL and is_missing(name):
        return MissingExtra(missing_message([name]))
    return None
