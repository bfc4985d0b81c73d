"""What the next human prompt says about the previous turn, and which user lines are human prompts.

Project rule 12(g) of docs/reference/karl.md: correction and redo come from the lower-cased first 300
characters of the next human prompt of the same session; its arrival alone means the session continued.
The pattern sets are the documented defaults; configuration may replace them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

DETECT_CHARS = 300
CORRECTION_PATTERNS = (
    r"^(no|nope|wrong|stop)\b",
    r"\b(not what i (asked|meant|wanted)|that'?s (not|wrong)|i (meant|said)"
    r"|you (just )?(deleted|broke|removed)|undo|revert|don'?t (do|use|change|touch)"
    r"|never|always|why did you|wtf)\b",
    r"\b(still|it'?s|is) (not working|broken|failing)",
    r"does ?n[o']t work",
)
REDO_PATTERNS = (r"\b(try again|redo|do it again|start over|one more time|again,? but)\b",)

# Claude Code user lines that are not human prompts (docs/reference/karl.md §12(g),
# docs/reference/agent-traces.md §2.2).
NOT_HUMAN_PREFIXES = (
    "<command-",
    "<local-command-",
    "<bash-",
    "<task-notification",
    "Caveat:",
    "[Request interrupted by user",
    "You are now executing",
    "This session is being continued from a previous conversation",
    "Base directory for this skill",
)
# Codex: injected context that arrives as user messages.
CODEX_INJECTED_PREFIXES = ("# AGENTS.md instructions", "<environment_context>", "<user_instructions>")


@dataclass(frozen=True)
class Detector:
    correction: tuple[re.Pattern[str], ...]
    redo: tuple[re.Pattern[str], ...]

    @classmethod
    def from_patterns(
        cls, correction: Sequence[str] = CORRECTION_PATTERNS, redo: Sequence[str] = REDO_PATTERNS
    ) -> Detector:
        return cls(tuple(re.compile(p, re.I) for p in correction), tuple(re.compile(p, re.I) for p in redo))

    def judge(self, next_prompt: str) -> tuple[bool, bool]:
        """(correction_detected, redo_detected) for the previous turn, from the next human prompt."""
        text = (next_prompt or "").strip().lower()[:DETECT_CHARS]
        return any(p.search(text) for p in self.correction), any(p.search(text) for p in self.redo)


DEFAULT_DETECTOR = Detector.from_patterns()


def is_human_text(text: str) -> bool:
    """A Claude Code user text that a person typed (not a command echo, caveat or summary)."""
    stripped = (text or "").lstrip()
    return bool(stripped) and not stripped.startswith(NOT_HUMAN_PREFIXES)


def is_codex_human_text(text: str) -> bool:
    stripped = (text or "").lstrip()
    return bool(stripped) and not stripped.startswith(CODEX_INJECTED_PREFIXES)
