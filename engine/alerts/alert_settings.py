"""`$CARL_HOME/engine.toml`: the engine's own settings, read-only for the engine. Today one table, `[alerts]`:

```toml
[alerts]
webhook = "https://hooks.example.com/carl"   # an HTTP POST of the alert as JSON
command = ["notify-send", "carl"]            # or a command line ("notify.sh --urgent"), the JSON on its stdin
timeout_s = 10                               # per try, for either (default 10, at most 120)
```

Either, both or neither may be set. A bad value is one line naming its key (`engine.toml: alerts.webhook:
...`) and leaves that key unset; the rest still applies. The webhook's URL often is its secret (Slack,
Discord), so it is never written to a log line.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.errors import CarlError
from engine.files import named
from engine.text import one_line
from engine.tomlfile import read_table

FILE_NAME = "engine.toml"
# [system] and [nodes]: engine/system/system_settings.py, engine/nodes/node_settings.py
KNOWN_TABLES = ("alerts", "system", "nodes")
KNOWN_KEYS = ("webhook", "command", "timeout_s")
DEFAULT_TIMEOUT_S = 10.0
KEY_CHARS = 80  # of a key the file names and we do not know, in its line (a key may hold a newline)
MAX_TIMEOUT_S = 120.0  # a try may hold the sender this long; the engine's loop never waits for it


class AlertsFileError(CarlError):
    """engine.toml cannot be read (the engine says so in its log and goes on without alerts)."""


@dataclass(frozen=True)
class AlertSettings:
    webhook: str | None = None
    command: tuple[str, ...] | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def targets(self) -> tuple[str, ...]:
        """Where an alert goes: "webhook", "command", both or none."""
        return tuple(t for t, on in (("webhook", self.webhook), ("command", self.command)) if on)


def load_settings(home: Path) -> tuple[AlertSettings, list[str]]:
    """The `[alerts]` table of `home/engine.toml` (no file: no alerts), and one line per problem."""
    path = home / FILE_NAME
    if not path.exists() and not path.is_symlink():
        return AlertSettings(), []
    try:
        data = read_table(path, AlertsFileError)  # a FIFO or a device is refused by type, never read
    except AlertsFileError as exc:  # named by its file name alone, as every line of this file is
        return AlertSettings(), [f"{FILE_NAME}: {str(exc).removeprefix(named(path) + ': ')}"]
    problems = [
        f"{FILE_NAME}: {one_line(key, KEY_CHARS)}: unknown setting (known: {', '.join(KNOWN_TABLES)})"
        for key in data
        if key not in KNOWN_TABLES
    ]
    table = data.get("alerts", {})
    if not isinstance(table, dict):
        return AlertSettings(), [*problems, f"{FILE_NAME}: alerts: expected a table ([alerts])"]
    problems += [
        f"{FILE_NAME}: alerts.{one_line(key, KEY_CHARS)}: unknown setting (known: {', '.join(KNOWN_KEYS)})"
        for key in table
        if key not in KNOWN_KEYS
    ]
    webhook = _webhook(table.get("webhook"), problems)
    command = _command(table.get("command"), problems)
    timeout = _timeout(table.get("timeout_s"), problems)
    return AlertSettings(webhook, command, timeout), problems


def _webhook(value: Any, problems: list[str]) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            parts = urlsplit(value.strip())
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        except ValueError:  # urllib's own refusal: a "[" that opens no IPv6 address, a port past 65535
            usable = False
        if usable:
            return value.strip()
    # The value itself is not shown: a webhook's URL is usually its secret.
    problems.append(f"{FILE_NAME}: alerts.webhook: expected an http:// or https:// URL")
    return None


def _command(value: Any, problems: list[str]) -> tuple[str, ...] | None:
    """A command line (split as a shell would, but run without one) or a list of words."""
    if value is None or value == "" or value == []:
        return None
    argv: list[str] | None = None
    if isinstance(value, str):
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            problems.append(f"{FILE_NAME}: alerts.command: cannot split it into words ({exc})")
            return None
    elif isinstance(value, list) and all(isinstance(v, str) and v for v in value):
        argv = list(value)
    if not argv:
        problems.append(f"{FILE_NAME}: alerts.command: expected a command line or a list of words")
        return None
    return tuple(argv)


def _timeout(value: Any, problems: list[str]) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_S
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if number and 0 < value <= MAX_TIMEOUT_S:
        return float(value)
    problems.append(
        f"{FILE_NAME}: alerts.timeout_s: expected seconds, more than 0 and at most {MAX_TIMEOUT_S:g}"
    )
    return DEFAULT_TIMEOUT_S
