"""Import agent session traces from disk: Claude Code transcripts, Codex rollouts, KARL record files.

The front door is `import_paths`. Each path may be a file or a folder (searched recursively for
`*.jsonl`); every file's kind is decided by its first valid lines, not by its name. Bad input never
raises: malformed lines become `file:line: reason` entries in `skipped`, unknown or unreadable files
one `file: reason` entry each. The per-format work lives in claude_code.py, codex.py and
karl_records.py beside this module.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.files import FileKindError, kind_of, named, open_regular, reason
from engine.text import loads_storable
from engine.trajectories.importers import claude_code, codex, karl_records
from engine.trajectories.importers.human_prompts import DEFAULT_DETECTOR, Detector
from engine.trajectories.importers.trace_lines import Line, Parsed
from engine.trajectories.trajectory import Trajectory

SNIFF_LINES = 50  # valid lines looked at to decide a file's kind
Parser = Callable[[Path, list[Line], Detector], Parsed]
# Checked in this order: a KARL record is the most specific shape, a Claude Code line the loosest.
KINDS: tuple[tuple[str, Callable[[dict], bool], Parser], ...] = (
    ("karl", karl_records.looks_like, karl_records.parse),
    ("codex", codex.looks_like, codex.parse),
    ("claude-code", claude_code.looks_like, claude_code.parse),
)


@dataclass
class ImportResult:
    trajectories: list[Trajectory] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "file:line: reason" or "file: reason"
    files: int = 0  # files recognized and read
    sessions: int = 0  # agent sessions found (a transcript, a subagent run, a rollout, a record session)
    empty_sessions: int = 0  # sessions that gave no trajectory (no human prompt, or no tool events)


def import_paths(paths: Sequence[Path | str], *, detector: Detector = DEFAULT_DETECTOR) -> ImportResult:
    """Every trajectory in the given files and folders; the same turn found twice is kept once."""
    result = ImportResult()
    seen: set[Path] = set()
    for path in _expand(paths, result.skipped):
        key = _resolved(path)
        if key in seen:
            continue
        seen.add(key)
        _import_file(path, detector, result)
    result.trajectories = _dedupe(result.trajectories)
    return result


def sniff(lines: list[Line]) -> str | None:
    """The kind of a file ("karl", "codex", "claude-code") from its first valid lines, or None."""
    for _, obj in lines[:SNIFF_LINES]:
        for kind, looks_like, _ in KINDS:
            if looks_like(obj):
                return kind
    return None


def _expand(paths: Sequence[Path | str], skipped: list[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw).expanduser()
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError) as exc:
            skipped.append(
                f"{named(path)}: {'not found' if isinstance(exc, FileNotFoundError) else _why(exc)}"
            )
            continue
        if stat.S_ISDIR(mode):
            yield from _walk(path, skipped)
        elif stat.S_ISREG(mode):
            yield path
        else:  # a FIFO would block the read for ever, a device may never end
            skipped.append(f"{named(path)}: {kind_of(mode)}, not a file to import")


def _walk(root: Path, skipped: list[str]) -> Iterator[Path]:
    """`*.jsonl` under root, sorted, a folder's files before its subfolders (sessions, then subagents); one
    that is not a regular file (a FIFO, a socket, a link to a device) is skipped with one line."""

    def unreadable(error: OSError) -> None:
        skipped.append(f"{named(error.filename)}: unreadable ({error.strerror})")

    for folder, subfolders, names in os.walk(root, onerror=unreadable):
        subfolders.sort()
        for name in sorted(names):
            # agent-acompact-*: the compaction run writes a summary, it does no agent work.
            if name.endswith(".jsonl") and not name.startswith("agent-acompact"):
                path = Path(folder) / name
                try:
                    mode = os.stat(path).st_mode
                except OSError as exc:
                    skipped.append(f"{named(path)}: {_why(exc)}")
                    continue
                if stat.S_ISREG(mode):
                    yield path
                else:
                    skipped.append(f"{named(path)}: {kind_of(mode)}, not a file to import")


def _why(exc: BaseException) -> str:
    return reason(exc) if isinstance(exc, OSError) else str(exc)


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: a symbolic link loop, in Python 3.11
        return path


def _import_file(path: Path, detector: Detector, result: ImportResult) -> None:
    try:
        lines, bad = read_jsonl(path)
    except FileKindError as exc:  # swapped for a FIFO since it was listed
        result.skipped.append(str(exc))
        return
    except OSError as exc:  # vanished or unreadable since it was listed
        result.skipped.append(f"{named(path)}: unreadable ({exc.strerror or exc})")
        return
    kind = sniff(lines)
    if kind is None:
        result.skipped.append(
            f"{named(path)}: not a Claude Code transcript, Codex rollout or KARL record file"
        )
        return
    parse = next(p for k, _, p in KINDS if k == kind)
    try:
        # The lines are read: from here the path only names things (source, session), as storable text.
        parsed = parse(Path(named(path)), lines, detector)
    except Exception as exc:  # a format change must cost one file, never the whole import
        result.skipped.append(f"{named(path)}: could not be read as {kind} ({type(exc).__name__}: {exc})")
        return
    result.files += 1
    result.skipped.extend(bad + parsed.skipped)
    result.trajectories.extend(parsed.trajectories)
    result.sessions += parsed.sessions
    result.empty_sessions += parsed.empty_sessions


def read_jsonl(path: Path) -> tuple[list[Line], list[str]]:
    """The JSON objects of a file with their line numbers, and a `file:line: reason` per malformed line."""
    lines: list[Line] = []
    bad: list[str] = []
    where = named(path)
    # Bytes that are not UTF-8 become U+FFFD, a \ud800 escape too (loads_storable): every text is storable.
    with io.TextIOWrapper(open_regular(path), encoding="utf-8", errors="replace") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                obj = loads_storable(raw)
            except (ValueError, RecursionError):
                bad.append(f"{where}:{number}: invalid JSON")
                continue
            if isinstance(obj, dict):
                lines.append((number, obj))
            else:
                bad.append(f"{where}:{number}: not a JSON object")
    return lines, bad


def _dedupe(trajectories: list[Trajectory]) -> list[Trajectory]:
    """One trajectory per uid (a resumed session can repeat earlier turns); the fuller copy wins."""
    chosen: dict[str, Trajectory] = {}
    for traj in trajectories:
        old = chosen.get(traj.uid)
        if old is None or _fullness(traj) > _fullness(old):
            chosen[traj.uid] = traj
    return list(chosen.values())


def _fullness(traj: Trajectory) -> tuple[int, bool]:
    return len(traj.events), traj.session_continued is not None
