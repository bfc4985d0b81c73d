"""Reading a YAML settings file, with one-line errors that name the file (and the line, for bad YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import CarlError
from engine.files import named, read_utf8

MAX_BYTES = 4 << 20  # a settings file is a few KiB
MAX_DEPTH = 32  # levels of nested mappings and lists; settings use three or four
MAX_NODES = 100_000  # values in all, aliases counted each time they are used


def read_mapping(
    path: Path, error: type[CarlError], *, missing: str = "no such file", what: str = "settings"
) -> dict[str, Any]:
    """The mapping at the top of the YAML file `path` (an empty file is `{}`); any problem raises
    `error` with one line: `path: no such file`, `path:LINE: invalid YAML: ...`, `path: expected ...`,
    `path: a FIFO (named pipe), not a regular file`, `path: not UTF-8 text ...`, `path: nested deeper ...`."""
    import yaml  # only the commands that read such a file pay for it

    if not Path(path).exists() and not Path(path).is_symlink():
        raise error(f"{named(path)}: {missing}")
    text = read_utf8(path, error=error, limit=MAX_BYTES)  # a FIFO is refused, never read
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{named(path)}:{mark.line + 1}" if mark is not None else named(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise error(f"{named(path)}: invalid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{named(path)}: expected a mapping of {what}, found {type(data).__name__}")
    problem = shape_problem(data)
    if problem is not None:
        raise error(f"{named(path)}: {problem}")
    return data


def shape_problem(value: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> str | None:
    """Why a parsed document is too deep or too big to use, or None. Walked without recursion and bounded:
    YAML aliases can make a structure that refers to itself,
    or one that expands a thousandfold at every level."""
    pending = [(value, 1)] if isinstance(value, dict | list) else []
    nodes = 0
    while pending:
        node, level = pending.pop()
        if level > max_depth:
            return f"nested deeper than {max_depth} levels"
        nodes += len(node)
        if nodes > max_nodes:
            return f"more than {max_nodes:,} values (YAML aliases expanding?)"
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, level + 1) for child in children if isinstance(child, dict | list))
    return None
