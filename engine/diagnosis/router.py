"""Which topics a question asks about, for the offline analyst.

Each topic has phrases (regular expressions, matched case-insensitively at the start of a word, so
"gate" finds "gated" but not "aggregate"). The longest phrase wins where phrases overlap: "coherence
rewards" is the gate, not Φ and the rewards. Weak phrases ("open", "flat", "stuck") count only when
no other phrase matched: "why did the gate open?" is the gate, "when did it open?" too. A question
that names several topics gets each, in the order it names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WORD_START = r"(?<![a-z0-9_])"


@dataclass(frozen=True)
class Topic:
    name: str
    title: str  # how the list of topics names it
    phrases: tuple[str, ...]
    weak: tuple[str, ...] = ()


TOPICS = (
    Topic(
        "gate",
        "the cascade gate (did it open, when, why)",
        (
            r"gat(?:e|es|ed|ing)\b",
            r"cascade",
            r"coherence (?:rewards?|weights?)",
            r"kick(?:s|ed)? in",
            r"ramp(?:s|ed|ing)?\b",
            r"threshold",
        ),
        weak=(r"open", r"clos(?:e|ed|es|ing)\b"),
    ),
    Topic(
        "phi",
        "Φ (coherence, its band and phase)",
        (r"phi\b", r"φ", r"coheren", r"certain", r"trap\b", r"crystalli", r"order parameter", r"melting"),
    ),
    Topic(
        "entropy", "entropy (nats, collapse)", (r"entrop", r"nats?\b", r"collaps", r"explor", r"diversity")
    ),
    Topic(
        "rewards",
        "the rewards (each reward's level and trend, hacking, plateaus)",
        (
            r"rewards?\b",
            r"rewarded\b",
            r"task score",
            r"hack",
            r"cheat",
            r"gaming\b",
            r"format",
            r"plateau",
            r"variance",
            r"zero[- ]std",
            r"advantage",
            r"no gradient",
            r"concise",
            r"partial credit",
        ),
        weak=(r"flat\b", r"stuck\b", r"not (?:learn|improv)", r"improv", r"learn(?:s|ing|ed)?\b"),
    ),
    Topic(
        "eval",
        "the held-out eval",
        (r"eval", r"held[- ]out", r"hold[- ]?out", r"solved?\b", r"generali[sz]", r"test set", r"unseen"),
    ),
    Topic(
        "loss",
        "the loss (NaN, divergence)",
        (
            r"loss(?:es)?\b",
            r"nan\b",
            r"diverg",
            r"inf\b",
            r"infinite",
            r"grad(?:ient)?s?(?: norm)?\b",
            r"explod",
            r"learning rate",
            r"lr\b",
        ),
    ),
    Topic(
        "kl",
        "the KL to the reference (too high, a blow-up)",
        (
            r"kl\b",
            r"kl[- ]?divergence",
            r"kullback",
            r"reference model",
            r"drift(?:s|ed|ing)? (?:away )?from (?:the )?(?:base|reference|start)",
            r"beta\b",
        ),
    ),
    Topic(
        "clip",
        "the clip fractions (the PPO ratio held by the clip)",
        (
            r"clip(?:_| )?(?:ratio|fraction|frac|rate)s?\b",
            r"clip(?:s|ping)?\b",
            r"trust region",
            r"(?:importance|ppo|policy) ratio",
            r"epsilon\b",
        ),
    ),
    Topic(
        "covariance",
        "Cov(log π, A), what drives the entropy",
        (
            r"covarian",
            r"cov\b",
            r"logp",
            r"log[- ]prob",
            r"entropy mechanism",
            r"what drives (?:the )?entropy",
        ),
    ),
    Topic(
        "length",
        "completion length (mean, cut at the maximum)",
        (
            r"lengths?\b",
            r"truncat",
            r"clipped\b",
            r"cut off",
            r"verbos",
            r"longer\b",
            r"shorter\b",
            r"too (?:long|short)",
            r"how long are",
        ),
    ),
    Topic(
        "status",
        "the run's status and overall health",
        (
            r"status",
            r"how(?:'s| is) (?:it|the run|training|this run) (?:going|doing)",
            r"going on",
            r"overall",
            r"summar",
            r"overview",
            r"what(?:'s| is) wrong",
            r"anything wrong",
            r"problems?\b",
            r"health",
            r"diagnos",
            r"stall",
            r"crash",
            r"traceback",
            r"exception",
            r"out of memory",
            r"\boom\b",
            r"nccl",
            r"console",
            r"hang(?:s|ing)?\b",
            r"dead\b",
            r"fail",
            r"error",
            r"stopped",
            r"finished",
            r"how (?:long|far)",
            r"eta\b",
        ),
    ),
    Topic(
        "trajectories",
        "trajectories (counts only)",
        (r"trajector", r"karl\b", r"claude code", r"transcripts?\b", r"sessions?\b"),
    ),
    Topic(
        "agents",
        "agents (counts only)",
        (
            r"agent",
            r"workers?\b",
            r"manager",
            r"plane\b",
            r"alarms?\b",
            r"nats[- ](?:server|bus|cluster)",
            r"(?:over|via|on) nats\b",
        ),
    ),
)
_STRONG = [(t.name, re.compile(WORD_START + p)) for t in TOPICS for p in t.phrases]
_WEAK = [(t.name, re.compile(WORD_START + p)) for t in TOPICS for p in t.weak]


def route(question: str) -> list[str]:
    """The names of the topics `question` asks about, in the order it names them; [] for none."""
    text = question.casefold()
    return _claim(text, _STRONG) or _claim(text, _WEAK)


def _claim(text: str, patterns: list[tuple[str, re.Pattern[str]]]) -> list[str]:
    """The topics of the phrases found, longest first, a phrase inside a longer one not counted."""
    found = sorted(
        ((m.end() - m.start(), m.start(), m.end(), name) for name, p in patterns for m in p.finditer(text)),
        key=lambda hit: (-hit[0], hit[1]),
    )
    taken: list[tuple[int, int, str]] = []
    for _, start, end, name in found:
        if all(end <= a or start >= b for a, b, _ in taken):
            taken.append((start, end, name))
    first: dict[str, int] = {}
    for start, _, name in sorted(taken):
        first.setdefault(name, start)
    return list(first)
