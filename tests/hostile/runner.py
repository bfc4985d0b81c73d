"""Running a family: its workspace (a home whose store holds the baseline), its cases drawn by hypothesis, the
oracle applied to each, and the tally.

CI runs a family with `strict=True`: the first case the oracle refuses fails the test, and hypothesis shrinks
it to a small one. The bench runs it with `strict=False`: every case is counted, none stops the run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from hostile.oracle import (
    HANG,
    OK,
    TRACEBACK,
    Baseline,
    Cli,
    Outcome,
    Tally,
    bounded,
    crash_in,
    fresh_dir,
    make_baseline,
)

FIFO, LOOP, DIRECTORY, DEVZERO, DANGLING, SOCKET = (
    "<fifo>",
    "<symlink loop>",
    "<directory>",
    "<link to /dev/zero>",
    "<dangling link>",
    "<socket>",
)
SPECIALS = (FIFO, LOOP, DIRECTORY, DEVZERO, DANGLING, SOCKET)


class Seeds(dict):
    """A family's seeds, shown short: hypothesis prints the arguments of a strategy that failed."""

    def __repr__(self) -> str:
        return f"Seeds({', '.join(self)})"


@dataclass
class Workspace:
    """Where a family's cases run: `home` (CARL_HOME, its carl.db holding the baseline) and a folder per
    case."""

    root: Path
    seeds: Any = None
    home: Path = field(init=False)
    cli: Cli = field(init=False)
    baseline: Baseline = field(init=False)
    cases: int = 0
    context: dict[str, Any] = field(default_factory=dict)  # a family's long-lived things (a server)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self, *, remove_old: bool = False) -> None:
        """A new home: after a hang (the thread left behind may still hold the old one), or now and then in a
        long run (a store that grows by every case makes each case slower than the one before)."""
        if remove_old:
            shutil.rmtree(self.home, ignore_errors=True)
        self.home = self.root / f"home-{self.cases}"
        self.baseline = make_baseline(self.home)
        self.cli = Cli(self.home)

    @property
    def db(self) -> Path:
        return self.home / "carl.db"

    def next_case(self) -> Path:
        self.cases += 1
        return fresh_dir(self.root / "cases" / str(self.cases))


@dataclass
class Family:
    """A parser family: seeds made once, cases drawn from them, and the edge each case is fed to."""

    name: str
    make_seeds: Callable[[Path], Any]
    cases: Callable[[Any], st.SearchStrategy[Any]]
    feed: Callable[[Any, Workspace, Path], Outcome]
    ci_examples: int = 200
    inputs_per_case: int = 1  # about how many inputs a case holds (the bench draws cases until it has enough)
    # Long-lived things the feed needs (a nats-server, a served control room), around the whole run.
    context: Callable[[Workspace], contextlib.AbstractContextManager[None]] | None = None
    # A last look once the cases are done (the listings that show what was stored): more printed text.
    after: Callable[[Workspace], Outcome] | None = None


# -- files on disk -------------------------------------------------------------------------------------------


def materialize(where: Path, files: dict[str, bytes | str]) -> None:
    """Write a case's files under `where`: bytes as a regular file, or one of SPECIALS."""
    for relative, content in files.items():
        path = where / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content == FIFO:
            os.mkfifo(path)
        elif content == LOOP:
            os.symlink(path.with_name(path.name + ".loop"), path)
            os.symlink(path, path.with_name(path.name + ".loop"))
        elif content == DIRECTORY:
            path.mkdir(exist_ok=True)
        elif content == DEVZERO:
            os.symlink("/dev/zero", path)
        elif content == DANGLING:
            os.symlink(where / "nowhere" / "x", path)
        elif content == SOCKET:
            bind_socket(path)


def bind_socket(path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
    except OSError:  # a path too long for a socket's address: a FIFO stands in
        os.mkfifo(path)
    finally:
        sock.close()


@st.composite
def path_kind(draw: st.DrawFn, content: bytes | str, special_one_in: int = 12) -> bytes | str:
    """`content`, or now and then something that is not a regular file where a file was expected."""
    if draw(st.integers(0, special_one_in - 1)):
        return content
    return draw(st.sampled_from(SPECIALS))


HOSTILE_NAMES = (
    "\x1b[2J\x1b]52;c;cHduZWQ=\x07",
    "a\rb",
    "[b]x[link=http://127.0.0.1/]y",
    os.fsdecode(b"not-utf8-\xff\xfe"),
    "\u202etxt",
    "-rf",
    " ",
)


@st.composite
def file_name(draw: st.DrawFn, name: str, hostile_one_in: int = 10) -> str:
    """`name`, or now and then a name holding control bytes, markup or bytes that are not UTF-8 (its suffix
    kept, so the file is still taken for what it is)."""
    if draw(st.integers(0, hostile_one_in - 1)):
        return name
    stem, dot, suffix = name.rpartition(".")
    hostile = draw(st.sampled_from(HOSTILE_NAMES))
    return f"{stem}{hostile}{dot}{suffix}" if dot else f"{name}{hostile}"


# -- running -------------------------------------------------------------------------------------------------

RESET_EVERY = 500  # a long run checks its store's integrity and starts a fresh one this often


class Refused(AssertionError):
    """A case the oracle refused (CI): hypothesis shrinks it and reports it."""


class TimeUp(BaseException):
    """A long run's time for the family is spent (a BaseException: hypothesis lets it through at once)."""


def judge(family: Family, outcome: Outcome, lost: int) -> str:
    """Why the oracle refuses a case ("" when it passes)."""
    if outcome.verdict == TRACEBACK:
        return f"{family.name}: a traceback\n{outcome.detail}"
    if outcome.verdict == HANG:
        return f"{family.name}: a hang ({outcome.detail})"
    if lost:
        return f"{family.name}: {lost} baseline row(s) lost"
    return ""


def run_family(
    family: Family,
    root: Path,
    *,
    examples: int,
    strict: bool,
    random_seed: int | None = None,
    progress: Callable[[Tally], None] | None = None,
    leaks_fail: bool = True,
    minutes: float | None = None,
) -> Tally:
    """Draw `examples` cases of `family` and feed each one; returns the tally. `strict`: the first refused
    case raises (after hypothesis shrank it); a printed raw control byte is refused too when `leaks_fail`. A
    long run stops after `minutes` with the cases it ran (`Tally.capped`)."""
    root.mkdir(parents=True, exist_ok=True)
    seeds = family.make_seeds(fresh_dir(root / "seeds"))
    if isinstance(seeds, dict):
        seeds = Seeds(seeds)
    workspace = Workspace(root, seeds)
    tally = Tally(family.name)
    started = time.monotonic()
    deadline = None if minutes is None or strict else started + 60 * minutes
    with family.context(workspace) if family.context else contextlib.nullcontext():

        @settings(
            max_examples=examples,
            derandomize=random_seed is None,
            deadline=None,
            database=None,
            print_blob=False,
            phases=[Phase.generate, Phase.shrink] if strict else [Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(family.cases(seeds))
        def one(case: Any) -> None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeUp
            where = workspace.next_case()
            try:
                outcome = bounded(lambda: family.feed(case, workspace, where), where)
                lost = workspace.baseline.lost()
                if not strict:
                    tally.add(outcome, lost)
                    if progress is not None:
                        progress(tally)
                if outcome.verdict == HANG:
                    workspace.reset()
                elif not strict and tally.inputs % RESET_EVERY == 0:
                    integrity_checked(workspace, tally)
                    workspace.reset(remove_old=True)
                why = judge(family, outcome, lost)
                if strict and not why and leaks_fail and outcome.leak:
                    why = f"{family.name}: a raw control byte printed: {outcome.leak[:300]!r}"
                if strict and why:
                    raise Refused(why)
                if strict:
                    tally.add(outcome, lost)
            finally:
                shutil.rmtree(where, ignore_errors=True)

        if random_seed is not None:
            one = seed(random_seed)(one)
        try:
            one()
        except TimeUp:
            tally.capped = True
        if family.after is not None:
            outcome = bounded(lambda: family.after(workspace), None)
            tally.add(outcome, workspace.baseline.lost())
            if strict:
                why = judge(family, outcome, 0) or (
                    leaks_fail and outcome.leak and f"printed: {outcome.leak!r}"
                )
                if why:
                    raise Refused(f"after the cases: {why}")
    integrity_checked(workspace, tally)
    if strict:
        assert tally.integrity == "ok", tally.integrity
    tally.seconds = time.monotonic() - started
    return tally


def integrity_checked(workspace: Workspace, tally: Tally) -> None:
    result = workspace.baseline.integrity()
    if result != "ok":
        tally.integrity = result


def swallowed(outcome: Outcome, lines: list[str] | None = None, allowed: tuple[str, ...] = ()) -> Outcome:
    """`outcome`, or a traceback when its printed lines (or `lines`) name an exception a catch-all
    swallowed."""
    crash = crash_in(lines if lines is not None else outcome.printed.splitlines(), allowed)
    if crash and outcome.verdict != TRACEBACK:
        return Outcome(TRACEBACK, f"swallowed: {crash}", outcome.printed)
    return outcome


def ok(printed: str = "") -> Outcome:
    return Outcome(OK, "", printed)


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
