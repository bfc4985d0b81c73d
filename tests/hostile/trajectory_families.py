"""The `carl trajectories import` families: Claude Code transcripts, Codex rollouts and KARL records (both
shapes), from the shapes the import tests build after the real tools' files, mutated line by line.

Each case is fed to `carl trajectories import PATH` (import, score, save, the retraining triggers), its output
captured. A line the importer cannot use is one `file:line: reason`; a file a parser raised on is reported as
`could not be read as <kind> (TypeError: ...)`, which the oracle counts as the traceback it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from test_trajectory_import import (
    CODEX_ID,
    SID,
    claude_session,
    codex_rollout,
    karl_record,
    published_session,
    subagent_lines,
)

from hostile import values as hv
from hostile.oracle import Outcome
from hostile.runner import Family, Workspace, file_name, materialize, path_kind, swallowed


@dataclass
class ImportCase:
    files: dict[str, Any]
    target: str


def feed_import(case: ImportCase, ws: Workspace, where: Path) -> Outcome:
    materialize(where, case.files)
    return swallowed(ws.cli("trajectories", "import", str(where / case.target)))


KARL_EVENTS = [
    {
        "tool_name": "Bash",
        "key_params": {"command": "xcodebuild", "content": "body"},
        "success": False,
        "exit_code": 65,
        "duration_ms": 1200,
        "ts": "2026-03-01T09:01:00Z",
    },
    {
        "tool_name": "exec_command",
        "key_params": {"command": "swift test"},
        "success": None,
        "exit_code": None,
        "duration_ms": None,
        "ts": "2026-03-01T09:02:00Z",
    },
]


def lines_family(
    name: str, make_lines: Any, layout: str, targets: tuple[str, ...], extra: Any = None
) -> Family:
    """A family whose case is one JSONL file at `layout` (its name sometimes hostile), mutated."""

    @st.composite
    def cases(draw: st.DrawFn, seeds: Any) -> ImportCase:
        folder, _, base = layout.rpartition("/")
        relative = f"{folder}/{draw(file_name(base))}"
        files = {relative: draw(path_kind(draw(hv.mutated_lines(make_lines()))))}
        if extra is not None:
            where, lines = extra
            files[where] = draw(hv.mutated_lines(lines())) if draw(st.booleans()) else hv.dumps_lines(lines())
        target = draw(st.sampled_from([*targets, relative]))
        return ImportCase(files, target)

    return Family(name, lambda folder: None, cases, feed_import, ci_examples=60, after=list_trajectories)


def list_trajectories(ws: Workspace) -> Outcome:
    """`carl trajectories list` once the cases are in: every prompt stored, as the listing prints it."""
    return swallowed(ws.cli("trajectories", "list", "--limit", "1000"))


FAMILIES = [
    lines_family(
        "claude-code",
        claude_session,
        f"projects/-home-dev-proj/{SID}.jsonl",
        ("projects", "projects/-home-dev-proj"),
        extra=(f"projects/-home-dev-proj/{SID}/subagents/agent-a7f3e21.jsonl", subagent_lines),
    ),
    lines_family(
        "codex",
        codex_rollout,
        f"sessions/2026/03/01/rollout-2026-03-01T09-00-00-{CODEX_ID}.jsonl",
        ("sessions",),
    ),
    lines_family(
        "karl-records",
        lambda: [
            karl_record("r1", KARL_EVENTS, ["Bash", "exec_command"]),
            karl_record("r2", KARL_EVENTS[:1], ["Bash"], correction_detected=True),
        ],
        "karl/records.jsonl",
        ("karl",),
    ),
    lines_family(
        "karl-published",
        lambda: [
            published_session(i, ["Bash", "Read", "Edit", "Read"] * (i + 1), failed={i}) for i in range(3)
        ],
        "karl/karl-ablation.jsonl",
        ("karl",),
    ),
]
