"""On-policy distillation (OPD) from a hint: the arithmetic, shared by the agents plane's torch trainer and
the MLX backend. Numpy only: each side computes its log-probs with its own framework and hands them here.

As published by OpenClaw-RL (arXiv 2603.10165; docs/reference/agents-plane.md §14): the teacher is the same
policy with the hint placed in its context; the student is trained on its own sampled tokens with the
per-token advantage

    A_opd[t] = clip(log π_teacher(y_t | prompt + hint, y_<t) − log π_student(y_t | prompt, y_<t), −c, c)

and the trainer's loss is w_RL · L_GRPO + w_OPD · L_OPD. Both are the same clipped surrogate with the same
ratio, so the two losses add as one advantage per token: A[t] = A_grpo + w_opd · A_opd[t] (w_RL stays 1:
a batch without hints trains exactly as before). The defaults are OpenClaw-RL's launcher's: w_opd 1.0
(`OPENCLAW_TOPK_W_OPD`) and the gap clipped at 1.0 nats (`OPENCLAW_TOPK_ADV_DIFF_CLIP`). A sample without
a hint gets no OPD term: OPD needs an explicit corrective signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

W_OPD = 1.0  # OpenClaw-RL's default weight of the OPD term (OPENCLAW_TOPK_W_OPD)
CLIP = 1.0  # OpenClaw-RL's clip on the teacher − student log-prob gap, nats (OPENCLAW_TOPK_ADV_DIFF_CLIP)
HINT_MARK = "Hint:"  # how the hint is set after the request in the teacher's context


def hinted_text(prompt: str, hint: str) -> str:
    """The request as the teacher reads it: the student's request, then the hint on a line of its own."""
    return f"{prompt}\n\n{HINT_MARK} {hint.strip()}"


def hinted_messages(messages: Sequence[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """A conversation with the hint added to its last user turn (the teacher's context); the rest as it was.
    A conversation without a user turn gets the hint as a new user turn at its end."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            message["content"] = hinted_text(message["content"], hint)
            return out
    return [*out, {"role": "user", "content": f"{HINT_MARK} {hint.strip()}"}]


def token_advantages(teacher: Any, student: Any, clip: float = CLIP) -> np.ndarray:
    """Per token: clip(teacher − student, −clip, clip), the two log-probs of the same sampled tokens."""
    teacher = np.asarray(teacher, dtype=np.float64)
    student = np.asarray(student, dtype=np.float64)
    if teacher.shape != student.shape:
        raise ValueError(f"teacher log-probs {teacher.shape} and student log-probs {student.shape} differ")
    if not clip > 0:
        raise ValueError(f"the OPD clip must be > 0, got {clip}")
    return np.clip(teacher - student, -clip, clip)


def combined(grpo_advantage: float, opd: np.ndarray | None, tokens: int, w_opd: float = W_OPD) -> np.ndarray:
    """A sample's per-token advantages: its GRPO advantage on every token, plus w_opd times its OPD
    advantages where it has a hint (opd None: exactly the GRPO advantage, as without OPD)."""
    base = np.full(tokens, float(grpo_advantage), dtype=np.float64)
    if opd is None:
        return base
    if len(opd) != tokens:
        raise ValueError(f"{len(opd)} OPD advantages for {tokens} tokens")
    return base + w_opd * np.asarray(opd, dtype=np.float64)


@dataclass(frozen=True)
class Distilled:
    """What OPD measured on one step's hinted samples (for the step's metrics)."""

    samples: int  # hinted samples that got an OPD term
    tokens: int
    advantage_mean: float  # mean OPD advantage (clipped) over their tokens
    kl: float  # mean of student − teacher log-prob over their tokens: KL(student || teacher), sampled
    clipped: float  # share of their tokens whose gap the clip held

    def metrics(self) -> dict[str, float]:
        return {
            "opd/samples": float(self.samples),
            "opd/tokens": float(self.tokens),
            "opd/advantage_mean": self.advantage_mean,
            "opd/kl": self.kl,
            "opd/clip_ratio": self.clipped,
        }


def summary(pairs: Sequence[tuple[np.ndarray, np.ndarray]], clip: float = CLIP) -> Distilled:
    """The step's OPD figures from each hinted sample's (teacher, student) log-probs."""
    if not pairs:
        return Distilled(0, 0, 0.0, 0.0, 0.0)
    gaps = np.concatenate([np.asarray(t, np.float64) - np.asarray(s, np.float64) for t, s in pairs])
    if gaps.size == 0:
        return Distilled(len(pairs), 0, 0.0, 0.0, 0.0)
    return Distilled(
        samples=len(pairs),
        tokens=int(gaps.size),
        advantage_mean=float(np.clip(gaps, -clip, clip).mean()),
        kl=float(-gaps.mean()),
        clipped=float(np.mean(np.abs(gaps) > clip)),
    )
