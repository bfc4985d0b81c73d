"""Tools Claude may call to look into the store beyond the digest, and their execution.

Each tool reads through a read-only `StoreReader` and answers with compact JSON (redacted,
bounded in size). Trajectory and agent-event tools are offered only when those tables have rows.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from engine.llm.redact import redact
from engine.store.reader import StoreReader

from .digest import sample_brief

MAX_RESULT_CHARS = 12_000

_STEP = {"type": "integer", "minimum": 0}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "list_metric_keys",
        "description": "Every metric key this run has logged (TRL's keys, rewards/<name>/mean, phi/*, cascade/*).",
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
        "description": "Per-token Phi, entropy (nats) and text of one sample, to see where the model hesitates.",
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
        "description": "Chart events (gate opened, crystallization, checkpoints, resumes, evals) and commands.",
        "input_schema": {"type": "object", "properties": {}},
    },
]
TRAJECTORY_TOOL = {
    "name": "get_trajectories",
    "description": "The newest scored agent trajectories (session, domain, tools, success rate, reward, advantage).",
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


def tools_for(reader: StoreReader) -> list[dict[str, Any]]:
    """The tools worth offering now: the trajectory and agent tools only when there is data."""
    tools = [dict(t) for t in TOOLS]
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
    result = handler(reader, run_id, args)
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
    start = _int(args, "start_step", 0)
    end = _int(args, "end_step", 2**62)
    if end < start:
        raise ToolError(f"end_step {end} is before start_step {start}")
    max_points = min(500, max(2, _int(args, "max_points", 100)))
    s = reader.metric_range(run_id, key, start, end, max_points=max_points)
    if s.level == 1:
        points = [[int(a), _num(b)] for a, b in zip(s.first, s.mean, strict=True)]
        return {"key": key, "points": points, "raw": True}
    buckets = [
        [int(a), int(b), _num(m), _num(lo), _num(hi)]
        for a, b, m, lo, hi in zip(s.first, s.last, s.mean, s.vmin, s.vmax, strict=True)
    ]
    return {
        "key": key,
        "buckets": buckets,
        "bucket_steps": s.level,
        "columns": ["first", "last", "mean", "min", "max"],
    }


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
    "get_samples": _samples,
    "get_sample_tokens": _tokens,
    "get_gate_history": _gate,
    "get_events": _events,
    "get_trajectories": _trajectories,
    "get_agent_events": _agent_events,
}
