"""YAML configs mapped onto dataclasses: unknown keys and wrong types are errors, `--set a.b=v` overrides."""

from __future__ import annotations

import argparse
import dataclasses
import decimal
import math
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ecgpos.errors import ConfigError
from ecgpos.files import atomic_write_text

T = TypeVar("T")


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _unique_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if not isinstance(key, str):  # `1:`, `null:`, `? [a]`: no config key is anything but a name
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} is not a name (line {key_node.start_mark.line + 1})", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Convert a YAML value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError("; or ".join(errors) if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: must be one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        if value is None:  # `optim:` with every key commented out: the section's defaults
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(hint, value, prefix=f"{where}.")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{where}: expected {len(args)} values, got {len(value)}")
            return tuple(_coerce(v, a, where) for v, a in zip(value, args))
        item = args[0] if args else Any
        return origin(_coerce(v, item, where) for v in value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):  # no config value means anything as NaN or infinity
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if hint is int:
        # PyYAML reads 1e5 and 1.5e5 as text: its floats need a dot, and a sign on any exponent
        if isinstance(value, str):
            value = _integer_text(value)
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(value)
    if hint is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def _integer_text(text: str) -> int | str:
    """The integer a number written as text means exactly ('1e5', '1.5e5', '200'), else the text unchanged."""
    try:
        number = decimal.Decimal(text.strip().replace("_", ""))
    except decimal.InvalidOperation:
        return text
    if not number.is_finite() or number != number.to_integral_value() or abs(number) > 10**30:
        return text
    return int(number)


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping; unknown keys raise ConfigError with their dotted path."""
    if data is None:
        data = {}
    data = renamed_keys(cls, data, prefix)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ConfigError(
            f"unknown config key(s): {', '.join(prefix + str(k) for k in unknown)} (known: {', '.join(sorted(fields))})"
        )
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {err}") from None


def renamed_keys(cls: type, data: Mapping[str, Any], prefix: str = "") -> Mapping[str, Any]:
    """`data` with the other spellings of `cls.KEY_ALIASES` ({other spelling: field}) read as their field;
    ConfigError when a mapping gives both spellings."""
    aliases = getattr(cls, "KEY_ALIASES", {})
    if not any(old in data for old in aliases):
        return data
    out = dict(data)
    for old, new in aliases.items():
        if old in out:
            if new in out:
                raise ConfigError(
                    f"config gives both {prefix}{old} and {prefix}{new} (the same key): keep {prefix}{new}"
                )
            out[new] = out.pop(old)
    return out


def to_dict(obj: Any) -> dict[str, Any]:
    """Plain-YAML-safe dict of a dataclass (tuples become lists)."""

    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(obj))


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `a.b=value` strings (value parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"--set expects key=value with a dotted key such as optim.lr, got {item!r}")
        node = data
        for part in parts[:-1]:
            if node.get(part) is None:  # absent, or a section whose keys are all commented out
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part} is not a section")
        try:
            value = _load_yaml(raw)
        except yaml.YAMLError as err:  # e.g. a `!!python/...` tag, which safe_load refuses to construct
            problem = " ".join(str(getattr(err, "problem", None) or err).split())
            raise ConfigError(f"--set {key}: value {raw!r} is not plain YAML ({problem})") from None
        node[parts[-1]] = _merged(node.get(parts[-1]), value)
    return data


def add_set_option(parser: argparse.ArgumentParser, what: str, example: str) -> None:
    """`--set KEY=VALUE` (repeatable) on a command's parser, collected in `args.overrides` for
    `apply_overrides` / `load_config`; `what` and `example` make its help the command's own."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override {what}, e.g. --set {example} (repeatable)",
    )


def _merged(old: Any, new: Any) -> Any:
    """`new` laid over `old`: a mapping given for a section changes only the keys it names
    (`--set optim={lr: 0.1}` keeps the file's optim.steps), anything else replaces the value."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _merged(old.get(k), v) for k, v in new.items()}}
    return new


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a folder, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = _load_yaml(path.read_text()) or {}
    except yaml.constructor.ConstructorError as err:  # a duplicate key or a tag safe_load refuses
        problem = " ".join(str(err.problem or err).split())
        raise ConfigError(f"{path}: not valid YAML ({problem})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def load_config(cls: type[T], path: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Read YAML `path` (or start from defaults), apply overrides, map onto `cls`."""
    data = read_yaml(path) if path is not None else {}
    return from_dict(cls, apply_overrides(data, overrides))


def save_config(obj: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (the file a run can be reproduced from), atomically: a run
    rewrites it at every start, and a full disk must not leave a run whose config no longer reads."""
    atomic_write_text(path, yaml.safe_dump(to_dict(obj), sort_keys=False))
