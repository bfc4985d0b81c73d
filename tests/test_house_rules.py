"""The house rules of ARCHITECTURE.md, enforced: the import contracts (import-linter, in pyproject.toml), the
formatter and the linter, what importing the control room really loads (which import-linter cannot see), and
file names that say once what they hold."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
        "import carl_tui, carl_tui.app, carl_tui.launch, carl_tui.chat_screen\n"
        "import widgets, widgets.chart, themes\n"
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


# File names several packages may share: a package's own files, which Python names.
SHARED_FILE_NAMES = {
    "__init__.py": "a package's public surface",
    "__main__.py": "what `python -m engine.X` runs: Python looks for that name",
}


def test_no_two_modules_share_a_file_name() -> None:
    """A module's file name says what it holds, once in the control room, the widgets and the engine: a
    search, a traceback or a map names one file (issue 31: cli.py was eleven files, chat.py three)."""
    by_name: dict[str, list[str]] = {}
    for top in ("carl_tui", "widgets", "engine"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.name not in SHARED_FILE_NAMES:
                by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def _tool(name: str) -> str:
    found = Path(sys.executable).with_name(name)
    return str(found) if found.exists() else name


def test_the_import_contracts_hold() -> None:
    """Layers (carl_tui -> widgets -> engine), a headless engine, a light control room, which engine
    capability may import which (ARCHITECTURE.md's table), and no import cycles among the modules of any
    package."""
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
    """Every statement on carl.db is in engine/store/, one module per concern (before issue 31: 128 statements
    in 29 modules elsewhere)."""
    found = sql_outside_the_store()
    assert not found, f"SQL on carl.db outside engine/store/ (put it in engine/store/): {found}"


# -- one vocabulary of commands (issue 31): a verb is named by its definition in engine/store/commands.py ---

VOCABULARY = "engine/store/commands.py"
# Who takes a verb as its first argument (`pending_verb`: every argument is one).
COMMAND_CALLS = {
    "enqueue_command",
    "insert_command",
    "CommandRequest",
    "send_to_run",
    "send_to_engine",
    "send_agents",
    "_engine_command",
    "pending_verb",
    "verb_of",
    "check",
}


def _names_a_verb(node: ast.AST) -> bool:
    """`verb`, `x.verb`, `x["verb"]` or `x.get("verb")`: a command's verb."""
    if isinstance(node, ast.Name):
        return node.id == "verb"
    if isinstance(node, ast.Attribute):
        return node.attr == "verb"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "verb"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "verb"
    return False


def verb_literals(source: str, verbs: set[str]) -> list[int]:
    """The lines where a verb is written as a string: passed to a sender (`COMMAND_CALLS`), compared with a
    command's verb, or kept in `verb` or a name of verbs (`..._VERBS = (...)`)."""

    def literals(node: ast.AST) -> list[int]:
        return [n.lineno for n in ast.walk(node) if isinstance(n, ast.Constant) and n.value in verbs]

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if name in COMMAND_CALLS:
                given = node.args if name == "pending_verb" else node.args[:1]
                given = [*given, *(k.value for k in node.keywords if k.arg == "verb")]
                found += [n.lineno for n in given if isinstance(n, ast.Constant) and n.value in verbs]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_a_verb(side) for side in sides):
                found += [line for side in sides for line in literals(side)]
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and (t.id == "verb" or t.id.endswith("VERBS")) for t in node.targets
        ):
            found += literals(node.value)
    return found


def test_the_verb_scanner_sees_literals() -> None:
    source = (
        'RESUMABLE_VERBS = {"observe", Verb.EVAL}\n'
        'def f(store, command, verb, event):\n    store.enqueue_command("pause", target="run")\n'
        '    send_to_engine(Verb.EVAL, {}, "observing", "eval")\n'
        '    if command["verb"] == "train" or verb in ("stop", "x") or event.verb == "pause_resume":\n'
        '        pending_verb(Verb.PAUSE, "agents_pause")\n    verb = "train" if verb else Verb.STOP\n'
        '    return "stop"\n'
    )
    verbs = {"observe", "eval", "pause", "train", "stop", "agents_pause"}
    assert sorted(verb_literals(source, verbs)) == [1, 3, 5, 5, 6, 7]  # not a title, a sentence, a key


def test_command_verbs_are_named_by_the_vocabulary() -> None:
    """No verb is a string literal outside engine/store/commands.py: senders, receivers and readers of command
    rows name `Verb` members, so a verb is defined (and checked) in one place."""
    from engine.store.commands import Verb

    verbs = {verb.value for verb in Verb}
    found = {}
    for top in ("carl_tui", "widgets", "engine"):
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == VOCABULARY or "__pycache__" in path.parts:
                continue
            if lines := verb_literals(path.read_text(encoding="utf-8"), verbs):
                found[name] = lines
    assert not found, f"verbs written as strings (name them as Verb members, {VOCABULARY}): {found}"


# -- a type checker (issue 31): mypy, configured in pyproject.toml, strict on the control room and widgets ---

MYPY_ERROR = re.compile(r"^[^:\s]+\.pyi?:\d+(?::\d+)?: error: ")


@pytest.mark.timeout(900)  # a first run, with no cache, takes minutes on two busy cores
def test_types_check() -> None:
    """mypy finds no error on the packages pyproject.toml names (its cache: .mypy_cache, so a run after the
    first reads again only what changed)."""
    done = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode in (0, 1), f"mypy did not run through:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
    errors = [line for line in done.stdout.splitlines() if MYPY_ERROR.match(line)]
    shown = "\n".join(errors) or done.stdout[-4000:]
    assert done.returncode == 0 and not errors, f"mypy finds {len(errors)} type errors:\n{shown}"


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
