"""The house rules of ARCHITECTURE.md, enforced: the import contracts (import-linter, in pyproject.toml), the
formatter and the linter, and what importing the control room really loads
(which import-linter cannot see)."""

from __future__ import annotations

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


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    return str(found) if found.exists() else name


def test_the_import_contracts_hold() -> None:
    """Layers (carl_tui -> widgets -> engine), a headless engine, a light control room, agents apart from
    diagnosis, and no import cycles among the modules of any package."""
    done = subprocess.run([_tool("lint-imports")], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_code_reads_as_its_formatter_and_linter_want() -> None:
    dirs = ["carl_tui", "widgets", "themes", "engine", "tests", "bench"]
    fmt = subprocess.run(
        [_tool("ruff"), "format", "--check", *dirs], capture_output=True, text=True, cwd=ROOT
    )
    assert fmt.returncode == 0, fmt.stdout[-4000:]
    lint = subprocess.run([_tool("ruff"), "check", *dirs], capture_output=True, text=True, cwd=ROOT)
    assert lint.returncode == 0, lint.stdout[-4000:]


def test_every_document_the_code_cites_is_in_the_repo() -> None:
    """A comment citing `docs/reference/karl.md §12(b)` points at a file and a section that exist."""
    import re

    headings = {
        path.name: set(re.findall(r"^#+ (\d+(?:\.\d+)*)\.? ", path.read_text(encoding="utf-8"), re.M))
        for path in (ROOT / "docs" / "reference").glob("*.md")
    }
    cited = re.compile(r"docs/reference/([\w-]+\.md)((?:,? (?:and )?§\d+(?:\.\d+)*(?:-\d+)?)*)")
    missing = set()
    for top in ("carl_tui", "widgets", "engine", "tests", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            for match in cited.finditer(path.read_text(encoding="utf-8")):
                if match.group(1) not in headings:
                    missing.add((str(path.relative_to(ROOT)), match.group(1)))
                for section in re.findall(r"§(\d+(?:\.\d+)*)", match.group(2)):
                    if section not in headings[match.group(1)]:
                        missing.add((str(path.relative_to(ROOT)), f"{match.group(1)} §{section}"))
    assert missing == set()
    for path in (ROOT / "docs").rglob("*.md"):  # and links between the docs resolve
        for link in re.findall(r"\]\(([^)#:]+\.md)", path.read_text(encoding="utf-8")):
            assert (path.parent / link).resolve().exists(), f"{path.relative_to(ROOT)} links to {link}"
