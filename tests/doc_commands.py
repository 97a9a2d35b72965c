"""The documentation read back: every command line, `--flag`, config key and file path it shows.

Sources: the Markdown files outside tests/ (README.md, the pages under docs/, the folder READMEs), the
usage comments of the Slurm and bench shell scripts, the module docstrings and `--help` texts of every
command and benchmark, and the model card that `ecgpos export` writes. Nothing here runs a command:
`doc_parsers` builds the real argparse parsers.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"tests", "node_modules", "build", "site", "demo-out", "gpu_data", "gpu_out"}
# prog -> the module whose build_parser() it is (`ecgpos <command>` and the benchmarks)
CLI_MODULES = {
    "preprocess": "ecgpos.preprocessing.cli",
    "pretrain": "ecgpos.cli.pretrain",
    "probe": "ecgpos.probes.linear.args",
    "export": "ecgpos.cli.export",
    "embed": "ecgpos.cli.embed",
    "verify": "ecgpos.cli.verify",
    "geometry": "ecgpos.probes.geometry.cli",
    "score": "ecgpos.cli.score",
    "carve": "ecgpos.cli.carve",
    "demo": "ecgpos.demo.demo",
    "predict": "ecgpos.cli.predict",
    "finetune": "ecgpos.probes.finetune.args",
}
# modules whose docstrings are documentation too (the pretrain synopsis is not its --help description)
DOC_MODULES = ("ecgpos.cli", "ecgpos.cli.pretrain", "ecgpos.probes.linear.cli")
BENCH_SCRIPTS = ("depth_study", "loader", "predict", "preprocess", "probe", "scale", "train_step")
COMMAND_WORDS = ("ecgpos", "python", "python3", "sbatch", "accelerate", "make", "bash", "srun")


@dataclasses.dataclass(frozen=True)
class Mention:
    """A piece of documentation: a code line (`block`, a whole command) or an inline code span."""

    where: str
    text: str
    block: bool


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py imported as a module (bench/ is not a package); the environment is left as it was."""
    saved = dict(os.environ)  # bench/preprocess.py pins its own threads on import
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        os.environ.clear()
        os.environ.update(saved)


def doc_parsers() -> dict[str, object]:
    """prog -> argparse parser: `ecgpos <command>` by command name, benchmarks as `bench/<name>.py`."""
    parsers = {name: importlib.import_module(module).build_parser() for name, module in CLI_MODULES.items()}
    for name in BENCH_SCRIPTS:
        parsers[f"bench/{name}.py"] = bench_module(name).build_parser()
    return parsers


def markdown_files() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        folders = path.relative_to(ROOT).parts[:-1]
        # hidden folders are tool caches and environments (.venv, .pytest_cache), not documentation
        if not SKIP_DIRS & set(folders) and not any(part.startswith(".") for part in folders):
            found.append(path)
    return found


def model_card() -> str:
    """The README.md that `ecgpos export` writes, for a nested export with ONNX and decoders."""
    from ecgpos.ecg.spec import DEFAULT_SPEC
    from ecgpos.export.card import render_card

    config = {
        "preprocess": dataclasses.asdict(DEFAULT_SPEC),
        "arch": {"kind": "nested", "levels": [{"width": 768}, {"width": 768}]},
        "io": {"features": 768},
        "pooling": "mean",
        "weights_sha256": "0" * 64,
        "onnx": {"opset": 17, "input": "windows", "output": "features"},
        "decoders": {"file": "decoders.safetensors", "level0": {}, "level1": {}},
    }
    return render_card(config)


def classifier_card() -> str:
    """The README.md that `ecgpos export --classifier` writes, with ONNX."""
    from ecgpos.ecg.spec import DEFAULT_SPEC
    from ecgpos.export.classifier_card import render_classifier_card

    config = {
        "preprocess": dataclasses.asdict(DEFAULT_SPEC),
        "arch": {"kind": "level0", "encoder": {"width": 768}},
        "labels": ["AFIB", "NORM"],
        "thresholds": {"rule": "max F1", "values": {"AFIB": 0.4, "NORM": 0.6}},
        "test": {"per_label": {"AFIB": {"auroc": 0.9, "low": 0.85, "high": 0.95, "positives": 10}}},
        "training": {"task": "cpsc2018", "protocol": "finetune-full"},
        "weights_sha256": "0" * 64,
        "onnx": {"file": "classifier.onnx", "opset": 18, "input": "ecg", "output": "probabilities"},
    }
    return render_classifier_card(config)


def text_sources(parsers: dict[str, object]) -> Iterator[tuple[str, str, bool]]:
    """(name, text, is_markdown) of every piece of documentation."""
    for path in markdown_files():
        yield str(path.relative_to(ROOT)), path.read_text(), True
    yield "model card (ecgpos/export/card.py)", model_card(), True
    yield "classifier card (ecgpos/export/classifier_card.py)", classifier_card(), True
    for path in sorted([*ROOT.glob("slurm/*.sbatch"), *ROOT.glob("slurm/*.sh"), *ROOT.glob("bench/*.sh")]):
        lines = path.read_text().splitlines()
        comments = [
            re.sub(r"^#", "", ln) if ln.startswith("#") and not ln.startswith(("#!", "#SBATCH")) else "" for ln in lines
        ]
        yield str(path.relative_to(ROOT)), "\n".join(comments), False
    for module in DOC_MODULES:
        yield module, importlib.import_module(module).__doc__ or "", False
    for prog, parser in parsers.items():
        texts = [parser.description or "", parser.epilog or ""]
        texts += [action.help or "" for action in parser._actions]
        yield f"{prog} --help", "\n".join(texts), False


def _continues(line: str) -> bool:
    """A synopsis line that carries on the command above it (`   [--workers N] ...`)."""
    return line.lstrip().startswith(("[", "--"))


def _command_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """Logical lines: `\\` continuations and indented synopsis continuations joined."""
    current: tuple[int, str] | None = None
    last = -1
    for number, line in lines:
        adjacent = number == last + 1
        last = number
        if current and adjacent and (current[1].endswith("\\") or _continues(line)):
            current = (current[0], current[1].rstrip("\\") + " " + line.strip())
            continue
        if current:
            yield current
        current = (number, line.strip())
    if current:
        yield current


def _starts_command(line: str) -> bool:
    word = line.split(maxsplit=1)[0] if line.split() else ""
    return word in COMMAND_WORDS or word.startswith(("slurm/", "bench/", "ECGPOS_"))


def mentions(name: str, text: str, markdown: bool) -> Iterator[Mention]:
    """The code lines and inline code spans of one document."""
    lines = text.splitlines()
    code: list[tuple[int, str]] = []
    if markdown:
        fence, language = False, ""
        prose = []
        for number, line in enumerate(lines, 1):
            if line.lstrip().startswith("```"):
                fence, language = not fence, line.strip()[3:].strip()
                prose.append("")
                continue
            if fence:
                if language not in ("python", "bibtex"):
                    code.append((number, line))
                prose.append("")
            elif line.startswith("    ") and (not prose or not prose[-1].strip() or prose[-1] == "\0"):
                code.append((number, line))  # an indented code block
                prose.append("\0")
            else:
                prose.append(line)
        prose_text = "\n".join(p.replace("\0", "") for p in prose)
    else:
        code = [(n, ln) for n, ln in enumerate(lines, 1) if _starts_command(ln.strip()) or _continues(ln)]
        prose_text = text
    for number, line in _command_lines(code):
        if line and not line.startswith("#") and _starts_command(line):
            yield Mention(f"{name}:{number}", line, True)
    for match in re.finditer(r"`([^`]+)`", prose_text):
        span = match.group(1)
        if "\n\n" not in span:
            yield Mention(f"{name}:{prose_text.count(chr(10), 0, match.start()) + 1}", " ".join(span.split()), False)


def all_mentions() -> tuple[dict[str, object], list[Mention]]:
    parsers = doc_parsers()
    found = [m for source in text_sources(parsers) for m in mentions(*source)]
    return parsers, found
