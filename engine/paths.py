"""Where carl keeps its state: $CARL_HOME (default ~/.carl), created with mode 0700."""

from __future__ import annotations

import os
from pathlib import Path

from engine.names import slug


def carl_home(create: bool = True) -> Path:
    home = Path(os.environ.get("CARL_HOME") or Path.home() / ".carl").expanduser()
    if create and not home.exists():
        home.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(home, 0o700)  # mkdir's mode is filtered by the umask
    return home


def db_path(home: Path | None = None) -> Path:
    return (home or carl_home()) / "carl.db"


def logs_dir(home: Path | None = None) -> Path:
    path = (home or carl_home()) / "logs"
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


def runs_dir(home: Path | None = None) -> Path:
    path = (home or carl_home()) / "runs"
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


def models_dir(home: Path | None = None) -> Path:
    path = (home or carl_home()) / "models"
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    return path


def shown(path: Path) -> str:
    """A path as a person reads it: under the home directory it starts with `~`."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def run_dir(run_id: int, name: str, home: Path | None = None) -> Path:
    """A run's own directory under runs/: named by its id, which is unique and safe, with a slug of its
    name to read a listing by; the name alone never makes a path (`../x` stays under runs/)."""
    return runs_dir(home) / f"{run_id}-{slug(name)}"
