"""The two rules of DESIGN.md, enforced: the engine is headless, and the TUI stays light."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = (
    "torch",
    "transformers",
    "trl",
    "peft",
    "mlx",
    "numba",
    "anthropic",
    "sqlite_utils",
    "pandas",
    "plotly",
)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_engine_never_imports_the_tui() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in (ROOT / "engine").rglob("*.py")
        if (bad := imported_modules(path) & {"textual", "widgets", "carl_tui", "themes"})
    }
    assert offenders == {}


def test_the_tui_imports_nothing_heavy() -> None:
    code = (
        "import json, sys\n"
        "import carl_tui, carl_tui.app, carl_tui.cli, carl_tui.chat, widgets, widgets.chart, themes\n"
        "from engine.control import engine_status\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout) == []


def test_every_package_is_in_the_distribution() -> None:
    """setuptools finds the packages by the patterns in pyproject; a folder of Python files without an
    __init__.py would be left out of the wheel, silently."""
    import tomllib

    from setuptools import find_packages

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = set(find_packages(str(ROOT), include=include["include"]))
    with_code = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for top in ("carl_tui", "widgets", "themes", "engine")
        for path in (ROOT / top).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert with_code - shipped == set()
