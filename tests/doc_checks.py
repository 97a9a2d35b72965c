"""Checks of what the documentation shows (tests/doc_commands.py) against the code: each returns problems
as `where: what` lines, empty when the documentation and the code agree."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import re
import shlex
import typing
from pathlib import Path

from doc_commands import ROOT, Mention

from ecgpos.cli import COMMANDS
from ecgpos.config import load_config
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.probes.geometry.cli import _splits
from ecgpos.probes.linear.run import ProbeConfig
from ecgpos.probes.shared.args import fractions_from_percent
from ecgpos.probes.shared.tasks import TASKS
from ecgpos.runs.run_config import RunConfig, load_run_config

# flags of the tools around ecgpos (accelerate, sbatch, srun, scancel, pip, pytest) that the docs show
EXTERNAL_FLAGS = {
    "--multi_gpu", "--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
    "--main_process_port", "--same_network", "--dynamo_backend", "--cpu", "--array", "--dependency",
    "--nodes", "--gres", "--signal", "--requeue", "--open-mode", "--ntasks-per-node", "--kill-on-bad-exit",
    "--cpus-per-task", "--kill-on-invalid-dep", "--me", "--quiet", "--upgrade", "--version", "--help",
}  # fmt: skip
# dotted names that look like config keys but are not (API attributes, files, a deliberate typo)
NOT_CONFIG_KEYS = {"encoder.embed", "encoder.forward_features", "optim.stpes"}
# documentation notation for "some override"
NOTATION = {"key=value", "a.b=value", "a.b=v", "section.key=value"}
FILE_SUFFIXES = (
    ".json",
    ".yaml",
    ".csv",
    ".md",
    ".py",
    ".h5",
    ".npz",
    ".npy",
    ".txt",
    ".png",
    ".onnx",
    ".jsonl",
    ".sbatch",
    ".sh",
)
OVERRIDE_TARGETS = {"pretrain": RunConfig, "carve": RunConfig, "bench/train_step.py": RunConfig, "probe": ProbeConfig}
OVERRIDE_TARGETS["preprocess"] = PreprocessSpec


def is_placeholder(token: str) -> bool:
    """DIR, FILE.yaml, RUN_OR_EXPORT, DATA/ptbxl, N, <id>, $VAR, …/shards, KEY=VALUE, [DATASET] (one that may
    be left out): any value fits."""
    if len(token) > 2 and token[0] == "[" and token[-1] == "]":
        token = token[1:-1]
    return bool(re.match(r"[A-Z][A-Z0-9_]*(?![a-z])", token)) or any(c in token for c in "<$…*")


def _tasks(text: str) -> None:
    for name in text.split(","):
        if name not in (*TASKS, "all") and not name.startswith("custom:"):
            raise EcgposError(f"unknown task {name!r}")


VALUE_CHECKS = {  # values a command validates after parsing
    ("probe", "--task"): _tasks,
    ("geometry", "--task"): _tasks,
    ("geometry", "--split"): _splits,
    ("probe", "--fractions"): fractions_from_percent,
}


def split_commands(line: str) -> list[list[str]]:
    """Shell words of a command line, cut at `;`, `&&`, `|` and `(`; quoted commands (`bash -c "..."`) opened."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # prose with an apostrophe
        words = line.split()
    flat: list[str] = []
    for word in words:
        if " " in word:  # a quoted command line
            flat += [w for part in split_commands(word) for w in [*part, ";"]]
        else:
            flat += [word[:-1], ";"] if word.endswith(";") and len(word) > 1 else [word]
    segments, current = [], []
    for word in flat:
        if word in (";", "&&", "||", "|") or word.startswith("("):
            segments.append(current)
            current = [] if word in (";", "&&", "||", "|") else None
            if current is None:
                break  # `(one process)`: a remark, not arguments
        else:
            current.append(word)
    if current:
        segments.append(current)
    return [s for s in segments if s]


def _variants(words: list[str]) -> list[list[str]]:
    """Synopsis notation unrolled: [optional] brackets dropped, `a|b` and `{a,b}` alternatives each used once."""
    options = []
    for word in words:
        word = word.replace("[", "").replace("]", "")
        if word in ("", "...", "\\"):
            continue
        if word.startswith("{") and word.endswith("}"):
            options.append(word[1:-1].split(","))
        elif word.startswith("--") and "/--" in word:  # `--spec/--set`: two flags named together
            options.append(word.split("/"))
        elif "|" in word and not word.startswith("-"):
            options.append(word.split("|"))
        else:
            options.append([word])
    count = max((len(o) for o in options), default=1)
    return [[o[min(i, len(o) - 1)] for o in options] for i in range(count)]


def _check_value(prog: str, action: argparse.Action, flag: str, value: str) -> str | None:
    if is_placeholder(value):
        return None
    try:
        converted = action.type(value) if callable(action.type) else value
    except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
        return f"{flag} {value!r} does not parse ({err})"
    if action.choices is not None and converted not in action.choices:
        return f"{flag} {value!r} is not one of {list(action.choices)}"
    check = VALUE_CHECKS.get((prog, flag))
    if check:
        try:
            check(value)
        except EcgposError as err:
            return f"{flag} {value!r}: {err}"
    if action.dest == "overrides":
        return check_override(OVERRIDE_TARGETS[prog], value)
    return None


def check_args(prog: str, parser: argparse.ArgumentParser, args: list[str], complete: bool) -> list[str]:
    """Problems of `prog args` under the real parser: unknown flags, values that do not parse, surplus or
    (for a whole command line) missing arguments. Placeholders stand for any valid value."""
    problems = []
    complete = complete and not {"...", "…"} & set(args)  # `ecgpos pretrain ...`: the rest left out
    for words in _variants(args):
        positionals = [a for a in parser._actions if not a.option_strings]
        seen: set[argparse.Action] = set()
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            if word.startswith("-") and not re.fullmatch(r"-[\d.]+", word):
                flag, eq, value = word.partition("=")
                action = parser._option_string_actions.get(flag)
                if action is None:
                    problems.append(f"`{prog}` has no flag {flag}")
                    continue
                seen.add(action)
                values = [value] if eq else []
                wanted = {None: 1, "?": 1, "+": len(words), "*": len(words)}.get(action.nargs, action.nargs)
                while not eq and len(values) < wanted and i < len(words) and not words[i].startswith("-"):
                    values.append(words[i])
                    i += 1
                problems += [p for v in values if (p := _check_value(prog, action, flag, v))]
            elif positionals:
                action = positionals[0]
                seen.add(action)
                if action.nargs not in ("+", "*"):
                    positionals.pop(0)
                if problem := _check_value(prog, action, action.dest, word):
                    problems.append(problem)
            else:
                problems.append(f"`{prog}` takes no argument {word!r}")
        if complete:
            missing = [
                a.option_strings[0] for a in parser._actions if a.required and a not in seen and a.option_strings
            ]
            problems += [f"`{prog}` needs {flag}" for flag in missing]
    return sorted(set(problems))


def _config_class(cls: type, key: str) -> str | None:
    """None when dotted `key` names a field of dataclass `cls`, else why not."""
    for depth, part in enumerate(key.split(".")):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            return f"{cls.__name__} has no key {'.'.join(key.split('.')[: depth + 1])}"
        cls = typing.get_type_hints(cls)[part]
        if not dataclasses.is_dataclass(cls):
            return None if depth == len(key.split(".")) - 1 else f"{key}: {part} is not a section"
    return None


def check_override(cls: type, override: str) -> str | None:
    """A `key=value` override (or a bare key) of config class `cls`: the key exists, the value loads."""
    if override in NOTATION:
        return None
    key, eq, value = override.partition("=")
    if problem := _config_class(cls, key.removeprefix("preprocess.") if cls is PreprocessSpec else key):
        return problem
    if not eq or is_placeholder(value) or value in ("value", "v"):
        return None
    try:
        if cls is RunConfig:
            load_run_config(None, [override])
        elif cls is PreprocessSpec:
            PreprocessSpec.load(None, [override])
        else:
            load_config(cls, None, [override])
    except EcgposError as err:
        return f"--set {override}: {err}"
    return None


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def sbatch_modes(script: Path) -> set[str]:
    """The first arguments a Slurm script takes (`preprocess.sbatch check`, `pretrain.sbatch 0`)."""
    text = script.read_text()
    modes = set(re.findall(r'"\$\{1:-\}" = (\w+)', text))
    for pattern in re.findall(r"^\s*([\d|]+)\) ;;", text, re.M):
        modes |= set(pattern.split("|"))
    if "=~ ^[0-9]+$ ]]" in text:  # a level number (`pretrain.sbatch 2`)
        modes.add("LEVEL")
    if "ecgpos_corpora DATASETS" in text:  # it takes a corpus by its dataset name (`preprocess.sbatch code15`)
        known = re.search(r'^ECGPOS_KNOWN_DATASETS="([^"]*)"', (script.parent / "common.sh").read_text(), re.M)
        modes |= set(known.group(1).split()) if known else set()
    return modes


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def check_command(words: list[str], parsers: dict, complete: bool) -> list[str]:
    """Problems of one shell command as the docs show it (only the ecgpos-related parts are checked)."""
    for i, word in enumerate(words):
        rest = words[i + 1 :]
        if word == "ecgpos" and rest:
            command = rest[0]
            if command in COMMANDS:
                parser = parsers[command]
                if command == "pretrain" and "--check-config" in rest:
                    parser = importlib.import_module("ecgpos.cli.pretrain").build_parser(check_only=True)
                return check_args(command, parser, rest[1:], complete)
            if command.startswith("<") or command.endswith(":") or command in ("--help", "-h", "--version"):
                return []  # `ecgpos <command>`, an error line `ecgpos pretrain: error: ...`
            return [f"no command `ecgpos {command}`"]
        if word == "-m" and rest and {"python", "python3", "accelerate", "torchrun"} & set(words[:i]):
            module = rest[0]
            if module == "ecgpos.pretrain":
                return check_command(["ecgpos", "pretrain", *rest[1:]], parsers, complete)
            if module in ("ecgpos", "ecgpos.cli"):
                return check_command(["ecgpos", *rest[1:]], parsers, complete)
            return [] if _module_exists(module) else [f"no module {module}"]
        if word in ("python", "python3") and rest and rest[0].endswith(".py"):
            path = rest[0]
            if not (ROOT / path).is_file():
                return [f"no file {path}"]
            return check_args(path, parsers[path], rest[1:], complete) if path in parsers else []
        if i == 0 and word in parsers:  # `bench/train_step.py --config ...` in prose
            return check_args(word, parsers[word], rest, complete)
        if word == "make":
            return [f"no make target {t}" for t in rest if not t.startswith("-") and t not in makefile_targets()]
        if word == "sbatch":
            scripts = [j for j, w in enumerate(rest) if w.endswith(".sbatch")]
            if not scripts:
                return []
            script = rest[scripts[0]]
            if not (ROOT / script).is_file():
                return [f"no file {script}"]
            args = [w for w in rest[scripts[0] + 1 :] if not is_placeholder(w)]
            modes = sbatch_modes(ROOT / script)
            taken = [a for a in args if a in modes or ("LEVEL" in modes and a.isdigit())]
            return [f"{script} takes no argument {a!r} (it takes {sorted(modes)})" for a in args if a not in taken]
        if re.fullmatch(r"(slurm|bench)/[\w.-]+\.(sh|sbatch|py)", word) and not is_placeholder(Path(word).name):
            if (ROOT / word).is_file():
                continue
            return [f"no file {word}"]
    return []


def check_mention(mention: Mention, parsers: dict) -> list[str]:
    return [
        f"{mention.where}: {p}  [{mention.text}]"
        for words in split_commands(mention.text)
        for p in check_command(words, parsers, mention.block)
    ]


def known_flags(parsers: dict) -> set[str]:
    """Every flag of every ecgpos command, benchmark and shell script (its `case` labels, `--depth)`), and
    those of the tools around them."""
    scripts = {
        flag
        for path in (ROOT / "slurm").glob("*.sh")
        for flag in re.findall(r"^\s*(--[\w-]+)\)", path.read_text(), re.M)
    }
    return EXTERNAL_FLAGS | scripts | {flag for parser in parsers.values() for flag in parser._option_string_actions}


def check_flags(where: str, text: str, flags: set[str]) -> list[str]:
    """Every `--flag` written anywhere in a document is one that some command has."""
    problems = []
    for match in re.finditer(r"(?<![\w/-])--([A-Za-z][\w-]*)", text):
        flag = "--" + match.group(1).rstrip("-")
        if flag not in flags:
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"{where}:{line}: no command has the flag {flag}")
    return problems


SECTIONS = {
    **{f.name: RunConfig for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(f.default_factory)},
    "protocol": ProbeConfig,
}


def check_config_words(mention: Mention) -> list[str]:
    """`section.key` and `section.key=value` words name a config key, and their values load."""
    problems = []
    # a single-quoted override is one shell word, blanks included ('optim.betas=[0.9, 0.99]')
    for match in re.finditer(r"'([\w.]+=[^']*)'|([\w.]+=?\S*)", mention.text):
        word = match.group(1) or match.group(2).strip("\"'`,;:()")
        key = word.split("=", 1)[0]
        section = key.split(".", 1)[0]
        if "." not in key or section not in SECTIONS or key in NOT_CONFIG_KEYS or key.endswith(FILE_SUFFIXES):
            continue
        if problem := check_override(SECTIONS[section], word):
            problems.append(f"{mention.where}: {problem}  [{mention.text}]")
    return problems


REPO_PATH = re.compile(r"(?<![\w./~-])((?:configs|bench|slurm|preprocessing|probes|ecgpos|tests|\.ci)/[\w./*-]*[\w*])")


def check_paths(mention: Mention, doc_folder: Path) -> list[str]:
    """Repository paths (`configs/level0.yaml`, `slurm/*.sbatch`) and bare source files (`wfdb_fast.py`) exist."""
    problems = []
    for path in REPO_PATH.findall(mention.text):
        if is_placeholder(Path(path).name) and "*" not in path:
            continue
        if path.startswith("probes/") and "." not in Path(path).name:
            continue  # a probe output folder (the Slurm jobs write WORK/probes/<task>/), not the package
        if not (list(ROOT.glob(path)) or (ROOT / path).exists() or (doc_folder / path).exists()):
            problems.append(f"{mention.where}: no file {path}  [{mention.text}]")
    return problems


def check_module_names(mention: Mention) -> list[str]:
    """Dotted names of the code (`ecgpos.ecg.screening.screen_record`) name a module and what it defines."""
    problems = []
    for name in re.findall(r"(?<![\w./])((?:ecgpos|probes|preprocessing)(?:\.[A-Za-z_]\w*)+)", mention.text):
        parts = name.split(".")
        if parts[-1] in ("py", "yaml", "json", "md"):
            continue
        depth = max(d for d in range(1, len(parts) + 1) if _module_exists(".".join(parts[:d])))
        target: object = importlib.import_module(".".join(parts[:depth]))
        for attr in parts[depth:]:
            if not hasattr(target, attr):
                problems.append(f"{mention.where}: {name}: no {attr} in {'.'.join(parts[:depth])}  [{mention.text}]")
                break
            target = getattr(target, attr)
    return problems
