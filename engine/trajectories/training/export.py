"""Advantage-weighted SFT export, OAPL-Lite (docs/reference/karl.md §6, with project rules 12(c) and 12(d)).

Each trajectory becomes one ChatML example: a system prompt, the human's task, and the *plan* (the
tool calls it made, one numbered line each, then the result). Its copies come from the stored
advantage (docs/reference/karl.md §12(c): the z-score of the one pass over the store, in units of sigma).
docs/reference/karl.md §12(d): unique examples are split 90/10 first, then oversampled inside their own side,
so no trajectory is in both train and valid. Hold-out trajectories never reach the export.

Besides `train.jsonl` / `valid.jsonl` ({"messages": [...]}) the export writes `train_pc.jsonl` /
`valid_pc.jsonl` in the prompt/completion form the project's SFT trainer reads.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.trajectories.training.flowrl_sampler import Record, Step

SYSTEM_PROMPT = (
    "You are an expert software engineering assistant. Given a task, plan the best sequence of tool uses:"
    " which tools, in which order, with which parameters. Read before you edit, test after you change,"
    " and use the most specific tool available."
)
MAX_PLAN_STEPS = 20
MAX_TEXT = 4000
MIN_PROMPT = 10
MIN_TOOL_EVENTS = 2
MIN_PLAN_CHARS = 20
MAX_OVERSAMPLE = 3
ADVANTAGE_THRESHOLD = 0.0
TIERS = ((ADVANTAGE_THRESHOLD, 0), (0.1, 1), (0.3, 2))  # A <= bound -> copies; above the last: 3
QUALITY_GRADES = {
    "high": {"high"},
    "medium": {"high", "medium"},
    "medium+": {"high", "medium"},
    "low+": {"high", "medium", "low"},
}
TRAIN_FILE, VALID_FILE = "train.jsonl", "valid.jsonl"
TRAIN_PC_FILE, VALID_PC_FILE = "train_pc.jsonl", "valid_pc.jsonl"


# -- one record as text ----------------------------------------------------------------------------


def short_path(path: str) -> str:
    """`../<last two parts>` for a path of more than 3 `/`-separated parts."""
    parts = path.split("/")
    return "/".join(["..", *parts[-2:]]) if len(parts) > 3 else path


def describe(step: Step) -> str:
    """One plan line's description (§6): the tool and its most telling parameter."""
    tool, params = step.tool, step.params
    if tool in ("Read", "Edit", "Write") and "file_path" in params:
        return f"{tool} {short_path(params['file_path'])}"
    if tool == "Bash" and "command" in params:
        return f"Bash: {params['command'][:80]}"
    if tool in ("Grep", "Glob") and "pattern" in params:
        return f"{tool} '{params['pattern'][:40]}'"
    if tool in ("Task", "Agent") and "description" in params:  # Agent is Task's normalized name
        return f"Task: {params['description'][:60]}"
    shown = ", ".join(f"{k}={str(v)[:30]}" for k, v in list(params.items())[:2])
    return f"{tool}({shown})" if shown else tool


def status(ok: bool | None) -> str:
    return "ok" if ok else ("fail" if ok is False else "?")


def plan_text(record: Record) -> str:
    """The assistant's answer: numbered `[ok]/[fail]/[?]` lines, a blank line, the result."""
    lines = [f"{i}. [{status(e.ok)}] {describe(e)}" for i, e in enumerate(record.events[:MAX_PLAN_STEPS], 1)]
    result = f"Result: {record.successes}/{record.total_tools} tools succeeded"
    if record.reward is not None:
        result += f", reward={record.reward:.2f}"
    return ("\n".join(lines) + "\n\n" + result)[:MAX_TEXT]


def user_text(record: Record) -> str:
    """The human's task; `[Task in <cwd>]` when it is missing or too short to say anything."""
    prompt = record.prompt or ""
    if len(prompt) < MIN_PROMPT:
        prompt = f"[Task in {record.cwd or 'unknown project'}]"
    return prompt[:MAX_TEXT]


def messages(record: Record, plan: str | None = None) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_text(record)},
        {"role": "assistant", "content": plan_text(record) if plan is None else plan},
    ]


def prompt_messages(record: Record) -> list[dict[str, str]]:
    """What a model is given to plan: the system and user turns of the export."""
    return messages(record, plan="")[:2]


def copies_for(advantage: float | None) -> int:
    """Copies by the stored advantage: A <= 0 -> 0; <= 0.1 -> 1; <= 0.3 -> 2; above -> 3."""
    a = 0.0 if advantage is None else advantage
    for bound, copies in TIERS:
        if a <= bound:
            return copies
    return MAX_OVERSAMPLE


def example_key(user: str, plan: str) -> str:
    return hashlib.sha256((user + plan).encode("utf-8")).hexdigest()[:16]


# -- the pipeline ---------------------------------------------------------------------------------


@dataclass
class Example:
    """One unique example (a trajectory) and how often it is repeated in its side."""

    record_id: int
    uid: str
    key: str
    copies: int
    messages: list[dict[str, str]]

    def chat(self) -> dict[str, Any]:
        return {"messages": self.messages}

    def prompt_completion(self) -> dict[str, Any]:
        return {"prompt": self.messages[:2], "completion": self.messages[2:]}


@dataclass
class ExportResult:
    records: int = 0  # records given (hold-out ones included, if any were passed)
    holdout_excluded: int = 0
    eligible: int = 0  # passed the reward and quality filters and have >= 2 events
    unique: int = 0  # examples after the plan-length check and dedup (copies > 0)
    train_unique: int = 0
    valid_unique: int = 0
    train_examples: int = 0  # after oversampling
    valid_examples: int = 0
    tiers: dict[int, int] = field(default_factory=lambda: dict.fromkeys(range(MAX_OVERSAMPLE + 1), 0))
    dropped: dict[str, int] = field(default_factory=dict)
    out_dir: Path | None = None
    files: dict[str, Path] = field(default_factory=dict)
    train: list[Example] = field(default_factory=list)
    valid: list[Example] = field(default_factory=list)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def passes_quality(record: Record, quality: str | None) -> bool:
    if quality is None:
        return True
    grades = QUALITY_GRADES.get(quality)
    if grades is None:
        raise ValueError(f"unknown quality filter {quality!r}: use one of {', '.join(QUALITY_GRADES)}")
    return (record.grade or "medium") in grades  # a missing grade counts as medium


def unique_examples(
    records: Sequence[Record], *, min_reward: float = 0.0, quality: str | None = None
) -> tuple[list[Example], ExportResult]:
    """Steps 1-5 of §6: filter, tier by the stored advantage, build the plan, dedup."""
    result = ExportResult(records=len(records))
    seen: set[str] = set()
    out: list[Example] = []
    for record in records:
        if record.holdout:
            result.holdout_excluded += 1
            continue
        if (record.reward if record.reward is not None else 0.0) < min_reward:
            result.drop("below_min_reward")
            continue
        if not passes_quality(record, quality):
            result.drop("quality")
            continue
        if len(record.events) < MIN_TOOL_EVENTS:
            result.drop("too_few_events")
            continue
        result.eligible += 1
        copies = copies_for(record.advantage)
        result.tiers[copies] += 1
        if copies == 0:
            result.drop("advantage_not_positive")
            continue
        chat = messages(record)
        user, plan = chat[1]["content"], chat[2]["content"]
        if len(plan) < MIN_PLAN_CHARS:
            result.drop("short_plan")
            continue
        key = example_key(user, plan)
        if key in seen:
            result.drop("duplicate")
            continue
        seen.add(key)
        out.append(Example(record.id, record.uid, key, copies, chat))
    result.unique = len(out)
    return out, result


def split_examples(
    examples: Sequence[Example], *, seed: int = 42, valid_share: float = 0.1
) -> tuple[list[Example], list[Example]]:
    """docs/reference/karl.md §12(d): each unique example goes to exactly one side
    (shuffled with the seed)."""
    order = list(examples)
    random.Random(seed).shuffle(order)
    # As published: train = max(1, floor(0.9 n)); the epsilon keeps 0.9 * 70 from flooring to 62.
    n_train = max(1, math.floor(len(order) * (1.0 - valid_share) + 1e-9)) if order else 0
    return order[:n_train], order[n_train:]


def oversample(examples: Iterable[Example], seed: int) -> list[Example]:
    """Each example repeated by its copy count, shuffled so repeats are not adjacent."""
    out = [e for e in examples for _ in range(e.copies)]
    random.Random(seed).shuffle(out)
    return out


def build_export(
    records: Sequence[Record],
    *,
    min_reward: float = 0.0,
    quality: str | None = None,
    seed: int = 42,
    valid_share: float = 0.1,
) -> ExportResult:
    """The whole export in memory: split the unique examples, then oversample inside each side."""
    examples, result = unique_examples(records, min_reward=min_reward, quality=quality)
    train, valid = split_examples(examples, seed=seed, valid_share=valid_share)
    result.train, result.valid = oversample(train, seed), oversample(valid, seed + 1)
    result.train_unique, result.valid_unique = len(train), len(valid)
    result.train_examples, result.valid_examples = len(result.train), len(result.valid)
    return result


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path


def write_examples(out_dir: Path, train: Sequence[Example], valid: Sequence[Example]) -> dict[str, Path]:
    """ChatML and prompt/completion files for both sides."""
    out_dir = Path(out_dir)
    return {
        "train": write_jsonl(out_dir / TRAIN_FILE, (e.chat() for e in train)),
        "valid": write_jsonl(out_dir / VALID_FILE, (e.chat() for e in valid)),
        "train_pc": write_jsonl(out_dir / TRAIN_PC_FILE, (e.prompt_completion() for e in train)),
        "valid_pc": write_jsonl(out_dir / VALID_PC_FILE, (e.prompt_completion() for e in valid)),
    }


def export_sft(
    records: Sequence[Record],
    out_dir: Path,
    *,
    min_reward: float = 0.0,
    quality: str | None = None,
    seed: int = 42,
    valid_share: float = 0.1,
) -> ExportResult:
    """Write train/valid (ChatML) and train_pc/valid_pc (prompt/completion) JSONL into out_dir."""
    result = build_export(records, min_reward=min_reward, quality=quality, seed=seed, valid_share=valid_share)
    result.out_dir = Path(out_dir)
    result.files = write_examples(result.out_dir, result.train, result.valid)
    return result


def format_export(result: ExportResult) -> str:
    tiers = ", ".join(f"{copies}x: {n}" for copies, n in sorted(result.tiers.items()))
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(result.dropped.items())) or "none"
    lines = [
        f"records {result.records} (hold-out excluded {result.holdout_excluded}), eligible {result.eligible},"
        f" unique examples {result.unique}",
        f"copies by advantage tier: {tiers}",
        f"train {result.train_examples} examples ({result.train_unique} trajectories),"
        f" valid {result.valid_examples} examples ({result.valid_unique} trajectories)",
        f"dropped: {dropped}",
    ]
    lines += [f"wrote {path}" for path in result.files.values()]
    return "\n".join(lines)
