"""Tools Claude may call to look into the store beyond the digest, and their execution.

Each tool reads through a read-only `StoreReader` and answers with compact JSON (redacted,
bounded in size). Trajectory and agent-event tools are offered only when those tables have rows,
and the rollout tools only when the run stored rollouts (engine/store/rollouts.py).
"""

from __future__ import annotations

import fnmatch
import json
import math
from typing import Any

import numpy as np

from engine.redact import redact, redact_value
from engine.store.reader import StoreReader

from .digest import sample_brief

MAX_RESULT_CHARS = 12_000
MAX_FOUND_KEYS = 12  # series find_metrics returns at once (it lists every matching key)
MAX_STEP_ROLLOUTS = 4096  # rollouts of one step read to rank them (a veRL dump can hold thousands)
MAX_TOKENS = 600  # tokens get_rollout_tokens returns of one rollout
FORK_SHARE = (
    0.2  # the top fifth of a completion's tokens by entropy: its "forks" (docs/reference/frameworks.md §4)
)
MAX_FORKS = 12

_STEP = {"type": "integer", "minimum": 0}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_metric_keys",
        "description": (
            "Every metric key this run has logged (TRL's keys, rewards/<name>/mean, phi/*, cascade/*)."
        ),
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "name": "get_metric",
        "description": (
            "Values of one metric key between two steps, as [step, value] points (raw when few enough, else "
            "bucket [first_step, last_step, mean, min, max]). Use it to check a number before you state it."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "a metric key, e.g. rewards/task/mean or phi/mean"},
                "start_step": {**_STEP, "description": "first step (default 0)"},
                "end_step": {**_STEP, "description": "last step (default: the newest)"},
                "max_points": {"type": "integer", "minimum": 2, "maximum": 500, "description": "default 100"},
            },
            "required": ["key"],
        },
    },
    {
        "name": "get_samples",
        "description": (
            "The completions kept at the step nearest to `step` (best, worst, median, random): prompt, "
            "completion, each reward, mean and min Phi. Each has an id for get_sample_tokens."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"step": _STEP, "limit": {"type": "integer", "minimum": 1, "maximum": 8}},
            "required": ["step"],
        },
    },
    {
        "name": "get_sample_tokens",
        "description": (
            "Per-token Phi, entropy (nats) and text of one sample, to see where the model hesitates."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"sample_id": {"type": "integer"}},
            "required": ["sample_id"],
        },
    },
    {
        "name": "get_gate_history",
        "description": "The cascade gate's state per step (threshold, steps above it, multiplier, reason).",
        "input_schema": {
            "type": "object",
            "properties": {"start_step": _STEP, "end_step": _STEP},
        },
    },
    {
        "name": "get_events",
        "description": (
            "Chart events (gate opened, crystallization, checkpoints, resumes, evals) and commands."
        ),
        "input_schema": {"type": "object", "properties": {}},
    },
]
FIND_METRICS_TOOL = {
    "name": "find_metrics",
    "description": (
        "Every metric key matching a glob (clip_ratio/*, rewards/*/mean, entropy/p*) or, without * ? [, a "
        "substring (kl), with the series of the first 12 between two steps, bounded like get_metric. Covers "
        "the RL health keys: kl (to the reference; absent when beta is 0), clip_ratio/low_mean|high_mean|"
        "region_mean, entropy/p10|p50|p90 (token entropy percentiles, nats), cov/logp_adv (Cov(log π, A) "
        "over the step's completion tokens: positive drives entropy down), "
        "completions/mean_length|clipped_ratio, frac_reward_zero_std."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "pattern": {
                "type": "string",
                "description": "a glob such as clip_ratio/* or a substring such as kl",
            },
            "start_step": {**_STEP, "description": "first step (default 0)"},
            "end_step": {**_STEP, "description": "last step (default: the newest)"},
            "max_points": {
                "type": "integer",
                "minimum": 2,
                "maximum": 200,
                "description": "per key, default 30",
            },
        },
        "required": ["pattern"],
    },
}
ROLLOUT_TOOLS: list[dict[str, Any]] = [
    {
        "name": "get_rollouts",
        "description": (
            "What the policy actually wrote: the stored rollouts of the step nearest `step` (prompt, "
            "completion, each reward, total, advantage, length): the best or the worst by total reward, one "
            "GRPO group side by side (its G completions of one prompt), or all in order. "
            "Each has an id for get_rollout_tokens. "
            "Find the step first (get_metric on reward), then read its worst rollouts to see what went wrong."
        ),
        "input_schema": {
            "type": "object",
            "properties": {
                "step": _STEP,
                "pick": {
                    "type": "string",
                    "enum": ["best", "worst", "group", "all"],
                    "description": "default worst",
                },
                "group_id": {
                    "type": "string",
                    "description": "with pick=group (default: the worst rollout's group)",
                },
                "limit": {"type": "integer", "minimum": 1, "maximum": 16, "description": "default 4"},
            },
            "required": ["step"],
        },
    },
    {
        "name": "get_rollout_tokens",
        "description": (
            "One rollout's tokens, each with the entropy (nats) of the distribution that produced it and its "
            "log-probability, and its forks: the highest-entropy tokens, where the policy hesitated."
        ),
        "input_schema": {
            "type": "object",
            "properties": {"rollout_id": {"type": "integer"}},
            "required": ["rollout_id"],
        },
    },
]
TRAJECTORY_TOOL = {
    "name": "get_trajectories",
    "description": (
        "The newest scored agent trajectories (session, domain, tools, success rate, reward, advantage)."
    ),
    "input_schema": {
        "type": "object",
        "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 50}},
    },
}
AGENT_EVENTS_TOOL = {
    "name": "get_agent_events",
    "description": "The newest manager/worker agent events (task, worker, score).",
    "input_schema": {
        "type": "object",
        "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 50}},
    },
}


def tools_for(reader: StoreReader, run_id: int | None = None) -> list[dict[str, Any]]:
    """The tools worth offering now: the trajectory and agent tools only when there is data, the rollout tools
    only when the run (when given) stored rollouts."""
    tools = [dict(t) for t in TOOLS] + [dict(FIND_METRICS_TOOL)]
    if run_id is not None and reader.rollouts(run_id, limit=1):
        tools += [dict(t) for t in ROLLOUT_TOOLS]
    if reader.table_count("trajectories"):
        tools.append(dict(TRAJECTORY_TOOL))
    if reader.table_count("agent_events"):
        tools.append(dict(AGENT_EVENTS_TOOL))
    return tools


class ToolError(Exception):
    """A tool call that cannot be answered; the message goes back to the model as an error."""


def _num(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        value = float(value)
        return round(value, 6) if math.isfinite(value) else None
    return value


def _int(args: dict[str, Any], name: str, default: int) -> int:
    value = args.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ToolError(f"{name} must be an integer, got {value!r}")
    return int(value)


def run_tool(reader: StoreReader, run_id: int, name: str, args: dict[str, Any]) -> str:
    """Execute one tool call; the JSON text to send back. ToolError for bad arguments."""
    if not isinstance(args, dict):
        raise ToolError("the input must be an object")
    handler = _HANDLERS.get(name)
    if handler is None:
        raise ToolError(f"unknown tool {name!r}")
    # Redacted as a structure, before it is encoded (JSON's escapes hide labels from the text checks), then as
    # the text it becomes.
    result = redact_value(handler(reader, run_id, args))
    text = redact(json.dumps(result, ensure_ascii=False, default=_num))
    if len(text) > MAX_RESULT_CHARS:
        text = text[:MAX_RESULT_CHARS] + ' … (truncated: ask for a narrower range)"'
    return text


def _keys(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    return {"keys": reader.metric_keys(run_id)}


def _metric(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    key = args.get("key")
    if not isinstance(key, str) or not key:
        raise ToolError("key is required (see list_metric_keys)")
    keys = reader.metric_keys(run_id)
    if key not in keys:
        close = [k for k in keys if key.split("/")[-1] in k][:8]
        raise ToolError(
            f"no metric {key!r} in this run" + (f"; similar: {', '.join(close)}" if close else "")
        )
    start, end = _span(args)
    max_points = min(500, max(2, _int(args, "max_points", 100)))
    return {"key": key, **_points(reader, run_id, key, start, end, max_points)}


def _span(args: dict[str, Any]) -> tuple[int, int]:
    start = _int(args, "start_step", 0)
    end = _int(args, "end_step", 2**62)
    if end < start:
        raise ToolError(f"end_step {end} is before start_step {start}")
    return start, end


def _points(
    reader: StoreReader, run_id: int, key: str, start: int, end: int, max_points: int
) -> dict[str, Any]:
    """A key's values from `start` to `end`: raw [step, value] points when few enough, else buckets."""
    s = reader.metric_range(run_id, key, start, end, max_points=max_points)
    if s.level == 1:
        return {"points": [[int(a), _num(b)] for a, b in zip(s.first, s.mean, strict=True)], "raw": True}
    buckets = [
        [int(a), int(b), _num(m), _num(lo), _num(hi)]
        for a, b, m, lo, hi in zip(s.first, s.last, s.mean, s.vmin, s.vmax, strict=True)
    ]
    return {"buckets": buckets, "bucket_steps": s.level, "columns": ["first", "last", "mean", "min", "max"]}


def key_matches(key: str, pattern: str) -> bool:
    """A glob when the pattern has * ? or [ (matched whole), else a substring; both case-insensitive."""
    key, pattern = key.casefold(), pattern.casefold()
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(key, pattern)
    return pattern in key


def _find_metrics(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern.strip() or len(pattern) > 200:
        raise ToolError("pattern is required: a glob such as clip_ratio/* or a substring such as kl")
    keys = reader.metric_keys(run_id)
    matched = [k for k in keys if key_matches(k, pattern.strip())]
    if not matched:
        raise ToolError(f"no metric key matches {pattern!r}; this run's keys: {', '.join(keys[:60])}")
    start, end = _span(args)
    max_points = min(200, max(2, _int(args, "max_points", 30)))
    shown = matched[:MAX_FOUND_KEYS]
    out: dict[str, Any] = {
        "pattern": pattern,
        "keys": matched[:200],
        "series": {k: _points(reader, run_id, k, start, end, max_points) for k in shown},
    }
    if len(matched) > len(shown):
        out["note"] = (
            f"{len(matched)} keys match; series for the first {len(shown)}: narrow the pattern for others"
        )
    return out


def _samples(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    step = _int(args, "step", 0)
    limit = min(8, max(1, _int(args, "limit", 4)))
    samples = reader.samples_at(run_id, step, limit)
    if not samples:
        return {"samples": [], "note": "this run keeps no samples"}
    return {"step": samples[0]["step"], "samples": [sample_brief(s, cut=False) for s in samples]}


def _tokens(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    sample = reader.sample(_int(args, "sample_id", -1))
    if sample is None or sample["run_id"] != run_id:
        raise ToolError(f"no sample {args.get('sample_id')!r} in this run (ids come from get_samples)")
    tokens = sample["tokens"] or []
    phi = sample["phi"] or [None] * len(tokens)
    entropy = sample["entropy"] or [None] * len(tokens)
    rows = [[t, _num(p), _num(h)] for t, p, h in zip(tokens, phi, entropy, strict=False)]
    return {
        "id": sample["id"],
        "step": sample["step"],
        "columns": ["token", "phi", "entropy"],
        "tokens": rows,
    }


def _rollout_brief(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout without its per-token arrays (get_rollout_tokens has them); long text cut."""
    entropy = [h for h in row.get("entropy") or [] if h is not None and math.isfinite(h)]
    prompt, completion = row.get("prompt") or "", row.get("completion") or ""
    return {
        "id": row["id"],
        "idx": row["idx"],
        "group_id": row["group_id"],
        "rewards": row["rewards"],
        "total": _num(row["total"]),
        "advantage": _num(row["advantage"]),
        "length": row["length"],
        "entropy_mean": _num(float(np.mean(entropy))) if entropy else None,
        "prompt": prompt[-400:],
        "completion": completion[:1500] + (" …" if len(completion) > 1500 else ""),
    }


def _by_total(row: dict[str, Any]) -> float:
    total = row["total"]
    return total if total is not None and math.isfinite(total) else math.nan


def _rollouts(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    step = _int(args, "step", 0)
    pick = args.get("pick") or "worst"
    if pick not in ("best", "worst", "group", "all"):
        raise ToolError(f"pick must be best, worst, group or all, got {pick!r}")
    limit = min(16, max(1, _int(args, "limit", 4)))
    steps = reader.rollout_steps(run_id)
    if not steps:
        return {"rollouts": [], "note": "this run stored no rollouts"}
    nearest = min(steps, key=lambda sc: (abs(sc[0] - step), sc[0]))[0]
    rows = reader.rollouts(run_id, nearest, limit=MAX_STEP_ROLLOUTS)
    scored = [r for r in rows if not math.isnan(_by_total(r))]
    if pick in ("best", "worst"):
        chosen = sorted(scored, key=_by_total, reverse=pick == "best")[:limit]
    elif pick == "group":
        group = args.get("group_id")
        if group is None:
            worst = min(scored, key=_by_total) if scored else rows[0]
            group = worst["group_id"]
        chosen = [r for r in rows if r["group_id"] == str(group)][:16]
        if not chosen:
            raise ToolError(f"no group {group!r} at step {nearest}")
    else:
        chosen = rows[:limit]
    return {
        "step": nearest,
        "rollouts_at_step": len(rows),
        "groups_at_step": len({r["group_id"] for r in rows}),
        "pick": pick,
        "rollouts": [_rollout_brief(r) for r in chosen],
    }


def _rollout_tokens(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    row = reader.rollout(_int(args, "rollout_id", -1))
    if row is None or row["run_id"] != run_id:
        raise ToolError(f"no rollout {args.get('rollout_id')!r} in this run (ids come from get_rollouts)")
    tokens = row["tokens"] or []
    entropy = row["entropy"] or [None] * len(tokens)
    logprob = row["logprob"] or [None] * len(tokens)
    out: dict[str, Any] = {"id": row["id"], "step": row["step"], "idx": row["idx"], "length": len(tokens)}
    if not tokens or row["entropy"] is None:
        out["note"] = "this source stored no per-token values for it (our own runs do; most logs do not)"
    out["columns"] = ["token", "entropy", "logprob"]
    out["tokens"] = [[t, _num(h), _num(lp)] for t, h, lp in zip(tokens, entropy, logprob, strict=False)][
        :MAX_TOKENS
    ]
    if len(tokens) > MAX_TOKENS:
        out["truncated"] = f"first {MAX_TOKENS} of {len(tokens)} tokens"
    known = [(i, h) for i, h in enumerate(entropy) if h is not None and math.isfinite(h)]
    if known:
        values = np.array([h for _, h in known])
        cut = float(np.quantile(values, 1 - FORK_SHARE))
        forks = sorted((p for p in known if p[1] >= cut), key=lambda p: -p[1])[:MAX_FORKS]
        out["entropy_mean"] = _num(float(values.mean()))
        out["forks"] = [[i, tokens[i] if i < len(tokens) else None, _num(h)] for i, h in forks]
        out["fork_columns"] = ["position", "token", "entropy"]
    return out


def _gate(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    rows = reader.gate_history(run_id, _int(args, "start_step", 0), _int(args, "end_step", 2**62))
    if len(rows) > 200:  # keep every change of state, thin the rest
        keep = {0, len(rows) - 1} | {
            i for i in range(1, len(rows)) if rows[i]["state"] != rows[i - 1]["state"]
        }
        stride = max(1, len(rows) // 150)
        rows = [r for i, r in enumerate(rows) if i in keep or i % stride == 0]
    return {"gate": rows}


def _events(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    commands = reader.run_commands(run_id, limit=30)
    return {
        "events": reader.events(run_id)[-100:],
        "commands": [{k: c[k] for k in ("verb", "args", "state", "result", "created_at")} for c in commands],
    }


def _trajectories(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    return {"trajectories": reader.trajectories_after(0, limit=min(50, max(1, _int(args, "limit", 20))))}


def _agent_events(reader: StoreReader, run_id: int, args: dict[str, Any]) -> Any:
    return {"agent_events": reader.agent_events_after(0, limit=min(50, max(1, _int(args, "limit", 20))))}


_HANDLERS = {
    "list_metric_keys": _keys,
    "get_metric": _metric,
    "find_metrics": _find_metrics,
    "get_rollouts": _rollouts,
    "get_rollout_tokens": _rollout_tokens,
    "get_samples": _samples,
    "get_sample_tokens": _tokens,
    "get_gate_history": _gate,
    "get_events": _events,
    "get_trajectories": _trajectories,
    "get_agent_events": _agent_events,
}
