"""The process fingerprint of a trajectory (docs/reference/karl.md §7): how the agent worked, in six signals.

Like the reward, the fingerprint reads the stored record: the scans (flow, mutated paths,
verification, recovery, scope) see the first 50 events, the counts (`research_count`,
`mutation_count`, `total_events`, the research ratio) cover every event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.trajectories.trajectory import MAX_STORED_EVENTS, MUTATION_TOOLS, Event, Trajectory

RESEARCH_TOOLS = frozenset({"Read", "Grep", "Glob", "WebSearch", "WebFetch"})
PLANNING_TOOLS = frozenset({"EnterPlanMode", "ExitPlanMode", "TaskCreate", "TaskUpdate"})
VERIFY_WORDS = ("test", "build", "check", "lint", "compile")
MAX_MODIFIED_FILES = 10


def category(tool: str) -> str:
    """R research, M mutation, X execution, P planning, O other."""
    if tool in RESEARCH_TOOLS:
        return "R"
    if tool in MUTATION_TOOLS:
        return "M"
    if tool == "Bash":
        return "X"
    if tool in PLANNING_TOOLS:
        return "P"
    return "O"


def fingerprint(t: Trajectory) -> dict[str, Any]:
    """§7: tool_flow, mutation_depth, research_ratio, verification, recovery_score, scope_coherence,
    signature, plus modified_files (at most 10), research_count, mutation_count, total_events."""
    total = t.total
    if total == 0:
        return _empty()
    stored = t.events[:MAX_STORED_EVENTS]
    research = sum(1 for e in t.events if e.tool in RESEARCH_TOOLS)
    mutations = sum(1 for e in t.events if e.tool in MUTATION_TOOLS)
    modified = list(
        dict.fromkeys(p for e in stored if e.tool in MUTATION_TOOLS and (p := e.params.get("file_path")))
    )
    verified = verification(stored)
    recovery = recovery_score(stored)
    return {
        "tool_flow": tool_flow(stored),
        "mutation_depth": len(modified),
        "research_ratio": round(research / total, 4),
        "verification": verified,
        "recovery_score": round(recovery, 4),
        "scope_coherence": round(scope_coherence(stored), 4),
        "signature": signature(research, len(modified), verified, recovery),
        "modified_files": modified[:MAX_MODIFIED_FILES],
        "research_count": research,
        "mutation_count": mutations,
        "total_events": total,
    }


def _empty() -> dict[str, Any]:
    return {
        "tool_flow": [],
        "mutation_depth": 0,
        "research_ratio": 0.0,
        "verification": None,
        "recovery_score": 0.0,
        "scope_coherence": 0.0,
        "signature": signature(0, 0, None, 0.0),
        "modified_files": [],
        "research_count": 0,
        "mutation_count": 0,
        "total_events": 0,
    }


def signature(research: int, depth: int, verified: bool | None, recovery: float) -> str:
    """`R<research_count>M<mutation_depth>V<Y|N>E<recovery to 1 decimal>`; no mutation reads as N."""
    return f"R{research}M{depth}V{'Y' if verified else 'N'}E{recovery:.1f}"


def tool_flow(events: Sequence[Event]) -> list[str]:
    """Category bigrams of consecutive events, unique, in first-seen order."""
    cats = [category(e.tool) for e in events]
    return list(dict.fromkeys(a + b for a, b in zip(cats, cats[1:], strict=False)))


def verification(events: Sequence[Event]) -> bool | None:
    """None without a mutation; else whether a Bash after the first mutation tests, builds, checks,
    lints or compiles."""
    mutated = False
    verified = False
    for e in events:
        if e.tool in MUTATION_TOOLS:
            mutated = True
        elif mutated and e.tool == "Bash":
            cmd = (e.params.get("command") or "").lower()
            verified = verified or any(word in cmd for word in VERIFY_WORDS)
    return verified if mutated else None


def recovery_score(events: Sequence[Event]) -> float:
    """Failure streaks followed by a non-failed event / all failure streaks (1.0 without failures)."""
    streaks = recovered = 0
    for i, e in enumerate(events):
        if e.failed and (i == 0 or not events[i - 1].failed):
            streaks += 1
        elif not e.failed and i > 0 and events[i - 1].failed:
            recovered += 1
    return recovered / streaks if streaks else 1.0


def scope_coherence(events: Sequence[Event]) -> float:
    """Depth of the common prefix of every file_path (split on "/") over the mean depth; 1.0 with
    fewer than two paths. Paths split literally, so "/a/b" has depth 3 ("", "a", "b")."""
    parts = [p.split("/") for e in events if (p := e.params.get("file_path"))]
    if len(parts) < 2:
        return 1.0
    common = 0
    for column in zip(*parts, strict=False):
        if any(c != column[0] for c in column):
            break
        common += 1
    return common / (sum(len(p) for p in parts) / len(parts))
