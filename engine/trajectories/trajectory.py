"""Trajectories: one user turn of agent work, its tool events, and what the next prompt said.

The shapes every source (hooks, Claude Code transcripts, Codex rollouts, KARL records) produces
and every consumer (scoring, advantages, the store, export) reads. Privacy is applied here, once:
prompts are cut to 500 characters, only the documented key parameters of a tool input are kept,
each cut to 200 characters, and secrets are redacted before anything reaches the store.
See docs/reference/karl.md (sections 2 and 12) and docs/reference/agent-traces.md (section 4).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from engine.limits import EXIT_CODE_MAX, EXIT_CODE_MIN, int_text
from engine.redact import redact

PROMPT_CHARS = 500
PARAM_CHARS = 200
MAX_STORED_EVENTS = 50
KEY_PARAMS = ("file_path", "command", "pattern", "query", "url", "description")

# Foreign tool names -> KARL (Claude Code) names; anything else passes through unchanged.
TOOL_NAMES = {
    "exec_command": "Bash",
    "shell_command": "Bash",
    "shell": "Bash",
    "local_shell_call": "Bash",
    "local_shell": "Bash",
    "PowerShell": "Bash",
    "apply_patch": "Edit",
    "apply_diff": "Edit",
    "read_file": "Read",
    "cat_file": "Read",
    "write_file": "Write",
    "create_file": "Write",
    "search_files": "Grep",
    "ripgrep": "Grep",
    "list_files": "Glob",
    "find_files": "Glob",
    "Task": "Agent",
}
MUTATION_TOOLS = frozenset({"Write", "Edit", "NotebookEdit"})

_EXIT_CODE = re.compile(
    r"^(?:Exit code:?\s*(-?\d+)|Command exited with non-zero status code\s+(-?\d+))", re.I
)


def normalize_tool(name: Any) -> str:
    """The short name the signals use; a name that is no text (a hostile file's list or bool) is "unknown"."""
    name = (name.strip() if isinstance(name, str) else "") or "unknown"
    return TOOL_NAMES.get(name, name)


def key_params(tool_input: Any) -> dict[str, str]:
    """The documented key parameters only, as strings of at most 200 characters, redacted."""
    if not isinstance(tool_input, dict):
        return {}
    out = {}
    for key in KEY_PARAMS:
        value = tool_input.get(key)
        if value is None:
            continue
        if isinstance(value, list):  # Codex argv form
            value = " ".join(str(v) for v in value)
        out[key] = redact(str(value))[:PARAM_CHARS]
    return out


def cut_prompt(text: str | None) -> str:
    return redact(text or "")[:PROMPT_CHARS]


def exit_code_from_text(text: Any) -> int | None:
    """N from a leading `Exit code N` / `Exit code: N` / `Command exited with non-zero status code N`."""
    if not isinstance(text, str):
        return None
    match = _EXIT_CODE.match(text.lstrip())
    if match is None:
        return None
    return int_text(match.group(1) or match.group(2), EXIT_CODE_MIN, EXIT_CODE_MAX)  # 32 bits, or no code


@dataclass
class Event:
    tool: str  # normalized name
    success: bool | None = None  # None: unknown (not a failure)
    exit_code: int | None = None
    duration_ms: float | None = None
    ts: float | None = None  # unix seconds
    params: dict[str, str] = field(default_factory=dict)  # key params only

    @property
    def failed(self) -> bool:
        return self.success is False

    @property
    def bash_error(self) -> bool:
        """docs/reference/karl.md §12(b): a Bash call failed, or has a known non-zero exit code."""
        return self.tool == "Bash" and (
            self.success is False or (self.exit_code is not None and self.exit_code != 0)
        )


@dataclass
class Trajectory:
    """One turn: a human prompt and the tool events that followed it."""

    uid: str  # stable across re-imports: source kind + session + turn
    session_id: str
    agent: str  # claude-code | codex | karl
    source: str  # hook | transcript path | rollout path | records path
    prompt: str = ""
    cwd: str | None = None
    git_repo: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    events: list[Event] = field(default_factory=list)  # every event (the store keeps the first 50)
    # Cross-turn signals, from the next human prompt of the session (None: unknown yet).
    correction: bool | None = None
    redo: bool | None = None
    build_success: bool | None = None
    session_continued: bool | None = None
    skill: str | None = None
    domain: str | None = None
    turn_index: int = 0
    # What the source file stored about its own score (a KARL record's reward, signals, advantage), kept
    # beside ours as `outcome.recorded` in the store; scoring never reads it.
    recorded: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.events)

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at

    @property
    def successes(self) -> int:
        return sum(1 for e in self.events if e.success is True)

    @property
    def failures(self) -> int:
        return sum(1 for e in self.events if e.success is False)

    @property
    def success_rate(self) -> float | None:
        return round(self.successes / self.total, 3) if self.total else None

    @property
    def tool_sequence(self) -> list[str]:
        return [e.tool for e in self.events]


@dataclass
class Scored:
    """A trajectory's reward: the total, the five signals and every component (docs/reference/karl.md §3)."""

    reward: float
    outcome: float
    process: float
    efficiency: float
    verification: float
    consistency: float
    components: dict[str, float] = field(default_factory=dict)

    def signals(self) -> dict[str, float]:
        return {
            "outcome": self.outcome,
            "process": self.process,
            "efficiency": self.efficiency,
            "verification": self.verification,
            "consistency": self.consistency,
        }


def make_uid(*parts: Any) -> str:
    """A stable id from the parts that identify a turn in its source."""
    text = "\x1f".join("" if p is None else str(p) for p in parts)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:24]
