"""prime-rl's rollouts: `<run dir>/rollouts/step_N/train/effective/traces.jsonl`.

prime-rl's FileMonitor (src/prime_rl/monitors/file.py, `log_episodes`) appends one verifiers episode a line
(`Episode.to_record()`, verifiers/v1/episode.py) to
`rollouts/step_N/{train,eval}/{all,effective}/traces.jsonl`. `train/effective` holds the episodes step N
trained on, written when the batch ships; `all` holds every episode that arrived (failures and unused ones
too) and `eval` the evaluations, so those are left out here. An episode carries its rollout group (`group.id`)
and one trace per agent (verifiers/v1/trace.py): the message graph (`nodes`, each with `message`, `sampled`,
`mask`, and for sampled tokens `logprobs` and `advantages`), named weighted rewards (`rewards: {name: {score,
weight}}`) and `metrics`. Each trace is one sample: the messages before its first sampled one are the prompt,
the rest the completion; its reward is Σ score·weight, its advantage the mean of its sampled tokens'
advantages (GRPO gives them all the same), and the sampled tokens' log-probabilities are kept per token.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from engine.limits import int_text
from engine.store import Store

from ..reader_base import Budget, IngestResult
from . import dumps
from .rollout_base import chat_text, finite

STEP = re.compile(r"step_(\d+)$")
TRACES = Path("train") / "effective" / "traces.jsonl"


def rollouts_dir(root: Path) -> Path:
    """The `rollouts/` folder of a run dir, or the folder itself."""
    return root / "rollouts" if (root / "rollouts").is_dir() else root


def files(root: Path, since: int) -> tuple[Path, list[tuple[int, str]]]:
    if root.is_file():
        step = next((int_text(m[1]) for m in map(STEP.fullmatch, (p.name for p in root.parents)) if m), 0)
        return root.parent, [(step or 0, root.name)]
    folder = rollouts_dir(root)
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:
        names = []
    found = []
    for match in filter(None, map(STEP.fullmatch, names)):
        step = int_text(match[1])  # None past 2**63: no step a store can keep
        if (
            step is not None and step >= since and (folder / match[0] / TRACES).is_file()
        ):  # stat steps to come
            found.append((step, str(Path(match[0]) / TRACES)))
    return folder, sorted(found)


def samples(record: Any, step: int) -> list[dict[str, Any]]:
    if not isinstance(record, dict) or not isinstance(record.get("traces"), list):
        raise dumps.BadRecord("not a verifiers episode (no traces list)")
    group = record.get("group")
    env = record.get("env")
    return [
        _sample(trace, step, group.get("id") if isinstance(group, dict) else record.get("id"), env, record)
        for trace in record["traces"]
        if isinstance(trace, dict)
    ]


def _sample(
    trace: dict[str, Any], step: int, group: Any, env: Any, episode: dict[str, Any]
) -> dict[str, Any]:
    nodes = [n for n in trace.get("nodes") or [] if isinstance(n, dict)]
    first = next((i for i, n in enumerate(nodes) if n.get("sampled") or any(n.get("mask") or [])), len(nodes))
    logprobs: list[float] = []
    advantages: list[float] = []
    for node in nodes[first:]:
        logprobs += [float(v) for v in node.get("logprobs") or [] if finite(v) is not None]
        advantages += [float(v) for v in node.get("advantages") or [] if finite(v) is not None]
    rewards: dict[str, Any] = {}
    total = 0.0
    for name, reward in (trace.get("rewards") or {}).items():
        score = finite(reward.get("score")) if isinstance(reward, dict) else None
        rewards[name] = score
        if score is not None:
            weight = finite(reward.get("weight", 1.0))
            total += score * (1.0 if weight is None else weight)
    agent = trace.get("agent")
    return {
        "step": step,
        "group_id": "" if group is None else str(group),
        "prompt": chat_text([n["message"] for n in nodes[:first] if isinstance(n.get("message"), dict)]),
        "completion": chat_text([n["message"] for n in nodes[first:] if isinstance(n.get("message"), dict)]),
        "rewards": rewards,
        "total": total if rewards and math.isfinite(total) else None,
        "advantage": sum(advantages) / len(advantages) if advantages else None,
        "length": len(logprobs) or None,
        "logprob": logprobs or None,
        "extra": {
            "episode": episode.get("id"),
            "trace": trace.get("id"),
            "env": env.get("id") if isinstance(env, dict) else None,
            "agent": agent.get("name") if isinstance(agent, dict) else None,
            "ok": trace.get("ok"),
            "stop_condition": trace.get("stop_condition"),
            "metrics": trace.get("metrics") or None,
        },
    }


def run_name(root: Path) -> str:
    """The run dir's name (the folder holding `rollouts/`)."""
    for folder in (root, *root.parents):
        if folder.name == "rollouts":
            return folder.parent.name
    return root.name


FORMAT = dumps.DumpFormat("rollouts-prime", files, samples, run_name)


def ingest(store: Store, source: dict[str, Any], budget: Budget) -> IngestResult:
    return dumps.ingest(FORMAT, store, source, budget)
