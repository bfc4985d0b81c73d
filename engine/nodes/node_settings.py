"""`[nodes]` in `$CARL_HOME/engine.toml`: where the engine reads what other nodes publish (`carl node`).

```toml
[nodes]
url = "nats://10.0.0.5:4222"     # a NATS server every node can reach (a comma-separated list: a cluster)
token_file = "~/.carl/nodes.token"  # the file holding its token (or creds_file = "..."; tls_ca_file = "...")
lost_after_s = 30                # a node without a sample for this long is marked lost (default 30)
enabled = true                   # false: the engine reads no node
```

Without `url`, the engine reads the nodes' stream from the agents plane's server while the plane is up. A
bad value is one line naming its key (`engine.toml: nodes.lost_after_s: ...`) and its default holds; the
rest still applies, as for `[system]` (engine/system/system_settings.py). Relative paths are taken from
$CARL_HOME.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CarlError
from engine.files import named
from engine.text import one_line
from engine.tomlfile import read_table

FILE_NAME = "engine.toml"
KNOWN_KEYS = ("url", "token_file", "creds_file", "tls_ca_file", "lost_after_s", "enabled")
DEFAULT_LOST_AFTER_S = (
    30.0  # fifteen samples missed at the default 2 s: a busy node misses a few, not fifteen
)
MIN_LOST_AFTER_S = 0.5
MAX_LOST_AFTER_S = 86400.0


class NodesFileError(CarlError):
    """engine.toml cannot be read."""


@dataclass(frozen=True)
class NodesSettings:
    url: str | None = None
    token_file: str | None = None
    creds_file: str | None = None
    tls_ca_file: str | None = None
    lost_after_s: float = DEFAULT_LOST_AFTER_S
    enabled: bool = True


def load_nodes_settings(home: Path) -> tuple[NodesSettings, list[str]]:
    """The `[nodes]` table of `home/engine.toml` (none: the defaults), and one line per problem."""
    path = home / FILE_NAME
    if not path.exists() and not path.is_symlink():
        return NodesSettings(), []
    try:
        data = read_table(path, NodesFileError)
    except NodesFileError as exc:
        return NodesSettings(), [f"{FILE_NAME}: {str(exc).removeprefix(named(path) + ': ')}"]
    table = data.get("nodes", {})
    if not isinstance(table, dict):
        return NodesSettings(), [f"{FILE_NAME}: nodes: expected a table ([nodes])"]
    problems = [
        f"{FILE_NAME}: nodes.{one_line(key, 80)}: unknown setting (known: {', '.join(KNOWN_KEYS)})"
        for key in table
        if key not in KNOWN_KEYS
    ]
    return (
        NodesSettings(
            _url(table.get("url"), problems),
            _file(table, "token_file", home, problems),
            _file(table, "creds_file", home, problems),
            _file(table, "tls_ca_file", home, problems),
            _lost_after(table.get("lost_after_s"), problems),
            _enabled(table.get("enabled"), problems),
        ),
        problems,
    )


def _url(value: Any, problems: list[str]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        problems.append(f"{FILE_NAME}: nodes.url: expected a nats:// URL")
        return None
    try:
        from engine.agents.plane_settings import check_url
    except ImportError:
        problems.append(
            f"{FILE_NAME}: nodes.url: reading nodes needs the nats extra (pip install 'carl-tui[nats]')"
        )
        return None
    try:
        return check_url(value)
    except ValueError as exc:
        problems.append(f"{FILE_NAME}: nodes.url: {one_line(str(exc), 200)}")
        return None


def _file(table: dict[str, Any], key: str, home: Path, problems: list[str]) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\0" in value:
        problems.append(f"{FILE_NAME}: nodes.{key}: expected a file's path")
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else home / path)


def _lost_after(value: Any, problems: list[str]) -> float:
    if value is None:
        return DEFAULT_LOST_AFTER_S
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if number and MIN_LOST_AFTER_S <= value <= MAX_LOST_AFTER_S:
        return float(value)
    problems.append(
        f"{FILE_NAME}: nodes.lost_after_s: expected seconds from {MIN_LOST_AFTER_S:g} to"
        f" {MAX_LOST_AFTER_S:g}; using {DEFAULT_LOST_AFTER_S:g}"
    )
    return DEFAULT_LOST_AFTER_S


def _enabled(value: Any, problems: list[str]) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    problems.append(f"{FILE_NAME}: nodes.enabled: expected true or false")
    return True
