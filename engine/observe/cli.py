"""`carl observe PATH [--follow] [--name N]`: import a run another tool wrote, or have the engine follow it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from engine import paths
from engine.errors import CliError

from .detect import detect_kind


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path")
    parser.add_argument("--follow", "-f", action="store_true", help="keep tailing it (through the engine)")
    parser.add_argument("--name", help="run name (default: from the source)")


def run(args: argparse.Namespace, home: Path) -> int:
    path = Path(args.path).expanduser().resolve()
    kind = detect_kind(path)  # a bad path fails here, before anything is stored
    if args.follow:
        return _observe_via_engine(home, path, args.name)
    from engine.coherence.analysis import analyze_runs
    from engine.store import Store

    from .ingest import observe

    with Store(paths.db_path(home)) as store, LazyProgress(f"importing {path.name}") as progress:
        _, result = observe(store, path, follow=False, name=args.name, progress=progress.update)
        with store.transaction():
            analyze_runs(store.conn, result.run_ids)
    _print_result(kind, path, result)
    return 0


def _print_result(kind: str, path: Path, result: object) -> None:
    rows = getattr(result, "rows", 0)
    bad = getattr(result, "bad_lines", 0)
    runs = getattr(result, "run_ids", [])
    print(
        f"{kind}: {path}: {rows:,} metric rows into {len(runs)} run(s)"
        + (f"; {bad:,} malformed lines skipped" if bad else "")
    )
    for problem in getattr(result, "problems", [])[:10]:
        print(f"  {problem}", file=sys.stderr)


def _observe_via_engine(home: Path, path: Path, name: str | None) -> int:
    """Hand a followed source to the engine (its one writer) and wait until it has caught up."""
    from engine.control import ensure_engine
    from engine.store import Store

    ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
    with Store(paths.db_path(home)) as store:
        command_id = store.enqueue_command("observe", {"path": str(path), "follow": True, "name": name})
        with LazyProgress(f"engine importing {path.name}") as progress:
            while True:
                state, result = store.conn.execute(
                    "SELECT state, result FROM commands WHERE id=?", (command_id,)
                ).fetchone()
                row = store.conn.execute("SELECT rows FROM sources WHERE path=?", (str(path),)).fetchone()
                progress.update(row[0] if row else 0, None)
                if state in ("done", "failed"):
                    break
                time.sleep(0.2)
    if state == "failed":
        raise CliError(result or "observe failed")
    print(f"{result}; the engine keeps following it")
    return 0


class LazyProgress:
    """A rich progress bar that appears only once work has taken more than a second."""

    def __init__(self, label: str, delay: float = 1.0) -> None:
        self.label, self.delay = label, delay
        self.started = time.monotonic()
        self.progress: Any = None
        self.task: Any = None

    def __enter__(self) -> LazyProgress:
        return self

    def update(self, done: int, total: int | None) -> None:
        if self.progress is None:
            if time.monotonic() - self.started < self.delay or not sys.stderr.isatty():
                return
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.label, total=total)
        self.progress.update(self.task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
