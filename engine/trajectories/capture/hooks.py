"""Claude Code hooks: install the recorder, read what it spooled, and turn a session's payloads into turns.

The recorder itself is recorder.py (standard library only, run by every hook event). This module is
the engine's side: `install`/`uninstall` edit a Claude Code settings.json without disturbing the
user's own hooks, `read_spool`/`remove_spool` hand spooled payloads to the engine in two phases
(store first, then delete, so nothing is lost if the engine dies in between), and `assemble` maps
one session's ordered payloads to trajectories (docs/reference/agent-traces.md §1.5,
docs/reference/karl.md §1 and rule 12).
"""

from __future__ import annotations

import argparse
import copy
import errno
import json
import logging
import os
import re
import shlex
import stat
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.errors import CarlError
from engine.text import encodable, may_hold_surrogates, one_line, storable_value
from engine.trajectories.importers.human_prompts import DEFAULT_DETECTOR, Detector, is_human_text
from engine.trajectories.trajectory import (
    Event,
    Trajectory,
    cut_prompt,
    exit_code_from_text,
    key_params,
    make_uid,
    normalize_tool,
)

log = logging.getLogger("carl.hooks")

HOOK_SCRIPT = Path(__file__).resolve().with_name("recorder.py")
AGENT = "claude-code"
SOURCE = "hook"
UID_KIND = "claude-code-hook"
# PreToolUse is not installed: a tool call is recorded once, from its Post hook, and a Pre handler
# would add a process start *before* every tool call. recorder.py and assemble() still accept it.
INSTALL_EVENTS = (
    "SessionStart",
    "UserPromptSubmit",
    "PostToolUse",
    "PostToolUseFailure",
    "Stop",
    "SessionEnd",
)
TOOL_EVENTS = frozenset({"PreToolUse", "PostToolUse", "PostToolUseFailure"})
HANDLER_TIMEOUT_S = 5  # the recorder takes milliseconds; SessionEnd hooks share a 1.5 s budget anyway
STALE_TURN_S = 2 * 3600.0  # an open turn this long without a payload ended without Stop (assemble's `now`)
Scope = Literal["user", "project", "local"]

# Ours: the recorder (script or import form, any interpreter; before it moved to capture/recorder.py it was
# trajectories/hook.py, and `carl hooks install` replaces those commands too) or the `carl hook` subcommand.
_OURS = re.compile(
    r"engine[/\\]trajectories\b.*\b(?:hook|recorder)\b|(?:^|[\s/\\\"'])carl(?:\.exe)?[\"']?\s+hook(?:\s|$)"
)


class HookSettingsError(CarlError):
    """A settings.json carl will not edit (not JSON, or hooks of the wrong shape); left untouched."""


# ---------------------------------------------------------------------------------------------------
# The command and the settings file


def hook_command(
    python: str = sys.executable, *, carl_home: Path | None = None, script: Path = HOOK_SCRIPT
) -> str:
    """The shell command settings.json runs for every event.

    `python -S -E -c "...; import recorder; recorder.main()"` rather than `python -S recorder.py`: a script is
    compiled on every run (~1.5 ms of a 10 ms budget), an imported module comes from its cached
    bytecode. -S skips site (~13 ms here), -E ignores PYTHON* variables of the user's shell.
    """
    code = f"import sys; sys.path[0] = {json.dumps(str(script.parent))}; import recorder; recorder.main()"
    argv = [python, "-S", "-E", "-c", code]
    if carl_home is not None:  # the engine's home, baked in: Claude Code may not see the same $CARL_HOME
        argv += ["--home", str(carl_home)]
    return shlex.join(argv)


def is_ours(command: object) -> bool:
    return isinstance(command, str) and _OURS.search(command) is not None


def settings_path(
    scope: Scope = "user", *, project_dir: Path | None = None, home: Path | None = None
) -> Path:
    """user: ~/.claude/settings.json; project: <dir>/.claude/settings.json (committed);
    local: <dir>/.claude/settings.local.json (git-ignored, right for a machine-specific command)."""
    if scope == "user":
        return (home or Path.home()) / ".claude" / "settings.json"
    if scope not in ("project", "local"):
        raise HookSettingsError(f"unknown hooks scope {scope!r} (user, project or local)")
    name = "settings.json" if scope == "project" else "settings.local.json"
    return (project_dir or Path.cwd()).resolve() / ".claude" / name


def install(
    scope: Scope = "user",
    *,
    project_dir: Path | None = None,
    home: Path | None = None,
    python: str = sys.executable,
    carl_home: Path | None = None,
    events: Sequence[str] = INSTALL_EVENTS,
) -> Path:
    """Add the recorder to every event in `events`; idempotent, keeps everything else. Returns the file.

    `home` is the user's home directory (default Path.home()); `carl_home` is baked into the command
    when given, or when $CARL_HOME is set now (so the hooks feed the engine that installed them).
    """
    path = settings_path(scope, project_dir=project_dir, home=home)
    if carl_home is None and os.environ.get("CARL_HOME"):
        carl_home = Path(os.environ["CARL_HOME"]).expanduser().resolve()
    command = hook_command(python, carl_home=carl_home)
    data, style = _load(path)
    before = copy.deepcopy(data)
    hooks = _hooks_table(data, path)
    if hooks is None:  # none yet, or `null`
        hooks = data["hooks"] = {}
    for event in events:
        _ensure_handler(hooks, event, command, path)
    if data != before:  # a second install writes nothing: the file stays byte-identical
        _write(path, data, style)
    _compile_recorder()
    return path


def uninstall(scope: Scope = "user", *, project_dir: Path | None = None, home: Path | None = None) -> Path:
    """Remove only carl's handlers, and the groups, events and `hooks` table that this leaves empty."""
    path = settings_path(scope, project_dir=project_dir, home=home)
    if not path.exists():
        return path
    data, style = _load(path)
    hooks = _hooks_table(data, path)
    if hooks is None:
        return path
    changed = False
    for event in list(hooks):
        groups = hooks[event]
        if isinstance(groups, list) and _remove_ours(groups):
            changed = True
            if not groups:
                del hooks[event]
    if changed and not hooks:
        del data["hooks"]
    if changed:
        _write(path, data, style)
    return path


def repoint_moved_recorder(
    scope: Scope = "user", *, project_dir: Path | None = None, home: Path | None = None
) -> Path | None:
    """Rewrite carl's handlers whose recorder is no longer where their command looks for it (an upgrade that
    moved trajectories/hook.py to capture/recorder.py, or a moved checkout), keeping each one's interpreter
    and baked-in home. Returns the file when it changed; handlers of `carl hook` and current ones are left.

    A handler left pointing at a missing file fails on every tool call of every Claude Code session.
    """
    path = settings_path(scope, project_dir=project_dir, home=home)
    if not path.exists():
        return None
    data, style = _load(path)
    hooks = _hooks_table(data, path) or {}
    changed = False
    for groups in hooks.values():
        for handler in _handlers(groups) if isinstance(groups, list) else ():
            fresh = _repointed(handler["command"])
            if fresh is not None and fresh != handler["command"]:
                handler["command"], changed = fresh, True
    if not changed:
        return None
    _write(path, data, style)
    _compile_recorder()
    return path


def _repointed(command: str) -> str | None:
    """The current command for an import-form handler whose recorder folder lost its recorder, else None."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    if len(argv) < 5 or argv[1:4] != ["-S", "-E", "-c"]:
        return None  # `carl hook`, or a hand-written command: not ours to rewrite
    folder = re.search(r"sys\.path\[0\] = (\"(?:[^\"\\\\]|\\\\.)*\")", argv[4])
    if folder is None or (Path(json.loads(folder.group(1))) / "recorder.py").exists():
        return None
    rest = argv[5:]
    carl_home = Path(rest[1]) if rest[:1] == ["--home"] and len(rest) > 1 else None
    return hook_command(argv[0], carl_home=carl_home)


def installed_events(
    scope: Scope = "user", *, project_dir: Path | None = None, home: Path | None = None
) -> list[str]:
    """The events that run carl's recorder in that settings file."""
    path = settings_path(scope, project_dir=project_dir, home=home)
    if not path.exists():
        return []
    data, _ = _load(path)
    hooks = _hooks_table(data, path) or {}
    return [event for event, groups in hooks.items() if isinstance(groups, list) and any(_handlers(groups))]


def _handlers(groups: list[Any]) -> Iterable[dict[str, Any]]:
    """carl's handlers among an event's matcher groups."""
    for group in groups:
        if isinstance(group, dict) and isinstance(group.get("hooks"), list):
            yield from (h for h in group["hooks"] if isinstance(h, dict) and is_ours(h.get("command")))


def _ensure_handler(hooks: dict[str, Any], event: str, command: str, path: Path) -> None:
    groups = hooks.setdefault(event, [])
    if not isinstance(groups, list):
        raise HookSettingsError(f"{path}: hooks.{event} is not a list; left it untouched")
    ours = list(_handlers(groups))
    if not ours:
        group: dict[str, Any] = {"matcher": "*"} if event in TOOL_EVENTS else {}
        group["hooks"] = [{"type": "command", "command": command, "timeout": HANDLER_TIMEOUT_S}]
        groups.append(group)
        return
    ours[0]["command"] = command  # a moved interpreter or checkout: same handler, new command
    if len(ours) > 1:  # duplicates (a hand edit, an old install): keep the first
        _remove_ours(groups, keep=ours[0])


def _remove_ours(groups: list[Any], keep: dict[str, Any] | None = None) -> bool:
    """Drop carl's handlers (but `keep`) and the groups that emptied; True if anything changed."""
    changed = False
    for group in list(groups):
        if not (isinstance(group, dict) and isinstance(group.get("hooks"), list)):
            continue
        kept = [
            h for h in group["hooks"] if h is keep or not (isinstance(h, dict) and is_ours(h.get("command")))
        ]
        if len(kept) != len(group["hooks"]):
            changed = True
            group["hooks"] = kept
            if not kept:
                groups.remove(group)
    return changed


def _hooks_table(data: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """The settings' `hooks` object; None when there is none (or `null`); any other value is refused."""
    hooks = data.get("hooks")
    if hooks is not None and not isinstance(hooks, dict):
        raise HookSettingsError(f"{path}: `hooks` is not an object; left it untouched")
    return hooks


@dataclass(frozen=True)
class _Style:
    indent: int | str = 2
    newline: bool = True


def _load(path: Path) -> tuple[dict[str, Any], _Style]:
    """The settings object and its layout; an invalid file is refused (one line: file:line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}, _Style()
    except (OSError, UnicodeDecodeError) as exc:
        raise HookSettingsError(f"{path}: cannot read it ({exc}); left it untouched") from None
    if not text.strip():
        return {}, _Style()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HookSettingsError(
            f"{path}:{exc.lineno}: not valid JSON ({exc.msg}); left it untouched"
        ) from None
    if not isinstance(data, dict):
        raise HookSettingsError(f"{path}:1: not a JSON object; left it untouched")
    indent = re.search(r"\n([ \t]+)\S", text)
    width = indent.group(1) if indent else "  "
    return data, _Style(len(width) if width.strip(" ") == "" else width, text.endswith("\n"))


def _write(path: Path, data: dict[str, Any], style: _Style) -> None:
    """Atomically (temp file + rename), through a symlink (dotfile managers), keeping the mode."""
    target = path.resolve() if path.is_symlink() else path
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, indent=style.indent, ensure_ascii=False) + ("\n" if style.newline else "")
    tmp = target.with_name(f".{target.name}.carl-{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if target.exists():
            os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _compile_recorder() -> None:
    """Write recorder.py's cached bytecode now, so the first hook call need not (and PYTHONDONTWRITEBYTECODE
    environments still get it). Best effort: a read-only install was compiled by pip."""
    import py_compile

    try:
        py_compile.compile(
            str(HOOK_SCRIPT), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
        )
    except (OSError, py_compile.PyCompileError) as exc:
        log.debug("could not compile %s: %s", HOOK_SCRIPT, exc)


# ---------------------------------------------------------------------------------------------------
# The spool


@dataclass(frozen=True)
class SpoolItem:
    path: Path
    received_at: float
    payload: dict[str, Any]

    @property
    def session_id(self) -> str:
        return str(self.payload.get("session_id") or "")


def spool_dir(home: Path) -> Path:
    return Path(home) / "spool" / "hooks"


def read_spool(
    home: Path,
    *,
    limit: int | None = None,
    on_bad: Callable[[Path, str], None] | None = None,
    stale_tmp_s: float = 60.0,
) -> list[SpoolItem]:
    """Spooled payloads in arrival order (file name order), at most `limit`. A corrupt file is moved
    to spool/bad/ and reported (log warning, hook-errors.log, `on_bad`). A `.tmp-` file older than
    `stale_tmp_s` is a recorder killed before its rename: it is finished here if it parses."""
    folder = spool_dir(home)
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    bad = _BadReporter(Path(home), on_bad)
    names = _salvage_tmp(folder, names, stale_tmp_s, bad)
    items: list[SpoolItem] = []
    for name in names:
        if limit is not None and len(items) >= limit:
            break
        if name.startswith(".") or not name.endswith(".json"):
            continue
        item, why = _read_item(folder / name)
        if item is None:
            bad(folder / name, why)
        else:
            items.append(item)
    return items


def remove_spool(items: Iterable[SpoolItem]) -> int:
    """Phase two, after the payloads are stored: delete their spool files. Returns how many."""
    removed = 0
    for item in items:
        try:
            item.path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _read_item(path: Path) -> tuple[SpoolItem | None, str]:
    """One spool file as an item, or (None, why it is bad). What the store cannot take is decided here,
    so one bad file is moved aside and never stops the files after it (or the engine's other jobs)."""
    try:
        raw = _read_regular(path)
        wrapper = json.loads(raw)
    except FileNotFoundError:
        return None, "vanished"
    except RecursionError:
        return None, "not JSON (nested too deeply)"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"not JSON ({exc})"
    if not (isinstance(wrapper, dict) and isinstance(wrapper.get("payload"), dict)):
        return None, "no payload object"
    received_at = wrapper.get("received_at")
    if isinstance(received_at, bool) or not isinstance(received_at, int | float):
        return None, "no received_at"
    if received_at != received_at or abs(received_at) == float("inf"):
        return None, "received_at is not a time"
    payload = wrapper["payload"]
    if may_hold_surrogates(raw):  # an escape, or a surrogate encoded as bytes UTF-8 forbids
        session = payload.get("session_id")
        if isinstance(session, str) and not encodable(session):
            # Replaced, it could merge two sessions into one: the file waits in spool/bad instead.
            return None, "session_id holds a lone surrogate (not UTF-8)"
        storable_value(payload)  # prompts, tool output: a lone surrogate becomes U+FFFD
    return SpoolItem(path, float(received_at), payload), ""


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file; a FIFO, socket or device in the spool is refused, never waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def _salvage_tmp(folder: Path, names: list[str], stale_s: float, bad: _BadReporter) -> list[str]:
    stale = [n for n in names if n.startswith(".tmp-")]
    if not stale:
        return names
    cutoff = time.time() - stale_s
    for name in stale:
        path = folder / name
        try:
            if path.stat().st_mtime > cutoff:
                continue  # a recorder may still be writing it
        except FileNotFoundError:
            continue
        item, why = _read_item(path)
        if item is None:
            bad(path, f"unfinished spool file: {why}")
        else:
            os.replace(path, folder / name.removeprefix(".tmp-"))
    return sorted(os.listdir(folder))


class _BadReporter:
    def __init__(self, home: Path, on_bad: Callable[[Path, str], None] | None) -> None:
        self.home, self.on_bad = home, on_bad

    def __call__(self, path: Path, why: str) -> None:
        if why == "vanished":
            return
        moved = quarantine(self.home, path, why)
        if moved is not None and self.on_bad is not None:
            self.on_bad(moved, why)


def quarantine(home: Path, path: Path, why: str) -> Path | None:
    """Move a spool file the engine cannot take to spool/bad/, and say why (the engine's log and
    logs/hook-errors.log); the files after it go on. Returns where it went (None: it had vanished)."""
    bad_dir = Path(home) / "spool" / "bad"
    bad_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
    moved = bad_dir / path.name.removeprefix(".tmp-")
    try:
        os.replace(path, moved)
    except FileNotFoundError:
        return None
    why = one_line(why)
    log.warning("bad hook spool file moved to %s: %s", moved, why)
    _append_error_log(Path(home), f"bad spool file moved to {moved}: {why}")
    return moved


def _append_error_log(home: Path, line: str) -> None:
    try:
        logs = home / "logs"
        logs.mkdir(parents=True, mode=0o700, exist_ok=True)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(logs / "hook-errors.log", "a", encoding="utf-8") as handle:
            handle.write(f"{stamp} {' '.join(line.split())}\n")
    except OSError:
        pass


def group_by_session(items: Iterable[SpoolItem]) -> dict[str, list[SpoolItem]]:
    """Arrival-ordered payloads per session_id (dict order: first arrival)."""
    sessions: dict[str, list[SpoolItem]] = {}
    for item in items:
        sessions.setdefault(item.session_id, []).append(item)
    return sessions


# ---------------------------------------------------------------------------------------------------
# Assembly: one session's payloads -> trajectories


@dataclass
class Assembly:
    trajectories: list[Trajectory]  # closed turns that have tool events, flags as known so far
    open_turn: bool  # a turn is still running: its trajectory comes with a later assembly
    session_id: str | None = None
    model: str | None = None  # from SessionStart
    cwd: str | None = None
    ended: bool = False  # SessionEnd was the last word


@dataclass
class _Turn:
    uid: str
    index: int
    prompt: str
    cwd: str | None
    started_at: float | None
    last_at: float | None
    ended_at: float | None = None
    closed_by: str | None = None  # None while open; "Stop", "SessionEnd", "prompt", "stale"
    judged: bool = False
    events: list[Event] = field(default_factory=list)
    correction: bool | None = None
    redo: bool | None = None
    session_continued: bool | None = None


HookItem = SpoolItem | Mapping[str, Any]


def assemble(
    payloads: Sequence[HookItem],
    *,
    detector: Detector = DEFAULT_DETECTOR,
    now: float | None = None,
    stale_after_s: float = STALE_TURN_S,
) -> Assembly:
    """Turns of ONE session from its hook payloads in arrival order (docs/reference/agent-traces.md §1.5).

    Each item is a SpoolItem, a spool wrapper `{"received_at", "payload"}`, or a bare payload.
    Pure: the same payloads give the same trajectories and uids, so re-assembling after a later
    prompt updates the earlier turn's cross-turn flags in place (the store upserts by uid). With
    `now`, a turn open for `stale_after_s` without a payload is closed (its Stop never came).
    """
    session = _Session(detector)
    for item in payloads:
        received_at, payload = _unwrap(item)
        if isinstance(payload, dict):
            session.feed(received_at, payload)
    session.finish(now, stale_after_s)
    return session.result()


def _unwrap(item: HookItem) -> tuple[float | None, Any]:
    if isinstance(item, SpoolItem):
        return item.received_at, item.payload
    if isinstance(item, Mapping) and isinstance(item.get("payload"), Mapping):
        return _number(item.get("received_at")), item["payload"]
    return (_number(item.get("received_at")), item) if isinstance(item, Mapping) else (None, None)


class _Session:
    def __init__(self, detector: Detector) -> None:
        self.detector = detector
        self.turns: list[_Turn] = []
        self.session_id: str | None = None
        self.model: str | None = None
        self.cwd: str | None = None
        self.ended = False

    @property
    def current(self) -> _Turn | None:
        return self.turns[-1] if self.turns and self.turns[-1].closed_by is None else None

    def feed(self, at: float | None, payload: dict[str, Any]) -> None:
        self.session_id = self.session_id or _str(payload.get("session_id"))
        self.cwd = _str(payload.get("cwd")) or self.cwd
        event = payload.get("hook_event_name")
        self.ended = False  # anything after SessionEnd (a resume) reopens the session
        if event == "SessionStart":
            self.model = _model(payload.get("model")) or self.model
        elif event == "UserPromptSubmit":
            self._prompt(at, payload)
        elif event in ("PostToolUse", "PostToolUseFailure"):
            self._tool(at, payload, failed=event == "PostToolUseFailure")
        elif event in ("Stop", "SessionEnd"):
            self._close(at, event)
            self.ended = event == "SessionEnd"
        # PreToolUse, SubagentStop, PreCompact, ...: nothing to record

    def _prompt(self, at: float | None, payload: dict[str, Any]) -> None:
        text = found if isinstance(found := payload.get("prompt"), str) else ""
        if not is_human_text(text):
            self._continue_turn()  # injected text (a task notification, a command echo): same turn
            return
        self._close(self.current.last_at if self.current else at, "prompt")
        for turn in (
            self.turns
        ):  # docs/reference/karl.md §12(g): the next human prompt speaks for the turns before it
            if not turn.judged:
                turn.judged, turn.session_continued = True, True
                turn.correction, turn.redo = self.detector.judge(text)
        key = _str(payload.get("prompt_id")) or at
        uid = make_uid(UID_KIND, self.session_id, key)
        cwd = _str(payload.get("cwd")) or self.cwd
        self.turns.append(
            _Turn(uid=uid, index=len(self.turns), prompt=text, cwd=cwd, started_at=at, last_at=at)
        )

    def _tool(self, at: float | None, payload: dict[str, Any], *, failed: bool) -> None:
        if payload.get("agent_id"):
            return  # a subagent's own call: the main turn records the Agent call once, as transcripts do
        turn = self.current or self._continue_turn() or self._implicit_turn(at)
        turn.last_at = at if at is not None else turn.last_at
        turn.cwd = turn.cwd or _str(payload.get("cwd"))
        turn.events.append(tool_event(payload, at, failed=failed))

    def _continue_turn(self) -> _Turn | None:
        """Reopen the last turn if only a Stop closed it (a Stop hook or injected text kept Claude going)."""
        if self.current is None and self.turns and self.turns[-1].closed_by == "Stop":
            self.turns[-1].closed_by = None
        return self.current

    def _implicit_turn(self, at: float | None) -> _Turn:
        """Tool calls with no prompt recorded (hooks installed mid-turn): a prompt-less turn (KARL tap B)."""
        uid = make_uid(UID_KIND, self.session_id, "no-prompt", at)
        turn = _Turn(uid=uid, index=len(self.turns), prompt="", cwd=self.cwd, started_at=at, last_at=at)
        self.turns.append(turn)
        return turn

    def _close(self, at: float | None, why: str) -> None:
        turn = self.current
        if turn is not None:
            turn.last_at = at if at is not None else turn.last_at
            turn.closed_by, turn.ended_at = why, turn.last_at

    def finish(self, now: float | None, stale_after_s: float) -> None:
        turn = self.current
        if (
            turn is not None
            and now is not None
            and turn.last_at is not None
            and now - turn.last_at > stale_after_s
        ):
            turn.closed_by, turn.ended_at = "stale", turn.last_at

    def result(self) -> Assembly:
        closed = [t for t in self.turns if t.closed_by is not None and t.events]  # tap C: no tools, no record
        trajectories = [self._trajectory(t) for t in closed]
        return Assembly(
            trajectories,
            open_turn=self.current is not None,
            session_id=self.session_id,
            model=self.model,
            cwd=self.cwd,
            ended=self.ended,
        )

    def _trajectory(self, turn: _Turn) -> Trajectory:
        return Trajectory(
            uid=turn.uid,
            session_id=self.session_id or "",
            agent=AGENT,
            source=SOURCE,
            prompt=cut_prompt(turn.prompt),
            cwd=turn.cwd,
            started_at=turn.started_at,
            ended_at=turn.ended_at,
            events=list(turn.events),
            correction=turn.correction,
            redo=turn.redo,
            session_continued=turn.session_continued,
            turn_index=turn.index,
        )


def tool_event(payload: Mapping[str, Any], at: float | None, *, failed: bool) -> Event:
    """A PostToolUse / PostToolUseFailure payload as a KARL event (docs/reference/karl.md §12(e))."""
    if failed:  # the tool threw: exit code from the error text's first line, when it has one
        success, exit_code = False, exit_code_from_text(payload.get("error"))
    else:  # success output carries no exit code (Bash included)
        success, exit_code = not explicit_error(payload.get("tool_response")), None
    return Event(
        tool=normalize_tool(_str(payload.get("tool_name"))),
        success=success,
        exit_code=exit_code,
        duration_ms=_number(payload.get("duration_ms")),
        ts=at,
        params=key_params(payload.get("tool_input")),
    )


def explicit_error(response: Any) -> bool:
    """A tool response that says it failed: an error string, `success: false`, an isError/is_error flag."""
    if not isinstance(response, Mapping):
        return False
    error = response.get("error")
    return (
        (isinstance(error, str) and bool(error.strip()))
        or response.get("success") is False
        or response.get("isError") is True
        or response.get("is_error") is True
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _model(value: Any) -> str | None:
    if isinstance(value, Mapping):  # some versions send {"id": ..., "display_name": ...}
        return _str(value.get("id")) or _str(value.get("display_name"))
    return _str(value)


# ---------------------------------------------------------------------------------------------------
# CLI helpers (engine/trajectories/carl_trajectories.py wires `carl hooks ...` to these)


def hook_cli_main(argv: Sequence[str] | None = None) -> int:
    """`carl hook`: record the payload on stdin; always 0, never a word on stdout."""
    from engine.trajectories.capture import recorder

    return recorder.main(list(argv or []))


def hooks_cli_main(argv: Sequence[str] | None = None) -> int:
    """`carl hooks install|uninstall|status [--user|--project|--local] [--project-dir DIR]`.
    A settings file carl will not edit raises HookSettingsError (a CarlError: one line)."""
    parser = argparse.ArgumentParser(
        prog="carl hooks", description="Claude Code hooks that record trajectories"
    )
    parser.add_argument("action", choices=("install", "uninstall", "status"))
    where = parser.add_mutually_exclusive_group()
    for name in ("user", "project", "local"):
        where.add_argument(f"--{name}", dest="scope", action="store_const", const=name)
    parser.add_argument("--project-dir", type=Path, default=None)
    parser.add_argument("--json", action="store_true", help="status: print one JSON object")
    args = parser.parse_args(list(argv) if argv is not None else None)
    scope: Scope = args.scope or "user"
    where_kw = {"project_dir": args.project_dir}
    if args.action == "install":
        path = install(scope, **where_kw)
        print(f"carl hooks installed in {path} ({', '.join(INSTALL_EVENTS)})")
    elif args.action == "uninstall":
        path = uninstall(scope, **where_kw)
        print(f"carl hooks removed from {path}")
    else:
        events = installed_events(scope, **where_kw)
        path = settings_path(scope, **where_kw)
        if args.json:
            print(
                json.dumps({"scope": scope, "path": str(path), "installed": bool(events), "events": events})
            )
        else:
            print(f"{path}: {', '.join(events) if events else 'no carl hooks'}")
    return 0
