"""The user's control-room preferences, kept in $CARL_HOME/tui.toml.

Read with tomllib, validated with pydantic, written with tomli-w. A bad file gives a one-line
error naming the file and the line or field; the control room then starts on defaults and
leaves the file alone rather than overwrite what the user wrote.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from engine.errors import CarlError
from themes import DEFAULT_THEME, THEME_NAMES


class ConfigError(CarlError):
    """One-line message naming the file and what is wrong."""


class TuiConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    theme: str = DEFAULT_THEME
    chart_mode: Literal["braille", "block"] = "braille"
    refresh_hz: float = Field(default=4.0, gt=0, le=4.0)

    @field_validator("theme")
    @classmethod
    def _known_theme(cls, value: str) -> str:
        if value not in THEME_NAMES:
            raise ValueError(f"unknown theme {value!r}; choose one of {', '.join(THEME_NAMES)}")
        return value


def config_path(home: Path) -> Path:
    return home / "tui.toml"


def load_config(home: Path) -> TuiConfig:
    path = config_path(home)
    if not path.exists():
        return TuiConfig()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    try:
        return TuiConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {field}: {first['msg']}") from None


def save_config(home: Path, config: TuiConfig) -> None:
    """Write atomically (temp file + rename) so a crash never leaves half a file."""
    path = config_path(home)
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(tomli_w.dumps(config.model_dump()), encoding="utf-8")
    os.replace(tmp, path)
