"""Reading a YAML settings file, with one-line errors that name the file (and the line, for bad YAML)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import CarlError


def read_mapping(
    path: Path, error: type[CarlError], *, missing: str = "no such file", what: str = "settings"
) -> dict[str, Any]:
    """The mapping at the top of the YAML file `path` (an empty file is `{}`); any problem raises
    `error` with one line: `path: no such file`, `path:LINE: invalid YAML: ...`, `path: expected ...`."""
    import yaml  # only the commands that read such a file pay for it

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(f"{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise error(f"{path}: expected a mapping of {what}, found {type(data).__name__}")
    return data
