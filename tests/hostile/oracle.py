"""The oracle of the hostile-input suite: what a case may do, and the tally of what it did.

A case may return, or end in one line for the user (a CarlError, ObserveError, `file:line: reason` problem,
argparse's usage line); any other exception is a traceback, and so is one that a catch-all turned into a
message (`could not be read as codex (TypeError: ...)`, `unreadable: KeyError: ...`): the parser met something
it did not expect. It must finish within a time bound (each case runs in a thread; one still running is a
hang, and a FIFO it may be blocked on is opened once for writing so the thread can go). The rows of the
baseline store are all still there, and `PRAGMA integrity_check` says ok. Nothing printed holds a raw control
byte (what `visible` escapes).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import queue
import re
import shutil
import sqlite3
import stat
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OK, ERROR, TRACEBACK, HANG = "ok", "error", "traceback", "hang"
# What `engine.text.visible` writes out: C0 controls but tab and newline, DEL, and the C1 controls.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# A message that names one of these was an exception some catch-all turned into text: a parser bug.
CRASH_NAMES = (
    "AssertionError",
    "AttributeError",
    "IndexError",
    "KeyError",
    "NameError",
    "RecursionError",
    "StopIteration",
    "TypeError",
    "UnboundLocalError",
    "UnicodeDecodeError",
    "UnicodeEncodeError",
    "ValueError",
    "ZeroDivisionError",
    "OverflowError",
    "MemoryError",
    "InterfaceError",
    "ProgrammingError",
    "IntegrityError",
    "RuntimeError",
)
CRASH = re.compile(r"\b(" + "|".join(CRASH_NAMES) + r")\b")
# The one catch that names an exception by design: a rollout dump's record whose field has a shape the reader
# does not take costs that record alone, in one `file:line` (engine/observe/rollouts/dumps.py).
DESIGNED = re.compile(r":\d+: not a [\w-]+ record \((TypeError|AttributeError|KeyError|IndexError)\)$")
TRACEBACK_TEXT = "Traceback (most recent call last)"
CASE_SECONDS = 20.0  # a case still running after this is a hang (the machine is shared and may be loaded)


@dataclass
class Outcome:
    verdict: str  # OK, ERROR, TRACEBACK or HANG
    detail: str = ""  # the error line, the traceback, or what hung
    printed: str = ""  # everything the case printed (stdout and stderr)
    inputs: int = 1  # inputs the case held (a NATS case publishes several messages)
    refused: int = 0  # of those, how many ended in one clean line each (a message stored as rejected)

    @property
    def leak(self) -> str:
        """The first printed line holding a raw control byte ("" when none does)."""
        return next((line for line in self.printed.split("\n") if CONTROL.search(line)), "")


def crash_in(lines: list[str] | tuple[str, ...], allowed: tuple[str, ...] = ()) -> str:
    """The first message that names an exception a catch-all swallowed ("" when none does)."""
    for line in lines:
        match = CRASH.search(line)
        if match and match.group(1) not in allowed and not DESIGNED.search(line.rstrip()):
            return line
    return ""


def is_user_error(exc: BaseException) -> bool:
    from engine.errors import CarlError

    return isinstance(exc, CarlError) or (isinstance(exc, SystemExit) and exc.code == 2)


def classify(exc: BaseException) -> Outcome:
    """An exception that ended a case: one line for the user, or a traceback."""
    if is_user_error(exc):
        text = str(exc)
        return (
            Outcome(ERROR, text)
            if "\n" not in text.strip()
            else Outcome(TRACEBACK, f"not one line: {text!r}")
        )
    return Outcome(TRACEBACK, "".join(traceback.format_exception(exc)))


class CarlLog(logging.Handler):
    """What the engine's own loggers (`carl.*`) say at WARNING and above while a case runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("carl"):
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + "".join(traceback.format_exception(*record.exc_info))
            self.lines.append(text)


@contextlib.contextmanager
def carl_log() -> Iterator[CarlLog]:
    handler = CarlLog()
    logger = logging.getLogger("carl")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


class CaseThread:
    """The thread cases run in, one after another (starting a thread per case costs more than many a case); a
    case still running after its time is left to it, and the next case gets a new thread."""

    current: CaseThread | None = None

    def __init__(self) -> None:
        self.work: queue.Queue[Callable[[], None]] = queue.Queue()
        threading.Thread(target=self.serve, daemon=True, name="hostile-case").start()

    def serve(self) -> None:
        while True:
            self.work.get()()

    @classmethod
    def run(cls, fn: Callable[[], None]) -> threading.Event:
        if cls.current is None:
            cls.current = CaseThread()
        done = threading.Event()

        def job() -> None:
            try:
                fn()
            finally:
                done.set()

        cls.current.work.put(job)
        return done


def bounded(fn: Callable[[], Outcome], where: Path | None, seconds: float = CASE_SECONDS) -> Outcome:
    """`fn()` in the case thread, classified; HANG when it is still running after `seconds` (then every FIFO
    under `where` is opened once for writing, so a thread blocked on one can end)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = fn()
        except BaseException as exc:  # noqa: BLE001 (classified below, in the caller's thread)
            box["outcome"] = classify(exc)

    done = CaseThread.run(target)
    if not done.wait(seconds):
        CaseThread.current = None  # that one is busy for good, maybe
        release_fifos(where)
        done.wait(2)
        return Outcome(HANG, f"still running after {seconds:.0f}s")
    return box["outcome"]


def release_fifos(where: Path | None) -> None:
    if where is None or not where.exists():
        return
    for folder, _, names in os.walk(where):
        for name in names:
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if stat.S_ISFIFO(os.lstat(path).st_mode):
                    os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


class Printed(io.StringIO):
    """What a case printed: through sys.stdout and sys.stderr, and (`fds`) what went to the file descriptors
    behind them from elsewhere (a library's logging handler that kept the real stderr, C code)."""

    fds: str = ""

    def getvalue(self) -> str:
        return super().getvalue() + self.fds


@contextlib.contextmanager
def printed() -> Iterator[Printed]:
    """stdout and stderr of the code under test, together, as a person sees them."""
    import sys
    import tempfile

    out = Printed()
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                yield out
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            out.fds = sink.read().decode("utf-8", "replace")


# What rich draws on a terminal (colours, the progress bar's cursor moves and line clears, the cursor hidden
# and shown): taken out before the raw-byte check of a case run on a pty.
TERMINAL_DRAWING = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


@contextlib.contextmanager
def on_a_pty() -> Iterator[Printed]:
    """stdout and stderr of the code under test on a real pseudo-terminal (80 columns), as a person at a
    terminal has them: rich draws its colours and progress bars there (a pipe gets plain text). A thread
    drains the terminal so a long output never blocks."""
    import pty
    import sys
    import termios
    import threading

    out = Printed()
    master, slave = pty.openpty()
    termios.tcsetwinsize(slave, (24, 80))
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    os.dup2(slave, 1)
    os.dup2(slave, 2)
    terminal = open(os.dup(slave), "w", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    old_env = {k: os.environ.get(k) for k in ("TERM", "COLUMNS", "NO_COLOR")}
    os.environ.update(TERM="xterm-256color", COLUMNS="80")
    os.environ.pop("NO_COLOR", None)
    try:
        with contextlib.redirect_stdout(terminal), contextlib.redirect_stderr(terminal):
            yield out
    finally:
        terminal.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, slave):
            os.close(fd)
        terminal.close()
        reader.join(5)
        os.close(master)
        for key, value in old_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        text = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
        out.fds = TERMINAL_DRAWING.sub("", text)


class Cli:
    """`carl ...` in this process, as `engine.cli.main` runs it, with each command's parser built once
    (building it is most of a short command's cost). Returns what it printed and how it ended; `tty` runs it
    on a real pseudo-terminal (progress bars and colours drawn)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.parsers: dict[str, Any] = {}

    def __call__(self, *argv: str, tty: bool = False) -> Outcome:
        from engine.cli import build_parser, dispatch
        from engine.errors import guard

        command = argv[0]
        if command not in self.parsers:
            self.parsers[command] = build_parser(command)
        with on_a_pty() if tty else printed() as out:
            try:
                args = self.parsers[command].parse_args(["--home", str(self.home), *argv])
                code = guard(dispatch, args)
            except SystemExit as exc:  # argparse's usage line
                code = exc.code
        text = out.getvalue()
        if TRACEBACK_TEXT in text:  # a library logged one on the way, and the user sees it
            return Outcome(TRACEBACK, f"printed a traceback: {text[-3000:]}", text)
        if code == 0:
            return Outcome(OK, "", text)
        last = text.rstrip("\n").split("\n")[-1]
        if code == 2 and (last.startswith("carl") or "error:" in last):
            return Outcome(ERROR, last, text)
        return Outcome(TRACEBACK, f"exit status {code}: {text[-2000:]}", text)


# -- the baseline store --------------------------------------------------------------------------------------

BASELINE_TABLES = (
    "runs",
    "metrics",
    "rollouts",
    "trajectories",
    "trajectory_events",
    "agent_events",
    "hook_events",
    "sources",
)


@dataclass
class Baseline:
    """The rows a store held before the cases: each table's count up to its highest rowid then, and a checksum
    of the baseline run's metrics."""

    db: Path
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (max rowid, rows)
    metrics: tuple[int, float] = (0, 0.0)

    def __post_init__(self) -> None:
        conn = self.connect()
        try:
            for table in BASELINE_TABLES:
                top, rows = conn.execute(f"SELECT coalesce(max(rowid), 0), count(*) FROM {table}").fetchone()
                self.counts[table] = (top, rows)
            self.metrics = self.metrics_sum(conn)
        finally:
            conn.close()

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"{self.db.absolute().as_uri()}?mode=ro", uri=True, timeout=30)

    @staticmethod
    def metrics_sum(conn: sqlite3.Connection) -> tuple[int, float]:
        return conn.execute(
            "SELECT count(*), total(value) FROM metrics WHERE run_id IN (SELECT id FROM runs WHERE name=?)",
            (BASELINE_RUN,),
        ).fetchone()

    def lost(self) -> int:
        """Rows of the baseline no longer there (a changed checksum of its metrics counts one)."""
        conn = self.connect()
        try:
            lost = 0
            for table, (top, rows) in self.counts.items():
                now = conn.execute(f"SELECT count(*) FROM {table} WHERE rowid <= ?", (top,)).fetchone()[0]
                lost += max(rows - now, 0)
            count, total = self.metrics_sum(conn)
            if count == self.metrics[0] and abs(total - self.metrics[1]) > 1e-6 * max(abs(total), 1):
                lost += 1
            return lost
        finally:
            conn.close()

    def integrity(self) -> str:
        conn = self.connect()
        try:
            return ", ".join(r[0] for r in conn.execute("PRAGMA integrity_check").fetchall())
        finally:
            conn.close()


BASELINE_RUN = "hostile-baseline"


def make_baseline(home: Path) -> Baseline:
    """A store at `home` holding a run of metrics and rollouts, trajectories, agent events and hook events."""
    import time

    from engine.agents.audit import AuditWriter, Incoming
    from engine.store import Store
    from engine.trajectories.store import save
    from engine.trajectories.trajectory import Event, Trajectory

    home.mkdir(parents=True, exist_ok=True)
    db = home / "carl.db"
    with Store(db) as store:
        run_id = store.create_run(BASELINE_RUN, source_kind="jsonl", status="finished", vocab_size=512)
        now = time.time()
        store.add_metrics(
            run_id, [(step, key, 1.0 / (step + 1), now) for step in range(100) for key in "abc"]
        )
        store.add_rollouts(
            run_id,
            [
                {
                    "step": step,
                    "group_id": str(step),
                    "idx": i,
                    "prompt": "p",
                    "completion": "c",
                    "total": 1.0,
                }
                for step in range(5)
                for i in range(4)
            ],
        )
        trajectories = [
            Trajectory(
                uid=f"baseline-{i}",
                session_id=f"baseline-session-{i}",
                agent="claude-code",
                source="baseline",
                prompt=f"baseline prompt {i}",
                events=[Event(tool="Bash", success=True, exit_code=0) for _ in range(3)],
            )
            for i in range(3)
        ]
        save(store, trajectories)
        task = b'{"type":"task","manager_id":"m","task_type":"demo","prompt":"baseline"}'
        AuditWriter(store).write([Incoming("tasks.demo", task, stream_seq=i + 1) for i in range(3)])
        with store.transaction():
            store.conn.executemany(
                "INSERT INTO hook_events (session_id, event, received_at, payload, assembled)"
                " VALUES (?,?,?,?,1)",
                [("baseline-hooks", "Stop", now, '{"hook_event_name": "Stop"}') for _ in range(3)],
            )
    return Baseline(db)


# -- the tally -----------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a family's cases did: the table's row, and the first few failures of each kind."""

    family: str
    inputs: int = 0
    ok: int = 0
    errors: int = 0
    tracebacks: int = 0
    hangs: int = 0
    lost: int = 0
    leaks: int = 0
    integrity: str = "ok"
    seconds: float = 0.0
    capped: bool = False  # a long run stopped at its time limit before its number of cases
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, outcome: Outcome, lost: int = 0) -> None:
        self.inputs += outcome.inputs
        self.ok += outcome.inputs - 1 - outcome.refused  # the others of a case of several inputs
        self.errors += outcome.refused
        if outcome.verdict == OK:
            self.ok += 1
        elif outcome.verdict == ERROR:
            self.errors += 1
        elif outcome.verdict == HANG:
            self.hangs += 1
            self.note(HANG, outcome.detail)
        else:
            self.tracebacks += 1
            self.note(TRACEBACK, outcome.detail)
        if outcome.leak:
            self.leaks += 1
            self.note("leak", repr(outcome.leak[:300]))
        if lost:
            self.lost += lost
            self.note("lost", f"{lost} baseline row(s) gone")

    def note(self, kind: str, text: str) -> None:
        kept = self.examples.setdefault(kind, [])
        if len(kept) < 5:
            kept.append(text[-3000:])


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def scratch_root(fallback: Path) -> Path:
    """Where cases write their files: memory (/dev/shm) when it has room, so the store's commits cost no disk
    flush and a thousand cases take seconds; `fallback` otherwise. Real files and real SQLite either way."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1 << 30:
            return Path(__import__("tempfile").mkdtemp(prefix="carl-hostile-", dir=shm))
    except OSError:
        pass
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback
