"""`carl observe PATH [--follow] [--name N] [--vocab-size V] [--log FILE ...]`: import runs another tool
wrote, or have the engine follow them. PATH is a file (one source) or a directory: every run found in it
(discover.py), one line each. `--log` names a file the run's script writes its stdout and stderr to: the run's
console (the log view, `L`, and the scan for tracebacks, engine/console/)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from engine import paths
from engine.errors import CliError
from engine.files import regular_file, resolved
from engine.limits import COUNT_MAX, int_flag
from engine.names import name_arg
from engine.text import visible, visible_line

from .detect import detect_kind
from .discover import Found, describe, discover, import_order, register, relative
from .reader_base import ObserveError

MAX_VOCAB = COUNT_MAX


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="a log file, a store, or a directory to look for runs in")
    parser.add_argument("--follow", "-f", action="store_true", help="keep tailing it (through the engine)")
    parser.add_argument("--name", type=name_arg, help="run name (default: from the source)")
    parser.add_argument(
        "--vocab-size",
        type=int_flag(2, MAX_VOCAB),
        metavar="N",
        help="the model's vocabulary size |V|, for Φ from entropy (default: from the run's own config)",
    )
    pairing = parser.add_mutually_exclusive_group()
    pairing.add_argument(
        "--join",
        dest="pairing",
        action="store_const",
        const="join",
        help="a directory: every source found in it logged one training run (one carl run)",
    )
    pairing.add_argument(
        "--separate",
        dest="pairing",
        action="store_const",
        const="separate",
        help="a directory: each source found in it is a carl run of its own (no pairing of trackers)",
    )
    parser.set_defaults(pairing="auto")
    parser.add_argument(
        "--log",
        action="append",
        metavar="FILE",
        help="a file the run's stdout/stderr go to: its console, shown with L and scanned for tracebacks "
        "(repeatable)",
    )


def console_logs(args: argparse.Namespace) -> list[str]:
    """The --log files, absolute; a FIFO, a device or a directory is refused here, in one line. A file not
    there yet is taken (a script about to write it) and said so."""
    logs = []
    for given in args.log or []:
        path = resolved(given, CliError)
        if path.exists():
            regular_file(path, "regular file (a log)", CliError)
        else:
            print(f"--log {visible_line(str(path))}: not there yet; shown once it is", file=sys.stderr)
        logs.append(str(path))
    return list(dict.fromkeys(logs))


def _attach(store: Any, source_ids: list[int | None], logs: list[str]) -> None:
    from engine.console.console_job import attach_logs

    runs = attach_logs(store, [s for s in source_ids if s is not None], logs)
    names = ", ".join(Path(p).name for p in logs)
    if runs:
        print(f"console: {visible_line(names)} for {len(runs)} run(s)")
    else:
        print(f"console: {visible_line(names)} for the runs to come")


def run(args: argparse.Namespace, home: Path) -> int:
    path = resolved(args.path, CliError)  # a symbolic link loop is one line
    vocab = args.vocab_size
    logs = console_logs(args)
    if path.is_dir():
        return _observe_dir(args, home, path, logs)
    kind = detect_kind(path)  # a bad path fails here, before anything is stored
    if vocab is not None:
        _register_with_vocab(home, path, args.follow, args.name, kind, vocab)
    if args.follow:
        return _observe_via_engine(home, path, args.name, vocab, logs)
    from engine.coherence.analysis import analyze_runs
    from engine.store import Store

    from .ingest import observe
    from .runkeys import backfill_phi

    with Store(paths.db_path(home)) as store, LazyProgress(f"importing {path.name}") as progress:
        _, result = observe(store, path, follow=False, name=args.name, progress=progress.update)
        for run_id in result.run_ids if vocab else ():
            backfill_phi(store, run_id, vocab)  # what an earlier import stored without |V|
        with store.transaction():
            analyze_runs(store, result.run_ids)
        if logs:
            _attach(store, [_source_id(store, path)], logs)
    _print_result(kind, path, result)
    if imported_nothing(result):
        raise CliError(f"{path}: nothing imported{_first_problem(result)}")
    return 0


def imported_nothing(result: Any) -> bool:
    """A source that holds something but gave no run at all (every line malformed, say): a failure, not an
    empty success. An empty file is a log about to be written, and a source read before has its runs."""
    return not result.run_ids and bool(result.bad_lines or result.total)


def _first_problem(result: Any) -> str:
    return f" ({result.problems[0]})" if result.problems else ""


def _register_with_vocab(
    home: Path, path: Path, follow: bool, name: str | None, kind: str, vocab: int
) -> None:
    """Register the source before its first batch, with the user's |V| for its runs."""
    from engine.store import Store

    from .ingest import register_source
    from .runkeys import set_vocab_override

    with Store(paths.db_path(home)) as store:
        source_id = register_source(store, path, follow=follow, name=name, kind=kind)
        set_vocab_override(store, source_id, vocab)


def _print_result(kind: str, path: Path, result: object) -> None:
    rows = getattr(result, "rows", 0)
    bad = getattr(result, "bad_lines", 0)
    runs = getattr(result, "run_ids", [])
    print(
        f"{kind}: {visible_line(str(path))}: {rows:,} metric rows into {len(runs)} run(s)"
        + (f"; {bad:,} malformed lines skipped" if bad else "")
    )
    for problem in getattr(result, "problems", [])[:10]:
        print(f"  {visible(problem)}", file=sys.stderr)
    _reader_note(kind)


def _reader_note(kind: str) -> None:
    """Which reader read W&B run files: ours over the installed wandb's protobufs (wandb_run.reader_note)."""
    if kind == "wandb":
        from .wandb_run import reader_note

        print(f"  W&B: {reader_note()}")


def _observe_via_engine(
    home: Path, path: Path, name: str | None, vocab: int | None, logs: list[str] | None = None
) -> int:
    """Hand a followed source to the engine (its one writer) and wait until it has caught up."""
    from engine.control import ensure_engine
    from engine.store import Store
    from engine.store.commands import Verb

    ensure_engine(home)  # says so on stderr when it starts one: the engine outlives this command
    with Store(paths.db_path(home)) as store:
        args: dict[str, Any] = {"path": str(path), "follow": True, "name": name}
        if logs:
            args["logs"] = logs  # the engine names them the console of the source's runs
        command_id = store.enqueue_command(Verb.OBSERVE, args)
        state, result = _wait(store, [command_id], f"engine importing {path.name}", home)[0]
        if vocab is not None:
            _backfill_sources(store, [_source_id(store, path)], vocab)
    if state == "failed":
        raise CliError(result or "observe failed")
    print(f"{result}; the engine keeps following it")
    _reader_note(detect_kind(path))
    return 0


ENGINE_CHECK_S = 2.0  # how often a wait looks at the engine itself


def _wait(store: Any, command_ids: list[int], label: str, home: Path) -> list[tuple[str, str]]:
    """(state, result) of each command, once every one is done or failed; CliError when the engine stops or
    stalls first (a full disk: it cannot write the result), saying why: never a wait for ever."""
    next_check = time.monotonic() + ENGINE_CHECK_S
    with LazyProgress(label) as progress:
        while True:
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + ENGINE_CHECK_S
                _engine_answers(home)
            rows = store.command_states(command_ids)
            progress.update(sum(1 for s, _ in rows.values() if s in ("done", "failed")), len(command_ids))
            if all(rows[c][0] in ("done", "failed") for c in command_ids):
                return [rows[c] for c in command_ids]
            time.sleep(0.2)


def _engine_answers(home: Path) -> None:
    """CliError when the engine is down or stalled, with what is known of why."""
    from engine.control import engine_status
    from engine.control.process import stalled, why_stuck

    status = engine_status(home)
    if status.state != "up":
        raise CliError(f"the engine stopped before it finished; see {status.log_path}")
    quiet = stalled(status)
    if quiet is not None:
        raise CliError(
            f"the engine has not answered for {quiet:.0f} s ({why_stuck(home, status)}); the source stays"
            " registered and is read once the engine is back"
        )


def _source_id(store: Any, path: Path) -> int | None:
    from engine.store.sources import source_at

    found = source_at(store, str(path))
    return None if found is None else found.id


def _backfill_sources(store: Any, source_ids: list[int | None], vocab: int) -> None:
    """Φ for what the sources' runs stored before the user's |V| applied (--vocab-size)."""
    from .reader_base import source_run_ids
    from .runkeys import backfill_phi

    for source_id in source_ids:
        if source_id is not None:
            for run_id in source_run_ids(store, source_id):
                backfill_phi(store, run_id, vocab)


# -- a directory ---------------------------------------------------------------------------------------------


def _observe_dir(args: argparse.Namespace, home: Path, root: Path, logs: list[str]) -> int:
    """Every run found in `root`: one line each, then imported (or handed to the engine to follow)."""
    from engine.store import Store

    from .runkeys import set_vocab_override

    found = discover(root, args.pairing)
    print(f"found {len(found.runs)} run(s) in {visible(str(root))}:")
    for found_run in found.runs:
        print(f"  {describe(found, found_run)}")
    for note in found.notes:
        print(f"  note: {visible(note)}", file=sys.stderr)
    if args.follow:
        from engine.control import ensure_engine

        ensure_engine(home)
    with Store(paths.db_path(home)) as store:
        registered = register(store, found, follow=args.follow, name=args.name, pairing=args.pairing)
        errors = [e for r in registered for e in r.errors]
        sources = import_order(registered)
        if args.vocab_size is not None:
            for source_id, _ in sources:
                set_vocab_override(store, source_id, args.vocab_size)
        read = _follow_dir if args.follow else _import_dir
        ok, failed = read(store, root, sources)
        if logs:  # after the import, so its runs are there (the engine gives them to those still to come)
            _attach(store, [source_id for source_id, _ in sources], logs)
        if args.vocab_size is not None:
            _backfill_sources(store, [s for s, _ in sources], args.vocab_size)
    errors += failed
    for error in errors:
        print(f"  {visible(error)}", file=sys.stderr)
    if not ok:
        first = f" (first: {visible(errors[0])})" if errors else ""
        raise CliError(f"nothing could be read from {visible(str(root))}{first}")
    return 0


def _import_dir(store: Any, root: Path, sources: list[tuple[int, Found]]) -> tuple[int, list[str]]:
    """Import each source until caught up (a run's metrics before the rollouts that join it); returns how many
    were read, and one line per source that could not be."""
    from engine.coherence.analysis import analyze_runs

    from .ingest import import_source

    errors: list[str] = []
    run_ids: list[int] = []
    for source_id, source in sources:
        where = relative(source.path, root)
        try:
            with LazyProgress(f"importing {where}") as progress:
                result = import_source(store, source_id, progress=progress.update)
        except ObserveError as exc:
            errors.append(f"{source.kind}: {exc}")
            continue
        run_ids += [r for r in result.run_ids if r not in run_ids]
        bad = f"; {result.bad_lines:,} malformed skipped" if result.bad_lines else ""
        print(f"{source.kind}: {where}: {result.rows:,} rows{bad}")
        for problem in result.problems[:10]:
            print(f"  {visible(problem)}", file=sys.stderr)
        _reader_note(source.kind)
        if imported_nothing(result):
            errors.append(f"{source.kind}: {where}: nothing imported{_first_problem(result)}")
    with store.transaction():
        analyze_runs(store, run_ids)
    return len(sources) - len(errors), errors


def _follow_dir(store: Any, root: Path, sources: list[tuple[int, Found]]) -> tuple[int, list[str]]:
    """The engine follows every source registered (they are 'following'); wait on those it reports on (rollout
    folders have no command of their own: the engine follows them all the same)."""
    from engine.store.commands import Verb

    commands = []
    for _, source in sources:
        try:
            reportable = detect_kind(source.path) == source.kind
        except ObserveError:
            reportable = False
        if reportable:
            commands.append(store.enqueue_command(Verb.OBSERVE, {"path": str(source.path), "follow": True}))
    errors = []
    for state, result in _wait(store, commands, "engine importing", root_home(store)):
        if state == "failed":
            errors.append(result or "observe failed")
        else:
            print(visible(result or ""))
    print(f"the engine keeps following {len(sources)} source(s) from {visible(str(root))}")
    return len(sources) - len(errors), errors


def root_home(store: Any) -> Path:
    """The $CARL_HOME of a store (its folder)."""
    return Path(store.path).parent


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
                TextColumn("{task.description}", markup=False),  # a path's `[/bold]` is text, not markup
                BarColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            self.progress.start()
            self.task = self.progress.add_task(visible(self.label), total=total)
        self.progress.update(self.task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
