"""A compact, numeric digest of one run, for Claude and for the offline analyst.

Everything comes from the store: the run row, its config, a handful of series downsampled to a
few dozen points, each series' trend (first, last, range, noise, and since when it has been
flat), the cascade gate (its transitions, the rule it ran under, the step it opened or came
closest, and the task-reward means of the window that decided it), chart events, recent commands,
a few samples, the newest eval, and what the scan of the run's console found (the newest traceback, CUDA
out-of-memory or NCCL error, engine/console/). `digest_text` renders it as a few kilobytes of plain lines;
secrets are redacted.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.coherence.health import judge_entropy
from engine.coherence.phases import K_NOISE, MIN_POINTS
from engine.redact import redact
from engine.store.reader import RunRow, StoreReader
from engine.training.config import CascadeConfig

POINTS = 32  # points per series in the digest: enough to see a shape, few tokens
# A trend over part of a run (RL, or the warm-up before it) reads raw steps up to this many, so that its ends
# are the stretch's own steps (a rollup bucket may straddle the start of RL); buckets that straddle are left
# out beyond it.
WINDOW_POINTS = 2048
# Series worth a look, in the order they are shown; rewards/<name>/mean of every reward is added.
DRAWN = ("phi/mean", "phi/entropy", "reward", "loss", "frac_reward_zero_std")  # + each reward: full series
KEYS = (
    "phi/mean",
    "phi/entropy",
    "phi/p10",
    "phi/p90",
    "reward",
    "reward_std",
    "loss",
    "entropy",
    "frac_reward_zero_std",
    "grad_norm",
    "learning_rate",
    "kl",
    "completions/mean_length",
    "completions/clipped_ratio",
    "train/loss",
    "train/reward",
)
# RL health (engine/coherence/health.py, docs/reference/carl.md §6.1), after the rewards: the offline analyst
# answers on these, and Claude sees their trends.
HEALTH_KEYS = (
    "policy_kl",
    "clip_ratio/region_mean",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "cov/logp_adv",
    "entropy/p10",
    "entropy/p50",
    "entropy/p90",
    "completions/max_length",
    # async RL (engine/observe/frameworks.py): the sampler against the learner, and the samples' age
    "mismatch/kl",
    "mismatch/logprob_abs_diff/mean",
    "staleness/mean",
    "completions/aborted_ratio",
)
MAX_KEYS = 40
MAX_PROCESSES = 12  # the run's processes in the digest: a few ranks, and those that died first
CONSOLE_FINDINGS = 3  # the newest tracebacks / OOM / NCCL errors of the run's console in the digest
NON_TASK = {"format", "concise", "coherence", "commitment"}  # rewards that do not measure the task


@dataclass
class Trend:
    """One series over the run, from its bucket means."""

    key: str
    points: int  # steps the store holds for it
    first_step: int
    last_step: int
    first: float | None
    last: float | None
    vmin: float | None
    vmax: float | None
    early: float | None  # mean of the first quarter
    late: float | None  # mean of the last quarter
    mean: float | None  # mean over the whole run
    noise: float | None  # robust step-to-step spread of the bucket means
    flat_since: int | None  # the step since which it has not moved beyond its noise
    flat_level: float | None
    nan_steps: int  # buckets whose values were all NaN / inf
    change_band: float | None = None  # late - early within this is no move: K_NOISE sds of that difference

    @property
    def change(self) -> float | None:
        if self.early is None or self.late is None:
            return None
        return self.late - self.early


def _round(value: float | None, digits: int = 3) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{digits}g}")


def _bins(steps: np.ndarray, values: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Average consecutive buckets down to at most `points`, ignoring NaN."""
    if len(values) <= points:
        return steps, values
    edges = np.linspace(0, len(values), points + 1).astype(int)
    out_steps, out_values = [], []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        chunk = values[a:b]
        finite = chunk[np.isfinite(chunk)]
        out_steps.append(int(steps[b - 1]))
        out_values.append(float(finite.mean()) if len(finite) else math.nan)
    return np.array(out_steps), np.array(out_values)


def _noise(values: np.ndarray) -> float:
    """Median absolute step-to-step change, scaled to a standard deviation (robust to trends); for a series
    that mostly repeats one value (a reward at its maximum but for a few steps: a median of 0) the standard
    deviation of the changes, so that those few steps still count as its noise."""
    diffs = np.diff(values[np.isfinite(values)])
    if len(diffs) == 0:
        return 0.0
    robust = float(1.4826 * np.median(np.abs(diffs - np.median(diffs))) / math.sqrt(2))
    return robust if robust > 0 else float(np.std(diffs) / math.sqrt(2))


def _flat_since(steps: np.ndarray, values: np.ndarray, noise: float) -> tuple[int | None, float | None]:
    """The earliest step from which the series has not moved beyond its noise, when that stretch covers at
    least a quarter of the run and five points. A stretch has not moved when the change across it of a
    straight line fitted to it is within K_NOISE standard errors of that change (the step-to-step `noise` over
    the stretch's points: the longer the stretch, the smaller the move that counts), and no point of it is
    more than 5 noise widths from its mean (a jump)."""
    finite = np.isfinite(values)
    steps, values = steps[finite].astype(np.float64), values[finite]
    n = len(values)
    if n < 8:
        return None, None
    x, y = steps - steps.mean(), values - values.mean()
    # Sums over each tail values[i:], for every i at once (a tail of one point is always flat).
    m = np.arange(n, 0, -1, dtype=np.float64)
    sx, sy = np.cumsum(x[::-1])[::-1], np.cumsum(y[::-1])[::-1]
    sxx, sxy = np.cumsum((x * x)[::-1])[::-1], np.cumsum((x * y)[::-1])[::-1]
    spread = np.maximum(sxx - sx * sx / m, 0.0)  # sum of (x - the tail's mean x)^2
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.where(spread > 0, (sxy - sx * sy / m) / spread, 0.0)
        se = np.where(spread > 0, noise / np.sqrt(spread), 0.0)  # of the slope
    span = steps[-1] - steps
    tiny = 1e-9 * max(1.0, float(np.abs(values).max()))
    moved = np.abs(slope) * span > np.maximum(K_NOISE * se * span, tiny)
    mean = (sy / m)[:-1]
    top = np.maximum.accumulate(y[::-1])[::-1][:-1]
    bottom = np.minimum.accumulate(y[::-1])[::-1][:-1]
    jumped = np.maximum(top - mean, mean - bottom) > max(5 * noise, tiny)
    broken = np.flatnonzero(moved[:-1] | jumped)
    start = int(broken[-1]) + 1 if len(broken) else 0
    if n - start < max(5, n // 4):
        return None, None
    return int(steps[start]), float(values[start:].mean())


def trend(
    reader: StoreReader, run_id: int, key: str, since: int | None = None, until: int | None = None
) -> Trend | None:
    """The trend of `key` over the run, or from step `since` on, or up to step `until` (read at the
    resolution of that stretch: raw steps when it holds few enough)."""
    series = reader.series(run_id, key, max_points=512)
    if (since is not None or until is not None) and len(series.last):
        end = series.last[-1] if until is None else until
        series = reader.metric_range(run_id, key, since or 0, end, max_points=WINDOW_POINTS)
    first = np.asarray(series.first, dtype=np.int64)
    steps = np.asarray(series.last, dtype=np.int64)
    values = np.asarray(series.mean, dtype=np.float64)
    keep = np.ones(len(first), dtype=bool)
    if since is not None:
        keep &= first >= since
    if until is not None:
        keep &= steps <= until
    first, steps, values = first[keep], steps[keep], values[keep]
    if len(first) == 0:
        return None
    finite = values[np.isfinite(values)]
    quarter = max(1, len(values) // 4)
    noise = _noise(values)
    flat_step, flat_level = _flat_since(steps, values, noise)

    def mean(part: np.ndarray) -> float | None:
        part = part[np.isfinite(part)]
        return float(part.mean()) if len(part) else None

    return Trend(
        key=key,
        points=reader.count_points(run_id, key),
        first_step=int(first[0]),
        last_step=int(steps[-1]),
        first=mean(values[:1]),
        last=series.latest if series.latest is not None else mean(values[-1:]),
        vmin=float(finite.min()) if len(finite) else None,
        vmax=float(finite.max()) if len(finite) else None,
        early=mean(values[:quarter]),
        late=mean(values[-quarter:]),
        mean=mean(values),
        noise=noise,
        flat_since=flat_step,
        flat_level=flat_level,
        nan_steps=int((~np.isfinite(values)).sum()),
        change_band=K_NOISE * noise * math.sqrt(2.0 / quarter) if len(values) >= 2 else None,
    )


def chosen_keys(keys: list[str]) -> list[str]:
    rewards = sorted(k for k in keys if k.startswith("rewards/") and k.endswith("/mean"))
    wanted = [k for k in KEYS if k in keys] + rewards + [k for k in HEALTH_KEYS if k in keys]
    return list(dict.fromkeys(wanted))[:MAX_KEYS]


def _run_fields(run: RunRow) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "source": run.source_kind,
        "status": run.status,
        "model": run.model,
        "backend": run.backend,
        "step": run.last_step,
        "max_steps": run.max_steps,
        "vocab_size": run.vocab_size,
        "temperature": run.temperature,
        "phase": run.phase,
        "health": run.health,
        "health_reasons": run.health_reasons,
        "error": run.error,
        "started_at": run.started_at,
        "last_update": run.last_update,
        "ended_at": run.ended_at,
    }


def task_keys(digest: dict[str, Any]) -> list[str]:
    """The run's task reward series: rewards/<name>/mean of every reward that is not format,
    concise or coherence; the total reward when there are none."""
    return _task_keys(digest["trends"])


def _task_keys(keys: Iterable[str]) -> list[str]:
    names = list(keys)
    tasks = [k for k in names if k.startswith("rewards/") and k.split("/")[1] not in NON_TASK]
    return tasks or [k for k in ("reward", "train/reward") if k in names]


def gate_rule(config: dict[str, Any]) -> dict[str, Any]:
    """The cascade settings the run's gate ran under: the run's config, else carl's defaults."""
    given = config.get("cascade")
    given = given if isinstance(given, dict) else {}
    rule = {key: given.get(key, value) for key, value in CascadeConfig().model_dump().items()}
    return rule | {"source": "config" if given else "defaults"}


def _gate(reader: StoreReader, run_id: int, config: dict[str, Any], tasks: list[str]) -> dict[str, Any]:
    """The cascade gate from its per-step records: its state now, its transitions, the step it
    opened (with the record of the step before) or, while closed, the step it came closest, the
    rule it ran under, and the task-reward means of the window that decided it."""
    history = reader.gate_history(run_id)
    if not history:
        return {
            "current": None,
            "transitions": [],
            "rule": None,
            "opened": None,
            "before_open": None,
            "closest": None,
            "window": [],
            "window_keys": [],
        }
    transitions: list[dict[str, Any]] = []
    for row in history:
        if not transitions or row["state"] != transitions[-1]["state"]:
            transitions.append(row)
    at = next((i for i, row in enumerate(history) if row["state"] != "closed"), None)
    opened = history[at] if at is not None else None
    closest = None
    if opened is None:
        closest = max(reversed(history), key=lambda row: row["above"] or 0)  # the newest of the best
    rule = gate_rule(config)
    decided = opened or history[-1]
    size = decided["window"] or rule["window"]
    return {
        "current": history[-1],
        "transitions": transitions[-12:],
        "rule": rule,
        "opened": opened,
        "before_open": history[at - 1] if at else None,
        "closest": closest,
        "window": _task_window(reader, run_id, tasks, decided["step"] - size + 1, decided["step"]),
        "window_keys": tasks,
    }


def _task_window(reader: StoreReader, run_id: int, keys: list[str], start: int, end: int) -> list[list[Any]]:
    """[step, task-reward mean] from `start` to `end`: what the gate is fed, the mean of the task
    rewards' per-step means (NaN counts as 0 there)."""
    by_step: dict[int, list[float]] = {}
    for key in keys:
        s = reader.metric_range(run_id, key, start, end)
        for step, value in zip(s.last, s.mean, strict=True):
            by_step.setdefault(int(step), []).append(float(value) if math.isfinite(value) else 0.0)
    return [[step, _round(sum(v) / len(v), 4)] for step, v in sorted(by_step.items())]


def sample_brief(sample: dict[str, Any], *, cut: bool = True) -> dict[str, Any]:
    """A sample without its per-token arrays: rewards, mean and min Phi; text cut for the digest."""
    phi = [p for p in sample.get("phi") or [] if p is not None]
    prompt, completion = sample.get("prompt") or "", sample.get("completion") or ""
    return {
        "id": sample["id"],
        "step": sample["step"],
        "kind": sample["kind"],
        "prompt": prompt[-200:] if cut else prompt,
        "completion": completion[:300] if cut else completion,
        "rewards": sample.get("rewards"),
        "phi_mean": _round(float(np.mean(phi))) if phi else None,
        "phi_min": _round(float(np.min(phi))) if phi else None,
        "tokens": len(sample.get("tokens") or []),
    }


def console_brief(reader: StoreReader, run_id: int) -> dict[str, Any]:
    """The run's log files and the newest CONSOLE_FINDINGS of their scan (newest first)."""
    return {
        "files": [
            {"file": Path(c["path"]).name, "kind": c["kind"]} for c in reader.system.run_consoles(run_id)
        ],
        "findings": [
            {
                "kind": f["kind"],
                "line": f["line"],
                "file": Path(f["path"]).name,
                "line_no": f["line_no"],
                "t": f["t"],
            }
            for f in reader.system.findings(run_id, limit=CONSOLE_FINDINGS)
        ],
    }


def build_digest(reader: StoreReader, run_id: int, *, now: float | None = None) -> dict[str, Any]:
    """Everything the diagnosis knows about a run, as JSON-able data (not yet redacted)."""
    run = next((r for r in reader.runs() if r.id == run_id), None)
    if run is None:
        raise LookupError(f"run {run_id}: no such run")
    # The box's rules come with engine.system, which brings the store's writer: loaded when a digest is made,
    # not when the control room imports diagnosis.
    from engine.system.box_health import box_flags

    now_t = time.time() if now is None else now
    keys = reader.metric_keys(run_id)
    chosen = chosen_keys(keys)
    series, trends = {}, {}
    for key in chosen:
        t = trend(reader, run_id, key)
        if t is None:
            continue
        trends[key] = t
        if key not in DRAWN and not key.startswith("rewards/"):
            continue
        s = reader.series(run_id, key, max_points=512)
        steps, values = _bins(
            np.asarray(s.last, dtype=np.int64), np.asarray(s.mean, dtype=np.float64), POINTS
        )
        series[key] = [[int(a), _round(float(b))] for a, b in zip(steps, values, strict=True)]
    config = reader.run_config(run_id)
    rl = rl_brief(reader, run, config)
    # Phi, entropy and the loss over the RL steps and before them, apart: an SFT warm-up makes the policy
    # certain on purpose (the coherence trap compares Φ over RL), and its loss is another loss than RL's.
    window: dict[str, Any] = {}
    before: dict[str, Any] = {}
    if rl["stage"] == "rl":
        for key in ("phi/mean", "phi/entropy", "entropy", "loss", "train/loss"):
            if key in trends and trends[key].first_step < rl["start"]:
                if t := trend(reader, run_id, key, rl["start"]):
                    window[key] = _trend_dict(t)
                if key in ("loss", "train/loss") and (t := trend(reader, run_id, key, until=rl["start"] - 1)):
                    before[key] = _trend_dict(t)
    return {
        "run": _run_fields(run),
        "config": config,
        "keys": keys,
        "series": series,
        "trends": {k: _trend_dict(t) for k, t in trends.items()},
        "rl": rl,
        "rl_trends": window,
        "before_rl_trends": before,
        "entropy": entropy_brief(reader, run, trends, rl),
        "gate": _gate(reader, run_id, config, _task_keys(trends)),
        "events": [e for e in reader.events(run_id) if e["kind"] != "checkpoint"][-20:],
        "checkpoints": [e["step"] for e in reader.events(run_id) if e["kind"] == "checkpoint"][-5:],
        "commands": [
            {k: c[k] for k in ("verb", "args", "state", "result", "created_at")}
            for c in reader.run_commands(run_id, limit=10)
        ],
        "samples": [sample_brief(s) for s in reader.samples(run_id, limit=3)],
        "eval": reader.latest_eval(run_id),
        "processes": processes_brief(reader, run_id),
        "box": [flag._asdict() for flag in box_flags(reader.system, run_id, run.status, now_t)],
        "console": console_brief(reader, run_id),
        "counts": {
            "trajectories": reader.table_count("trajectories"),
            "agent_events": reader.table_count("agent_events"),
        },
        "now": now_t,
    }


def _trend_dict(t: Trend) -> dict[str, Any]:
    return t.__dict__ | {"change": t.change}


def rl_brief(reader: StoreReader, run: RunRow, config: dict[str, Any]) -> dict[str, Any]:
    """Where the run stands with RL, as the control room's health reads it (engine/coherence/analysis.py
    `rl_start`): the first RL step (the first with a reward, else the step after the SFT warm-up the config
    names; None for a run without RL), the stage (`warmup` before it, `rl` from it on, None without RL) and
    the warm-up's length in the config."""
    from engine.coherence.analysis import rl_start

    start = rl_start(reader, run.id)
    warmup = config.get("sft_warmup_steps")
    warmup = warmup if isinstance(warmup, int) and not isinstance(warmup, bool) and warmup > 0 else None
    stage = None if start is None else "rl" if (run.last_step or 0) >= start else "warmup"
    return {"start": start, "stage": stage, "warmup_steps": warmup}


def entropy_brief(
    reader: StoreReader, run: RunRow, trends: dict[str, Trend], rl: dict[str, Any]
) -> dict[str, Any] | None:
    """The run's entropy as the control room's health judges it: over the RL steps only, its start and where
    it is now by the collapse rule itself (engine/coherence/health.py `judge_entropy`, on the steps
    engine/coherence/analysis.py `rl_entropy` reads), and the steps before RL (an SFT warm-up: learning, not
    judged) apart, from their first value to their last. None: the run logs no entropy."""
    from engine.coherence.analysis import HORIZON_STEPS, rl_entropy

    t = trends.get("phi/entropy") or trends.get("entropy")
    if t is None:
        return None
    brief: dict[str, Any] = {
        "key": t.key,
        "run": {"first": t.first, "first_step": t.first_step, "last": t.last, "last_step": t.last_step},
        "before_rl": None,
        "rl": None,
    }
    start = rl["start"]
    if (
        start is not None
        and t.first_step < start
        and (before := trend(reader, run.id, t.key, until=start - 1))
    ):
        brief["before_rl"] = {
            "first": before.first,
            "first_step": before.first_step,
            "last": before.last,
            "last_step": before.last_step,
        }
    if rl["stage"] == "rl":
        steps, values = rl_entropy(reader, run.id, start, max(0, (run.last_step or 0) - HORIZON_STEPS))
        judged = judge_entropy(values, steps)
        brief["rl"] = {
            "points": int(np.isfinite(values).sum()),
            "needs": 2 * MIN_POINTS,
            "judged": None if judged is None else judged._asdict(),
        }
    return brief


def processes_brief(reader: StoreReader, run_id: int) -> list[dict[str, Any]]:
    """The run's processes, compactly: those that died first, then the live ones, then the other ends; at
    most MAX_PROCESSES."""
    rows = reader.system.run_processes(run_id)
    rows.sort(key=lambda p: (not p["died"], p["ended_at"] is not None))
    keys = ("role", "rank", "pid", "node", "state", "cpu", "rss", "gpu_mem", "gpus", "end_reason", "died")
    return [{k: p[k] for k in keys} | {"ended": p["ended_at"] is not None} for p in rows[:MAX_PROCESSES]]


# -- text ------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


def _config_line(config: dict[str, Any]) -> str:
    if not config:
        return ""
    parts = [
        f"{k}={config[k]}"
        for k in (
            "method",
            "learning_rate",
            "num_generations",
            "per_device_train_batch_size",
            "max_completion_length",
            "temperature",
            "sft_warmup_steps",
            "aggregation",
            "dataset",
        )
        if k in config
    ]
    rewards = config.get("rewards")
    if isinstance(rewards, list):
        shown = ", ".join(f"{r.get('name')}×{r.get('weight', 1.0)}" for r in rewards if isinstance(r, dict))
        parts.append(f"rewards=[{shown}]")
    cascade = config.get("cascade")
    if isinstance(cascade, dict):
        parts.append("cascade(" + ", ".join(f"{k}={v}" for k, v in cascade.items()) + ")")
    return " ".join(parts)


def digest_text(digest: dict[str, Any]) -> str:
    """The digest as compact lines (a few KB), secrets redacted."""
    run = digest["run"]
    lines = [
        f"RUN {run['name']} (id {run['id']}, source {run['source']}, model {_fmt(run['model'])}, "
        f"backend {_fmt(run['backend'])}, |V| {_fmt(run['vocab_size'])}, "
        f"temperature {_fmt(run['temperature'])})",
        f"status {run['status']}, step {_fmt(run['step'])} of {_fmt(run['max_steps'])}, phase "
        f"{_fmt(run['phase'])}, health {_fmt(run['health'])}"
        + (f": {'; '.join(run['health_reasons'])}" if run["health_reasons"] else ""),
    ]
    if run["last_update"]:
        lines.append(f"last write {_ago(digest['now'] - run['last_update'])} ago")
    if run["error"]:
        lines.append(f"error: {run['error']}")
    if config_line := _config_line(digest["config"]):
        lines.append(f"CONFIG {config_line}")
    lines.append(f"METRIC KEYS ({len(digest['keys'])}): {', '.join(digest['keys'][:60])}")
    lines.append(
        "TRENDS (first→last; early/late = mean of first/last quarter; noise = step-to-step sd; late - early "
        "within the change band is no move)"
    )
    for key, t in digest["trends"].items():
        flat = (
            f", flat since step {t['flat_since']} at {_fmt(t['flat_level'])}"
            if t["flat_since"] is not None
            else ""
        )
        nan = f", {t['nan_steps']} NaN buckets" if t["nan_steps"] else ""
        lines.append(
            f"  {key}: {_fmt(t['first'])}→{_fmt(t['last'])} (steps {t['first_step']}–{t['last_step']}, "
            f"min {_fmt(t['vmin'])}, max {_fmt(t['vmax'])}, early {_fmt(t['early'])}, late "
            f"{_fmt(t['late'])}, noise {_fmt(t['noise'])}, change band ±{_fmt(t['change_band'])}{flat}{nan})"
        )
    for key, t in digest["rl_trends"].items():
        lines.append(
            f"  {key} over the RL steps only ({t['first_step']}–{t['last_step']}): early "
            f"{_fmt(t['early'])}, late {_fmt(t['late'])}, noise {_fmt(t['noise'])}"
        )
    lines += _entropy_lines(digest)
    lines.append(f"SERIES (step:value, ≤{POINTS} points of bucket means)")
    for key, points in digest["series"].items():
        lines.append(f"  {key}: " + " ".join(f"{s}:{_fmt(v)}" for s, v in points))
    gate = digest["gate"]
    if gate["current"]:
        g = gate["current"]
        lines.append(
            f"GATE now {g['state']} at step {g['step']} (threshold {_fmt(g['threshold'])}, "
            f"{g['above']}/{g['window']} recent steps above, multiplier {_fmt(g['multiplier'])}): "
            f"{g['reason']}"
        )
        for t in gate["transitions"]:
            lines.append(f"  step {t['step']}: {t['state']} — {t['reason']}")
        rule = gate["rule"]
        lines.append(
            f"  rule ({rule['source']}): " + ", ".join(f"{k}={v}" for k, v in rule.items() if k != "source")
        )
        if o := gate["opened"]:
            lines.append(
                f"  opened at step {o['step']}: {o['above']}/{o['window']} above {_fmt(o['threshold'])} "
                f"(n={o['history']})"
            )
        if gate["window"]:
            lines.append(
                f"  task reward fed to the gate, steps {gate['window'][0][0]}–{gate['window'][-1][0]}: "
                + " ".join(f"{s}:{_fmt(v)}" for s, v in gate["window"])
            )
    else:
        lines.append("GATE none (no cascade gate in this run)")
    if digest["events"]:
        lines.append(
            "EVENTS "
            + "; ".join(f"step {e['step']} {e['kind']} {e['detail']}".strip() for e in digest["events"])
        )
    if digest["checkpoints"]:
        lines.append(f"CHECKPOINTS at steps {', '.join(map(str, digest['checkpoints']))}")
    if digest["commands"]:
        lines.append("COMMANDS (newest first)")
        for c in digest["commands"]:
            lines.append(f"  {c['verb']} {c['args']} → {c['state']}: {c['result'] or ''}")
    if digest["samples"]:
        lines.append("SAMPLES (newest)")
        for s in digest["samples"]:
            lines.append(
                f"  #{s['id']} step {s['step']} {s['kind']}: rewards {json.dumps(s['rewards'])}, "
                f"Φ mean {_fmt(s['phi_mean'])} min {_fmt(s['phi_min'])}, {s['tokens']} tokens: "
                f"{json.dumps(s['completion'])}"
            )
    if digest["eval"]:
        e = digest["eval"]
        lines.append(
            f"EVAL {'passed' if e['passed'] else 'failed'}: "
            f"{'; '.join(e['reasons'])} {json.dumps(e['metrics'])}"
        )
    lines += _box_lines(digest)
    console = digest.get("console") or {}
    if console.get("files"):
        lines.append(
            "CONSOLE (the run's stdout/stderr: "
            + ", ".join(f"{c['file']} [{c['kind']}]" for c in console["files"])
            + ")"
        )
        for f in console["findings"]:
            at = f" line {f['line_no']}" if f["line_no"] else ""
            lines.append(f"  {f['kind']} in {f['file']}{at}, {_ago(digest['now'] - f['t'])} ago: {f['line']}")
        if not console["findings"]:
            lines.append("  no traceback, CUDA out-of-memory or NCCL error found in it")
    counts = digest["counts"]
    lines.append(f"STORE {counts['trajectories']} trajectories, {counts['agent_events']} agent events")
    return redact("\n".join(lines))


def _entropy_lines(digest: dict[str, Any]) -> list[str]:
    """Where the run stands with RL, and its entropy as health judges it."""
    rl, entropy = digest["rl"], digest["entropy"]
    if rl["stage"] is None:
        lines = [
            "RL none: no step with a reward (health's RL rules, entropy collapse among them, do not apply)"
        ]
    elif rl["stage"] == "warmup":
        lines = [
            f"RL starts at step {rl['start']} (the run is before it: SFT warm-up of "
            f"{_fmt(rl['warmup_steps'])} steps; health judges entropy over the RL steps only)"
        ]
    else:
        lines = [f"RL from step {rl['start']} (health's RL rules read the steps from there)"]
    if entropy and entropy["before_rl"]:
        b = entropy["before_rl"]
        lines.append(
            f"  {entropy['key']} before RL (steps {b['first_step']}–{b['last_step']}, not judged): "
            f"{_fmt(b['first'])}→{_fmt(b['last'])}"
        )
    if entropy and entropy["rl"] and (j := entropy["rl"]["judged"]):
        lines.append(
            f"  {entropy['key']} over RL as health judges it: start {_fmt(j['start'])} (steps "
            f"{j['start_steps'][0]}–{j['start_steps'][1]}), now {_fmt(j['now'])} (steps {j['now_steps'][0]}–"
            f"{j['now_steps'][1]}): {'collapsed' if j['collapsed'] else 'no collapse'}"
        )
    return lines


def _box_lines(digest: dict[str, Any]) -> list[str]:
    """The run's processes (alive, or ended with the reason) and what the box says of the run."""
    lines = []
    processes = digest.get("processes") or []
    if processes:
        live = sum(not p["ended"] for p in processes)
        lines.append(f"PROCESSES ({live} live, {len(processes) - live} ended)")
    for p in processes:
        name = f"rank {p['rank']}" if p["rank"] is not None else p["role"]
        where = f" on {p['node']}" if p["node"] else ""
        if p["ended"]:
            died = " (died while the run was live)" if p["died"] else ""
            lines.append(
                f"  {name} pid {p['pid']}{where}: ended: {p['end_reason'] or 'no reason recorded'}{died}"
            )
            continue
        parts = [p["state"]]
        if p["cpu"] is not None:
            parts.append(f"cpu {p['cpu']:.0f}%")
        if p["rss"] is not None:
            parts.append(f"rss {p['rss'] / 2**30:.2f} GiB")
        if p["gpus"]:
            parts.append(f"GPU {','.join(map(str, p['gpus']))} {_fmt((p['gpu_mem'] or 0) / 2**30)} GiB")
        lines.append(f"  {name} pid {p['pid']}{where}: {', '.join(parts)}")
    for flag in digest.get("box") or []:
        lines.append(f"BOX {flag['cause']} ({flag['level']}): {flag['reason']}")
    return lines
