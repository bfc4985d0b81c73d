"""Codex CLI rollouts (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`) -> trajectories.

See docs/reference/agent-traces.md §3. A turn runs from one `event_msg` `user_message` to the
next (or to `turn_aborted`); its events are the function, custom-tool and local-shell calls in line
order, joined to their outputs by `call_id`. Success is settled only at the end of the file because
the evidence arrives late: `patch_apply_end`, and `write_stdin` outputs that carry the exit code of
an `exec_command` still running when its own output was written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.trajectories.importers.human_prompts import DEFAULT_DETECTOR, Detector, is_codex_human_text
from engine.trajectories.importers.trace_lines import (
    Line,
    Parsed,
    as_dict,
    as_float,
    content_text,
    exit_code,
    latest,
    params_of,
    prompt_of,
    unix_ts,
)
from engine.trajectories.trajectory import Event, Trajectory, make_uid, normalize_tool

AGENT = "codex"
# Tuples, not sets: a malformed line's `type` may be a list, which a set cannot look up.
ENVELOPES = ("session_meta", "response_item", "event_msg", "turn_context", "compacted")
ITEMS = (
    "message",
    "reasoning",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "local_shell_call",
    "web_search_call",
)
CALLS = ("function_call", "custom_tool_call", "local_shell_call")
OUTPUTS = ("function_call_output", "custom_tool_call_output")

_PROCESS_EXITED = re.compile(r"^Process exited with code (-?\d+)", re.M)
_EXIT_CODE = re.compile(r"^Exit code:\s*(-?\d+)", re.M)
_WALL_TIME = re.compile(r"^Wall time:\s*(\d+(?:\.\d+)?)\s*s", re.M)
_RUNNING = re.compile(r"^Process running with session ID (\S+)", re.M)
_PATCH_FILE = re.compile(r"^\*\*\* (?:Add|Update|Delete) File:\s*(.+?)\s*$", re.M)


def looks_like(obj: dict[str, Any]) -> bool:
    """A rollout line: the `{timestamp, type, payload}` envelope, or a very old build's header line."""
    if obj.get("type") in ENVELOPES and isinstance(obj.get("payload"), dict):
        return True
    return "instructions" in obj and "id" in obj and "timestamp" in obj and "type" not in obj


@dataclass
class _Call:
    event: Event
    has_output: bool = False
    failed: bool = False  # explicit failure evidence: patch_apply_end, MCP isError

    def settle(self) -> None:
        code = self.event.exit_code
        if self.failed or (code is not None and code != 0):
            self.event.success = False
        elif self.has_output:
            self.event.success = True


@dataclass
class _Output:
    exit_code: int | None = None
    duration_ms: float | None = None
    running_session: str | None = None
    is_error: bool = False


@dataclass
class _Turn:
    prompt: str
    stamp: str | None  # the user_message line's raw timestamp: part of the uid
    index: int
    started_at: float | None
    cwd: str | None
    ended_at: float | None = None
    events: list[Event] = field(default_factory=list)


@dataclass
class _Rollout:
    path: Path
    session_id: str
    has_meta: bool = False
    cwd: str | None = None
    git_repo: str | None = None
    turns: list[_Turn] = field(default_factory=list)
    current: _Turn | None = None  # None before the first prompt and after turn_aborted
    calls: dict[str, _Call] = field(default_factory=dict)
    exec_sessions: dict[str, _Call] = field(default_factory=dict)  # unified-exec session id -> its call
    stdin_calls: dict[str, str] = field(default_factory=dict)  # write_stdin call_id -> session id


def parse(path: Path, lines: list[Line], detector: Detector = DEFAULT_DETECTOR) -> Parsed:
    entries = [e for e in (_entry(obj) for _, obj in lines) if e is not None]
    rollout = _Rollout(path, _fallback_session_id(path))
    # Old builds persisted no user_message events; then the user messages are the prompts.
    prompts_from_items = not any(k == "event_msg" and p.get("type") == "user_message" for k, p, _ in entries)
    for kind, payload, stamp in entries:
        _take(rollout, kind, payload, stamp, prompts_from_items)
    for call in rollout.calls.values():
        call.settle()
    parsed = Parsed()
    parsed.add_session(_trajectories(rollout, detector))
    return parsed


def _entry(obj: dict[str, Any]) -> tuple[str, dict[str, Any], str | None] | None:
    """(envelope kind, payload, raw timestamp) for any generation of line; None for state lines."""
    stamp = obj.get("timestamp") if isinstance(obj.get("timestamp"), str) else None
    if obj.get("type") in ENVELOPES and isinstance(obj.get("payload"), dict):
        return obj["type"], obj["payload"], stamp
    if "instructions" in obj and "id" in obj and "type" not in obj:
        return "session_meta", obj, stamp
    if obj.get("type") in ITEMS:  # very old builds: bare response items
        return "response_item", obj, stamp
    return None


def _fallback_session_id(path: Path) -> str:
    match = re.search(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", path.stem, re.I)
    return match.group(1) if match else path.stem


def _take(
    r: _Rollout, kind: str, payload: dict[str, Any], stamp: str | None, prompts_from_items: bool
) -> None:
    ts = unix_ts(stamp)
    ptype = payload.get("type")
    # A user message closes the turn before it: its time (and its mirror's) is the next turn's start.
    if r.current is not None and not (ptype == "user_message" or payload.get("role") == "user"):
        r.current.ended_at = latest(r.current.ended_at, ts)
    if kind == "session_meta":
        _meta(r, payload)
    elif kind == "turn_context":
        r.cwd = _str(payload.get("cwd")) or r.cwd
        if r.current is not None:
            r.current.cwd = r.cwd
    elif kind == "event_msg":
        _event_msg(r, payload, stamp, ts)
    elif kind == "response_item" and ptype == "message" and prompts_from_items:
        if payload.get("role") == "user":
            _prompt(r, content_text(payload.get("content")), stamp, ts)
    elif kind == "response_item" and ptype in CALLS:
        _call(r, payload, ts)
    elif kind == "response_item" and ptype in OUTPUTS:
        _output(r, str(payload.get("call_id")), payload.get("output"))


def _meta(r: _Rollout, payload: dict[str, Any]) -> None:
    if not r.has_meta and _str(payload.get("id")):
        r.session_id = payload["id"]  # the first session_meta wins (forks repeat their parent's)
    r.has_meta = True
    r.cwd = r.cwd or _str(payload.get("cwd"))
    r.git_repo = r.git_repo or repo_name(as_dict(payload.get("git")).get("repository_url"))


def repo_name(url: Any) -> str | None:
    """`carl-tui` from https://host/owner/carl-tui.git or git@host:owner/carl-tui.git."""
    if not isinstance(url, str) or not url.strip():
        return None
    return re.split(r"[/:]", url.strip().rstrip("/").removesuffix(".git"))[-1] or None


def _event_msg(r: _Rollout, payload: dict[str, Any], stamp: str | None, ts: float | None) -> None:
    ptype = payload.get("type")
    call = r.calls.get(str(payload.get("call_id")))
    if ptype == "user_message":
        if payload.get("kind") in (None, "plain"):  # some builds tag injected context with a kind
            _prompt(r, payload.get("message"), stamp, ts)
    elif ptype == "turn_aborted":
        r.current = None  # later calls belong to no prompt until the next user_message
    elif call is None:
        return
    elif ptype == "patch_apply_end" and payload.get("success") is False:
        call.failed = True
    elif ptype == "exec_command_end" and call.event.exit_code is None:
        call.event.exit_code = exit_code(payload.get("exit_code"))
        call.has_output = call.has_output or call.event.exit_code is not None
    elif ptype == "mcp_tool_call_end":
        result = as_dict(payload.get("result"))
        call.failed = call.failed or "Err" in result or as_dict(result.get("Ok")).get("isError") is True


def _prompt(r: _Rollout, text: Any, stamp: str | None, ts: float | None) -> None:
    if not isinstance(text, str) or not is_codex_human_text(text):
        return
    r.current = _Turn(text, stamp, len(r.turns), ts, r.cwd, ended_at=ts)
    r.turns.append(r.current)


def _call(r: _Rollout, payload: dict[str, Any], ts: float | None) -> None:
    call_id = payload.get("call_id") or payload.get("id")
    name = "local_shell_call" if payload.get("type") == "local_shell_call" else payload.get("name")
    args = _arguments(payload)
    if name == "write_stdin":  # continues an exec_command session: not a new command
        r.stdin_calls[str(call_id)] = str(args.get("session_id"))
        return
    if r.current is None:
        return  # no turn to attach to (before the first prompt, or after an abort)
    event = Event(
        tool=normalize_tool(name if isinstance(name, str) else None), params=_params(name, args), ts=ts
    )
    r.current.events.append(event)
    if call_id is not None:  # without an id no output can be joined: success stays unknown
        r.calls[str(call_id)] = _Call(event)


def _arguments(payload: dict[str, Any]) -> dict[str, Any]:
    if payload.get("type") == "local_shell_call":
        return as_dict(payload.get("action"))
    raw = payload.get("arguments") if payload.get("type") == "function_call" else payload.get("input")
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"input": raw}  # custom tools take raw text (an apply_patch body)
    return value if isinstance(value, dict) else {"input": raw}


def _params(name: Any, args: dict[str, Any]) -> dict[str, str]:
    if normalize_tool(name if isinstance(name, str) else None) == "Bash":
        return params_of({"command": shell_script(args.get("cmd", args.get("command")))})
    if name in ("apply_patch", "apply_diff"):
        files = _PATCH_FILE.findall(str(args.get("input", args.get("patch", ""))))
        return params_of({"file_path": files[0]} if files else {})
    return params_of(args)


def shell_script(command: Any) -> str | None:
    """The script of a shell call: the `-lc` argument of an argv, else the joined argv, else the string."""
    if isinstance(command, str):
        return command
    if not isinstance(command, list):
        return None
    argv = [str(a) for a in command]
    for flag in ("-lc", "-c"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1]
    return " ".join(argv)


def _output(r: _Rollout, call_id: str, raw: Any) -> None:
    out = read_output(raw)
    session = r.stdin_calls.get(call_id)
    if session is not None:  # a write_stdin result speaks for the exec_command it continues
        call = r.exec_sessions.get(session)
        if call is not None:
            call.event.exit_code = out.exit_code if out.exit_code is not None else call.event.exit_code
            call.event.duration_ms = _add(call.event.duration_ms, out.duration_ms)
        return
    call = r.calls.get(call_id)
    if call is None:
        return
    call.has_output = True
    call.failed = call.failed or out.is_error
    call.event.exit_code = out.exit_code
    call.event.duration_ms = out.duration_ms
    if out.running_session is not None:
        r.exec_sessions[out.running_session] = call


def read_output(raw: Any) -> _Output:
    """Exit code, duration and running session from a call output, in the order of §3.5."""
    failed = False
    if isinstance(raw, dict):  # some builds: {content, success}
        failed = raw.get("success") is False
        raw = raw.get("content", raw.get("output"))
    text = content_text(raw)
    parsed = _json_object(text)
    if parsed is not None:
        meta = as_dict(parsed.get("metadata"))
        secs = as_float(meta.get("duration_seconds"))
        error = parsed.get("isError") is True or parsed.get("is_error") is True
        return _Output(
            exit_code(meta.get("exit_code")), None if secs is None else secs * 1000.0, None, failed or error
        )
    header = _header(text)
    code = _first_int(_PROCESS_EXITED, header)
    code = code if code is not None else _first_int(_EXIT_CODE, header)
    wall = _WALL_TIME.search(header)
    running = _RUNNING.search(header)
    duration = float(wall.group(1)) * 1000.0 if wall else None
    return _Output(code, duration, running.group(1) if running else None, failed)


def _json_object(text: str) -> dict[str, Any] | None:
    if not text.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _header(text: str) -> str:
    """The lines before `Output:`: the command's own output must not be read as an exit status."""
    lines = text.splitlines()
    if "Output:" in lines:
        return "\n".join(lines[: lines.index("Output:")])
    return "\n".join(lines[:5])


def _first_int(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    return exit_code(match.group(1)) if match else None


def _add(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _trajectories(r: _Rollout, detector: Detector) -> list[Trajectory]:
    out = []
    for i, turn in enumerate(r.turns):
        if not turn.events:
            continue
        traj = Trajectory(
            uid=make_uid(AGENT, r.session_id, turn.stamp or f"turn-{turn.index}"),
            session_id=r.session_id,
            agent=AGENT,
            source=str(r.path),
            prompt=prompt_of(turn.prompt),
            cwd=turn.cwd or r.cwd,
            git_repo=r.git_repo,
            started_at=turn.started_at,
            ended_at=turn.ended_at,
            events=turn.events,
            turn_index=turn.index,
        )
        if i + 1 < len(
            r.turns
        ):  # docs/reference/karl.md §12(g): the next human prompt sets the cross-turn flags
            traj.session_continued = True
            traj.correction, traj.redo = detector.judge(r.turns[i + 1].prompt)
        out.append(traj)
    return out


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
