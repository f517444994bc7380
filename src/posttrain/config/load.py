"""Load a YAML run config, apply dotted ``key=value`` overrides, and report errors in one line."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.config.run import RunConfig


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field and the allowed values."""


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """Turn ``["sao.steps=10", "generator.engine=hf"]`` into a nested dict (values parsed as YAML).

    Raises:
        ConfigError: an item without ``=``, with an empty key, or nested deeper than ``MAX_CONFIG_DEPTH``.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"override {item!r}: expected dotted.key=value")
        node = out
        parts = key.split(".")
        if len(parts) > MAX_CONFIG_DEPTH:
            raise ConfigError(f"override {item[:60]!r}...: key nested deeper than {MAX_CONFIG_DEPTH} levels")
        for part in parts[:-1]:
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: {part} is set both as a value and as a section")
            node = nxt
        node[parts[-1]] = _safe_yaml(raw, f"override {item[:60]!r}") if raw != "" else ""
    return out


MAX_CONFIG_DEPTH = 64
"""Deepest nesting of mappings/lists a config (file or override) may have; deeper YAML (100 k levels in
the audit) printed about 3,000 lines of ``RecursionError``."""


def _safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, with nesting beyond Python's recursion limit reported as one ``ConfigError``.

    Raises:
        ConfigError: the YAML is nested too deeply to parse (names ``where``).
        yaml.YAMLError: the YAML is invalid (the caller reports it).
    """
    try:
        return yaml.safe_load(text)
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply (a config has at most {MAX_CONFIG_DEPTH} levels)") from None


def _check_depth(data: Any, where: str) -> None:
    """Refuse nesting deeper than ``MAX_CONFIG_DEPTH`` (iteratively: no recursion on hostile input).

    Raises:
        ConfigError: naming the dotted path where the limit was passed.
    """
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    seen: set[int] = set()
    while stack:
        node, path, depth = stack.pop()
        if not isinstance(node, dict | list) or id(node) in seen:
            continue  # a shared (aliased) node is walked once; its size is checked where it matters
        seen.add(id(node))
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"{where}{path or '<root>'}: nested deeper than {MAX_CONFIG_DEPTH} levels")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            stack.append((value, f"{path}.{key}" if path and isinstance(node, dict) else
                          (str(key) if isinstance(node, dict) else f"{path}[{key}]"), depth + 1))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


SHOWN_ERRORS = 5
"""Validation errors named in a config error's one line; the rest are counted."""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (``X``, ``X | None``, ``list[X]``, ``Annotated[X, ...]``...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _field_names(model: type[BaseModel]) -> list[str]:
    """The keys a config section accepts: each field's name, and its alias where it has one (``grpo.async``)."""
    return [n for name, f in model.model_fields.items() for n in dict.fromkeys((f.alias or name, name))]


def close_field(loc: tuple[Any, ...], root: type[BaseModel] = RunConfig) -> str | None:
    """The valid dotted key closest to the unknown key ``loc`` (``("sao", "stepz")`` -> ``"sao.steps"``), or None.

    Walks ``root``'s sections along ``loc[:-1]`` (list indices pass through), then picks the closest of that
    section's keys (``difflib.get_close_matches``, cutoff 0.6); failing that, a key of one of its sub-sections with
    that name, or the closest such (``sao.lr`` -> ``sao.optim.lr``); None when the section is not a model or nothing
    is close.
    """
    models: list[type[BaseModel]] = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        models = [m for model in models if (f := model.model_fields.get(str(part))) is not None
                  for m in _models_in(f.annotation)]
    names = list(dict.fromkeys(n for model in models for n in _field_names(model)))
    match = difflib.get_close_matches(str(loc[-1]), names, n=1) if names else []
    if not match:  # one section down: sao.lr -> sao.optim.lr
        deeper = list(dict.fromkeys(f"{name}.{n}" for model in models for name, f in model.model_fields.items()
                                    for sub in _models_in(f.annotation) for n in _field_names(sub)))
        leaf = {d: d.rsplit(".", 1)[1] for d in deeper}
        match = [d for d in deeper if leaf[d] == str(loc[-1])][:1] or [
            d for d in deeper if leaf[d] in difflib.get_close_matches(str(loc[-1]), list(leaf.values()), n=1)][:1]
    if not match:
        return None
    return ".".join([*(str(p) for p in loc[:-1] if not isinstance(p, int)), match[0]])


def _describe_one(error: Any) -> str:
    """``field: reason[, got value]`` for one pydantic error (``ValidationError.errors()`` item).

    An unknown field says which valid key is closest (``sao.stepz: unknown field (did you mean sao.steps?)``).
    """
    loc = ".".join(str(p) for p in error["loc"]) or "<root>"
    msg = error["msg"]
    ctx = error.get("ctx") or {}
    if error["type"] == "extra_forbidden":
        msg = "unknown field"
        if (near := close_field(tuple(error["loc"]))) is not None:
            msg += f" (did you mean {near}?)"
    elif error["type"] == "literal_error" and "expected" in ctx:
        msg = f"allowed values are {ctx['expected']}"
    elif error["type"] == "value_error":
        msg = msg.removeprefix("Value error, ")  # our validators' own sentence, without pydantic's label
    given = error.get("input")
    shown = "" if isinstance(given, dict) or error["type"] == "extra_forbidden" else f", got {given!r}"
    return f"{loc}: {msg}{shown}"


def _describe(err: ValidationError, source: Callable[[str, bool], str] = lambda loc, unknown: "") -> str:
    """Every error of ``err`` on one line (``; ``-separated), the first ``SHOWN_ERRORS`` named and the rest counted.

    ``source(field, unknown)`` is the prefix naming where a field's value came from (the config file, or the override
    that set it; ``unknown``: the error is an unknown field); it is written before an error whenever it differs from
    the error before it. Two misspelt fields were
    reported as the first one ``(and 1 more)``: a user fixed one and ran again.
    """
    errors = err.errors()
    parts, last = [], None
    for error in errors[:SHOWN_ERRORS]:
        where = source(".".join(str(p) for p in error["loc"]), error["type"] == "extra_forbidden")
        parts.append(("" if where == last else where) + _describe_one(error))
        last = where
    more = f" (and {len(errors) - SHOWN_ERRORS} more)" if len(errors) > SHOWN_ERRORS else ""
    return "; ".join(parts) + more


def _has_path(data: Any, dotted: str) -> bool:
    """Whether the nested mapping ``data`` holds the dotted key ``dotted`` (``"sao.critic"``)."""
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def load_config(path: Path | str | None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config (or defaults when ``path`` is None) and apply overrides.

    Args:
        path: YAML file path.
        overrides: Dotted ``key=value`` strings; values are parsed as YAML scalars.

    Returns:
        The validated ``RunConfig``.

    Raises:
        ConfigError: unreadable or empty file, YAML that is not a mapping, or a field out of range; one
            line naming the field and the allowed values.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: no such config file")
        if not p.is_file():
            raise ConfigError(f"{p}: not a file (give the path of a YAML config file)")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: cannot read the config file: {exc}") from exc
        try:
            loaded = _safe_yaml(text, str(p))
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" (line {where.line + 1}, column {where.column + 1})" if where is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{p}: not valid YAML{at}: {problem}") from exc
        if loaded is None:  # an empty file, or only comments: it ran a full default SAO run and registered it
            raise ConfigError(f"{p}: empty config file (no settings); a config names at least its technique, "
                              "e.g. `technique: sft` (examples in configs/)")
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: top level must be a mapping, got {type(loaded).__name__}")
        data = loaded
    _check_depth(data, f"{path}: " if path is not None else "")
    extra = parse_overrides(overrides or [])
    _check_depth(extra, "override ")
    from_file = data
    data = _merge(data, extra)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        def source(loc: str, unknown: bool) -> str:
            def sets(key: str) -> bool:  # the override sets ``loc`` (or, for an unknown field, something under it)
                return loc == key or loc.startswith(key + ".") or (
                    unknown and key.startswith(loc + ".") and not _has_path(from_file, loc))
            overridden = [o for o in overrides or [] if sets(o.partition("=")[0].strip())]
            if overridden:  # the bad value came from the command line, not from the file
                return f"override {overridden[-1]!r}: "
            return f"{path}: " if path is not None else ""

        raise ConfigError(_describe(exc, source)) from exc
