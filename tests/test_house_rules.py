"""The house rules of ARCHITECTURE.md, enforced: the import contracts (import-linter, in pyproject.toml), the
formatter and the linter, and what importing the control room really loads
(which import-linter cannot see)."""

from __future__ import annotations

import ast
import json
import re
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


# -- one door to carl.db (issue 31): SQL on the store lives in engine/store/ ---

SQL_VERBS = ("SELECT", "INSERT", "UPDATE", "DELETE", "REPLACE", "WITH", "CREATE")
EXECUTES = ("execute", "executemany", "executescript")
# Readers of other tools' SQLite files: their own statements are on those files, not on carl.db, so only what
# they run through a `store` or a `reader` counts.
FOREIGN_SQLITE = {
    "engine/observe/trackio.py": "Trackio's project database",
    "engine/observe/trackio_traces.py": "Trackio's traces table",
    "engine/observe/mlflow_store.py": "MLflow's tracking database",
}
# The modules whose statements on carl.db have not moved into engine/store/ yet, with how many each has. The
# list only shrinks: a module leaves it when its SQL has moved, and no count grows.
SQL_NOT_MOVED_YET = {
    "engine/agents/cli.py": 3,
    "engine/agents/manager.py": 1,
    "engine/agents/plane.py": 3,
    "engine/agents/serving.py": 1,
    "engine/agents/verdicts.py": 1,
    "engine/alerts/job.py": 2,
    "engine/control/process.py": 1,
    "engine/demo/start.py": 3,
    "engine/diagnosis/conversations.py": 7,
    "engine/experiments/runner.py": 5,
    "engine/experiments/summary.py": 1,
    "engine/observe/cli.py": 2,
    "engine/observe/common.py": 6,
    "engine/observe/ingest.py": 5,
    "engine/observe/pairing.py": 3,
    "engine/observe/rollouts/common.py": 1,
    "engine/observe/trackio.py": 1,
    "engine/trajectories/capture/live.py": 6,
    "engine/trajectories/cli.py": 5,
    "engine/trajectories/training/sampler.py": 2,
    "engine/trajectories/training/train.py": 2,
}


def _is_sql(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr) and node.values:
        node = node.values[0]
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    words = node.value.split(None, 1)
    return bool(words) and words[0] in SQL_VERBS and len(words) == 2


def sql_statements(source: str, *, foreign: bool = False) -> int:
    """The statements on carl.db in one module: each `.execute`/`.executemany`/`.executescript` call, and each
    SQL string literal outside such a call (one kept in a name that an execute call runs counts once)."""
    tree = ast.parse(source)
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in EXECUTES
    ]
    if foreign:
        return sum(1 for c in calls if re.search(r"store|reader", ast.unparse(c.func.value)))
    inside = {id(sub) for c in calls for sub in ast.walk(c)}
    run_names = {c.args[0].id for c in calls if c.args and isinstance(c.args[0], ast.Name)}
    kept = {
        id(n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in run_names for t in n.targets)
    }
    literals = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant | ast.JoinedStr)
        and id(n) not in inside
        and id(n) not in kept
        and _is_sql(n)
    ]
    return len(calls) + len(literals)


def sql_outside_the_store() -> dict[str, int]:
    found = {}
    for top in ("carl_tui", "widgets", "engine"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith("engine/store/") or "__pycache__" in path.parts:
                continue
            if count := sql_statements(path.read_text(encoding="utf-8"), foreign=name in FOREIGN_SQLITE):
                found[name] = count
    return found


def test_the_sql_counter_sees_statements() -> None:
    source = (
        'Q = "SELECT 1 FROM runs"\nKEPT = "DELETE FROM kv"\n'
        'def f(store):\n    store.conn.execute("UPDATE runs SET x=1")\n    store.conn.execute(KEPT)\n'
        'def g(conn):\n    conn.executemany(f"INSERT INTO t VALUES ({1})", [])\n    return "Select a run"\n'
    )
    assert sql_statements(source) == 4  # Q, the UPDATE, KEPT once, the INSERT; not the sentence
    assert sql_statements(source, foreign=True) == 2  # only what goes through a store


def test_sql_on_carl_db_lives_in_the_store() -> None:
    """Every statement on carl.db is in engine/store/ (one module per concern); the modules not moved yet are
    named with their counts, which only go down."""
    found = sql_outside_the_store()
    new = {name: n for name, n in found.items() if name not in SQL_NOT_MOVED_YET}
    assert not new, f"SQL on carl.db outside engine/store/ (put it in engine/store/): {new}"
    grown = {name: (SQL_NOT_MOVED_YET[name], n) for name, n in found.items() if n > SQL_NOT_MOVED_YET[name]}
    assert not grown, f"more SQL than allowed (allowed, found): {grown}"
    gone = {name: n for name, n in SQL_NOT_MOVED_YET.items() if found.get(name, 0) < n}
    left = sum(found.values())
    lower = {name: found.get(name, 0) for name in gone}
    assert not gone, f"fewer statements now: lower SQL_NOT_MOVED_YET to {lower} (0: drop it); {left} remain"
    print(f"{left} statements on carl.db in {len(found)} modules outside engine/store/ remain")


# -- no import circle in carl_tui (issue 31): counting the imports made only for typing ---


def carl_tui_imports() -> dict[str, set[str]]:
    """Each module of carl_tui and the modules of carl_tui it imports: at the top, under TYPE_CHECKING or in
    a function (import-linter's contract leaves out the imports made for typing; this counts them)."""
    modules = {path.stem: path for path in (ROOT / "carl_tui").glob("*.py") if path.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                found.update([node.module] if node.module else [alias.name for alias in node.names])
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("carl_tui."):
                found.add((node.module or "").split(".")[1])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("carl_tui."))
        graph[name] = {module.split(".")[0] for module in found} & set(modules) - {name}
    return graph


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in the graph (its modules in order, the first again at the end), or []."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str]:
        for imported in sorted(graph[module]):
            if imported in path:
                return [*path[path.index(imported) :], imported]
            if imported not in done and (circle := visit(imported, [*path, imported])):
                return circle
        done.add(module)
        return []

    for module in sorted(graph):
        if circle := visit(module, [module]):
            return circle
    return []


def test_the_circle_finder_finds_one_through_a_typing_import() -> None:
    assert import_circle({"app": {"controls"}, "controls": {"app"}, "model": set()}) == [
        "app",
        "controls",
        "app",
    ]
    assert import_circle({"app": {"controls", "model"}, "controls": {"model"}, "model": set()}) == []


def test_no_import_circle_in_carl_tui_counting_typing_imports() -> None:
    """A part of the control room takes what it needs of the app as a Protocol (carl_tui/room.py), never
    the app: no module of carl_tui imports, even for typing only, one that imports it back."""
    circle = import_circle(carl_tui_imports())
    assert not circle, " -> ".join(circle)
