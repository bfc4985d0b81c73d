"""`$CARL_HOME/trajectories.toml`: the user's domain patterns and correction/redo patterns.

```toml
replace_default_domains = false      # true: only the entries below
[[domains]]
# pattern: a regex, searched case-insensitively in paths, commands, cwd, repo, prompt
pattern = "billing-api|stripe"
skill = "payments-dev"
domain = "payments"

correction_patterns = ["^(no|wrong)\\b"]   # optional: replace the documented defaults
redo_patterns = ["\\btry again\\b"]
```

A bad file is one line naming the file and the field; nothing is scored with a half-read table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CarlError
from engine.text import one_line
from engine.tomlfile import read_table
from engine.trajectories.importers.human_prompts import CORRECTION_PATTERNS, REDO_PATTERNS, Detector

FILE_NAME = "trajectories.toml"
KNOWN = {"replace_default_domains", "domains", "correction_patterns", "redo_patterns"}


class TrajectoryConfigError(CarlError):
    """One line: file, field, what is wrong."""


@dataclass
class TrajectoryConfig:
    table: Any  # domains.DomainTable
    detector: Detector


def load(home: Path) -> TrajectoryConfig:
    from engine.trajectories.scoring.domains import DomainTable

    path = home / FILE_NAME
    data: dict[str, Any] = {}
    if path.exists() or path.is_symlink():
        data = read_table(path, TrajectoryConfigError)  # a FIFO or a device is refused by type, never read
    unknown = sorted(set(data) - KNOWN)
    if unknown:
        raise TrajectoryConfigError(
            f"{path}: {one_line(unknown[0], 80)}: unknown setting (known: {', '.join(sorted(KNOWN))})"
        )
    entries = data.get("domains", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TrajectoryConfigError(
            f"{path}: domains: expected [[domains]] tables with pattern, skill, domain"
        )
    for i, entry in enumerate(entries):
        missing = [k for k in ("pattern", "domain") if not isinstance(entry.get(k), str) or not entry.get(k)]
        if missing:
            raise TrajectoryConfigError(f"{path}: domains[{i}].{missing[0]}: required (a non-empty string)")
    try:
        table = DomainTable.from_config(
            entries, replace_defaults=bool(data.get("replace_default_domains", False))
        )
    except ValueError as exc:
        raise TrajectoryConfigError(f"{path}: {exc}") from None
    detector = Detector.from_patterns(
        _patterns(path, data, "correction_patterns", CORRECTION_PATTERNS),
        _patterns(path, data, "redo_patterns", REDO_PATTERNS),
    )
    return TrajectoryConfig(table, detector)


def _patterns(path: Path, data: dict[str, Any], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise TrajectoryConfigError(f"{path}: {key}: expected a list of regular expressions")
    for i, pattern in enumerate(value):
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TrajectoryConfigError(f"{path}: {key}[{i}]: invalid regular expression ({exc})") from None
    return tuple(value)
