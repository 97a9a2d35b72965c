"""Every command line, flag, config key and file the documentation shows works as written.

The documentation (tests/doc_commands.py: Markdown outside tests/, script usage comments, `--help`
texts, the export's model card) is read back and checked against the real argparse parsers, config
dataclasses and repository files; nothing is run.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_checks import (  # noqa: E402
    check_config_words,
    check_flags,
    check_mention,
    check_module_names,
    check_paths,
    known_flags,
)
from doc_commands import ROOT, Mention, all_mentions, text_sources  # noqa: E402

from ecgpos.runs.run_config import RunConfig  # noqa: E402


@pytest.fixture(scope="module")
def docs() -> tuple[dict, list[Mention]]:
    return all_mentions()


def _report(problems: list[str]) -> str:
    return "documentation and code disagree:\n" + "\n".join(problems)


def test_documented_commands_parse(docs: tuple[dict, list[Mention]]) -> None:
    parsers, found = docs
    commands = [m for m in found if m.block and m.text.startswith("ecgpos ")]
    # the extraction itself finds what the pages show (a broken reader would check nothing)
    assert sum(m.where.startswith("docs/") for m in commands) >= 8, commands
    assert any(m.where.startswith("README.md:") and m.text.startswith("make test ") for m in found if m.block)
    assert any("-m ecgpos.pretrain" in m.text for m in found if m.block)
    assert any(m.text.startswith("python bench/") for m in found if m.block)
    assert any(m.text.startswith("sbatch ") for m in found if m.block)
    problems = [p for m in found for p in check_mention(m, parsers)]
    assert not problems, _report(problems)


def test_documented_flags_exist(docs: tuple[dict, list[Mention]]) -> None:
    parsers, _ = docs
    flags = known_flags(parsers)
    problems = [p for source in text_sources(parsers) for p in check_flags(source[0], source[1], flags)]
    assert not problems, _report(problems)


def test_documented_config_keys_paths_and_names_exist(docs: tuple[dict, list[Mention]]) -> None:
    _, found = docs
    problems = []
    for mention in found:
        doc_folder = (ROOT / mention.where.split(":")[0]).parent
        problems += check_config_words(mention) + check_paths(mention, doc_folder) + check_module_names(mention)
    assert not problems, _report(problems)


def _readme_key_tables() -> dict[str, list[tuple[list[str], str]]]:
    """docs/configs.md's key tables: section ('' = top level) -> [(keys of a row, its default)]."""
    tables: dict[str, list[tuple[list[str], str]]] = {}
    sections = {f.name for f in dataclasses.fields(RunConfig)}
    section = None
    for line in (ROOT / "docs" / "configs.md").read_text().splitlines():
        heading = re.match(r"`(\w+)`", line)
        if heading and heading.group(1) not in sections or line.startswith("## "):
            section = None
        elif line.strip() == "Top level" or heading:
            section = heading.group(1) if heading else ""
            tables[section] = []
        elif section is not None and line.startswith("| `"):
            keys_cell, default = (cell.strip() for cell in line.strip("|").split("|")[:2])
            tables[section].append((re.findall(r"`(\w+)`", keys_cell), default))
    return tables


def _same(documented: str, default: object) -> bool:
    if isinstance(default, tuple) and all(isinstance(v, str) for v in default):
        return documented.split() == [*default[:6], "V1..V6"]  # the lead list, abbreviated
    value = yaml.safe_load(documented)
    if isinstance(default, bool) or default is None:
        return value == default
    if isinstance(default, (int, float)):
        return float(value) == default
    if isinstance(default, tuple):
        return [float(v) for v in value] == list(default)
    return str(value) == str(default)


def test_configs_page_lists_every_key_with_its_default() -> None:
    tables = _readme_key_tables()
    defaults = RunConfig()
    problems = []
    for section, rows in tables.items():
        target = getattr(defaults, section) if section else defaults
        fields = [f.name for f in dataclasses.fields(target)]
        if not section:  # the top level lists its plain keys; its sections have tables of their own
            fields = [f for f in fields if not dataclasses.is_dataclass(getattr(target, f))]
        documented = [key for keys, _ in rows for key in keys]
        problems += [f"{section or 'top level'}: {key} is not documented" for key in fields if key not in documented]
        for keys, default in rows:
            values = default.split(", ") if len(keys) > 1 else [default]
            for key, value in zip(keys, values):
                if key not in fields:
                    problems.append(f"{section or 'top level'}: no key {key}")
                elif not _same(value, getattr(target, key)):
                    problems.append(f"{section}.{key}: documented default {value}, is {getattr(target, key)!r}")
    assert set(tables) == {"", "encoder", "decoder", "push_pull", "optim", "train", "preprocess"}
    assert not problems, _report(problems)


@pytest.mark.parametrize(
    "line",
    [
        "ecgpos export --rundir runs/level1 --out DIR",  # a renamed flag
        "ecgpos pretrian --level 0",  # no such command
        "ecgpos preprocess code-15 --out DIR",  # not a choice
        "ecgpos pretrain --level two --config level0 --check-config",  # not a level
        "ecgpos pretrain --level 0 --config level0 --set train.num_worker=2 --check-config",  # unknown key
        "ecgpos pretrain --level 0 --config level0 --set train.compile=fast --check-config",  # bad value
        "ecgpos probe --task ptbxl-rythm --out DIR",
        "ecgpos embed --input DIR --out feats.csv",  # a required flag left out
        "python bench/train_step.py --config FILE --e2e-step 3",
        "accelerate launch -m ecgpos.pretrainer --level 0",
        "make tests",
        "sbatch slurm/probe.sbatch merg",
    ],
)
def test_the_checker_finds_drift(line: str, docs: tuple[dict, list[Mention]]) -> None:
    assert check_mention(Mention("example", line, True), docs[0])


def test_the_checker_finds_drifted_words(docs: tuple[dict, list[Mention]]) -> None:
    flags = known_flags(docs[0])
    assert check_flags("example", "pass --seedz 3", flags)
    for text in ("train.num_worker", "configs/level9.yaml", "ecgpos.ecg.screening.screen_recordz"):
        mention = Mention("example", text, False)
        assert check_config_words(mention) + check_paths(mention, ROOT) + check_module_names(mention), text


def _anchors(page: Path) -> set[str]:
    """The heading ids of a Markdown page, as the site's table of contents makes them."""
    ids = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().replace("`", "")
            ids.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower()))
    return ids


def test_readme_links_reach_pages_and_sections() -> None:
    """README.md and the folder READMEs link into docs/, which the site build does not check."""
    readmes = [
        ROOT / "README.md",
        *(ROOT / folder / "README.md" for folder in ("configs", "slurm", "bench", "preprocessing")),
    ]
    problems, links = [], 0
    for readme in readmes:
        for target, anchor in re.findall(r"\]\(([^)#\s]+)#?([^)\s]*)\)", readme.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            links += 1
            page = (readme.parent / target).resolve()
            if not page.is_file():
                problems.append(f"{readme.relative_to(ROOT)}: no file {target}")
            elif anchor and anchor not in _anchors(page):
                problems.append(f"{readme.relative_to(ROOT)}: {target} has no section #{anchor}")
    assert links >= 15, links  # the README's documentation table and command table link every page
    assert not problems, _report(problems)
    assert "the-demo" in _anchors(ROOT / "docs" / "index.md")
