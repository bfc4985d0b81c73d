"""`[system]` in `$CARL_HOME/engine.toml`: how the engine samples the machine.

```toml
[system]
interval_s = 2          # seconds between samples (default 2; at least 0.1, so at most 10 a second)
enabled = true          # false: the engine samples nothing (the System pane says so)
paths = ["/data/ckpt"]  # more directories whose disk's free space is watched ($CARL_HOME's and runs' are)
```

A bad value is one line naming its key (`engine.toml: system.interval_s: ...`) and the default holds; the rest
still applies, as for `[alerts]` (engine/alerts/alert_settings.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CarlError
from engine.files import named
from engine.text import one_line
from engine.tomlfile import read_table

FILE_NAME = "engine.toml"
KNOWN_KEYS = ("interval_s", "enabled", "paths")
DEFAULT_INTERVAL_S = 2.0  # btop's and nvitop's default; LEET samples every 15 s
MIN_INTERVAL_S = 0.1  # 10 samples a second at most
MAX_INTERVAL_S = 3600.0
MAX_PATHS = 64


class SystemFileError(CarlError):
    """engine.toml cannot be read."""


@dataclass(frozen=True)
class SystemSettings:
    interval_s: float = DEFAULT_INTERVAL_S
    enabled: bool = True
    paths: tuple[str, ...] = field(default_factory=tuple)


def load_system_settings(home: Path) -> tuple[SystemSettings, list[str]]:
    """The `[system]` table of `home/engine.toml` (none: the defaults), and one line per problem."""
    path = home / FILE_NAME
    if not path.exists() and not path.is_symlink():
        return SystemSettings(), []
    try:
        data = read_table(path, SystemFileError)
    except SystemFileError as exc:
        return SystemSettings(), [f"{FILE_NAME}: {str(exc).removeprefix(named(path) + ': ')}"]
    table = data.get("system", {})
    if not isinstance(table, dict):
        return SystemSettings(), [f"{FILE_NAME}: system: expected a table ([system])"]
    problems = [
        f"{FILE_NAME}: system.{one_line(key, 80)}: unknown setting (known: {', '.join(KNOWN_KEYS)})"
        for key in table
        if key not in KNOWN_KEYS
    ]
    return (
        SystemSettings(
            _interval(table.get("interval_s"), problems),
            _enabled(table.get("enabled"), problems),
            _paths(table.get("paths"), problems),
        ),
        problems,
    )


def _interval(value: Any, problems: list[str]) -> float:
    if value is None:
        return DEFAULT_INTERVAL_S
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if number and MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        return float(value)
    problems.append(
        f"{FILE_NAME}: system.interval_s: expected seconds from {MIN_INTERVAL_S:g} (10 a second) to"
        f" {MAX_INTERVAL_S:g}; sampling every {DEFAULT_INTERVAL_S:g} s"
    )
    return DEFAULT_INTERVAL_S


def _enabled(value: Any, problems: list[str]) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    problems.append(f"{FILE_NAME}: system.enabled: expected true or false")
    return True


def _paths(value: Any, problems: list[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, list) and len(value) <= MAX_PATHS and all(isinstance(v, str) and v for v in value):
        return tuple(str(Path(v).expanduser()) for v in value)
    problems.append(f"{FILE_NAME}: system.paths: expected a list of at most {MAX_PATHS} directories")
    return ()
