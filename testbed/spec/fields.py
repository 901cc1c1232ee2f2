"""The fields of the description files as declarative tables: one :class:`Field` per key (its
name, kind, unit, default, allowed range and the fix an error names), one :class:`FieldTable` per
mapping of a file (the top level, ``compute``, ``links[i]``...). The readers (``specfile.FieldReader``)
take keys, kinds and ranges from these tables, the checks of a value set on the command line
(``experiment.check_experiment``) take the same ranges, and the reference page of the file formats
(``docs/reference/files.md``, ``cli/reference.py``) is written from them: a field added to
a table is read, checked and documented at once.

What a table cannot say (a rule between fields, such as ``stages`` at most ``model.n_layers``) is
checked by the reader's code and written in the field's ``rule``, so the page shows it too."""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.errors import SpecError
from testbed.spec.units import (
    UnitError,
    format_duration_us,
    format_rate,
    parse_bytes,
    parse_duration_us,
    parse_percent,
    parse_rate_bps,
)


class _Required:
    """The default of a field a file must give."""

    def __repr__(self) -> str:
        return "REQUIRED"


#: the default of a field a file must give
REQUIRED: Any = _Required()


def _whole(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise UnitError("is not a whole number; write a count such as 4")
    return v


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise UnitError("is not a number; write e.g. 0.5")
    return float(v)


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise UnitError("is not true or false; write true or false")
    return v


def _text(v: Any) -> str:
    if isinstance(v, (dict, list)):
        raise UnitError("is not text; write a single word or a quoted string")
    return str(v)


def _network(v: Any) -> ipaddress.IPv4Network:
    try:
        return ipaddress.IPv4Network(str(v))
    except ValueError:
        raise UnitError("is not an IPv4 network; write it as address/prefix, such as 10.100.0.0/16") from None


def _as_is(v: Any) -> Any:
    return v


#: each kind of field: (how the reference page names it, the parser of a file's value). A parser
#: raises UnitError "problem; fix" for a value of the wrong kind
KINDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "int": ("whole number", _whole),
    "number": ("number", _number),
    "bool": ("true or false", _bool),
    "text": ("text", _text),
    "choice": ("name", _as_is),  # checked against the choices by ``Field.problem``
    "rate": ("rate (`100mbit`, `10gbit`, `1.5Gbps`)", parse_rate_bps),
    "duration": ("duration (`10ms`, `1.5s`, `250us`)", parse_duration_us),
    "size": ("size (`64MiB`, `80GB`, `4096`)", parse_bytes),
    "percent": ("percentage (`0.1%`)", parse_percent),
    "network": ("IPv4 network (`10.100.0.0/16`)", _network),
    "path": ("path", _as_is),
    "section": ("mapping", _as_is),
    "list": ("list", _as_is),
    "model": ("model name or mapping", _as_is),
    "pair": ("pair of DC names", _as_is),
    "matrix": ("matrix (rows of values, `null` for none)", _as_is),
}


#: the kinds whose value the table checks whole (the others are read by their own code)
SCALAR_KINDS = ("int", "number", "bool", "text", "choice", "rate", "duration", "size", "percent")


@dataclass(frozen=True)
class Field:
    """One key of a description file.

    ``kind``: a key of ``KINDS``; ``unit``: the unit of the value as read (``bit/s`` for a rate,
    ``µs`` for a duration, ``bytes``...); ``default``: the value when the key is left out
    (``REQUIRED``: it must be given; None: unset, where ``default_text`` says what that means);
    ``low``/``high``: the allowed range, open at an end where ``low_open``/``high_open``;
    ``choices``: the allowed names of a ``choice``; ``rule``: a constraint between fields that the
    reader's code checks (shown on the reference page); ``fix``: what an error about this field
    tells the user to write; ``table``: the name of the table a ``section`` or the entries of a
    ``list`` follow."""

    name: str
    kind: str
    doc: str
    unit: str = ""
    default: Any = None
    default_text: str = ""
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False
    choices: tuple[str, ...] = ()
    rule: str = ""
    fix: str = ""
    table: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"field {self.name}: unknown kind {self.kind!r} (one of {', '.join(KINDS)})")

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def parse(self, value: Any) -> Any:
        """The file's ``value`` as the program holds it, checked against the kind, the choices and
        the range. Raises UnitError "problem; fix"."""
        try:
            parsed = KINDS[self.kind][1](value)
        except UnitError as e:  # a number of another kind: the field's own fix, where it has one
            problem, _, fix = str(e).partition("; ")
            own = self.fix if self.kind in ("int", "number") else ""
            raise UnitError(f"{problem}; {own or fix}") from None
        problem = self.problem(parsed)
        if problem:
            raise UnitError(f"{problem}; {self.fix or self._range_fix()}")
        return parsed

    def problem(self, value: Any) -> str:
        """What is wrong with a parsed ``value`` ("" if nothing): a value of another kind (one the
        Python API or the command line set), a name not among the choices, or a number outside the
        range. None (unset) is never wrong here: whether a field must be set is the reader's."""
        if value is None:
            return ""
        if self.kind in ("int", "number") and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"is not a {KINDS[self.kind][0]}"
        if self.kind == "int" and not isinstance(value, int):
            return "is not a whole number"
        if self.kind == "bool" and not isinstance(value, bool):
            return "is not true or false"
        if self.choices and (not isinstance(value, str) or value not in self.choices):
            return "is not one of " + ", ".join(self.choices)
        if self.low is None and self.high is None:
            return ""
        if isinstance(value, float) and not math.isfinite(value):
            return "is not a finite number"
        low_bad = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        high_bad = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if not (low_bad or high_bad):
            return ""
        if self.low is not None and self.high is not None:
            return f"is not {self.range_text()}"
        fmt = _FORMATS.get(self.kind, _fmt)
        if low_bad:
            return f"is not above {fmt(self.low)}" if self.low_open else f"is below {fmt(self.low)}"
        return f"is not below {fmt(self.high)}" if self.high_open else f"is above {fmt(self.high)}"

    def range_text(self) -> str:
        """The allowed range in words, in the file's own terms: ``at least 1``, ``in (0, 1]``,
        ``from 0 to 16``, ``above 0``, ``from 0us to 10s``."""
        fmt = _FORMATS.get(self.kind, _fmt)
        low, high = fmt(self.low), fmt(self.high)
        if self.low is not None and self.high is not None:
            if not self.low_open and not self.high_open:
                return f"from {low} to {high}"
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"above {low}" if self.low_open else f"at least {low}"
        if self.high is not None:
            return f"below {high}" if self.high_open else f"at most {high}"
        return ""

    def _range_fix(self) -> str:
        if self.choices:
            return f"use one of {', '.join(self.choices)}"
        fmt = _FORMATS.get(self.kind, _fmt)
        if self.high is None and self.low is not None and not self.low_open:
            return f"use {fmt(self.low)} or more"
        if self.low is None and self.high is not None and not self.high_open:
            return f"use {fmt(self.high)} or less"
        return f"give a value {self.range_text()}"

    def error(self, source: str, where: str, value: Any, problem: str) -> SpecError:
        """The SpecError for ``value`` of this field at ``where`` (a dotted path), naming the fix."""
        return SpecError(source, where, value, problem, self.fix or self._range_fix())

    def allowed_text(self) -> str:
        """Everything the reference page says a value may be: choices, range and rule."""
        parts = [", ".join(f"`{c}`" for c in self.choices)] if self.choices else []
        parts += [self.range_text()] if self.range_text() else []
        parts += [self.rule] if self.rule else []
        return "; ".join(parts)


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:g}" if not float(x).is_integer() else str(int(x))


#: how a range's ends are written for a kind whose values the program holds in other units
_FORMATS: dict[str, Callable[[float | None], str]] = {
    "rate": lambda x: "" if x is None else format_rate(x),
    "duration": lambda x: "" if x is None else format_duration_us(x),
    "percent": lambda x: "" if x is None else f"{_fmt(x)}%",
}


@dataclass(frozen=True)
class FieldTable:
    """The keys of one mapping of a description file: ``name`` as the reference page heads it
    (``experiment``, ``experiment: compute``), ``where`` the path of the mapping in a file
    (``compute``, ``links[i]``; "" for the top level), ``doc`` a sentence on what it holds."""

    name: str
    where: str
    doc: str
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"table {self.name}: a field is listed twice")

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"table {self.name} has no field {name!r}")

    def check(self, source: str, obj: Any, where: str = "") -> None:
        """Check every field of ``obj`` (a description made from a file, the command line or the
        Python API) that ``obj`` holds under the field's name against its kind, choices and range.
        Raises SpecError naming ``<where>.<field>``, the value and the fix, for the first wrong one."""
        for f in self.fields:
            if f.kind in SCALAR_KINDS and hasattr(obj, f.name):
                value = getattr(obj, f.name)
                unset = value is None and f.default is not None  # None means "unset" only where that is the default
                problem = f"is not {'a ' + KINDS[f.kind][0] if f.kind != 'bool' else 'true or false'}" if unset else ""
                problem = problem or f.problem(value)
                if problem:
                    raise f.error(source, f"{where}.{f.name}" if where else f.name, value, problem)
