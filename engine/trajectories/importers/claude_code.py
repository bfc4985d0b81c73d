"""Claude Code transcripts (`~/.claude/projects/<cwd>/<sessionId>.jsonl`) -> trajectories.

See docs/reference/agent-traces.md §2. A main transcript gives one trajectory per human prompt
that was followed by tool calls; a subagent file (`<sessionId>/subagents/agent-<id>.jsonl`) gives
one trajectory for the whole subagent run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.trajectories.importers.human_prompts import DEFAULT_DETECTOR, Detector, is_human_text
from engine.trajectories.importers.trace_lines import (
    Line,
    Parsed,
    as_dict,
    content_text,
    elapsed_ms,
    latest,
    params_of,
    prompt_of,
    unix_ts,
)
from engine.trajectories.trajectory import (
    Event,
    Trajectory,
    exit_code_from_text,
    make_uid,
    normalize_tool,
)

AGENT = "claude-code"
# Tuples, not sets: a malformed line's `type` may be a list, which a set cannot look up.
LINE_TYPES = (
    "user",
    "assistant",
    "system",
    "progress",
    "summary",
    "file-history-snapshot",
    "queue-operation",
)


def looks_like(obj: dict[str, Any]) -> bool:
    """A Claude Code transcript line: a known line type with the transcript envelope."""
    if obj.get("type") not in LINE_TYPES:
        return False
    return any(key in obj for key in ("sessionId", "uuid", "parentUuid", "leafUuid", "messageId"))


@dataclass
class _Call:
    event: Event
    called_at: float | None
    paired: bool = False


@dataclass
class _Turn:
    prompt: str
    line_uuid: str | None
    session_id: str
    index: int
    started_at: float | None
    cwd: str | None
    ended_at: float | None = None
    events: list[Event] = field(default_factory=list)


class _Calls:
    """tool_use blocks become events; tool_result blocks (paired by tool_use_id) complete them."""

    def __init__(self) -> None:
        self.by_id: dict[str, _Call] = {}

    def add_uses(self, obj: dict[str, Any], ts: float | None, events: list[Event]) -> None:
        for block in _blocks(obj):
            if block.get("type") != "tool_use":
                continue
            use_id = block.get("id")
            if isinstance(use_id, str) and use_id in self.by_id:
                continue  # the same block written twice (streamed message) is one call
            event = Event(tool=normalize_tool(block.get("name")), params=params_of(block.get("input")), ts=ts)
            events.append(event)
            if isinstance(use_id, str):
                self.by_id[use_id] = _Call(event, ts)

    def pair_results(self, obj: dict[str, Any], ts: float | None) -> None:
        for block in _blocks(obj):
            if block.get("type") != "tool_result":
                continue
            call = self.by_id.get(str(block.get("tool_use_id")))
            if call is None or call.paired:
                continue
            call.paired = True
            failed = block.get("is_error") is True  # absent on most successes: only `true` is a failure
            call.event.success = not failed
            call.event.duration_ms = elapsed_ms(call.called_at, ts)
            if call.event.tool == "Bash":
                call.event.exit_code = _bash_exit_code(block, obj) if failed else 0


def _blocks(obj: dict[str, Any]) -> list[dict[str, Any]]:
    content = as_dict(obj.get("message")).get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _bash_exit_code(block: dict[str, Any], obj: dict[str, Any]) -> int | None:
    code = exit_code_from_text(content_text(block.get("content")))
    result = obj.get("toolUseResult")
    if code is None and isinstance(result, str):  # usually "Error: Exit code N\n..."
        code = exit_code_from_text(result.removeprefix("Error:"))
    return code


def human_prompt(obj: dict[str, Any]) -> str | None:
    """The text of a user line a person typed (§2.2); None for meta, summaries, echoes, tool results."""
    if obj.get("type") != "user" or obj.get("isMeta") is True or obj.get("isCompactSummary") is True:
        return None
    content = as_dict(obj.get("message")).get("content")
    if isinstance(content, list):
        blocks = [b for b in content if isinstance(b, dict)]
        if any(b.get("type") == "tool_result" for b in blocks):
            return None
        text = "\n".join(
            b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    elif isinstance(content, str):
        text = content
    else:
        return None
    return text if is_human_text(text) else None


def is_subagent_file(path: Path, lines: list[Line]) -> bool:
    """A subagent run: its conversation lines are all sidechain lines (2.1.x subagents/agent-*.jsonl)."""
    for _, obj in lines:
        if obj.get("type") in ("user", "assistant"):
            return obj.get("isSidechain") is True
    return path.name.startswith("agent-") and path.parent.name == "subagents"


def parse(path: Path, lines: list[Line], detector: Detector = DEFAULT_DETECTOR) -> Parsed:
    parsed = Parsed()
    if is_subagent_file(path, lines):
        parsed.add_session(_subagent(path, lines))
    else:
        parsed.add_session(_main_chain(path, lines, detector))
    return parsed


def _session_id(path: Path, lines: list[Line]) -> str:
    for _, obj in lines:
        if isinstance(obj.get("sessionId"), str) and obj["sessionId"]:
            return obj["sessionId"]
    return path.stem


def _main_chain(path: Path, lines: list[Line], detector: Detector) -> list[Trajectory]:
    session_id = _session_id(path, lines)
    turns: list[_Turn] = []
    calls = _Calls()
    for _, obj in lines:
        if obj.get("isSidechain") is True:  # old versions keep subagent lines in the main file
            continue
        ts = unix_ts(obj.get("timestamp"))
        text = human_prompt(obj)
        if text is not None:
            turns.append(_new_turn(obj, text, session_id, len(turns), ts))
            continue
        if turns:  # work before the first human prompt belongs to no turn
            _absorb(turns[-1], calls, obj, ts)
    return [
        _trajectory(path, turn, turns[i + 1] if i + 1 < len(turns) else None, detector)
        for i, turn in enumerate(turns)
        if turn.events
    ]


def _absorb(turn: _Turn, calls: _Calls, obj: dict[str, Any], ts: float | None) -> None:
    """One line inside a turn: it extends the turn's time; tool calls and results become events."""
    turn.ended_at = latest(turn.ended_at, ts)
    turn.cwd = turn.cwd or _str(obj.get("cwd"))
    if obj.get("type") == "assistant":
        calls.add_uses(obj, ts, turn.events)
    elif obj.get("type") == "user":
        calls.pair_results(obj, ts)


def _new_turn(obj: dict[str, Any], text: str, session_id: str, index: int, ts: float | None) -> _Turn:
    session_id = _str(obj.get("sessionId")) or session_id
    uuid, cwd = _str(obj.get("uuid")), _str(obj.get("cwd"))
    return _Turn(text, uuid, session_id, index, started_at=ts, cwd=cwd, ended_at=ts)


def _trajectory(path: Path, turn: _Turn, following: _Turn | None, detector: Detector) -> Trajectory:
    traj = Trajectory(
        uid=make_uid(AGENT, turn.session_id, turn.line_uuid or f"turn-{turn.index}"),
        session_id=turn.session_id,
        agent=AGENT,
        source=str(path),
        prompt=prompt_of(turn.prompt),
        cwd=turn.cwd,
        git_repo=None,  # gitBranch names a branch and the cwd basename is not a repository
        started_at=turn.started_at,
        ended_at=turn.ended_at,
        events=turn.events,
        turn_index=turn.index,
    )
    if (
        following is not None
    ):  # docs/reference/karl.md §12(g): only the next human prompt sets the cross-turn flags
        traj.session_continued = True
        traj.correction, traj.redo = detector.judge(following.prompt)
    return traj


def _subagent(path: Path, lines: list[Line]) -> list[Trajectory]:
    """One trajectory per subagent file: its first user line is the parent's task prompt."""
    session_id = _session_id(path, lines)
    agent_id = _agent_id(path, lines)
    calls = _Calls()
    turn: _Turn | None = None
    for _, obj in lines:
        ts = unix_ts(obj.get("timestamp"))
        if turn is None:
            if obj.get("type") == "user":
                prompt = content_text(as_dict(obj.get("message")).get("content"))
                turn = _Turn(prompt, agent_id, session_id, 0, ts, _str(obj.get("cwd")), ended_at=ts)
            continue
        _absorb(turn, calls, obj, ts)
    if turn is None or not turn.events:
        return []
    traj = _trajectory(path, turn, None, DEFAULT_DETECTOR)
    traj.uid = make_uid(AGENT, session_id, "agent", agent_id)
    return [traj]


def _agent_id(path: Path, lines: list[Line]) -> str:
    for _, obj in lines:
        if isinstance(obj.get("agentId"), str) and obj["agentId"]:
            return obj["agentId"]
    return path.stem.removeprefix("agent-")


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
