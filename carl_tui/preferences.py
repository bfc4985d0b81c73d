"""The user's control-room preferences, kept in $CARL_HOME/tui.toml.

Read with tomllib, written with tomli-w, each imported only when used: a start without a file
reads no TOML, and only a change of theme, chart mode or pins writes one. A bad file gives a one-line
error naming the file and the line or field; the control room then starts on defaults and leaves
the file alone rather than overwrite what the user wrote. The `[keymap]` table is kept as written;
its entries are checked where the bindings are known (carl_tui/keymap.py), and a bad one is left
out there, not here. The `[pins]` table names, per run (by its name), the metric keys pinned to the
main screen from the metrics explorer (`p`, carl_tui/explorer.py):

    [pins]
    grpo-1 = ["kl", "clip_ratio/high_mean"]

The fields are checked by hand:
importing pydantic here would add about 0.1 s to every start of the control room.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import CarlError
from engine.text import one_line
from themes import DEFAULT_THEME, THEME_NAMES

CHART_MODES = ("braille", "block")


class ConfigError(CarlError):
    """One-line message naming the file and what is wrong."""


@dataclass(frozen=True)
class TuiConfig:
    theme: str = DEFAULT_THEME
    chart_mode: str = "braille"
    refresh_hz: float = 4.0
    claude_model: str | None = None  # the diagnosis model; $CARL_CLAUDE_MODEL and /model override it
    keymap: dict[str, Any] = field(default_factory=dict)  # binding id -> keys, as written in [keymap]
    pins: dict[str, list[str]] = field(default_factory=dict)  # run name -> metric keys pinned, in [pins]

    def replace(self, **changes: Any) -> TuiConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> TuiConfig:
        """Validate a parsed file; raises ValueError('field: reason')."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"{one_line(key, 80)}: unknown setting (known: {', '.join(sorted(known))})")
        theme = data.get("theme", DEFAULT_THEME)
        if theme not in THEME_NAMES:
            raise ValueError(f"theme: unknown theme {theme!r}; choose one of {', '.join(THEME_NAMES)}")
        mode = data.get("chart_mode", "braille")
        if mode not in CHART_MODES:
            raise ValueError(f"chart_mode: {mode!r} is not one of {', '.join(CHART_MODES)}")
        hz = data.get("refresh_hz", 4.0)
        if isinstance(hz, bool) or not isinstance(hz, int | float) or not 0 < hz <= 4:
            raise ValueError(f"refresh_hz: must be a number above 0 and at most 4, not {hz!r}")
        model = data.get("claude_model")
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ValueError(f"claude_model: must be a model name such as 'claude-sonnet-5-5', not {model!r}")
        keymap = data.get("keymap", {})
        if not isinstance(keymap, dict):
            raise ValueError("keymap: must be a table of binding id = keys, such as [keymap] help = 'h'")
        pins = data.get("pins", {})
        if not isinstance(pins, dict) or not all(
            isinstance(keys, list) and all(isinstance(k, str) for k in keys) for keys in pins.values()
        ):
            raise ValueError(
                "pins: must be a table of run name = [metric keys], such as [pins] grpo-1 = ['kl']"
            )
        return cls(
            theme=theme,
            chart_mode=mode,
            refresh_hz=float(hz),
            claude_model=model,
            keymap=keymap,
            pins={name: list(keys) for name, keys in pins.items() if keys},
        )

    def pinned(self, run_name: str) -> list[str]:
        """The keys pinned for this run, in the order pinned."""
        return list(self.pins.get(run_name, []))

    def toggle_pin(self, run_name: str, key: str) -> TuiConfig:
        """This config with `key` pinned for the run, or unpinned when it was."""
        keys = self.pinned(run_name)
        keys = [k for k in keys if k != key] if key in keys else [*keys, key]
        pins = {name: list(pinned) for name, pinned in self.pins.items() if name != run_name}
        if keys:
            pins[run_name] = keys
        return self.replace(pins=pins)


def config_path(home: Path) -> Path:
    return home / "tui.toml"


def load_config(home: Path) -> TuiConfig:
    path = config_path(home)
    if not path.exists() and not path.is_symlink():
        return TuiConfig()
    # Here, not at the top: a first start without a tui.toml parses no TOML.
    from engine.tomlfile import read_table

    data = read_table(path, ConfigError)  # a FIFO or a device is refused by type, never read
    try:
        return TuiConfig.from_mapping(data)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def save_config(home: Path, config: TuiConfig) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    import tomli_w  # only a change of theme, chart mode or pins writes; the start never does

    path = config_path(home)
    tmp = path.with_suffix(".toml.tmp")
    # TOML has no null; an empty keymap or pins is no table
    values = {k: v for k, v in dataclasses.asdict(config).items() if v is not None and v != {}}
    tmp.write_text(tomli_w.dumps(values), encoding="utf-8")
    os.replace(tmp, path)
