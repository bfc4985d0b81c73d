"""Does the adapter plan like the best trajectories? Measured on the hold-out, which no run trained on.

Beyond the paper (which compared training losses): each model is given the export's system and user
turns of a well-scored hold-out trajectory, greedily writes a plan, and the plan is parsed back
into tool calls and compared with what the agent actually did (its first 20 tools, what a plan
shows): sequence similarity (difflib ratio over tool names), tool-set Jaccard, first-tool accuracy,
and the reward the plan itself would earn under the five-signal scorer (each step taken as a
success, with the actual turn's timing and cross-turn signals, so only the plan's process differs).
Every model is scored on the same trajectories, so the differences are paired; their 95% intervals
come from a seeded bootstrap.
"""

from __future__ import annotations

import difflib
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engine import paths
from engine.errors import CarlError
from engine.store import Store
from engine.trajectories.scoring.signals import score
from engine.trajectories.training.export import MAX_PLAN_STEPS, MIN_TOOL_EVENTS, plan_text, prompt_messages
from engine.trajectories.training.flowrl_sampler import Record, load_records
from engine.trajectories.trajectory import Event, Trajectory

METRICS = ("similarity", "jaccard", "first_tool", "plan_reward")
MIN_HIGH = 5  # fewer hold-out trajectories with A > 0 than this: take the top half by reward
MAX_NEW_TOKENS = 160
BOOTSTRAP = 2000
GENERATE_BATCH = 8

_LINE = re.compile(r"^\s*\d+\s*[.)]\s*(?:\[(ok|fail|\?)\]\s*)?(.*?)\s*$")
_FILE = re.compile(r"^(Read|Edit|Write)\s+(\S.*)$")
_PATTERN = re.compile(r"^(Grep|Glob)\s+'(.*?)'?$")
_CALL = re.compile(r"^([A-Za-z_][\w.-]*)\((.*?)\)?$")
_NAME = re.compile(r"^([A-Za-z_][\w.-]*)")
_KV = re.compile(r"(?:^|,\s*)([A-Za-z_]\w*)=")


# -- plans back into tool calls -------------------------------------------------------------------


@dataclass(frozen=True)
class PlanStep:
    tool: str
    params: dict[str, str] = field(default_factory=dict)


def _call_params(inner: str) -> dict[str, str]:
    """`k=v, k2=v2` of a generic plan line (a value may itself hold commas)."""
    marks = list(_KV.finditer(inner))
    out = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(inner)
        out[m.group(1)] = inner[m.end() : end]
    return out


def parse_step(desc: str) -> PlanStep | None:
    """One plan line's description back into a tool and its key parameter (the inverse of `describe`)."""
    if m := _FILE.match(desc):
        return PlanStep(m.group(1), {"file_path": m.group(2)})
    if desc.startswith("Bash:"):
        return PlanStep("Bash", {"command": desc[5:].strip()})
    if m := _PATTERN.match(desc):
        return PlanStep(m.group(1), {"pattern": m.group(2)})
    if desc.startswith("Task:"):
        return PlanStep("Agent", {"description": desc[5:].strip()})  # Agent: Task's normalized name
    if m := _CALL.match(desc):
        return PlanStep(m.group(1), _call_params(m.group(2)))
    if m := _NAME.match(desc):
        return PlanStep(m.group(1))
    return None


def parse_plan(text: str, max_steps: int = 2 * MAX_PLAN_STEPS) -> list[PlanStep]:
    """The numbered lines of a plan, up to its `Result:` line; lines that say nothing are skipped."""
    steps = []
    for line in text.splitlines():
        m = _LINE.match(line)
        desc = m.group(2) if m else line.strip()
        if desc.startswith("Result:"):  # also a numbered one: a model may number its result line
            break
        step = parse_step(desc) if m else None
        if step is not None:
            steps.append(step)
        if len(steps) >= max_steps:
            break
    return steps


# -- per-example metrics ----------------------------------------------------------------------------


def similarity(predicted: Sequence[str], actual: Sequence[str]) -> float:
    if not predicted and not actual:
        return 1.0
    return difflib.SequenceMatcher(None, list(predicted), list(actual), autojunk=False).ratio()


def jaccard(predicted: Sequence[str], actual: Sequence[str]) -> float:
    a, b = set(predicted), set(actual)
    return len(a & b) / len(a | b) if a | b else 1.0


def plan_trajectory(record: Record, steps: Sequence[PlanStep]) -> Trajectory:
    """The predicted plan as a trajectory: every step a success, the actual turn's timing and signals."""
    o = record.outcome
    return Trajectory(
        uid=f"plan:{record.uid}",
        session_id="plan-eval",
        agent="plan",
        source="plan-eval",
        prompt=record.prompt,
        cwd=record.cwd,
        started_at=record.started_at,
        ended_at=record.ended_at,
        domain=record.domain,
        events=[Event(s.tool, success=True, params=dict(s.params)) for s in steps],
        correction=o.get("correction_detected"),
        redo=o.get("redo_detected"),
        build_success=o.get("build_success"),
        session_continued=o.get("session_continued"),
    )


def example_metrics(record: Record, plan: str) -> dict[str, Any]:
    steps = parse_plan(plan)
    predicted = [s.tool for s in steps]
    actual = record.tools[:MAX_PLAN_STEPS]
    return {
        "similarity": similarity(predicted, actual),
        "jaccard": jaccard(predicted, actual),
        "first_tool": float(bool(predicted) and predicted[0] == actual[0]),
        "plan_reward": score(plan_trajectory(record, steps)).reward,
        "steps": len(predicted),
        "predicted": predicted,
    }


# -- the evaluation set ----------------------------------------------------------------------------


def eval_records(records: Sequence[Record], limit: int | None = None) -> tuple[list[Record], str]:
    """Hold-out trajectories that scored well: A > 0, or the top half by reward when too few have it."""
    held = [r for r in records if r.holdout and len(r.events) >= MIN_TOOL_EVENTS]
    chosen = [r for r in held if (r.advantage or 0.0) > 0]
    selection = "hold-out, advantage > 0"
    if len(chosen) < MIN_HIGH:
        by_reward = sorted(held, key=lambda r: (-(r.reward or 0.0), r.id))
        chosen = by_reward[: math.ceil(len(by_reward) / 2)]
        selection = "hold-out, top half by reward"
    chosen.sort(key=lambda r: (-(r.advantage or 0.0), r.id))
    return chosen[:limit] if limit else chosen, selection


# -- models ----------------------------------------------------------------------------------------


def _base_path(adapter_dir: Path | None, base_model: str | None, home: Path) -> str:
    from engine.training.artifacts import base_model_of
    from engine.training.config import TINY_MODEL
    from engine.training.data import resolve_model

    if base_model is None and adapter_dir is not None:
        recorded = base_model_of(adapter_dir)  # what peft saved: the resolved directory, or a hub id
        if recorded and Path(recorded).is_dir():
            return recorded
        base_model = recorded
    return resolve_model(base_model or TINY_MODEL, home, 0)


def load_model(adapter_dir: Path | None, *, base: str) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode): the base model, with the LoRA adapter on top when given."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from engine.training.backend import CPU_THREADS
    from engine.training.data import offline_if_local

    offline_if_local(base)
    hf_logging.disable_progress_bar()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(CPU_THREADS)  # as in training: small matrices, threads only synchronise
    model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)  # or peft's model around it
    tokenizer_dir = base
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter_dir))
        if (Path(adapter_dir) / "tokenizer_config.json").is_file():
            tokenizer_dir = str(adapter_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation continues each row's last prompt token
    return tokenizer, model.to(device).eval()


def generate_plans(
    tokenizer: Any, model: Any, records: Sequence[Record], *, max_new_tokens: int
) -> list[str]:
    """Greedy plans for the records' export prompts (system + user turns), in batches."""
    import torch

    texts = [
        tokenizer.apply_chat_template(prompt_messages(r), add_generation_prompt=True, tokenize=False)
        for r in records
    ]
    out: list[str] = []
    for i in range(0, len(texts), GENERATE_BATCH):
        batch = tokenizer(
            texts[i : i + GENERATE_BATCH], return_tensors="pt", padding=True, add_special_tokens=False
        ).to(model.device)
        with torch.no_grad():
            ids = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        width = batch["input_ids"].shape[1]
        out += tokenizer.batch_decode(ids[:, width:], skip_special_tokens=True)
    return out


# -- the result ------------------------------------------------------------------------------------


@dataclass
class ModelScore:
    name: str
    path: str
    n: int
    means: dict[str, float]
    parsed_share: float  # plans with at least one parsed step
    mean_steps: float


@dataclass
class Diff:
    a: str
    b: str
    metric: str
    mean: float
    lo: float
    hi: float


@dataclass
class PlanEvalResult:
    n: int
    selection: str
    actual_reward: float  # mean stored reward of the evaluated trajectories
    models: dict[str, ModelScore]
    diffs: list[Diff]
    examples: list[dict[str, Any]]
    seconds: float
    per_example: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # model -> metric -> values


def bootstrap_diff(
    a: Sequence[float], b: Sequence[float], *, n_boot: int = BOOTSTRAP, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of the paired differences a - b and its percentile-bootstrap 95% interval."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if len(d) == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def score_plans(
    name: str, path: str, records: Sequence[Record], plans: Sequence[str]
) -> tuple[ModelScore, dict[str, list[float]], list[dict[str, Any]]]:
    rows = [example_metrics(r, p) for r, p in zip(records, plans, strict=True)]
    values = {m: [float(row[m]) for row in rows] for m in METRICS}
    means = {m: float(np.mean(v)) if v else math.nan for m, v in values.items()}
    parsed = float(np.mean([row["steps"] > 0 for row in rows])) if rows else math.nan
    steps = float(np.mean([row["steps"] for row in rows])) if rows else math.nan
    return ModelScore(name, path, len(rows), means, parsed, steps), values, rows


def evaluate_adapter(
    home: Path | None,
    adapter_dir: Path,
    *,
    compare_base: bool = True,
    compare_uniform: Path | None = None,
    limit: int | None = None,
    max_new_tokens: int = MAX_NEW_TOKENS,
    base_model: str | None = None,
    seed: int = 0,
    n_boot: int = BOOTSTRAP,
    progress: Callable[[str], None] | None = None,
) -> PlanEvalResult:
    """Plans of the adapter (and the base model, and a uniform-sample adapter) on the hold-out."""
    started = time.monotonic()
    home = paths.carl_home() if home is None else Path(home)
    with Store(paths.db_path(home)) as store:
        records, selection = eval_records(load_records(store, include_holdout=True), limit)
    if not records:
        raise CarlError("no hold-out trajectories with 2 or more tool calls to evaluate on")
    base = _base_path(Path(adapter_dir), base_model, home)
    candidates: list[tuple[str, Path | None]] = [("adapter", Path(adapter_dir))]
    if compare_uniform is not None:
        candidates.append(("uniform", Path(compare_uniform)))
    if compare_base:
        candidates.append(("base", None))
    models: dict[str, ModelScore] = {}
    per_example: dict[str, dict[str, list[float]]] = {}
    examples: list[dict[str, Any]] = [
        {"uid": r.uid, "prompt": r.prompt[:120], "actual": r.tools[:MAX_PLAN_STEPS]} for r in records
    ]
    for name, path in candidates:
        if progress:
            progress(f"{name}: planning {len(records)} hold-out tasks")
        tokenizer, model = load_model(path, base=base)
        plans = generate_plans(tokenizer, model, records, max_new_tokens=max_new_tokens)
        models[name], per_example[name], rows = score_plans(name, str(path or base), records, plans)
        for example, plan, row in zip(examples, plans, rows, strict=True):
            example[name] = {"plan": plan, "predicted": row["predicted"], "plan_reward": row["plan_reward"]}
    # The actual plans through the same parser and scorer: the ceiling, and a check of the round trip.
    models["actual"], per_example["actual"], _ = score_plans(
        "actual", "(the recorded plans)", records, [plan_text(r) for r in records]
    )
    diffs = [
        Diff(a, b, m, *bootstrap_diff(per_example[a][m], per_example[b][m], n_boot=n_boot, seed=seed))
        for a, b in (("adapter", "base"), ("uniform", "base"), ("adapter", "uniform"))
        if a in per_example and b in per_example
        for m in METRICS
    ]
    actual = float(np.mean([r.reward or 0.0 for r in records]))
    return PlanEvalResult(
        len(records),
        selection,
        actual,
        models,
        diffs,
        examples,
        round(time.monotonic() - started, 2),
        per_example,
    )


def format_report(result: PlanEvalResult) -> str:
    """A table of the models' means, then each paired difference with its 95% interval."""
    head = f"{'model':<9} {'n':>4} " + " ".join(f"{m:>11}" for m in METRICS) + f" {'parsed':>7} {'steps':>6}"
    lines = [
        f"plan eval on {result.n} trajectories ({result.selection}); their recorded reward mean"
        f" {result.actual_reward:.3f}; {result.seconds:.1f}s",
        head,
    ]
    for row in result.models.values():
        cells = " ".join(f"{row.means[m]:>11.3f}" for m in METRICS)
        lines.append(f"{row.name:<9} {row.n:>4} {cells} {row.parsed_share:>7.2f} {row.mean_steps:>6.1f}")
    for diff in result.diffs:
        lines.append(
            f"{diff.a} - {diff.b:<8} {diff.metric:<11} {diff.mean:+.3f}  95% CI [{diff.lo:+.3f}, "
            f"{diff.hi:+.3f}]"
        )
    return "\n".join(lines)
