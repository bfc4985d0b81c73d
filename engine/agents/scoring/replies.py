"""A worker's reply: `<step>..</step>` spans and an `<answer>..</answer>`, read and written."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_TAG = re.compile(r"<(/?)(step|answer)>", re.IGNORECASE)


@dataclass(frozen=True)
class _Tag:
    start: int
    end: int
    closing: bool
    name: str


def _tags(text: str) -> list[_Tag]:
    return [_Tag(m.start(), m.end(), m.group(1) == "/", m.group(2).lower()) for m in _TAG.finditer(text)]


def split_reply(text: str) -> tuple[list[str], str]:
    """The steps and the answer of a reply.

    Steps are the `<step>..</step>` spans, stripped; a step left open runs to the next `<step>` or
    `<answer>`, or to the end. The answer is the `<answer>..</answer>` span (left open: to the end),
    or the whole stripped text when there is none. A reply without step tags takes its steps from
    the non-empty lines before `<answer>` (or of the whole text).
    """
    tags = _tags(text)
    opening_answer = next((t for t in tags if t.name == "answer" and not t.closing), None)
    answer = _answer(text, tags, opening_answer)
    if any(t.name == "step" and not t.closing for t in tags):
        return _tagged_steps(text, tags), answer
    before = text[: opening_answer.start] if opening_answer is not None else text
    return [line.strip() for line in before.splitlines() if line.strip()], answer


def _answer(text: str, tags: list[_Tag], opening: _Tag | None) -> str:
    if opening is None:
        return text.strip()
    close = next((t for t in tags if t.start > opening.start and t.name == "answer" and t.closing), None)
    return text[opening.end : close.start if close is not None else len(text)].strip()


def _tagged_steps(text: str, tags: list[_Tag]) -> list[str]:
    steps = []
    for i, tag in enumerate(tags):
        if tag.name != "step" or tag.closing:
            continue
        # The first later tag that closes this step, opens another step, or opens the answer ends it.
        end = next(
            (t.start for t in tags[i + 1 :] if t.name == "step" or (t.name == "answer" and not t.closing)),
            len(text),
        )
        steps.append(text[tag.end : end].strip())
    return steps


def render_reply(steps: Sequence[str], answer: str) -> str:
    """The canonical text of a reply: one `<step>` line per step, then the `<answer>`."""
    return "\n".join([*(f"<step>{step}</step>" for step in steps), f"<answer>{answer}</answer>"])
