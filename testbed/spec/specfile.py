"""Reading description files (topologies, experiments): YAML loading with traps closed, field
readers whose every error names the file, the field (a dotted path), the value and the fix, and
the lookup of shipped files by name."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from testbed.errors import SpecError
from testbed.spec.fields import SCALAR_KINDS, FieldTable
from testbed.spec.units import UnitError


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (an alias bomb expands to gigabytes) and duplicate
    keys (where PyYAML silently keeps the last one)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not supported; write the value out", mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise yaml.constructor.ConstructorError(None, None, "a key must be a plain word", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


class FieldReader:
    """Reads one mapping of a file by its table (``fields.FieldTable``: the keys allowed and
    required, each one's kind, range and fix), naming the field path in every error. ``path``: the
    mapping's place in the file (``links[2]``; "" for the top level); ``fields``: field paths to
    name in place of ``<path>.<key>`` (a matrix cell)."""

    def __init__(
        self, source: str, data: Any, path: str, table: FieldTable, fields: dict[str, str] | None = None
    ) -> None:
        self.source, self.path, self.table, self.fields = source, path, table, fields or {}
        allowed = table.keys
        if not isinstance(data, dict):
            raise SpecError(
                source,
                path or "(top level)",
                data,
                "is not a mapping",
                f"write it as 'key: value' lines with keys among {', '.join(allowed)}",
            )
        for key in data:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                fix = f"did you mean {close[0]!r}?" if close else f"allowed keys are {', '.join(allowed)}"
                raise SpecError(source, self.at(str(key)), key, "is not a known key", fix)
        for key in table.required:
            if key not in data:
                raise SpecError(source, self.at(key), None, "is missing", f"add '{key}:' to {path or 'the file'}")
        self.data = data

    def at(self, key: str) -> str:
        if key in self.fields:
            return self.fields[key]
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str, fix: str) -> SpecError:
        return SpecError(self.source, self.at(key), self.data.get(key), problem, fix)

    def value(self, key: str) -> Any:
        """Field ``key`` as read by its table: parsed and checked against its kind, choices and
        range, or its default where the file leaves it out. Written out empty (``key:`` or
        ``null``), it is its default where that is "unset" (None), and an error where the field
        is required or has a value of its own. Raises SpecError naming the field, the value and the fix."""
        field = self.table[key]
        if key not in self.data or self.data[key] is None:
            if key in self.data and (field.required or field.default is not None):
                raise SpecError(
                    self.source,
                    self.at(key),
                    None,
                    "is empty",
                    f"give '{key}' a value" + ("" if field.required else ", or leave the key out for its default"),
                )
            return None if field.required else field.default
        try:
            return field.parse(self.data[key])
        except UnitError as e:
            raise SpecError(self.source, self.at(key), self.data[key], *split_unit_error(e)) from None

    def values(self, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
        """``value`` of each of ``keys`` (default: every field of a kind the table checks whole)
        that the file gives: what it leaves out keeps the description's own default."""
        keys = keys if keys is not None else tuple(f.name for f in self.table.fields if f.kind in SCALAR_KINDS)
        return {key: self.value(key) for key in keys if key in self.data}


def split_unit_error(e: UnitError) -> tuple[str, str]:
    problem, _, fix = str(e).partition("; ")
    return problem, fix


def resolve_spec_path(name_or_path: str | Path, folder: Path, what: str) -> Path:
    """A file path, or the name of a shipped file (``three_dc``) in ``folder``."""
    p = Path(name_or_path)
    if p.exists():
        return p
    shipped = folder / (p.name if p.suffix else f"{p.name}.yaml")
    if shipped.exists() and p.parent == Path("."):
        return shipped
    known = ", ".join(sorted(f.stem for f in folder.glob("*.yaml")))
    raise SpecError(
        str(name_or_path),
        "(file)",
        str(name_or_path),
        "does not exist",
        f"give a path to {'an' if what[0] in 'aeiou' else 'a'} {what} file or one of the shipped names: {known}",
    )


def read_spec_file(name_or_path: str | Path, folder: Path, what: str) -> tuple[Path, Any]:
    """(path, parsed YAML) of a description file; every failure is a one-line SpecError."""
    try:
        path = resolve_spec_path(name_or_path, folder, what)
    except OSError as e:
        raise SpecError(
            str(name_or_path)[:200],
            "(file)",
            str(name_or_path)[:200],
            f"cannot be read ({e.strerror})",
            "check the path and its permissions",
        ) from None
    try:
        return path, yaml.load(path.read_text(), Loader=SpecLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise SpecError(
            str(path), "(file)", path.name, f"is not valid YAML{where}: {problem}", "fix the YAML syntax there"
        ) from None
    except OSError as e:
        raise SpecError(
            str(path), "(file)", path.name, f"cannot be read ({e.strerror})", "check the path and its permissions"
        ) from None
    except UnicodeDecodeError as e:
        raise SpecError(
            str(path),
            "(file)",
            path.name,
            f"is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})",
            "save it as UTF-8",
        ) from None
    except (ValueError, RecursionError) as e:
        raise SpecError(
            str(path),
            "(file)",
            path.name,
            f"cannot be read as a {what} ({type(e).__name__}: {str(e)[:120]})",
            "keep numbers short and nesting shallow",
        ) from None
