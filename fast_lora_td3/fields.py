"""Declared valid values of config fields, and the one checker every config group runs.

Each config dataclass declares a field's valid range or choices where the field is defined:
`gamma: float = setting(0.99, gt=0.0, le=1.0)`. `check_fields` checks every field of a config
against its annotated type (bool, int, float, str, list[...], `| None`) and its declared `Valid`,
and raises a one-line ConfigError naming the dotted key and what would be valid. Floats must be
finite. Rules that relate two fields stay in the owning class's `check()`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from fast_lora_td3.errors import ConfigError

__all__ = ["Valid", "check_fields", "field_type", "setting", "valid_of"]

VALID = "valid"
"""The `dataclasses.field` metadata key under which a field's `Valid` is stored."""


@dataclass(frozen=True)
class Valid:
    """The valid values of one field (of each item, for a list field)."""

    ge: float | None = None
    """Smallest valid value."""
    gt: float | None = None
    """Valid values are strictly greater than this."""
    le: float | None = None
    """Largest valid value."""
    lt: float | None = None
    """Valid values are strictly smaller than this."""
    choices: tuple[str, ...] | Callable[[], Sequence[str]] | None = None
    """The valid strings, or a function returning them (a registry that plug-ins extend)."""
    ignore_case: bool = False
    """Compare strings with `choices` case-insensitively."""
    pattern: str | None = None
    """A regular expression the whole string must match (described by `what`)."""
    what: str = ""
    """How to describe a valid string in the error (instead of the pattern or the choices)."""
    min_len: int = 0
    """Fewest items of a list field."""
    length: int | None = None
    """Exact number of items of a list field."""
    free: str = ""
    """Why every value of the annotated type is valid here (a free string, a path checked when
    used); the field-walking test exempts such fields from its range and choice probes."""

    def options(self) -> tuple[str, ...]:
        """The valid strings (an empty tuple when the field has no choices)."""
        if self.choices is None:
            return ()
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def bounds(self) -> str:
        """The numeric range in words, e.g. `> 0 and <= 1` (empty when unbounded)."""
        parts = [
            f"{op} {_num(v)}"
            for op, v in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
            if v is not None
        ]
        return " and ".join(parts)

    def in_range(self, x: float) -> bool:
        """Whether the number `x` lies in the declared range."""
        return not (
            (self.ge is not None and x < self.ge)
            or (self.gt is not None and x <= self.gt)
            or (self.le is not None and x > self.le)
            or (self.lt is not None and x >= self.lt)
        )


def setting(default: Any = dataclasses.MISSING, *, factory: Any = None, **valid: Any) -> Any:
    """A dataclass field with its default (or `factory`) and its `Valid` (keyword arguments)."""
    meta = {VALID: Valid(**valid)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def valid_of(f: dataclasses.Field) -> Valid:
    """The declared `Valid` of a field (no bounds when none was declared)."""
    return f.metadata.get(VALID, Valid())


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_type(cls: type, name: str) -> tuple[Any, bool]:
    """(the annotated type without `None`, whether None is allowed) of field `name` of `cls`."""
    hint = _hints(cls)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


_WORDS = {bool: "bool (true or false)", int: "int", float: "number", str: "string"}


def type_name(tp: Any, plural: bool = False) -> str:
    """`an int`, `a number`, `a list of ints` (plural: `ints`) for an annotated type."""
    if typing.get_origin(tp) is list:
        return ("lists" if plural else "a list") + f" of {type_name(typing.get_args(tp)[0], True)}"
    word = _WORDS.get(tp, getattr(tp, "__name__", str(tp)))
    if plural:
        return f"{word.split(' ')[0]}s{word[len(word.split(' ')[0]) :]}"
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def _scalar_problem(value: Any, tp: Any, spec: Valid) -> str | None:
    """What is wrong with one scalar `value` of type `tp` under `spec` (None: nothing)."""
    if tp is bool:
        return None if isinstance(value, bool) else "a bool (true or false)"
    if tp is int or tp is float:
        ok_type = isinstance(value, int) if tp is int else isinstance(value, (int, float))
        rng = spec.bounds()
        want = ("an int" if tp is int else "a finite number") + (f" {rng}" if rng else "")
        if isinstance(value, bool) or not ok_type:
            return want
        if not math.isfinite(value) or not spec.in_range(value):
            return want
        return None
    if tp is str:
        if not isinstance(value, str):
            return "a string"
        options = spec.options()
        probe = value.lower() if spec.ignore_case else value
        if options and probe not in options:
            return spec.what or f"one of {', '.join(map(repr, options))}"
        if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
            return spec.what or f"a string matching {spec.pattern}"
        return None
    return None  # other types (nested configs) check themselves


def check_value(key: str, value: Any, tp: Any, optional: bool, spec: Valid) -> None:
    """Raise a one-line ConfigError when `value` is not a valid value of `key`."""
    if value is None and optional:
        return
    tail = " or null" if optional else ""
    if typing.get_origin(tp) is list:
        item = typing.get_args(tp)[0]
        items = type_name(item, plural=True)
        if spec.length is not None:
            want = f"a list of {spec.length} {items}"
        else:
            want = f"a {'non-empty ' if spec.min_len else ''}list of {items}"
        if spec.bounds():
            want += f", each {spec.bounds()}"
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r} is not valid: use {want}{tail}")
        n = len(value)
        if n < spec.min_len or (spec.length is not None and n != spec.length):
            raise ConfigError(f"{key}={list(value)!r} is not valid: use {want}{tail}")
        for x in value:
            problem = _scalar_problem(x, item, spec)
            if problem:
                raise ConfigError(
                    f"{key}={list(value)!r} is not valid: each item must be {problem}"
                )
        return
    problem = _scalar_problem(value, tp, spec)
    if problem:
        raise ConfigError(f"{key}={value!r} is not valid: use {problem}{tail}")


def check_fields(config: Any, prefix: str) -> None:
    """Check every non-nested field of the dataclass `config` against its type and `Valid`;
    `prefix` is the group's dotted name (`algo`), empty for the root config."""
    cls = type(config)
    for f in dataclasses.fields(cls):
        tp, optional = field_type(cls, f.name)
        if dataclasses.is_dataclass(tp):
            continue  # a nested group checks itself
        key = f"{prefix}.{f.name}" if prefix else f.name
        check_value(key, getattr(config, f.name), tp, optional, valid_of(f))
